package cpu

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/numerics"
)

// CompressStep implements mla.CompressStepper on the host: the entries of
// the plan's jobs by package compressor (PoolEntryDim, then FinishPooled or,
// for the indexer's entries, FinishIndexer), stored in place
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
	dim := a.Entry.Dim()
	norm := numerics.F32sFromBytes(Bytes(a.NormWeight)[:4*dim])
	w := a.Width()
	rowBytes := 2 * w * 4
	var kg, ape []byte
	if a.KGRows > 0 {
		kg = Bytes(a.KG)[a.KGOffset:]
	}
	kgStride := a.KGRowStride() * 4
	if a.APE != nil {
		ape = Bytes(a.APE)
	}
	ring := Bytes(a.Ring)
	ringRow := func(slot, pos int) []byte {
		o := (slot*a.RingRows + pos%a.RingRows) * rowBytes
		return ring[o : o+rowBytes]
	}
	// value returns position p's K and G rows of sequence s, decoded from
	// the bytes of that row only.
	value := func(s *mla.CompressPlanSeq, p int) (k, g []float32) {
		if p < s.Start {
			row := numerics.F32sFromBytes(ringRow(s.From, p))
			return row[:w], row[w:]
		}
		o := (s.Row + p - s.Start) * kgStride
		row := numerics.F32sFromBytes(kg[o : o+rowBytes])
		k, g = row[:w], row[w:]
		if ape != nil {
			ap := numerics.F32sFromBytes(ape[p%a.Ratio*w*4 : (p%a.Ratio+1)*w*4])
			for c := range g {
				g[c] = float32(g[c] + ap[c])
			}
		}
		return k, g
	}
	seqOK := func(s *mla.CompressPlanSeq) bool {
		return s.Row >= 0 && s.Rows >= 0 && s.Row+s.Rows <= a.KGRows && s.Start >= 0 &&
			s.From >= 0 && s.From < a.Slots && s.To >= 0 && s.To < a.Slots
	}
	pageBytes := a.PoolPageBytes()
	pool, rope := Bytes(a.Pool), Bytes(a.Rope)
	pooled := make([]float32, dim)
	for _, j := range plan.Jobs {
		if j.Seq < 0 || j.Seq >= len(plan.Seqs) {
			continue
		}
		s := &plan.Seqs[j.Seq]
		if !seqOK(s) || j.Index < 0 || int64(j.Index)*int64(a.Ratio) >= int64(a.RopePositions) ||
			(j.Index+1)*a.Ratio > s.Start+s.Rows || j.Page < 0 || j.Page >= a.NumPages || j.Offset < 0 || j.Offset >= a.PageSize {
			continue
		}
		if err := compressor.PoolEntryDim(a.Ratio, dim, j.Index, func(p int) ([]float32, []float32) { return value(s, p) }, pooled); err != nil {
			return fmt.Errorf("cpu: compress step: %w", err)
		}
		pos := j.Index * a.Ratio
		cs := numerics.F32sFromBytes(rope[pos*numerics.RopeDim*4 : (pos+1)*numerics.RopeDim*4])
		base := j.Page * pageBytes
		page := pool[base : base+pageBytes]
		if a.Entry == mla.EntryIndexer {
			e, err := compressor.FinishIndexer(pooled, norm, a.Eps, cs)
			if err != nil {
				return fmt.Errorf("cpu: compress step: %w", err)
			}
			compressor.StoreIndexerEntry(page, a.PageSize, j.Offset, &e)
			continue
		}
		e, err := compressor.FinishPooled(j.Index, (*[compressor.Dim]float32)(pooled), (*[compressor.Dim]float32)(norm), a.Eps, cs)
		if err != nil {
			return fmt.Errorf("cpu: compress step: %w", err)
		}
		e.Store(page, a.PageSize, j.Offset)
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
			dst := ringRow(s.To, p)
			if p < s.Start {
				copy(dst, ringRow(s.From, p))
				continue
			}
			k, g := value(s, p)
			copy(dst[:w*4], numerics.F32Bytes(k))
			copy(dst[w*4:], numerics.F32Bytes(g))
		}
	}
	return nil
}

// Confirm the method matches mla.CompressStepper's.
var _ mla.CompressStepper = (*Backend)(nil)
