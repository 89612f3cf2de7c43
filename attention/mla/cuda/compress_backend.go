package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
)

// Compress implements mla.CompressorBackend: the entries of a layer's
// compressor work are computed on the device by compress_entries (byte for
// byte package compressor's), and the states advance on the host
// (compressor.State.Advance). The iteration's K/G rows and the states'
// rows the entries read are uploaded for each call; the layer's norm weight
// and RoPE table once per layer and table (kept until Close). With
// Options.HostCompressor the work runs on the host instead (mla.Compress's
// own path). On an error some states may have advanced, as mla.Compress
// says: the caller rolls them back.
func (b *Backend) Compress(ctx context.Context, a *mla.CompressArgs) (int, error) {
	if b.opts.HostCompressor {
		return mla.Compress(ctx, hostCompressor{b}, a)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	plan, err := planCompress(a)
	if err != nil {
		return 0, err
	}
	if len(plan.jobs) > 0 {
		if err := b.runPlan(ctx, a, plan); err != nil {
			return 0, err
		}
	}
	for i, s := range a.Seqs {
		if _, err := s.State.Advance(s.StartPos, a.K[s.Row:s.Row+s.Rows], a.G[s.Row:s.Row+s.Rows]); err != nil {
			return len(plan.jobs), fmt.Errorf("mla: compress: sequence %d: %w", i, err)
		}
	}
	return len(plan.jobs), nil
}

// hostCompressor hides Backend.Compress from mla.Compress, which then runs
// the host path with the backend's Write.
type hostCompressor struct{ mla.Backend }

// compressPlan is one mla.CompressArgs as the kernel takes it: the jobs,
// whose new rows are the rows of CompressArgs.K and G, and the state rows
// they read, gathered from the sequences' states.
type compressPlan struct {
	jobs           []CompressJob
	stateK, stateG []float32
	stateRows      int
}

// planCompress checks a as mla.CompressArgs.Run does (before anything
// runs) and lists every entry its rows complete.
func planCompress(a *mla.CompressArgs) (*compressPlan, error) {
	if a.Layer == nil {
		return nil, fmt.Errorf("mla: compress: no layer")
	}
	if len(a.K) != len(a.G) {
		return nil, fmt.Errorf("mla: compress: %d K rows but %d G rows", len(a.K), len(a.G))
	}
	if a.PageSize < 1 || a.PageSize > kvcache.MaxPageSize || a.NumPages < 1 {
		return nil, fmt.Errorf("mla: compress: page size %d and pages %d must be positive (page size at most %d)", a.PageSize, a.NumPages, kvcache.MaxPageSize)
	}
	if want := a.NumPages * kvcache.FormatFP8UE8M0.PageBytes(a.PageSize); a.Pool == nil || a.Pool.Len() < want {
		return nil, fmt.Errorf("mla: compress: the pool must hold %d pages of %d entries (%d bytes)", a.NumPages, a.PageSize, want)
	}
	l := a.Layer
	r, w := l.Ratio(), l.Width()
	for t := range a.K {
		if len(a.K[t]) != w || len(a.G[t]) != w {
			return nil, fmt.Errorf("mla: compress: row %d: K has %d values and G %d, want %d each", t, len(a.K[t]), len(a.G[t]), w)
		}
	}
	p := &compressPlan{}
	for i, s := range a.Seqs {
		if s.Row < 0 || s.Rows < 0 || s.Row+s.Rows > len(a.K) {
			return nil, fmt.Errorf("mla: compress: sequence %d rows [%d, %d) outside the %d rows", i, s.Row, s.Row+s.Rows, len(a.K))
		}
		if s.State == nil {
			return nil, fmt.Errorf("mla: compress: sequence %d has no state", i)
		}
		if s.StartPos != s.State.Len() {
			return nil, fmt.Errorf("mla: compress: sequence %d: compressor: Append at position %d, but the sequence has %d positions (want startPos = %d; roll back drafts with Accept)",
				i, s.StartPos, s.State.Len(), s.State.Len())
		}
		stateRow := map[int]int32{} // position -> code of its gathered row
		code := func(pos int) (int32, error) {
			if pos >= s.StartPos {
				return int32(s.Row + pos - s.StartPos), nil
			}
			if c, ok := stateRow[pos]; ok {
				return c, nil
			}
			k, g, ok := s.State.Row(pos)
			if !ok {
				return 0, fmt.Errorf("mla: compress: sequence %d: its state has no row for position %d", i, pos)
			}
			c := StateRow(p.stateRows)
			p.stateK, p.stateG = append(p.stateK, k...), append(p.stateG, g...)
			p.stateRows++
			stateRow[pos] = c
			return c, nil
		}
		end := s.StartPos + s.Rows
		for idx := s.StartPos / r; (idx+1)*r <= end; idx++ {
			first := idx * r
			if compressor.Overlap(r) == 2 && idx > 0 {
				first -= r
			}
			cands := make([]int32, 0, (idx+1)*r-first)
			for pos := first; pos < (idx+1)*r; pos++ {
				c, err := code(pos)
				if err != nil {
					return nil, err
				}
				cands = append(cands, c)
			}
			j := idx / a.PageSize
			if j >= len(s.Table) || s.Table[j] < 0 || int(s.Table[j]) >= a.NumPages {
				return nil, fmt.Errorf("mla: compress: sequence %d entry %d: block table %v has no page for it in a pool of %d pages", i, idx, s.Table, a.NumPages)
			}
			p.jobs = append(p.jobs, CompressJob{Index: idx, Candidates: cands, Page: int(s.Table[j]), Offset: idx % a.PageSize})
		}
	}
	return p, nil
}

// compressUploads are the grow-only device buffers of Compress's rows, in
// the order newK, newG, stateK, stateG.
const compressUploads = 4

// runPlan uploads a plan's rows and launches its jobs.
func (b *Backend) runPlan(ctx context.Context, a *mla.CompressArgs, p *compressPlan) error {
	norm, rope, err := b.compressConstants(a.Layer)
	if err != nil {
		return err
	}
	w := a.Layer.Width()
	rows := [compressUploads][][]float32{a.K, a.G}
	flat := [compressUploads][]float32{nil, nil, p.stateK, p.stateG}
	var bufs [compressUploads]mla.Buffer
	for i := range compressUploads {
		var raw []byte
		if rows[i] != nil {
			raw = make([]byte, 0, 4*len(rows[i])*w)
			for _, row := range rows[i] {
				raw = appendFloats(raw, row)
			}
		} else {
			raw = appendFloats(make([]byte, 0, 4*len(flat[i])), flat[i])
		}
		if len(raw) == 0 {
			continue
		}
		if bufs[i], err = b.compressUpload(i, raw); err != nil {
			return err
		}
	}
	l := &CompressLayer{
		Ratio: a.Layer.Ratio(),
		NewK:  bufs[0], NewG: bufs[1], NewRows: len(a.K),
		StateK: bufs[2], StateG: bufs[3], StateRows: p.stateRows,
		NormWeight: norm, Eps: a.Layer.Eps(),
		Rope: rope, RopePositions: a.Layer.Rope().Positions,
		Pool: a.Pool, PageSize: a.PageSize, NumPages: a.NumPages,
	}
	return b.CompressEntries(ctx, l, p.jobs)
}

func appendFloats(dst []byte, vals []float32) []byte {
	for _, v := range vals {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

// compressUpload writes raw to upload buffer i, growing it first if needed
// (Write is ordered after the launches that may still read it).
func (b *Backend) compressUpload(i int, raw []byte) (mla.Buffer, error) {
	c := &b.comp
	if c.uploads[i] == nil || c.uploads[i].Len() < len(raw) {
		if c.uploads[i] != nil {
			if err := b.Free(c.uploads[i]); err != nil {
				return nil, err
			}
			c.uploads[i] = nil
		}
		buf, err := b.Alloc(max(len(raw), 1<<20))
		if err != nil {
			return nil, err
		}
		c.uploads[i] = buf
	}
	return c.uploads[i], b.Write(c.uploads[i], 0, raw)
}

// compressConstants returns the device copies of a layer's norm weight and
// RoPE table, uploading each once (a table shared by layers once).
func (b *Backend) compressConstants(l *compressor.Layer) (norm, rope mla.Buffer, err error) {
	c := &b.comp
	if c.norms == nil {
		c.norms = map[*compressor.Layer]mla.Buffer{}
		c.ropes = map[*dsv4.RopeTable]mla.Buffer{}
	}
	if norm = c.norms[l]; norm == nil {
		raw := appendFloats(nil, l.NormWeight())
		if norm, err = b.Alloc(len(raw)); err != nil {
			return nil, nil, err
		}
		if err = b.Write(norm, 0, raw); err != nil {
			return nil, nil, errors.Join(err, b.Free(norm))
		}
		c.norms[l] = norm
	}
	t := l.Rope()
	if rope = c.ropes[t]; rope == nil {
		raw := t.Bytes()
		if rope, err = b.Alloc(len(raw)); err != nil {
			return nil, nil, err
		}
		if err = b.Write(rope, 0, raw); err != nil {
			return nil, nil, errors.Join(err, b.Free(rope))
		}
		c.ropes[t] = rope
	}
	return norm, rope, nil
}

// Confirm the method matches mla.CompressorBackend's.
var _ mla.CompressorBackend = (*Backend)(nil)
