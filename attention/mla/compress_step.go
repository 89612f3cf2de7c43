package mla

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// The compressor's work on the backend (DESIGN.md section 8), in two
// launches per compressed layer that a CUDA graph can hold: the projection
// GEMM (BF16GEMMBackend) writes the layer's K and G rows, then CompressStep
// emits the entries the iteration's rows complete and keeps the rows later
// entries read in the layer's ring of states, all on the device. What varies
// between iterations (the sequences' rows, positions and slots, the entries
// to emit and where) is a CompressPlan the host writes once per iteration
// into a fixed-address buffer, shared by the layers of a ratio.

// BF16GEMMArgs compute Y = X . W^T with bf16 operands, float32 products and
// a float32 accumulation, Y left in float32 (no rounding): X has Rows rows
// of K bf16 values (row r at XOffset + r*XStride*2 bytes), W is [N][K] bf16
// row-major, Y row r is N float32 at YOffset + r*YStride*4 bytes. Another
// backend may accumulate in another order: DESIGN.md section 7's bound
// applies (gemm.BoundBF16).
type BF16GEMMArgs struct {
	Rows, N, K int
	X          Buffer
	XOffset    int // bytes, a multiple of 16
	XStride    int // elements, >= K and a multiple of 8
	W          Buffer
	Y          Buffer
	YOffset    int // bytes, a multiple of 16
	YStride    int // elements, >= N and a multiple of 4
}

// Validate checks the shapes, strides and buffer sizes, naming the field
// at fault; backends call it before writing Y.
func (a *BF16GEMMArgs) Validate() error {
	switch {
	case a.Rows < 0 || a.Rows > math.MaxInt32:
		return fmt.Errorf("mla: BF16GEMMArgs.Rows = %d out of range [0, %d]", a.Rows, math.MaxInt32)
	case a.N <= 0 || a.N > math.MaxInt32 || a.N%8 != 0:
		return fmt.Errorf("mla: BF16GEMMArgs.N = %d, must be a positive multiple of 8", a.N)
	case a.K <= 0 || a.K > math.MaxInt32 || a.K%8 != 0:
		return fmt.Errorf("mla: BF16GEMMArgs.K = %d, must be a positive multiple of 8", a.K)
	case a.XOffset < 0 || a.XOffset%16 != 0:
		return fmt.Errorf("mla: BF16GEMMArgs.XOffset = %d bytes, must be >= 0 and a multiple of 16", a.XOffset)
	case a.XStride < a.K || a.XStride%8 != 0:
		return fmt.Errorf("mla: BF16GEMMArgs.XStride = %d elements, must be >= K = %d and a multiple of 8", a.XStride, a.K)
	case a.YOffset < 0 || a.YOffset%16 != 0:
		return fmt.Errorf("mla: BF16GEMMArgs.YOffset = %d bytes, must be >= 0 and a multiple of 16", a.YOffset)
	case a.YStride < a.N || a.YStride%4 != 0:
		return fmt.Errorf("mla: BF16GEMMArgs.YStride = %d elements, must be >= N = %d and a multiple of 4", a.YStride, a.N)
	}
	x, w, y := a.Extents()
	need := []struct {
		name string
		buf  Buffer
		n    int64
	}{{"W", a.W, w}, {"X", a.X, int64(a.XOffset) + x}, {"Y", a.Y, int64(a.YOffset) + y}}
	if a.Rows == 0 {
		need = need[:1] // no X or Y is read or written
	}
	for _, n := range need {
		if n.buf == nil {
			return fmt.Errorf("mla: BF16GEMMArgs.%s is nil", n.name)
		}
		if int64(n.buf.Len()) < n.n {
			return fmt.Errorf("mla: BF16GEMMArgs.%s has %d bytes, needs %d", n.name, n.buf.Len(), n.n)
		}
	}
	return nil
}

