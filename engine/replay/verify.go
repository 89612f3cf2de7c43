package replay

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// VerifyError is the first difference between the engine and the cpu
// reference.
type VerifyError struct {
	Iteration int
	Layer     int
	Backend   string // the engine's backend
	Buffer    string // "Q output" or "cache page N"
	Offset    int    // first differing byte in the buffer
	Where     string // what that byte is: token, head, element, region
	Got, Want []byte // up to 16 bytes from Offset: engine, reference
	Differ    int    // bytes that differ in the buffer
	Size      int    // bytes compared in the buffer
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("verify: iteration %d layer %d: %s differs from the cpu reference at byte %d (%s): %s % x, cpu % x; %d of %d bytes differ",
		e.Iteration, e.Layer, e.Buffer, e.Offset, e.Where, e.Backend, e.Got, e.Want, e.Differ, e.Size)
}

// compareBytes returns the first differing offset and the count of
// differing bytes; -1 when equal.
func compareBytes(got, want []byte) (first, differ int) {
	first = -1
	if len(got) != len(want) {
		return min(len(got), len(want)), max(len(got), len(want)) - min(len(got), len(want))
	}
	if bytes.Equal(got, want) { // the usual case, without a loop per byte
		return -1, 0
	}
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			differ++
		}
	}
	return first, differ
}

func window(b []byte, off int) []byte {
	if off >= len(b) {
		return nil
	}
	return append([]byte(nil), b[off:min(len(b), off+16)]...)
}

// compare checks the Q output after a layer and every page the iteration
// wrote in that layer's pool.
func (r *Replayer) compare(it, rit *engine.Iteration, layer int) error {
	got, err := it.Debug().ReadQ()
	if err != nil {
		return err
	}
	want, err := rit.Debug().ReadQ()
	if err != nil {
		return fmt.Errorf("reference engine: %w", err)
	}
	cfg := r.eng.Config()
	mk := func(buffer string, off, differ, size int, where string, g, w []byte) *VerifyError {
		return &VerifyError{Iteration: it.Index(), Layer: layer, Backend: r.eng.Backend().Name(), Buffer: buffer,
			Offset: off, Where: where, Got: window(g, off), Want: window(w, off), Differ: differ, Size: size}
	}
	// The engine may pad the batch (a CUDA-graph bucket) where the
	// reference does not: the real rows must match, the padding rows must
	// be zeros.
	heads := r.eng.Heads()
	real := it.Tokens() * heads * numerics.HeadDim * cfg.QFormat.ElemBytes()
	if len(got) < real || len(want) < real {
		return fmt.Errorf("verify: Q output of %d bytes (reference %d) is shorter than %d tokens", len(got), len(want), it.Tokens())
	}
	if off, n := compareBytes(got[:real], want[:real]); off >= 0 {
		return mk("Q output", off, n, real, describeQ(off, heads, cfg.QFormat.ElemBytes()), got, want)
	}
	if off, n := compareBytes(got[real:], make([]byte, len(got)-real)); off >= 0 {
		return mk("Q output padding", real+off, n, len(got)-real, describeQ(real+off, heads, cfg.QFormat.ElemBytes()), got, make([]byte, len(got)))
	}
	for _, p := range it.Debug().WrittenPages() {
		g, err := r.eng.Debug().ReadPage(layer, int(p))
		if err != nil {
			return err
		}
		w, err := r.ref.Debug().ReadPage(layer, int(p))
		if err != nil {
			return fmt.Errorf("reference engine: %w", err)
		}
		if off, n := compareBytes(g, w); off >= 0 {
			return mk(fmt.Sprintf("cache page %d", p), off, n, len(w), describePage(off, cfg.Cache), g, w)
		}
	}
	if r.eng.CompressorWidth(layer) > 0 {
		// The whole compressed pool: both engines hand out the same pages,
		// so every byte, entries of earlier iterations included, matches.
		g, err := r.eng.Debug().ReadCompressedPool(layer)
		if err != nil {
			return err
		}
		w, err := r.ref.Debug().ReadCompressedPool(layer)
		if err != nil {
			return fmt.Errorf("reference engine: %w", err)
		}
		if off, n := compareBytes(g, w); off >= 0 {
			cc := kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: engine.CompressedPageSize}
			pb := cc.PageBytes()
			return mk(fmt.Sprintf("ratio-%d compressed pool page %d", r.eng.CompressRatio(layer), off/pb), off, n, len(w),
				"entry "+describePage(off%pb, cc), g, w)
		}
		if r.eng.RunsIndexer(layer) {
			if err := r.compareIndexer(it, rit, layer, mk); err != nil {
				return err
			}
		}
		// The state slots the iteration wrote, sequence by sequence.
		for _, seq := range it.Metadata().Seqs {
			g, err := it.Debug().ReadCompressorSlot(layer, seq)
			if err != nil {
				return err
			}
			w, err := rit.Debug().ReadCompressorSlot(layer, seq)
			if err != nil {
				return fmt.Errorf("reference engine: %w", err)
			}
			if off, n := compareBytes(g, w); off >= 0 {
				rowBytes := 2 * r.eng.CompressorWidth(layer) * 4
				row := off / rowBytes
				return mk(fmt.Sprintf("compressor state of sequence %d", seq), off, n, len(w), fmt.Sprintf("ring row %d value %d (%s)", row,
					off%rowBytes/4, map[bool]string{true: "G", false: "K"}[off%rowBytes >= rowBytes/2]), g, w)
			}
		}
	}
	return nil
}

