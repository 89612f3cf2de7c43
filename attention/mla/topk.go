package mla

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/metadata"
)

// The indexer's top-k selection (DESIGN.md section 9, "Selection"): for
// each query token of a ratio-4 layer, score every compressed entry it may
// see against its MXFP4 query and head weights, and keep the index_topk
// best as ascending int32 entry indices padded with -1. What varies between
// iterations (which rows are which sequence's tokens at which positions,
// and the sequences' block tables) is a TopKPlan the host writes into a
// fixed-address buffer; the launch's shape depends on the TopKShape's
// capacities only, so a CUDA graph replays it for every plan.

// The selection's bounds (DESIGN.md section 9); the rows are
// IndexerHeads query rows of IndexerEntryBytes a token and cache entries
// of IndexerEntryBytes.
const (
	// TopKRatio is the compress ratio of the layers with an indexer:
	// entry i covers tokens [4i, 4i+4), so the token at position p sees
	// entries s < floor((p+1)/4).
	TopKRatio = 4
	// MaxTopKPositions is DSv4's max_position_embeddings (1M tokens): no
	// query token of a plan lies at or past it, so a row sees at most
	// MaxTopKEntries entries.
	MaxTopKPositions = 1 << 20
	// MaxTopKEntries is the most entries a row sees: 262,144.
	MaxTopKEntries = MaxTopKPositions / TopKRatio
	// MaxTopKScratchEntries bounds TopKShape.ScratchEntries: the plan's
	// key offsets are int32 words.
	MaxTopKScratchEntries = math.MaxInt32
)

var (
	// ErrTopKScratch: a plan's scores do not fit the shape's scratch
	// (TopKShape.ScratchEntries); the batch is refused before anything is
	// written or launched.
	ErrTopKScratch = errors.New("mla: the top-k scores of the batch exceed the scratch space")
	// ErrTopKContext: a plan's query token lies at or past
	// MaxTopKPositions.
	ErrTopKContext = errors.New("mla: a query token lies past max_position_embeddings")
)

// TopKVisible is the number of entries the query token at position p sees:
// floor((p+1)/4) (0 for a negative position).
func TopKVisible(p int) int {
	if p < 0 {
		return 0
	}
	return (p + 1) / TopKRatio
}

// TopKKey maps a score to the selection's order: a larger key ranks
// higher. The map is order-preserving on the numbers (-0 and +0 share one
// key), and every NaN maps to 0, below every number (-Inf included): a
// NaN score is selected only where fewer numbers than the slots remain,
// and then, like every tie, the lower index first.
func TopKKey(score float32) uint32 {
	b := math.Float32bits(score)
	switch {
	case b&0x7FFFFFFF > 0x7F800000:
		return 0
	case b&0x7FFFFFFF == 0:
		return 0x80000000
	case b&0x80000000 != 0:
		return ^b
	}
	return b | 0x80000000
}

// TopKPlanSeq is one sequence of a selection: rows [Row, Row+Rows) of the
// query, weight and output buffers are its tokens at positions [Start,
// Start+Rows), and Table is its ratio-4 block table: page Table[j] of the
// indexer cache holds its entries [j*PageSize, (j+1)*PageSize).
type TopKPlanSeq struct {
	Row, Rows, Start int
	Table            []int32
}

// TopKPlan is what one iteration's selection in a ratio-4 layer does; the
// layers of the ratio share it. Its sequences lie in ascending row order
// without overlap; rows no sequence covers are padding (written -1).
type TopKPlan struct {
	Seqs []TopKPlanSeq
}

// SetFromMetadata makes p the selection of an iteration's batch, reusing
// p's memory: batch sequence b's tokens are rows [CuQ[b], CuQ[b+1]) at
// positions [Cached[b], KVLen[b]), the same rows and positions as the
// prologue's (metadata.Metadata.Row), and tables[b] is its ratio-4 block
// table (by entry index, as the compressor's plan reads it). Rows past
// m.Tokens are padding.
func (p *TopKPlan) SetFromMetadata(m *metadata.Metadata, tables [][]int32) error {
	if len(tables) != m.NumSeqs {
		return fmt.Errorf("mla: top-k plan of %d sequences given %d block tables", m.NumSeqs, len(tables))
	}
	p.Seqs = p.Seqs[:0]
	for b := range m.NumSeqs {
		p.Seqs = append(p.Seqs, TopKPlanSeq{Row: int(m.CuQ[b]), Rows: int(m.QLen[b]), Start: int(m.Cached[b]), Table: tables[b]})
	}
	return nil
}