// Extents are the bytes the GEMM reads of X (from XOffset) and W and
// writes of Y (from YOffset); X's and Y's are 0 when Rows is 0. The shapes
// must have passed Validate's range checks.
func (a *BF16GEMMArgs) Extents() (x, w, y int64) {
	w = 2 * int64(a.N) * int64(a.K)
	if a.Rows > 0 {
		x = 2 * (int64(a.Rows-1)*int64(a.XStride) + int64(a.K))
		y = 4 * (int64(a.Rows-1)*int64(a.YStride) + int64(a.N))
	}
	return x, w, y
}

// BF16GEMMBackend runs the compressor's projection GEMM (bf16 weights,
// float32 output).
type BF16GEMMBackend interface {
	BF16GEMM(ctx context.Context, a *BF16GEMMArgs) error
}

// CompressPlanSeq is one sequence of a compressor step: its new tokens at
// positions [Start, Start+Rows) are rows [Row, Row+Rows) of the step's
// projections; positions below Start are read from ring slot From, and the
// rows the sequence keeps after the step are written to ring slot To (see
// CompressStepArgs).
type CompressPlanSeq struct {
	Row, Rows, Start int
	From, To         int
}

// CompressPlanJob is one entry a step emits: entry Index of sequence Seq
// (an index into CompressPlan.Seqs), stored at in-page offset Offset of
// pool page Page.
type CompressPlanJob struct {
	Index, Seq, Page, Offset int
}

// CompressPlan is what one iteration's compressor steps of one ratio do:
// the sequences, and the entries their rows complete in ascending order per
// sequence.
type CompressPlan struct {
	Seqs []CompressPlanSeq
	Jobs []CompressPlanJob
}

// Words of the encoded plan (int32 little-endian): a header, then MaxSeqs
// sequences of CompressPlanSeqWords words, then MaxJobs jobs of
// CompressPlanJobWords words. The kernels read them by these indices
// (kernels/cuda/abi).
const (
	CompressPlanHdrSeqs  = 0 // header word: the sequences
	CompressPlanHdrJobs  = 1 // header word: the jobs
	CompressPlanHdrWords = 4

	CompressPlanSeqRow   = 0
	CompressPlanSeqRows  = 1
	CompressPlanSeqStart = 2
	CompressPlanSeqFrom  = 3
	CompressPlanSeqTo    = 4
	CompressPlanSeqWords = 8

	CompressPlanJobIndex  = 0
	CompressPlanJobSeq    = 1
	CompressPlanJobPage   = 2
	CompressPlanJobOffset = 3
	CompressPlanJobWords  = 4
)

// CompressPlanBytes is the size of an encoded plan of a capacity.
func CompressPlanBytes(maxSeqs, maxJobs int) int {
	return 4 * (CompressPlanHdrWords + maxSeqs*CompressPlanSeqWords + maxJobs*CompressPlanJobWords)
}

// MaxCompressJobs bounds the entries of one step of a ratio over at most
// maxTokens rows of at most maxSeqs sequences: each sequence's rows
// complete at most floor(rows/r) + 1 entries.
func MaxCompressJobs(ratio, maxSeqs, maxTokens int) int { return maxTokens/ratio + maxSeqs }

// Encode lays the plan out for capacities maxSeqs and maxJobs (words past
// its sequences and jobs are 0). It refuses a plan over the capacity.
func (p *CompressPlan) Encode(maxSeqs, maxJobs int) ([]byte, error) {
	out := make([]byte, CompressPlanBytes(maxSeqs, maxJobs))
	if err := p.EncodeTo(out, maxSeqs, maxJobs); err != nil {
		return nil, err
	}
	return out, nil
}

