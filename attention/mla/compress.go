package mla

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
)

// CompressSeq is one sequence's share of a compressed layer's compressor
// work in an iteration (DESIGN.md section 8).
type CompressSeq struct {
	Row, Rows int               // its token rows in CompressArgs.K and G
	StartPos  int               // position of its first row: State.Len()
	State     *compressor.State // the sequence's state in this layer
	// Table is the sequence's block table of the layer's ratio: page j
	// holds entries [j*PageSize, (j+1)*PageSize). It covers every entry the
	// rows complete, floor((StartPos+Rows)/ratio).
	Table []int32
}

// CompressArgs is one compressed layer's compressor work over an
// iteration: each sequence's projection rows are appended to its state,
// and every entry they complete is stored at its index in the layer's
// compressed pool (fp8_ue8m0, PageSize entries a page, NumPages pages).
type CompressArgs struct {
	Layer              *compressor.Layer
	K, G               [][]float32 // the iteration's rows, Layer.Width() values each (G includes ape)
	Seqs               []CompressSeq
	Pool               Buffer
	PageSize, NumPages int
}

// CompressorBackend is implemented by backends that run the compressor
// themselves (the CPU backend, in place in its pool memory). A GPU
// implementation pools, normalizes, rotates and quantizes on the device
// from the layer's K/G rows and a device copy of the states; until one
// exists, Compress runs the work on the host and writes the entries with
// Backend.Write.
type CompressorBackend interface {
	Compress(ctx context.Context, a *CompressArgs) (entries int, err error)
}

// Compress runs a layer's compressor work on b: through b's own
// implementation when it has one (CompressorBackend), else on the host
// (package compressor, the reference every implementation matches byte for
// byte) with two Backend.Write calls per entry. It returns the number of
// entries stored. On an error some sequences' states may have advanced:
// the caller rolls them back.
func Compress(ctx context.Context, b Backend, a *CompressArgs) (int, error) {
	if cb, ok := b.(CompressorBackend); ok {
		return cb.Compress(ctx, a)
	}
	f := kvcache.FormatFP8UE8M0
	pageBytes := f.PageBytes(a.PageSize)
	var scratch []byte
	return a.Run(ctx, func(e *compressor.Entry, page int32, off int) error {
		if scratch == nil {
			scratch = make([]byte, pageBytes)
		}
		e.Store(scratch, a.PageSize, off)
		vo, so := f.ValueOffset(a.PageSize, off), f.ScaleOffset(a.PageSize, off)
		base := int(page) * pageBytes
		if err := b.Write(a.Pool, base+vo, scratch[vo:vo+kvcache.UE8M0ValueBytes]); err != nil {
			return err
		}
		return b.Write(a.Pool, base+so, scratch[so:so+compressor.EntryBytes-kvcache.UE8M0ValueBytes-1])
	})
}

// Run checks a, appends each sequence's rows to its state in order and
// hands every emitted entry to store with its page and in-page offset. It
// returns the number of entries stored.
func (a *CompressArgs) Run(ctx context.Context, store func(e *compressor.Entry, page int32, off int) error) (int, error) {
	if a.Layer == nil {
		return 0, fmt.Errorf("mla: compress: no layer")
	}
	if len(a.K) != len(a.G) {
		return 0, fmt.Errorf("mla: compress: %d K rows but %d G rows", len(a.K), len(a.G))
	}
	if a.PageSize < 1 || a.NumPages < 1 {
		return 0, fmt.Errorf("mla: compress: page size %d and pages %d must be positive", a.PageSize, a.NumPages)
	}
	if want := a.NumPages * kvcache.FormatFP8UE8M0.PageBytes(a.PageSize); a.Pool == nil || a.Pool.Len() < want {
		return 0, fmt.Errorf("mla: compress: the pool must hold %d pages of %d entries (%d bytes)", a.NumPages, a.PageSize, want)
	}
	stored := 0
	for i, s := range a.Seqs {
		if err := ctx.Err(); err != nil {
			return stored, err
		}
		if s.Row < 0 || s.Rows < 0 || s.Row+s.Rows > len(a.K) {
			return stored, fmt.Errorf("mla: compress: sequence %d rows [%d, %d) outside the %d rows", i, s.Row, s.Row+s.Rows, len(a.K))
		}
		if s.State == nil {
			return stored, fmt.Errorf("mla: compress: sequence %d has no state", i)
		}
		entries, err := s.State.Append(s.StartPos, a.K[s.Row:s.Row+s.Rows], a.G[s.Row:s.Row+s.Rows])
		if err != nil {
			return stored, fmt.Errorf("mla: compress: sequence %d: %w", i, err)
		}
		for k := range entries {
			e := &entries[k]
			j := e.Index / a.PageSize
			if j >= len(s.Table) || s.Table[j] < 0 || int(s.Table[j]) >= a.NumPages {
				return stored, fmt.Errorf("mla: compress: sequence %d entry %d: block table %v has no page for it in a pool of %d pages", i, e.Index, s.Table, a.NumPages)
			}
			if err := store(e, s.Table[j], e.Index%a.PageSize); err != nil {
				return stored, fmt.Errorf("mla: compress: sequence %d entry %d: %w", i, e.Index, err)
			}
			stored++
		}
	}
	return stored, nil
}