// Words of the encoded plan (int32 little-endian): a header, then MaxSeqs
// sequences of TopKPlanSeqWords words, then MaxSeqs block-table rows of
// PageStride words (-1 past a table's end). A sequence's Scratch and
// Stride say where its rows' keys lie in the scratch space: row Row+i at
// entry Scratch + i*Stride (Encode computes them). The kernels read them
// by these indices (kernels/cuda/abi).
const (
	TopKPlanHdrSeqs  = 0 // header word: the sequences
	TopKPlanHdrWords = 4

	TopKPlanSeqRow     = 0
	TopKPlanSeqRows    = 1
	TopKPlanSeqStart   = 2
	TopKPlanSeqScratch = 3
	TopKPlanSeqStride  = 4
	TopKPlanSeqWords   = 8
)

// TopKShape is the capacities a selection's buffers and launch are sized
// for.
type TopKShape struct {
	// TopK is index_topk (512 for V4-Flash, 1024 for V4-Pro): the indices a
	// row keeps.
	TopK int
	// Rows is the query rows of Q, W and Out (padding included).
	Rows int
	// MaxSeqs and PageStride are the plan's capacity: sequences, and
	// block-table entries a sequence.
	MaxSeqs, PageStride int
	// PageSize and NumPages describe the indexer cache: NumPages pages of
	// PageSize entries of IndexerEntryBytes bytes, entry o of a page at byte
	// o*IndexerEntryBytes.
	PageSize, NumPages int
	// ScratchEntries is the scratch space in keys (4 bytes each): a plan
	// needs Stride*Rows of each sequence with more visible entries than
	// TopK (TopKPlan.ScratchEntries).
	ScratchEntries int
}

// Validate checks the capacities, naming the field at fault.
func (s *TopKShape) Validate() error {
	switch {
	case s.TopK < 1 || s.TopK > MaxTopKEntries:
		return fmt.Errorf("mla: TopKShape.TopK = %d out of range [1, %d]", s.TopK, MaxTopKEntries)
	case s.Rows < 0 || int64(s.Rows)*int64(s.TopK) > math.MaxInt32:
		return fmt.Errorf("mla: TopKShape.Rows = %d: want [0, %d] rows of TopK = %d indices", s.Rows, math.MaxInt32/s.TopK, s.TopK)
	case s.MaxSeqs < 1 || s.PageStride < 1 || int64(s.MaxSeqs)*(int64(s.PageStride)+TopKPlanSeqWords) > math.MaxInt32/4-TopKPlanHdrWords:
		return fmt.Errorf("mla: TopKShape.MaxSeqs, PageStride = %d, %d: want positive capacities of a plan under 2 GiB", s.MaxSeqs, s.PageStride)
	case s.PageSize < 1 || s.PageSize > MaxTopKEntries:
		return fmt.Errorf("mla: TopKShape.PageSize = %d out of range [1, %d]", s.PageSize, MaxTopKEntries)
	case s.NumPages < 1 || int64(s.NumPages)*int64(s.PageSize)*IndexerEntryBytes > math.MaxInt64/2:
		return fmt.Errorf("mla: TopKShape.NumPages = %d out of range", s.NumPages)
	case s.ScratchEntries < 0 || s.ScratchEntries > MaxTopKScratchEntries:
		return fmt.Errorf("mla: TopKShape.ScratchEntries = %d out of range [0, %d]", s.ScratchEntries, MaxTopKScratchEntries)
	}
	return nil
}