// EncodeTo is Encode into dst, CompressPlanBytes(maxSeqs, maxJobs) bytes
// (a caller's reused buffer; every byte is written). A refused plan writes
// nothing.
func (p *CompressPlan) EncodeTo(dst []byte, maxSeqs, maxJobs int) error {
	if len(p.Seqs) > maxSeqs || len(p.Jobs) > maxJobs {
		return fmt.Errorf("mla: compress plan of %d sequences and %d entries exceeds its capacity of %d and %d", len(p.Seqs), len(p.Jobs), maxSeqs, maxJobs)
	}
	if n := CompressPlanBytes(maxSeqs, maxJobs); len(dst) != n {
		return fmt.Errorf("mla: compress plan buffer of %d bytes, capacity %d sequences and %d entries needs %d", len(dst), maxSeqs, maxJobs, n)
	}
	out := dst
	clear(out)
	put := func(word int, v int) { binary.LittleEndian.PutUint32(out[4*word:], uint32(int32(v))) }
	put(CompressPlanHdrSeqs, len(p.Seqs))
	put(CompressPlanHdrJobs, len(p.Jobs))
	for i, s := range p.Seqs {
		w := CompressPlanHdrWords + i*CompressPlanSeqWords
		put(w+CompressPlanSeqRow, s.Row)
		put(w+CompressPlanSeqRows, s.Rows)
		put(w+CompressPlanSeqStart, s.Start)
		put(w+CompressPlanSeqFrom, s.From)
		put(w+CompressPlanSeqTo, s.To)
	}
	for i, j := range p.Jobs {
		w := CompressPlanHdrWords + maxSeqs*CompressPlanSeqWords + i*CompressPlanJobWords
		put(w+CompressPlanJobIndex, j.Index)
		put(w+CompressPlanJobSeq, j.Seq)
		put(w+CompressPlanJobPage, j.Page)
		put(w+CompressPlanJobOffset, j.Offset)
	}
	return nil
}

// DecodeCompressPlan is Encode's inverse (for backends that run the step
// on the host, and for tests).
func DecodeCompressPlan(b []byte, maxSeqs, maxJobs int) (*CompressPlan, error) {
	if len(b) < CompressPlanBytes(maxSeqs, maxJobs) {
		return nil, fmt.Errorf("mla: compress plan of %d bytes, capacity %d sequences and %d entries needs %d", len(b), maxSeqs, maxJobs, CompressPlanBytes(maxSeqs, maxJobs))
	}
	get := func(word int) int { return int(int32(binary.LittleEndian.Uint32(b[4*word:]))) }
	ns, nj := get(CompressPlanHdrSeqs), get(CompressPlanHdrJobs)
	if ns < 0 || ns > maxSeqs || nj < 0 || nj > maxJobs {
		return nil, fmt.Errorf("mla: compress plan of %d sequences and %d entries, capacity %d and %d", ns, nj, maxSeqs, maxJobs)
	}
	p := &CompressPlan{Seqs: make([]CompressPlanSeq, ns), Jobs: make([]CompressPlanJob, nj)}
	for i := range p.Seqs {
		w := CompressPlanHdrWords + i*CompressPlanSeqWords
		p.Seqs[i] = CompressPlanSeq{Row: get(w + CompressPlanSeqRow), Rows: get(w + CompressPlanSeqRows), Start: get(w + CompressPlanSeqStart),
			From: get(w + CompressPlanSeqFrom), To: get(w + CompressPlanSeqTo)}
	}
	for i := range p.Jobs {
		w := CompressPlanHdrWords + maxSeqs*CompressPlanSeqWords + i*CompressPlanJobWords
		p.Jobs[i] = CompressPlanJob{Index: get(w + CompressPlanJobIndex), Seq: get(w + CompressPlanJobSeq), Page: get(w + CompressPlanJobPage),
			Offset: get(w + CompressPlanJobOffset)}
	}
	return p, nil
}

// RingRows is the rows of one sequence's ring slot in a layer of the ratio
// whose generation steps have at most maxDrafts drafts: the coff*r
// positions the next entry may read, plus a step's 1 + maxDrafts tokens
// (so a rejected step's rows never overwrite a row still needed).
func RingRows(ratio, maxDrafts int) int {
	return compressor.Overlap(ratio)*ratio + maxDrafts + 1
}

// InPlaceRows is the most rows a sequence may add to its own ring slot in
// one step (From = To): more would overwrite rows its entries still read.
// A longer chunk moves the sequence to a fresh slot (To != From).
func InPlaceRows(ratio, ringRows int) int { return ringRows - compressor.Overlap(ratio)*ratio }

