package metadata

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/dsv4mla/prologue/kvcache"
)

// Sentinel errors; test with errors.Is. A generation request on a sequence
// the cache does not hold wraps kvcache.ErrUnknownSequence, and a token
// position past the RoPE table (kv_len > MaxPositions) wraps
// kvcache.ErrPositionOutOfRange: the same errors the cache returns.
var (
	// ErrTooManyTokens: the batch has more real tokens than PadTokensTo (the
	// caller may retry with a larger CUDA-graph bucket).
	ErrTooManyTokens = errors.New("too many tokens for the padded size")
)

// Request is one sequence's entry in a batch description.
type Request struct {
	Seq       uint64
	Phase     Phase
	NewTokens int // context: chunk length (>= 1). generation: 0 means 1+MTP; if set it must equal 1+MTP
	MTP       int // generation only: draft tokens per step (>= 0); must be 0 for context
}

// LengthLookup reports how many tokens a sequence already has in the cache.
// known=false means the sequence does not exist yet. A non-nil err (a
// finished sequence, any other refusal) is returned wrapped with the request
// index, so errors.Is still sees it.
type LengthLookup func(seq uint64) (cached int, known bool, err error)

// Params are the per-iteration parameters of the pass.
type Params struct {
	Heads        int             // Q heads, for CuQRows (> 0)
	PageSize     int             // KV cache page size in tokens, a power of two
	MaxPositions int             // RoPE table length: every position must be < MaxPositions
	PadTokensTo  int             // 0: no padding; else rows are padded up to this (CUDA-graph bucket)
	MaxPages     int             // block-table width; 0 = the smallest width that fits this batch
	Scheduler    SchedulerParams // no implicit default: see DefaultSchedulerParams
}

// Need is the KV length a sequence must hold after this iteration.
type Need struct {
	Seq    uint64
	Length int  // kv_len: cached + new tokens
	Create bool // a context request on a sequence the cache does not hold yet
}

// Plan is a validated batch with every length computed. It is immutable;
// Build may be called more than once.
type Plan struct {
	params    Params
	pageShift uint
	seqs      []uint64
	qLen      []int32
	kvLen     []int32
	cached    []int32
	create    []bool
	numCtx    int
	ctxTokens int
	genTokens int
	genSeqLen int
	maxPages  int
	padded    int
	scheduler SchedulerScalars
}

func (p Params) validate() error {
	if p.Heads <= 0 || p.Heads > math.MaxInt32 {
		return fmt.Errorf("metadata: Heads = %d, must be in [1, %d]", p.Heads, math.MaxInt32)
	}
	if p.PageSize <= 0 || p.PageSize > kvcache.MaxPageSize || p.PageSize&(p.PageSize-1) != 0 {
		return fmt.Errorf("metadata: PageSize = %d, must be a power of two in [1, %d]", p.PageSize, kvcache.MaxPageSize)
	}
	if p.MaxPositions <= 0 || p.MaxPositions > math.MaxInt32 {
		return fmt.Errorf("metadata: MaxPositions = %d, must be in [1, %d]", p.MaxPositions, math.MaxInt32)
	}
	if p.PadTokensTo < 0 || p.PadTokensTo > math.MaxInt32 {
		return fmt.Errorf("metadata: PadTokensTo = %d, must be 0 (no padding) or in [1, %d]", p.PadTokensTo, math.MaxInt32)
	}
	if p.MaxPages < 0 || p.MaxPages > math.MaxInt32 {
		return fmt.Errorf("metadata: MaxPages = %d, must be 0 (fit the batch) or in [1, %d]", p.MaxPages, math.MaxInt32)
	}
	return p.Scheduler.validate()
}

// requestError prefixes an error about request i.
func requestError(i int, seq uint64, format string, args ...any) error {
	return fmt.Errorf("metadata: request %d (seq %d): %s", i, seq, fmt.Sprintf(format, args...))
}

