package compressor

import (
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// Sizes of the compressor's rows and entries.
const (
	// Dim is the width of one pooled row (and of each half of a ratio-4
	// projection).
	Dim = numerics.HeadDim
	// EntryBytes is one compressed entry in the fp8_ue8m0 format: 448 e4m3
	// nope values, 64 little-endian bf16 rope values, 7 UE8M0 exponent
	// bytes and one padding byte (always 0 here).
	EntryBytes = kvcache.UE8M0ValueBytes + kvcache.UE8M0ScaleBytes
	// MaxDraftsLimit bounds Params.MaxDrafts (state memory grows with it).
	MaxDraftsLimit = 64
)

// Overlap returns coff, the number of r-token windows an entry reads: 2 for
// ratio 4 (the previous window's "A" half and the current window's "B"
// half), 1 for ratio 128. Other ratios have no compressor and give 0.
func Overlap(ratio int) int {
	switch ratio {
	case 4:
		return 2
	case 128:
		return 1
	}
	return 0
}

// Params describe one compressed layer's compressor, as far as the pooling
// and the entry need it (the projection weights are in [Projection]).
type Params struct {
	Ratio      int             // compress_ratio: 4 or 128
	NormWeight []float32       // compressor.norm.weight, 512 values (bf16 in the checkpoint, widened)
	Eps        float32         // rms_norm_eps
	Rope       *dsv4.RopeTable // the layer's table: YaRN (every compressed layer uses it)
	MaxDrafts  int             // most positions State.Accept may roll back (MTP drafts per step), in [0, MaxDraftsLimit]
}

// Layer is one compressed layer's compressor: its parameters and the entry
// math. It holds no per-sequence data (see [State]) and is safe for
// concurrent use.
type Layer struct {
	ratio, coff int
	norm        [Dim]float32
	eps         float32
	rope        *dsv4.RopeTable
	maxDrafts   int
}

// NewLayer checks p and returns its Layer.
func NewLayer(p Params) (*Layer, error) {
	coff := Overlap(p.Ratio)
	if coff == 0 {
		return nil, fmt.Errorf("compressor: ratio %d has no compressor (want 4 or 128)", p.Ratio)
	}
	if len(p.NormWeight) != Dim {
		return nil, fmt.Errorf("compressor: norm weight has %d values, want %d", len(p.NormWeight), Dim)
	}
	if !(p.Eps > 0) || math.IsInf(float64(p.Eps), 0) {
		return nil, fmt.Errorf("compressor: eps %g must be finite and positive", p.Eps)
	}
	if p.Rope == nil {
		return nil, fmt.Errorf("compressor: no RoPE table")
	}
	if p.Rope.Kind != dsv4.RopeYaRN {
		return nil, fmt.Errorf("compressor: RoPE table is %v, compressed layers use %v", p.Rope.Kind, dsv4.RopeYaRN)
	}
	if p.MaxDrafts < 0 || p.MaxDrafts > MaxDraftsLimit {
		return nil, fmt.Errorf("compressor: MaxDrafts %d out of range [0, %d]", p.MaxDrafts, MaxDraftsLimit)
	}
	l := &Layer{ratio: p.Ratio, coff: coff, eps: p.Eps, rope: p.Rope, maxDrafts: p.MaxDrafts}
	copy(l.norm[:], p.NormWeight)
	return l, nil
}

// NormWeight returns a copy of Params.NormWeight.
func (l *Layer) NormWeight() []float32 { return append([]float32(nil), l.norm[:]...) }

// Eps returns Params.Eps.
func (l *Layer) Eps() float32 { return l.eps }

// Rope returns the layer's RoPE table (Params.Rope), shared: not to be
// modified.
func (l *Layer) Rope() *dsv4.RopeTable { return l.rope }

// Ratio returns r, the tokens per entry.
func (l *Layer) Ratio() int { return l.ratio }

// Width returns the values per projection row, K[t] and G[t]: coff*512.
func (l *Layer) Width() int { return l.coff * Dim }

// Candidates returns the candidates an entry pools per channel: 8 for
// ratio 4 (4 for entry 0), 128 for ratio 128.
func (l *Layer) Candidates() int { return l.coff * l.ratio }

// MaxDrafts returns Params.MaxDrafts.
func (l *Layer) MaxDrafts() int { return l.maxDrafts }

// StateRows returns the most positions a [State] keeps: coff*r + MaxDrafts
// (the last coff*r - 1 positions an entry may still read, plus a step's
// drafts, plus one).
func (l *Layer) StateRows() int { return l.coff*l.ratio + l.maxDrafts }

// StateBytes returns the memory of one [State]: StateRows rows of K and G,
// Width float32 values each.
func (l *Layer) StateBytes() int { return l.StateRows() * l.Width() * 2 * 4 }

// firstNeeded returns the first position whose (K, G) an entry not yet
// emitted at length n reads: the next entry is i = floor(n/r) and reads
// from window i - coff + 1.
func (l *Layer) firstNeeded(n int) int {
	return max(0, (n/l.ratio-l.coff+1)*l.ratio)
}

// Entry is one compressed entry: window Index, [Index*r, (Index+1)*r),
// encoded in the fp8_ue8m0 layout (see EntryBytes).
type Entry struct {
	Index int
	Bytes [EntryBytes]byte
}

// Store writes the entry at in-page offset off of a compressed-cache page
// in the fp8_ue8m0 format with pageSize entries a page: the 576 value bytes
// at the token's value offset and the 7 exponent bytes at its scale offset
// (the padding byte is not written), exactly as kvcache.EncodeToken lays
// out a token. It panics on a short page or an offset outside the page.
func (e *Entry) Store(page []byte, pageSize, off int) {
	f := kvcache.FormatFP8UE8M0
	if want := f.PageBytes(pageSize); len(page) < want {
		panic(fmt.Sprintf("compressor: page is %d bytes, page size %d needs %d", len(page), pageSize, want))
	}
	vo, so := f.ValueOffset(pageSize, off), f.ScaleOffset(pageSize, off)
	copy(page[vo:vo+kvcache.UE8M0ValueBytes], e.Bytes[:kvcache.UE8M0ValueBytes])
	copy(page[so:so+numerics.NumGroups], e.Bytes[kvcache.UE8M0ValueBytes:])
}

// PoolChannel is the softmax-weighted sum of one channel over its
// candidates, in the fixed order of DESIGN.md section 8 (logits[j] and
// values[j] are candidate j's G and K; absent candidates are left out,
// which gives the same bits as logit -Inf and value 0):
//
//	m = -Inf; m = (G_j > m) ? G_j : m, j ascending (a NaN logit is skipped)
//	e_j = Exp32(fl(G_j - m))
//	s = 0; s = fl(s + e_j), j ascending
//	E = 0; E = fl(E + fl(fl(e_j / s) * K_j)), j ascending
//
// A GPU thread per channel runs the same loops; recomputing e_j in the
// last loop instead of keeping it gives the same bits.
//
// Its loops are left out of the race detector's per-element
// instrumentation; it reports its reads of logits and values as two
// ranges instead.
//
//go:norace
//go:nocheckptr
func PoolChannel(logits, values []float32) float32 {
	values = values[:len(logits)]
	race.Read(logits)
	race.Read(values)
	m := float32(math.Inf(-1))
	for _, g := range logits {
		if g > m {
			m = g
		}
	}
	var buf [128]float32 // up to 128 candidates without a heap allocation
	e := buf[:0]
	var s float32
	for _, g := range logits {
		ej := numerics.Exp32(float32(g - m))
		e = append(e, ej)
		s = float32(s + ej)
	}
	var acc float32
	for j, ej := range e {
		w := float32(ej / s)
		acc = float32(acc + float32(w*values[j]))
	}
	return acc
}

// rowSource returns the (K, G) rows of a position, each Width values.
type rowSource func(pos int) (k, g []float32)

// pool writes E_i, the pooled 512 values of entry i, to out, reading each
// candidate position's rows from src (positions (i-coff+1)*r .. (i+1)*r-1;
// those below 0 are absent).
func (l *Layer) pool(i int, src rowSource, out *[Dim]float32) {
	poolDim(l.ratio, l.coff, Dim, i, src, out[:])
}

// poolDim pools entry i of rows whose halves are dim channels wide (512 for
// the main compressor, 128 for the indexer's) into out[:dim]: ratio 4
// (coff 2), the previous window's "A" half [0, dim), absent for i = 0, then
// the current window's "B" half [dim, 2*dim); ratio 128, columns [0, dim)
// of the window's tokens. Uninstrumented under -race like PoolChannel: it
// reports each row it reads and the out it writes as ranges.
//
//go:norace
func poolDim(ratio, coff, dim, i int, src rowSource, out []float32) {
	n := coff * ratio
	ks := make([][]float32, 0, n)
	gs := make([][]float32, 0, n)
	if coff == 2 {
		if i > 0 { // previous window, "A" half
			for j := range ratio {
				k, g := src((i-1)*ratio + j)
				ks, gs = append(ks, k[:dim]), append(gs, g[:dim])
			}
		}
		for j := range ratio { // current window, "B" half
			k, g := src(i*ratio + j)
			ks, gs = append(ks, k[dim:2*dim]), append(gs, g[dim:2*dim])
		}
	} else {
		for j := range ratio {
			k, g := src(i*ratio + j)
			ks, gs = append(ks, k[:dim]), append(gs, g[:dim])
		}
	}
	for j := range ks {
		race.Read(ks[j])
		race.Read(gs[j])
	}
	race.Write(out[:dim])
	logits := make([]float32, len(ks))
	values := make([]float32, len(ks))
	for c := range dim {
		for j := range ks {
			logits[j], values[j] = gs[j][c], ks[j][c]
		}
		out[c] = PoolChannel(logits, values)
	}
}

// FinishEntry turns the pooled values E_i of entry index into its bytes:
// the KV prologue (DESIGN.md sections 3-4) applied to bf16(E) at position
// index*r: x = bf16(E); r = fl(1/fl(sqrt(fl(fl(S/512) + eps)))) with S the
// canonical sum of squares; y = bf16(fl(fl(x*r) * w)); RoPE on the 64-value
// tail with the table's row index*r; UE8M0 quantization of the 448 nope
// values. It fails when the position is outside the RoPE table.
func (l *Layer) FinishEntry(index int, pooled *[Dim]float32) (Entry, error) {
	pos := index * l.ratio
	if index < 0 {
		return Entry{}, fmt.Errorf("compressor: entry index %d is negative", index)
	}
	if err := l.rope.CheckPosition(pos); err != nil {
		return Entry{}, fmt.Errorf("compressor: entry %d: %w", index, err)
	}
	return FinishPooled(index, pooled, &l.norm, l.eps, l.rope.Row(pos))
}

// FinishPooled is FinishEntry with the layer's parameters given: norm, eps
// and the RoPE row of position index*r (32 {cos, sin} pairs), for a backend
// that reads them from its own memory.
func FinishPooled(index int, pooled, norm *[Dim]float32, eps float32, cs []float32) (Entry, error) {
	var x, y [Dim]float32
	for c, v := range pooled {
		x[c] = numerics.RoundBF16(v)
	}
	r := numerics.RMSInv(numerics.SumSquares(x[:]), eps)
	for c := range y {
		y[c] = numerics.RoundBF16(float32(float32(x[c]*r) * norm[c]))
	}
	for k := range numerics.RopePairs {
		i := numerics.NopeDim + 2*k
		y[i], y[i+1] = numerics.Rope(y[i], y[i+1], cs[2*k], cs[2*k+1])
	}
	// A one-entry page holds exactly the entry's layout: values, then scales.
	var page [2 * kvcache.UE8M0ValueBytes]byte
	if err := kvcache.EncodeToken(kvcache.FormatFP8UE8M0, page[:], 1, 0, &y, 0); err != nil {
		return Entry{}, fmt.Errorf("compressor: entry %d: %w", index, err)
	}
	e := Entry{Index: index}
	copy(e.Bytes[:], page[:EntryBytes])
	return e, nil
}

// PoolEntry writes E_i, the pooled 512 values of entry i of a ratio, to
// out, reading each candidate position's (K, G) rows from src: what
// [State.Append] pools, without a Layer.
func PoolEntry(ratio, i int, src func(pos int) (k, g []float32), out *[Dim]float32) error {
	return PoolEntryDim(ratio, Dim, i, src, out[:])
}

// PoolEntryDim is PoolEntry for rows whose halves are dim channels wide
// (Dim, or IndexerDim for the indexer's compressor): src returns rows of
// Overlap(ratio)*dim values, out receives dim values.
func PoolEntryDim(ratio, dim, i int, src func(pos int) (k, g []float32), out []float32) error {
	coff := Overlap(ratio)
	if coff == 0 {
		return fmt.Errorf("compressor: ratio %d has no compressor (want 4 or 128)", ratio)
	}
	if dim <= 0 || len(out) < dim {
		return fmt.Errorf("compressor: pooling %d channels into %d values", dim, len(out))
	}
	poolDim(ratio, coff, dim, i, src, out)
	return nil
}