// CompressStepArgs is one compressed layer's compressor step over an
// iteration (the main compressor's, or with Entry = EntryIndexer the
// indexer's). Width is compressor.Overlap(Ratio)*Entry.Dim(): 1024 or 512
// for the main compressor's ratios 4 and 128, 256 for the indexer's. Position p of plan
// sequence s has the projections
//
//	p >= s.Start: K = KG row s.Row+p-s.Start, values [0, Width);
//	              G = that row's values [Width, 2*Width), plus
//	              APE[p mod Ratio] (float32 add; APE nil: G as it is)
//	p <  s.Start: ring slot s.From, row p mod RingRows: K then G
//
// as the ring held them before the step. The step then:
//   - for each plan job, pools entry Index of its sequence from its
//     candidates' (K, G) (DESIGN.md section 8: softmax per channel, bf16,
//     RMSNorm with NormWeight, RoPE at Index*Ratio, UE8M0) into page Page,
//     offset Offset of Pool (fp8_ue8m0, PageSize entries a page); with
//     EntryIndexer (section 9): softmax per channel over 128 channels,
//     bf16, RMSNorm (W = 128), RoPE of dims [64, 128) at Index*4,
//     Hadamard(128), MXFP4: 68 bytes at Page*IndexerPageBytes(PageSize) +
//     Offset*68;
//   - for each sequence, writes ring slot To, row p mod RingRows, with
//     position p's K then G (ape added) for p in [lo, s.Start+s.Rows):
//     lo = max(0, s.Start+s.Rows-RingRows) when To != From (the rows the
//     sequence keeps, the older ones copied from slot From), else
//     max(s.Start, s.Start+s.Rows-RingRows) (the new rows only).
//
// The plan lies at PlanOffset of Plan, encoded for MaxSeqs and MaxJobs;
// the launch's shape depends on those capacities only, so a CUDA graph
// replays it for any plan. Every plan the engine writes keeps To != From
// or Rows <= InPlaceRows, and no two sequences share a slot; a backend
// skips jobs and rows whose indices fall outside the buffers.
type CompressStepArgs struct {
	Ratio  int
	Entry  CompressEntry // EntryKV (the zero value) or EntryIndexer
	KG     Buffer        // KGRows rows of 2*Width float32: K then G
	KGRows int
	// KG row r starts at KGOffset + r*KGRowStride()*4 bytes: a step may read
	// its columns of a wider projection (the engine's one GEMM of a ratio-4
	// layer's three projections, DESIGN.md section 9).
	KGOffset      int    // bytes, a multiple of 16
	KGStride      int    // float32 values, >= 2*Width and a multiple of 4; 0: 2*Width (packed rows)
	APE           Buffer // [Ratio][Width] float32, or nil when KG's G includes ape
	Ring          Buffer // Slots slots of RingRows rows of 2*Width float32
	RingRows      int
	Slots         int
	Plan          Buffer
	PlanOffset    int // bytes, a multiple of 16
	MaxSeqs       int
	MaxJobs       int
	NormWeight    Buffer // compressor.norm.weight: Entry.Dim() float32
	Eps           float32
	Rope          Buffer // [RopePositions][32]{cos, sin} float32, the layer's table
	RopePositions int
	Pool          Buffer
	PageSize      int
	NumPages      int
	// Scratch is the step's working memory, CompressScratchBytes(MaxJobs)
	// bytes (the pooled rows before the entry's norm: the CUDA backend
	// spreads one entry over several blocks). Its contents before and after
	// the step mean nothing.
	Scratch Buffer
}

// CompressScratchBytes is CompressStepArgs.Scratch's size for maxJobs
// entries: 512 float32 each, enough for either entry kind.
func CompressScratchBytes(maxJobs int) int { return maxJobs * numerics.HeadDim * 4 }

// Width is the float32 values of one K or G row.
func (a *CompressStepArgs) Width() int { return compressor.Overlap(a.Ratio) * a.Entry.Dim() }

