package metadata

import (
	"fmt"
	"math"
)

// SchedulerParams are the inputs of the FMHA scheduler scalars. There is no
// implicit default: a zero field is refused by NewPlan, so start from
// DefaultSchedulerParams and change what differs.
type SchedulerParams struct {
	QDeq     float32 // dequantization scale of the Q buffer
	KVDeq    float32 // dequantization scale of the KV cache
	QScaling float32 // extra softmax scaling divisor
	OScale   float32 // output scale
}

// DefaultSchedulerParams returns every scale set to 1.
func DefaultSchedulerParams() SchedulerParams {
	return SchedulerParams{QDeq: 1, KVDeq: 1, QScaling: 1, OScale: 1}
}

// SchedulerScalars are the FMHA scheduler values written once per iteration.
type SchedulerScalars struct {
	TileCounter uint32     // reset to 0 before each layer's attention
	BMM1        [2]float32 // softmax scale, and the same times log2(e)
	BMM2        float32    // output scale
}

// sqrtHeadDim is sqrt(512) rounded once to float32; the GPU kernel uses the
// same constant.
var sqrtHeadDim = float32(math.Sqrt(512))

// log2e is log2(e) rounded once to float32.
var log2e = float32(math.Log2E)

// ComputeSchedulerScalars computes the scheduler scalars. It does not
// validate p; NewPlan does.
//
// Bit-exact contract (the GPU kernel computes the same values in the same
// order; fl() is one IEEE float32 round-to-nearest-even, no fused
// multiply-add):
//
//	denom   = fl(QScaling * fl(sqrt(512)))
//	bmm1[0] = fl(fl(QDeq * KVDeq) / denom)
//	bmm1[1] = fl(bmm1[0] * fl(log2(e)))
//	bmm2    = fl(OScale * KVDeq)
//	tile_counter = 0
//
// Each step is an explicit float32() conversion so that the Go compiler does
// not fuse or reassociate it.
func ComputeSchedulerScalars(p SchedulerParams) SchedulerScalars {
	denom := float32(p.QScaling * sqrtHeadDim)
	qk := float32(p.QDeq * p.KVDeq)
	bmm10 := float32(qk / denom)
	bmm11 := float32(bmm10 * log2e)
	bmm2 := float32(p.OScale * p.KVDeq)
	return SchedulerScalars{TileCounter: 0, BMM1: [2]float32{bmm10, bmm11}, BMM2: bmm2}
}

// validate refuses scales that are not finite and positive, and inputs whose
// scalars overflow or underflow to zero.
func (p SchedulerParams) validate() error {
	fields := [...]struct {
		name string
		v    float32
	}{{"QDeq", p.QDeq}, {"KVDeq", p.KVDeq}, {"QScaling", p.QScaling}, {"OScale", p.OScale}}
	for _, f := range fields {
		v := float64(f.v)
		if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			return fmt.Errorf("metadata: Scheduler.%s = %v, must be finite and > 0 (start from DefaultSchedulerParams)", f.name, f.v)
		}
	}
	s := ComputeSchedulerScalars(p)
	results := [...]struct {
		name string
		v    float32
	}{{"bmm1[0]", s.BMM1[0]}, {"bmm1[1]", s.BMM1[1]}, {"bmm2", s.BMM2}}
	for _, r := range results {
		v := float64(r.v)
		if math.IsInf(v, 0) || v == 0 {
			return fmt.Errorf("metadata: Scheduler %+v gives %s = %v, want a finite non-zero scale", p, r.name, r.v)
		}
	}
	return nil
}
