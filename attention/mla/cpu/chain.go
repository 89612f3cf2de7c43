package cpu

import (
	"context"
	"encoding/binary"
	"math"
	"sync"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/numerics"
)

// The chain's bit-exact steps (DESIGN.md section 7 steps 1 and 3): act_quant
// and q_norm fused with it. One task quantizes one row.

const qb = numerics.ActQuantBlockSize

// rowPool recycles the float32 row of a task (up to hidden-size values).
var rowPool sync.Pool

func getRow(k int) *[]float32 {
	if p, ok := rowPool.Get().(*[]float32); ok && cap(*p) >= k {
		*p = (*p)[:k]
		return p
	}
	p := make([]float32, k)
	return &p
}

// quantRow quantizes each row's values y (numerics.ActQuantBlock per block)
// into out: data row r, scale of block b at [b][ScaleStride] column r.
func quantRow(y []float32, data, scale []byte, r, scaleStride int) {
	k := len(y)
	q := data[r*k : (r+1)*k]
	for b := 0; b < k/qb; b++ {
		s := numerics.ActQuantBlock(y[b*qb:(b+1)*qb], q[b*qb:(b+1)*qb])
		binary.LittleEndian.PutUint32(scale[4*(b*scaleStride+r):], math.Float32bits(s))
	}
}

func loadBF16(x []float32, src []byte) {
	for i := range x {
		x[i] = numerics.F32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// ActQuant implements mla.ChainBackend: act_quant of each bf16 row.
func (c *Backend) ActQuant(ctx context.Context, a *mla.ActQuantArgs) error {
	if err := a.Validate(); err != nil {
		return err
	}
	x, data, scale, err := quantBuffers(a.X, &a.Out)
	if err != nil {
		return err
	}
	k := a.Out.K
	return c.parallel(ctx, a.Out.Rows, func(r int) {
		p := getRow(k)
		defer rowPool.Put(p)
		y := *p
		loadBF16(y, x[a.XOffset+2*r*a.XStride:])
		quantRow(y, data, scale, r, a.Out.ScaleStride)
	})
}

// NormQuant implements mla.ChainBackend: RMSNorm of each row over its K
// values (W = K, the args' Eps), rounded to bf16, then act_quant.
func (c *Backend) NormQuant(ctx context.Context, a *mla.NormQuantArgs) error {
	if err := a.Validate(); err != nil {
		return err
	}
	x, data, scale, err := quantBuffers(a.X, &a.Out)
	if err != nil {
		return err
	}
	wb, err := span(a.Weight, 0, 4*a.Out.K)
	if err != nil {
		return err
	}
	k := a.Out.K
	w := make([]float32, k)
	for i := range w {
		w[i] = math.Float32frombits(binary.LittleEndian.Uint32(wb[4*i:]))
	}
	return c.parallel(ctx, a.Out.Rows, func(r int) {
		p := getRow(k)
		defer rowPool.Put(p)
		y := *p
		loadBF16(y, x[a.XOffset+2*r*a.XStride:])
		inv := numerics.RMSInvN(numerics.SumSquaresN(y), k, a.Eps)
		for i, v := range y {
			y[i] = numerics.RoundBF16(float32(float32(v*inv) * w[i]))
		}
		quantRow(y, data, scale, r, a.Out.ScaleStride)
	})
}

// quantBuffers resolves the host memory of a validated call.
func quantBuffers(xb mla.Buffer, out *mla.FP8Activations) (x, data, scale []byte, err error) {
	if x, err = span(xb, 0, xb.Len()); err != nil {
		return
	}
	if data, err = span(out.Data, 0, out.Rows*out.K); err != nil {
		return
	}
	scale, err = span(out.Scale, 0, out.Scale.Len())
	return
}