// KGRowStride is the float32 values from one KG row to the next: KGStride,
// or 2*Width when it is 0.
func (a *CompressStepArgs) KGRowStride() int {
	if a.KGStride == 0 {
		return 2 * a.Width()
	}
	return a.KGStride
}

// KGBytes is the bytes the step reads of KG from KGOffset: KGRows rows of
// KGRowStride values, the last one 2*Width (0 without rows). The shapes
// must have passed Validate's range checks.
func (a *CompressStepArgs) KGBytes() int64 {
	if a.KGRows <= 0 {
		return 0
	}
	return 4 * (int64(a.KGRows-1)*int64(a.KGRowStride()) + 2*int64(a.Width()))
}

// PoolPageBytes is the size of one page of Pool: an fp8_ue8m0 page of
// PageSize entries, or IndexerPageBytes(PageSize).
func (a *CompressStepArgs) PoolPageBytes() int {
	if a.Entry == EntryIndexer {
		return IndexerPageBytes(a.PageSize)
	}
	return kvcache.FormatFP8UE8M0.PageBytes(a.PageSize)
}

// Validate checks the arguments' sizes (not the plan's contents), naming
// the field at fault.
func (a *CompressStepArgs) Validate() error {
	if compressor.Overlap(a.Ratio) == 0 {
		return fmt.Errorf("mla: CompressStepArgs.Ratio = %d has no compressor (want 4 or 128)", a.Ratio)
	}
	switch a.Entry {
	case EntryKV:
	case EntryIndexer:
		if a.Ratio != 4 {
			return fmt.Errorf("mla: CompressStepArgs.Ratio = %d with the indexer's entries (ratio-4 layers only)", a.Ratio)
		}
	default:
		return fmt.Errorf("mla: CompressStepArgs.Entry = %v is unknown", a.Entry)
	}
	w := int64(a.Width())
	dim := int64(a.Entry.Dim())
	switch {
	case a.KGRows < 0 || a.KGRows > math.MaxInt32:
		return fmt.Errorf("mla: CompressStepArgs.KGRows = %d out of range [0, %d]", a.KGRows, math.MaxInt32)
	case a.KGOffset < 0 || a.KGOffset%16 != 0:
		return fmt.Errorf("mla: CompressStepArgs.KGOffset = %d bytes, must be >= 0 and a multiple of 16", a.KGOffset)
	case a.KGStride != 0 && (int64(a.KGStride) < 2*w || a.KGStride%4 != 0 || a.KGStride > math.MaxInt32/4):
		return fmt.Errorf("mla: CompressStepArgs.KGStride = %d float32 values, must be 0 or >= 2*Width = %d and a multiple of 4", a.KGStride, 2*w)
	case a.RingRows < InPlaceRowsMin(a.Ratio) || a.RingRows > math.MaxInt32:
		return fmt.Errorf("mla: CompressStepArgs.RingRows = %d, must be at least %d", a.RingRows, InPlaceRowsMin(a.Ratio))
	case a.Slots < 1 || a.Slots > math.MaxInt32:
		return fmt.Errorf("mla: CompressStepArgs.Slots = %d, must be positive", a.Slots)
	case a.MaxSeqs < 1 || a.MaxJobs < 1 || int64(a.MaxSeqs)*CompressPlanSeqWords+int64(a.MaxJobs)*CompressPlanJobWords > math.MaxInt32/4:
		return fmt.Errorf("mla: CompressStepArgs.MaxSeqs, MaxJobs = %d, %d: want positive capacities of a plan under 2 GiB", a.MaxSeqs, a.MaxJobs)
	case a.PlanOffset < 0 || a.PlanOffset%16 != 0:
		return fmt.Errorf("mla: CompressStepArgs.PlanOffset = %d bytes, must be >= 0 and a multiple of 16", a.PlanOffset)
	case !(a.Eps > 0) || math.IsInf(float64(a.Eps), 0):
		return fmt.Errorf("mla: CompressStepArgs.Eps = %g must be finite and positive", a.Eps)
	case a.RopePositions < 1 || a.RopePositions > math.MaxInt32:
		return fmt.Errorf("mla: CompressStepArgs.RopePositions = %d out of range [1, %d]", a.RopePositions, math.MaxInt32)
	case a.PageSize < 1 || a.PageSize > kvcache.MaxPageSize:
		return fmt.Errorf("mla: CompressStepArgs.PageSize = %d out of range [1, %d]", a.PageSize, kvcache.MaxPageSize)
	case a.NumPages < 1 || a.NumPages > math.MaxInt32:
		return fmt.Errorf("mla: CompressStepArgs.NumPages = %d out of range [1, %d]", a.NumPages, math.MaxInt32)
	}
	type sized struct {
		name string
		buf  Buffer
		n    int64
	}
	need := []sized{
		{"Ring", a.Ring, int64(a.Slots) * int64(a.RingRows) * 2 * w * 4},
		{"Plan", a.Plan, int64(a.PlanOffset) + int64(CompressPlanBytes(a.MaxSeqs, a.MaxJobs))},
		{"NormWeight", a.NormWeight, 4 * dim},
		{"Rope", a.Rope, int64(a.RopePositions) * numerics.RopeDim * 4},
		{"Pool", a.Pool, int64(a.NumPages) * int64(a.PoolPageBytes())},
		{"Scratch", a.Scratch, int64(a.MaxJobs) * dim * 4},
	}
	if a.KGRows > 0 {
		need = append(need, sized{"KG", a.KG, int64(a.KGOffset) + a.KGBytes()})
	}
	if a.APE != nil {
		need = append(need, sized{"APE", a.APE, int64(a.Ratio) * w * 4})
	}
	for _, n := range need {
		if n.buf == nil {
			return fmt.Errorf("mla: CompressStepArgs.%s is nil", n.name)
		}
		if int64(n.buf.Len()) < n.n {
			return fmt.Errorf("mla: CompressStepArgs.%s has %d bytes, needs %d", n.name, n.buf.Len(), n.n)
		}
	}
	return nil
}