// describeQ names the element a byte of the Q buffer belongs to.
func describeQ(off, heads, elemBytes int) string {
	e := off / elemBytes
	tok, rest := e/(heads*numerics.HeadDim), e%(heads*numerics.HeadDim)
	h, i := rest/numerics.HeadDim, rest%numerics.HeadDim
	part := "nope"
	if i >= numerics.NopeDim {
		part = "rope"
	}
	return fmt.Sprintf("token row %d, head %d, %s element %d", tok, h, part, i)
}

// describePage names what a byte of a cache page holds in the format.
func describePage(off int, c kvcache.Config) string {
	f, p := c.Format, c.PageSize
	if f == kvcache.FormatFP8UE8M0 {
		values := kvcache.UE8M0ValueBytes * p
		if off >= values {
			s := off - values
			if tok := s / kvcache.UE8M0ScaleBytes; tok < p {
				g := s % kvcache.UE8M0ScaleBytes
				if g == numerics.NumGroups {
					return fmt.Sprintf("token offset %d, scale padding byte (never written)", tok)
				}
				return fmt.Sprintf("token offset %d, UE8M0 exponent of nope group %d", tok, g)
			}
			return "page padding after the scales region"
		}
		tok, b := off/kvcache.UE8M0ValueBytes, off%kvcache.UE8M0ValueBytes
		if b < kvcache.UE8M0RopeOffset {
			return fmt.Sprintf("token offset %d, e4m3 nope value %d (group %d)", tok, b, b/numerics.GroupSize)
		}
		return fmt.Sprintf("token offset %d, bf16 rope value %d", tok, (b-kvcache.UE8M0RopeOffset)/2)
	}
	per := f.BytesPerToken()
	tok, b := off/per, off%per
	elem := b / (per / numerics.HeadDim)
	part := "nope"
	if elem >= numerics.NopeDim {
		part = "rope"
	}
	return fmt.Sprintf("token offset %d, %s %s value %d", tok, strings.ReplaceAll(f.String(), "_pertensor", ""), part, elem)
}

// compareIndexer checks a ratio-4 layer's indexer outputs: the query and
// head weights of the iteration's tokens, the whole indexer cache (both
// engines hand out the same pages), the indexer states the iteration
// wrote, and every index of the top-k selection (the reference's own
// selection on the same query and cache), where the engine runs one.
func (r *Replayer) compareIndexer(it, rit *engine.Iteration, layer int, mk func(buffer string, off, differ, size int, where string, g, w []byte) *VerifyError) error {
	gq, gw, err := it.Debug().ReadIndexerQuery()
	if err != nil {
		return err
	}
	wq, ww, err := rit.Debug().ReadIndexerQuery()
	if err != nil {
		return fmt.Errorf("reference engine: %w", err)
	}
	f := r.eng.Config().Compressor.IndexerQueryFormat
	rb, wsz := f.RowBytes(), f.WeightBytes()
	if off, n := compareBytes(gq, wq); off >= 0 {
		row := off / rb
		return mk("indexer query", off, n, len(wq), fmt.Sprintf("token %d head %d byte %d", row/64, row%64, off%rb), gq, wq)
	}
	if off, n := compareBytes(gw, ww); off >= 0 {
		return mk("indexer head weights", off, n, len(ww), fmt.Sprintf("token %d head %d", off/(64*wsz), off/wsz%64), gw, ww)
	}
	g, err := r.eng.Debug().ReadIndexerCache(layer)
	if err != nil {
		return err
	}
	w, err := r.ref.Debug().ReadIndexerCache(layer)
	if err != nil {
		return fmt.Errorf("reference engine: %w", err)
	}
	if off, n := compareBytes(g, w); off >= 0 {
		pb := engine.CompressedPageSize * 68
		return mk(fmt.Sprintf("indexer cache page %d", off/pb), off, n, len(w), fmt.Sprintf("entry %d byte %d", off%pb/68, off%68), g, w)
	}
	for _, seq := range it.Metadata().Seqs {
		g, err := it.Debug().ReadIndexerSlot(layer, seq)
		if err != nil {
			return err
		}
		w, err := rit.Debug().ReadIndexerSlot(layer, seq)
		if err != nil {
			return fmt.Errorf("reference engine: %w", err)
		}
		if off, n := compareBytes(g, w); off >= 0 {
			return mk(fmt.Sprintf("indexer state of sequence %d", seq), off, n, len(w), fmt.Sprintf("ring row %d", off/(2*256*4)), g, w)
		}
	}
	if r.eng.IndexerTopK(layer) == nil { // the fp8 query format: no selection
		return nil
	}
	gi, err := it.Debug().ReadIndexerTopK(layer)
	if err != nil {
		return err
	}
	wi, err := rit.Debug().ReadIndexerTopK(layer)
	if err != nil {
		return fmt.Errorf("reference engine: %w", err)
	}
	gb, wb := i32s(gi), i32s(wi)
	if off, n := compareBytes(gb, wb); off >= 0 {
		k := 4 * r.eng.IndexTopK()
		return mk("indexer top-k indices", off, n, len(wb), fmt.Sprintf("token %d slot %d", off/k, off%k/4), gb, wb)
	}
	return nil
}