// PlanBytes is the size of an encoded plan of the shape.
func (s *TopKShape) PlanBytes() int {
	return 4 * (TopKPlanHdrWords + s.MaxSeqs*(TopKPlanSeqWords+s.PageStride))
}

// PageBytes is one page of the indexer cache.
func (s *TopKShape) PageBytes() int { return IndexerPageBytes(s.PageSize) }

// TopKStride is the keys a sequence's row takes in the scratch space: the
// entries its last token sees, rounded up to a multiple of 4 (16 bytes);
// 0 when no row sees more than topK (every entry is then selected, no
// score needed).
func TopKStride(start, rows, topK int) int {
	n := TopKVisible(start + rows - 1)
	if rows <= 0 || n <= topK {
		return 0
	}
	return (n + 3) &^ 3
}

// ScratchEntries is the scratch space the plan needs for top-k topK, in
// keys.
func (p *TopKPlan) ScratchEntries(topK int) int64 {
	var n int64
	for _, s := range p.Seqs {
		n += int64(TopKStride(s.Start, s.Rows, topK)) * int64(s.Rows)
	}
	return n
}

// MaxRowKeys is the most keys a row of the plan scores for top-k topK
// (the largest TopKStride of its sequences; 0 when no row scores any):
// TopKArgs.MaxRowKeys for a launch of this plan.
func (p *TopKPlan) MaxRowKeys(topK int) int {
	n := 0
	for _, s := range p.Seqs {
		n = max(n, TopKStride(s.Start, s.Rows, topK))
	}
	return n
}

// check validates the plan against the shape: ErrTopKContext for a token
// past MaxTopKPositions, ErrTopKScratch when its scores do not fit.
func (p *TopKPlan) check(s *TopKShape) error {
	if len(p.Seqs) > s.MaxSeqs {
		return fmt.Errorf("mla: top-k plan of %d sequences exceeds its capacity of %d", len(p.Seqs), s.MaxSeqs)
	}
	next := 0
	for i, q := range p.Seqs {
		switch {
		case q.Row < next || q.Rows < 0 || q.Row+q.Rows > s.Rows:
			return fmt.Errorf("mla: top-k plan sequence %d: rows [%d, %d) overlap the previous sequence's or leave the %d rows", i, q.Row, q.Row+q.Rows, s.Rows)
		case q.Start < 0:
			return fmt.Errorf("mla: top-k plan sequence %d: Start = %d is negative", i, q.Start)
		case q.Start+q.Rows > MaxTopKPositions:
			return fmt.Errorf("%w: sequence %d's tokens reach position %d, the model's limit is %d", ErrTopKContext, i, q.Start+q.Rows-1, MaxTopKPositions)
		case len(q.Table) > s.PageStride:
			return fmt.Errorf("mla: top-k plan sequence %d: block table of %d pages exceeds the stride of %d", i, len(q.Table), s.PageStride)
		}
		next = q.Row + q.Rows
		n := TopKVisible(q.Start + q.Rows - 1)
		if q.Rows == 0 || n <= s.TopK {
			continue // every entry is selected: no page is read
		}
		pages := (n + s.PageSize - 1) / s.PageSize
		if pages > len(q.Table) {
			return fmt.Errorf("mla: top-k plan sequence %d: %d visible entries need %d pages of %d, its block table has %d", i, n, pages, s.PageSize, len(q.Table))
		}
		for j, pg := range q.Table[:pages] {
			if pg < 0 || int(pg) >= s.NumPages {
				return fmt.Errorf("mla: top-k plan sequence %d: block table entry %d = %d outside the %d pages", i, j, pg, s.NumPages)
			}
		}
	}
	if need := p.ScratchEntries(s.TopK); need > int64(s.ScratchEntries) {
		return fmt.Errorf("%w: %d keys needed, %d available", ErrTopKScratch, need, s.ScratchEntries)
	}
	return nil
}