// InPlaceRowsMin is the least RingRows of a ratio: the coff*r positions an
// entry reads plus one new row in place.
func InPlaceRowsMin(ratio int) int { return compressor.Overlap(ratio)*ratio + 1 }

// CompressStepper is implemented by backends that run a compressed layer's
// compressor step on their own memory (CompressStepArgs), in stream order
// with the layer's other work.
type CompressStepper interface {
	CompressStep(ctx context.Context, a *CompressStepArgs) error
}

// PlanEntries appends to p.Jobs the entries that rows [start, start+rows)
// of plan sequence seq complete in a ratio (entry i when position
// (i+1)*r-1 is among them), ascending, each at its page of table (page j
// holds entries [j*pageSize, (j+1)*pageSize)). It refuses an entry the
// table has no page for within numPages pages.
func (p *CompressPlan) PlanEntries(seq, ratio, start, rows int, table []int32, pageSize, numPages int) error {
	end := start + rows
	for idx := start / ratio; (idx+1)*ratio <= end; idx++ {
		j := idx / pageSize
		if j >= len(table) || table[j] < 0 || int(table[j]) >= numPages {
			return fmt.Errorf("mla: compress plan: sequence %d entry %d: block table %v has no page for it in a pool of %d pages", seq, idx, table, numPages)
		}
		p.Jobs = append(p.Jobs, CompressPlanJob{Index: idx, Seq: seq, Page: int(table[j]), Offset: idx % pageSize})
	}
	return nil
}

// SideRunner is implemented by backends with a second stream (beside
// KVForker, which it shares): Side issues fn's launches on it, after the
// work issued so far, so they overlap what the main stream does next;
// KVForker.JoinKV makes later main-stream work wait for them. The engine
// runs the compressor's projection GEMM and step there, under the layer's
// own GEMMs.
type SideRunner interface {
	Side(ctx context.Context, fn func() error) error
}
