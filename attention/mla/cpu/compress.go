package cpu

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// CompressStep implements mla.CompressStepper on the host: the entries of
// the plan's jobs by package compressor (Layer.EntryFrom), stored in place
// in the pool, then each sequence's ring rows. A job or sequence whose
// indices fall outside the buffers is skipped, as on the device.
func (*Backend) CompressStep(ctx context.Context, a *mla.CompressStepArgs) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	bufs := []mla.Buffer{a.Ring, a.Plan, a.NormWeight, a.Rope, a.Pool}
	if a.KGRows > 0 {
		bufs = append(bufs, a.KG)
	}
	if a.APE != nil {
		bufs = append(bufs, a.APE)
	}
	for _, b := range bufs {
		if _, ok := b.(*Buffer); !ok {
			return fmt.Errorf("cpu: compress step: buffer of type %T is not a CPU buffer", b)
		}
	}
	plan, err := mla.DecodeCompressPlan(Bytes(a.Plan)[a.PlanOffset:], a.MaxSeqs, a.MaxJobs)
	if err != nil {
		return err
	}
	layer, err := compressor.NewLayer(compressor.Params{Ratio: a.Ratio, NormWeight: numerics.F32sFromBytes(Bytes(a.NormWeight)[:4*numerics.HeadDim]),
		Eps: a.Eps, Rope: &dsv4.RopeTable{Kind: dsv4.RopeYaRN, Positions: a.RopePositions,
			CosSin: numerics.F32sFromBytes(Bytes(a.Rope)[:a.RopePositions*numerics.RopeDim*4])}})
	if err != nil {
		return fmt.Errorf("cpu: compress step: %w", err)
	}
	w := a.Width()
	var kg, ape []float32
	if a.KGRows > 0 {
		kg = numerics.F32sFromBytes(Bytes(a.KG)[:a.KGRows*2*w*4])
	}
	if a.APE != nil {
		ape = numerics.F32sFromBytes(Bytes(a.APE)[:a.Ratio*w*4])
	}
	ring := Bytes(a.Ring)
	ringRow := func(slot, pos int) []byte {
		o := ((slot*a.RingRows + pos%a.RingRows) * 2 * w) * 4
		return ring[o : o+2*w*4]
	}
	// value returns position p's K and G rows of sequence s.
	value := func(s *mla.CompressPlanSeq, p int) (k, g []float32) {
		if p >= s.Start {
			r := (s.Row + p - s.Start) * 2 * w
			k, g = kg[r:r+w], kg[r+w:r+2*w]
			if ape != nil {
				ga := make([]float32, w)
				for c := range ga {
					ga[c] = float32(g[c] + ape[p%a.Ratio*w+c])
				}
				g = ga
			}
			return k, g
		}
		row := numerics.F32sFromBytes(ringRow(s.From, p))
		return row[:w], row[w:]
	}
	seqOK := func(s *mla.CompressPlanSeq) bool {
		return s.Row >= 0 && s.Rows >= 0 && s.Row+s.Rows <= a.KGRows && s.Start >= 0 &&
			s.From >= 0 && s.From < a.Slots && s.To >= 0 && s.To < a.Slots
	}
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(a.PageSize)
	pool := Bytes(a.Pool)
	for _, j := range plan.Jobs {
		if j.Seq < 0 || j.Seq >= len(plan.Seqs) {
			continue
		}
		s := &plan.Seqs[j.Seq]
		if !seqOK(s) || j.Index < 0 || int64(j.Index)*int64(a.Ratio) >= int64(a.RopePositions) ||
			(j.Index+1)*a.Ratio > s.Start+s.Rows || j.Page < 0 || j.Page >= a.NumPages || j.Offset < 0 || j.Offset >= a.PageSize {
			continue
		}
		e, err := layer.EntryFrom(j.Index, func(p int) ([]float32, []float32) { return value(s, p) })
		if err != nil {
			return fmt.Errorf("cpu: compress step: %w", err)
		}
		base := j.Page * pageBytes
		e.Store(pool[base:base+pageBytes], a.PageSize, j.Offset)
	}
	for i := range plan.Seqs {
		s := &plan.Seqs[i]
		if !seqOK(s) {
			continue
		}
		end := s.Start + s.Rows
		lo := max(s.Start, end-a.RingRows)
		if s.To != s.From {
			lo = max(0, end-a.RingRows)
		}
		for p := lo; p < end; p++ {
			k, g := value(s, p)
			dst := ringRow(s.To, p)
			copy(dst, numerics.F32Bytes(append(append(make([]float32, 0, 2*w), k...), g...)))
		}
	}
	return nil
}

// Confirm the method matches mla.CompressStepper's.
var _ mla.CompressStepper = (*Backend)(nil)