// NewPlan validates a batch and computes its lengths. It calls lookup at most
// once per request, in batch order, stops at the first refused request, and
// touches no cache: a refused batch leaves nothing to undo.
func NewPlan(reqs []Request, lookup LengthLookup, p Params) (*Plan, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.New("metadata: empty batch: at least one request is needed")
	}
	if lookup == nil {
		return nil, errors.New("metadata: lookup is nil")
	}
	n := len(reqs)
	pl := &Plan{
		params:    p,
		pageShift: uint(bits.TrailingZeros(uint(p.PageSize))),
		seqs:      make([]uint64, n),
		qLen:      make([]int32, n),
		kvLen:     make([]int32, n),
		cached:    make([]int32, n),
		create:    make([]bool, n),
		scheduler: ComputeSchedulerScalars(p.Scheduler),
	}
	firstGen := -1
	seen := make(map[uint64]int, n)
	var tokens, kvTotal int64
	for i, r := range reqs {
		qLen, err := queryLength(i, r)
		if err != nil {
			return nil, err
		}
		switch r.Phase {
		case Context:
			if firstGen >= 0 {
				return nil, fmt.Errorf("metadata: context request at index %d (seq %d) follows generation request at index %d; context requests must come first", i, r.Seq, firstGen)
			}
			pl.numCtx++
		case Generation:
			if firstGen < 0 {
				firstGen = i
				pl.genSeqLen = qLen
			} else if qLen != pl.genSeqLen {
				return nil, requestError(i, r.Seq, "generation query length %d (MTP %d) differs from %d of the generation request at index %d; the generation part needs one uniform query length", qLen, r.MTP, pl.genSeqLen, firstGen)
			}
		}
		if j, dup := seen[r.Seq]; dup {
			return nil, requestError(i, r.Seq, "duplicate sequence: already at index %d", j)
		}
		seen[r.Seq] = i

		cached, known, err := lookup(r.Seq)
		if err != nil {
			return nil, fmt.Errorf("metadata: request %d (seq %d): lookup: %w", i, r.Seq, err)
		}
		if !known {
			if r.Phase == Generation {
				return nil, fmt.Errorf("metadata: request %d (seq %d): generation needs a cached sequence: %w", i, r.Seq, kvcache.ErrUnknownSequence)
			}
			cached = 0
			pl.create[i] = true
		}
		if cached < 0 {
			return nil, requestError(i, r.Seq, "lookup reported cached = %d, so kv_len < q_len = %d", cached, qLen)
		}
		if cached > p.MaxPositions-qLen {
			return nil, fmt.Errorf("metadata: request %d (seq %d): kv_len = %d (cached %d + q_len %d) exceeds MaxPositions = %d (the RoPE table): %w", i, r.Seq, uint64(cached)+uint64(qLen), cached, qLen, p.MaxPositions, kvcache.ErrPositionOutOfRange)
		}
		kv := cached + qLen
		pl.seqs[i] = r.Seq
		pl.qLen[i] = int32(qLen)
		pl.kvLen[i] = int32(kv)
		pl.cached[i] = int32(cached)
		if r.Phase == Context {
			pl.ctxTokens += qLen
		} else {
			pl.genTokens += qLen
		}
		tokens += int64(qLen)
		kvTotal += int64(kv)
		if pages := (kv + p.PageSize - 1) >> pl.pageShift; pages > pl.maxPages {
			pl.maxPages = pages
		}
	}
	if tokens > math.MaxInt32 {
		return nil, fmt.Errorf("metadata: batch has %d tokens, cu_q_seqlens overflows int32", tokens)
	}
	if tokens*int64(p.Heads) > math.MaxInt32 {
		return nil, fmt.Errorf("metadata: batch has %d tokens x Heads %d = %d Q rows, cu_q_rows overflows int32", tokens, p.Heads, tokens*int64(p.Heads))
	}
	if kvTotal > math.MaxInt32 {
		return nil, fmt.Errorf("metadata: batch has %d KV tokens in total, cu_kv_seqlens overflows int32", kvTotal)
	}
	pl.padded = int(tokens)
	if p.PadTokensTo > 0 {
		if tokens > int64(p.PadTokensTo) {
			return nil, fmt.Errorf("metadata: batch has %d tokens, more than PadTokensTo = %d: %w", tokens, p.PadTokensTo, ErrTooManyTokens)
		}
		pl.padded = p.PadTokensTo
	}
	if p.MaxPages > 0 {
		if pl.maxPages > p.MaxPages {
			for i, kv := range pl.kvLen {
				if pages := (int(kv) + p.PageSize - 1) >> pl.pageShift; pages > p.MaxPages {
					return nil, requestError(i, pl.seqs[i], "kv_len %d needs %d pages of %d, more than MaxPages = %d", kv, pages, p.PageSize, p.MaxPages)
				}
			}
		}
		pl.maxPages = p.MaxPages
	}
	return pl, nil
}