// EncodeTo lays the plan out for shape s into dst, s.PlanBytes() bytes
// (every byte is written). It refuses, writing nothing, a plan over the
// capacities, a block table without the pages of a visible entry, a token
// past MaxTopKPositions (ErrTopKContext), and scores that do not fit the
// scratch space (ErrTopKScratch).
func (p *TopKPlan) EncodeTo(dst []byte, s *TopKShape) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if n := s.PlanBytes(); len(dst) != n {
		return fmt.Errorf("mla: top-k plan buffer of %d bytes, the shape needs %d", len(dst), n)
	}
	if err := p.check(s); err != nil {
		return err
	}
	put := func(word int, v int) { binary.LittleEndian.PutUint32(dst[4*word:], uint32(int32(v))) }
	clear(dst[:4*(TopKPlanHdrWords+s.MaxSeqs*TopKPlanSeqWords)])
	tables := TopKPlanHdrWords + s.MaxSeqs*TopKPlanSeqWords
	for i := tables; i < len(dst)/4; i++ {
		put(i, -1)
	}
	put(TopKPlanHdrSeqs, len(p.Seqs))
	scratch := 0
	for i, q := range p.Seqs {
		w := TopKPlanHdrWords + i*TopKPlanSeqWords
		stride := TopKStride(q.Start, q.Rows, s.TopK)
		put(w+TopKPlanSeqRow, q.Row)
		put(w+TopKPlanSeqRows, q.Rows)
		put(w+TopKPlanSeqStart, q.Start)
		put(w+TopKPlanSeqScratch, scratch)
		put(w+TopKPlanSeqStride, stride)
		scratch += stride * q.Rows
		for j, pg := range q.Table {
			put(tables+i*s.PageStride+j, int(pg))
		}
	}
	return nil
}

// Encode is EncodeTo into new memory.
func (p *TopKPlan) Encode(s *TopKShape) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	out := make([]byte, s.PlanBytes())
	if err := p.EncodeTo(out, s); err != nil {
		return nil, err
	}
	return out, nil
}

// TopKRow is where one row of an encoded plan stands: Valid rows are token
// Row-Seq.Row of plan sequence Seq at Position, seeing Visible entries;
// when Visible > TopK their keys lie at scratch entry Keys.
type TopKRow struct {
	Valid             bool
	Seq               int
	Position, Visible int
	Keys              int64
}

// ResolveTopKRow reads row r's place from an encoded plan (words, the
// plan's int32 words as the device holds them) as the kernels do, for the
// backends that run on the host: the sequence whose rows hold r (a binary
// search by Row), its position and visible entries. A row no sequence
// holds, or one of a sequence whose fields are out of range (a position
// past MaxTopKPositions, keys outside the scratch space, or a stride below
// its visible entries), is not valid: padding, written -1.
func ResolveTopKRow(words []int32, s *TopKShape, r int) TopKRow {
	ns := int(words[TopKPlanHdrSeqs])
	if ns < 0 || ns > s.MaxSeqs {
		ns = 0
	}
	seq := func(i, f int) int { return int(words[TopKPlanHdrWords+i*TopKPlanSeqWords+f]) }
	lo, hi := 0, ns // the last sequence with Row <= r is lo-1
	for lo < hi {
		m := (lo + hi) / 2
		if seq(m, TopKPlanSeqRow) <= r {
			lo = m + 1
		} else {
			hi = m
		}
	}
	i := lo - 1
	if i < 0 {
		return TopKRow{}
	}
	row, rows, start := seq(i, TopKPlanSeqRow), seq(i, TopKPlanSeqRows), seq(i, TopKPlanSeqStart)
	if r >= row+rows || start < 0 || start > MaxTopKPositions-1-(r-row) {
		return TopKRow{}
	}
	pos := start + r - row
	t := TopKRow{Valid: true, Seq: i, Position: pos, Visible: TopKVisible(pos)}
	if t.Visible <= s.TopK {
		return t
	}
	scratch, stride := int64(seq(i, TopKPlanSeqScratch)), int64(seq(i, TopKPlanSeqStride))
	t.Keys = scratch + int64(r-row)*stride
	if scratch < 0 || stride < int64(t.Visible) || t.Keys+int64(t.Visible) > int64(s.ScratchEntries) {
		return TopKRow{}
	}
	return t
}