// queryLength checks the per-request fields and returns q_len.
func queryLength(i int, r Request) (int, error) {
	switch r.Phase {
	case Context:
		if r.MTP != 0 {
			return 0, requestError(i, r.Seq, "MTP = %d on a context request, must be 0", r.MTP)
		}
		if r.NewTokens <= 0 {
			return 0, requestError(i, r.Seq, "NewTokens = %d on a context request, must be >= 1", r.NewTokens)
		}
		return r.NewTokens, nil
	case Generation:
		if r.MTP < 0 {
			return 0, requestError(i, r.Seq, "MTP = %d, must be >= 0", r.MTP)
		}
		if r.MTP >= math.MaxInt32 {
			return 0, requestError(i, r.Seq, "MTP = %d, must be < %d", r.MTP, math.MaxInt32)
		}
		if r.NewTokens != 0 && r.NewTokens != 1+r.MTP {
			return 0, requestError(i, r.Seq, "NewTokens = %d on a generation request with MTP %d, must be 0 or 1+MTP = %d", r.NewTokens, r.MTP, 1+r.MTP)
		}
		return 1 + r.MTP, nil
	default:
		return 0, requestError(i, r.Seq, "Phase = %d, must be Context (0) or Generation (1)", uint8(r.Phase))
	}
}

// Needs returns, in batch order, the KV length each sequence must hold after
// this iteration. The slice is fresh; the caller may keep it.
func (p *Plan) Needs() []Need {
	out := make([]Need, len(p.seqs))
	for i, s := range p.seqs {
		out[i] = Need{Seq: s, Length: int(p.kvLen[i]), Create: p.create[i]}
	}
	return out
}

// Build finishes the pass once the cache holds Needs(). blockTable returns a
// sequence's page list; it must cover at least the sequence's kv_len, with
// a real page for every new token (a sliding-window cache marks the pages
// it freed, all before the cached positions, with -1, copied as is). Only
// the pages covering kv_len are copied (entries past them are -1), so the
// metadata does not depend on pages a cache allocated ahead. Build does not
// keep or modify the returned slices.
func (p *Plan) Build(blockTable func(seq uint64) ([]int32, error)) (*Metadata, error) {
	if blockTable == nil {
		return nil, errors.New("metadata: blockTable is nil")
	}
	n := len(p.seqs)
	m := &Metadata{
		NumSeqs:      n,
		NumCtx:       p.numCtx,
		NumGen:       n - p.numCtx,
		CtxTokens:    p.ctxTokens,
		GenTokens:    p.genTokens,
		Tokens:       p.ctxTokens + p.genTokens,
		PaddedTokens: p.padded,
		GenSeqLen:    p.genSeqLen,
		Heads:        p.params.Heads,
		PageSize:     p.params.PageSize,
		Seqs:         append([]uint64(nil), p.seqs...),
		QLen:         append([]int32(nil), p.qLen...),
		KVLen:        append([]int32(nil), p.kvLen...),
		Cached:       append([]int32(nil), p.cached...),
		CuQ:          make([]int32, n+1),
		CuKV:         make([]int32, n+1),
		CuQRows:      make([]int32, n+1),
		MaxPages:     p.maxPages,
		BlockTables:  make([]int32, n*p.maxPages),
		Scheduler:    p.scheduler,
	}
	heads := int32(p.params.Heads)
	for b := range n {
		m.CuQ[b+1] = m.CuQ[b] + p.qLen[b]
		m.CuKV[b+1] = m.CuKV[b] + p.kvLen[b]
		m.CuQRows[b+1] = m.CuQRows[b] + p.qLen[b]*heads
	}
	for b, seq := range p.seqs {
		pages, err := blockTable(seq)
		if err != nil {
			return nil, fmt.Errorf("metadata: request %d (seq %d): block table: %w", b, seq, err)
		}
		need := (int(p.kvLen[b]) + p.params.PageSize - 1) >> p.pageShift
		if len(pages) < need {
			return nil, requestError(b, seq, "block table has %d pages, kv_len %d needs %d pages of %d", len(pages), p.kvLen[b], need, p.params.PageSize)
		}
		row := m.BlockTables[b*m.MaxPages : (b+1)*m.MaxPages]
		// A sliding-window cache frees the pages no query reads any more:
		// their entries are -1. Only pages wholly before the cached
		// positions may be: every new token's page must be real.
		behind := min(int(p.cached[b])>>p.pageShift, need)
		copy(row, pages[:need])
		for j, pg := range row[:behind] {
			if pg < -1 {
				return nil, requestError(b, seq, "block table entry %d is page %d, must be >= 0 (or -1 for a page freed behind the cached positions, before entry %d)", j, pg, behind)
			}
		}
		for j, pg := range row[behind:need] {
			if pg < 0 {
				return nil, requestError(b, seq, "block table entry %d is page %d, must be >= 0 (or -1 for a page freed behind the cached positions, before entry %d)", behind+j, pg, behind)
			}
		}
		for j := need; j < len(row); j++ {
			row[j] = -1
		}
	}
	return m, nil
}