// TopKPage returns the indexer cache page of entry e of plan sequence seq
// (words as for ResolveTopKRow), or -1 where the table has none in range:
// such an entry scores NaN, and no byte of the cache is read for it.
func TopKPage(words []int32, s *TopKShape, seq, e int) int {
	j := e / s.PageSize
	if j >= s.PageStride {
		return -1
	}
	pg := int(words[TopKPlanHdrWords+s.MaxSeqs*TopKPlanSeqWords+seq*s.PageStride+j])
	if pg < 0 || pg >= s.NumPages {
		return -1
	}
	return pg
}

// TopKArgs is one ratio-4 layer's selection over an iteration.
type TopKArgs struct {
	TopKShape
	// Q is [Rows][IndexerHeads][IndexerEntryBytes]: each token's MXFP4 query
	// rows (rotated, Hadamard-transformed, quantized: DESIGN.md section 9).
	Q Buffer
	// W is [Rows][IndexerHeads] bf16: the head weights.
	W Buffer
	// Cache is the layer's indexer key cache: NumPages pages of PageSize
	// MXFP4 entries.
	Cache Buffer
	// Plan holds the encoded plan at PlanOffset (a multiple of 16 bytes).
	Plan       Buffer
	PlanOffset int
	// Scratch is the selection's working memory, 4*ScratchEntries bytes
	// (the keys of the rows' scores). Its contents before and after mean
	// nothing.
	Scratch Buffer
	// Out is [Rows][TopK] int32: each row's selected entry indices,
	// ascending, then -1; a padding row is all -1.
	Out Buffer
	// MaxRowKeys, when positive, bounds the keys a row of this plan
	// scores (TopKPlan.MaxRowKeys), so that a backend may size the
	// select's launch by it rather than by the block table's capacity
	// (PageStride x PageSize: an engine sized for a 1M-token context
	// would otherwise launch every prefill's select for 262,144 keys a
	// row). It is a hint: a row past it is still selected exactly, only
	// slower, so a graph captured with it stays right for later plans. 0:
	// the shape's bound.
	MaxRowKeys int
}

// Validate checks the shape and the buffers' sizes (not the plan's
// contents), naming the field at fault.
func (a *TopKArgs) Validate() error {
	if err := a.TopKShape.Validate(); err != nil {
		return err
	}
	if a.PlanOffset < 0 || a.PlanOffset%16 != 0 {
		return fmt.Errorf("mla: TopKArgs.PlanOffset = %d bytes, must be >= 0 and a multiple of 16", a.PlanOffset)
	}
	if a.MaxRowKeys < 0 {
		return fmt.Errorf("mla: TopKArgs.MaxRowKeys = %d, must be >= 0", a.MaxRowKeys)
	}
	need := []struct {
		name string
		buf  Buffer
		n    int64
	}{
		{"Q", a.Q, int64(a.Rows) * IndexerHeads * IndexerEntryBytes},
		{"W", a.W, int64(a.Rows) * IndexerHeads * 2},
		{"Cache", a.Cache, int64(a.NumPages) * int64(a.PageBytes())},
		{"Plan", a.Plan, int64(a.PlanOffset) + int64(a.PlanBytes())},
		{"Scratch", a.Scratch, 4 * int64(a.ScratchEntries)},
		{"Out", a.Out, 4 * int64(a.Rows) * int64(a.TopK)},
	}
	for _, n := range need {
		if n.n == 0 && n.buf == nil {
			continue
		}
		if n.buf == nil {
			return fmt.Errorf("mla: TopKArgs.%s is nil", n.name)
		}
		if int64(n.buf.Len()) < n.n {
			return fmt.Errorf("mla: TopKArgs.%s has %d bytes, needs %d", n.name, n.buf.Len(), n.n)
		}
	}
	return nil
}

// TopKSelector is implemented by backends that run the indexer's top-k
// selection (TopKArgs) on their own memory, in stream order with the
// layer's other work.
type TopKSelector interface {
	IndexerTopK(ctx context.Context, a *TopKArgs) error
}
