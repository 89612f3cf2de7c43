package metadata

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"unsafe"

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

// Plan is a validated batch with every length computed. It is immutable
// (one from a Planner until the planner's next call);
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
	return new(Planner).Plan(reqs, lookup, p)
}

// Planner is NewPlan for a caller that plans one batch after another (a
// server's step loop): it reuses its memory, so the Plan that a call
// returns is valid only until the next call. The zero value is ready.
type Planner struct {
	plan Plan
	seen seqIndex
	// planned: plan.seqs are the ids of the last call, which succeeded (so
	// they are distinct). A batch that repeats a prefix of them needs no
	// duplicate search over that prefix: a decode loop's does.
	planned bool
}

// Plan is NewPlan, into the planner's memory.
func (pr *Planner) Plan(reqs []Request, lookup LengthLookup, p Params) (*Plan, error) {
	return pr.planBatch(reqs, lookup, nil, p)
}

// PlanLookedUp is Plan with the lengths looked up already, as
// kvcache.Cache.LookupAll returns them: lookups[i] answers reqs[i] (same
// ID); an Err wrapping kvcache.ErrUnknownSequence means the sequence does
// not exist yet, any other Err refuses the request, as an error of
// Plan's lookup does.
func (pr *Planner) PlanLookedUp(reqs []Request, lookups []kvcache.SequenceLookup, p Params) (*Plan, error) {
	if len(lookups) != len(reqs) {
		return nil, fmt.Errorf("metadata: %d lookups for a batch of %d requests", len(lookups), len(reqs))
	}
	return pr.planBatch(reqs, nil, lookups, p)
}

// planBatch is Plan through lookup, or PlanLookedUp when lookups is not
// nil.
func (pr *Planner) planBatch(reqs []Request, lookup LengthLookup, lookups []kvcache.SequenceLookup, p Params) (*Plan, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, errors.New("metadata: empty batch: at least one request is needed")
	}
	if lookup == nil && lookups == nil {
		return nil, errors.New("metadata: lookup is nil")
	}
	n := len(reqs)
	pl := &pr.plan
	var last []uint64 // distinct ids the batch may repeat, in order
	if pr.planned {
		last = pl.seqs
	}
	pr.planned = false
	*pl = Plan{
		params:    p,
		pageShift: uint(bits.TrailingZeros(uint(p.PageSize))),
		seqs:      resize(pl.seqs, n),
		qLen:      resize(pl.qLen, n),
		kvLen:     resize(pl.kvLen, n),
		cached:    resize(pl.cached, n),
		create:    resize(pl.create, n),
		scheduler: ComputeSchedulerScalars(p.Scheduler),
	}
	firstGen := -1
	seen := &pr.seen
	repeats := 0 // reqs[:repeats] repeat last; the ids after them go through seen
	// Local slices and sums, of the batch's length, so that the loop runs
	// without bounds checks or stores through pl.
	seqs, qLens, kvLens, cacheds, creates := pl.seqs[:n], pl.qLen[:n], pl.kvLen[:n], pl.cached[:n], pl.create[:n]
	if lookups != nil {
		lookups = lookups[:n]
	}
	var numCtx, ctxTokens, genTokens, genSeqLen, maxKV int
	var kvTotal int64
	if lookups != nil && len(last) == n { // last is seqs' memory: it holds the ids already
		var ok bool
		if genSeqLen, maxKV, kvTotal, ok = repeatedDecode(reqs, lookups, last, p.MaxPositions, qLens, kvLens, cacheds, creates); ok {
			genTokens = n * genSeqLen
			reqs = nil // planned: the general loop below has nothing to do
		}
	}
	for i := range reqs {
		r := &reqs[i]
		var qLen int
		if r.Phase == Generation && r.MTP >= 0 && r.MTP < math.MaxInt32 && (r.NewTokens == 0 || r.NewTokens == 1+r.MTP) {
			qLen = 1 + r.MTP // queryLength's answer, without the call
		} else {
			var err error
			if qLen, err = queryLength(i, *r); err != nil {
				return nil, err
			}
		}
		if r.Phase == Context {
			if firstGen >= 0 {
				return nil, fmt.Errorf("metadata: context request at index %d (seq %d) follows generation request at index %d; context requests must come first", i, r.Seq, firstGen)
			}
			numCtx++
		} else if firstGen < 0 {
			firstGen = i
			genSeqLen = qLen
		} else if qLen != genSeqLen {
			return nil, requestError(i, r.Seq, "generation query length %d (MTP %d) differs from %d of the generation request at index %d; the generation part needs one uniform query length", qLen, r.MTP, genSeqLen, firstGen)
		}
		if repeats == i && i < len(last) && last[i] == r.Seq {
			repeats++ // seqs[i] is written below, after this read of last[i]
		} else {
			if repeats == i {
				// The first id off the repeated prefix: index the prefix,
				// whose ids are distinct.
				seen.reset(n)
				for j, id := range seqs[:repeats] {
					seen.insert(id, j)
				}
				repeats = -1
			}
			if j, dup := seen.insert(r.Seq, i); dup {
				return nil, requestError(i, r.Seq, "duplicate sequence: already at index %d", j)
			}
		}

		var cached int
		var known bool
		var err error
		if lookups != nil {
			switch l := &lookups[i]; {
			case l.ID != r.Seq:
				return nil, requestError(i, r.Seq, "lookups[%d] is for seq %d", i, l.ID)
			case l.Err == nil:
				cached, known = l.Length, true
			case !errors.Is(l.Err, kvcache.ErrUnknownSequence):
				err = l.Err
			}
		} else {
			cached, known, err = lookup(r.Seq)
		}
		if err != nil {
			return nil, fmt.Errorf("metadata: request %d (seq %d): lookup: %w", i, r.Seq, err)
		}
		if !known {
			if r.Phase == Generation {
				return nil, fmt.Errorf("metadata: request %d (seq %d): generation needs a cached sequence: %w", i, r.Seq, kvcache.ErrUnknownSequence)
			}
			cached = 0
		}
		if cached < 0 {
			return nil, requestError(i, r.Seq, "lookup reported cached = %d, so kv_len < q_len = %d", cached, qLen)
		}
		if cached > p.MaxPositions-qLen {
			return nil, fmt.Errorf("metadata: request %d (seq %d): kv_len = %d (cached %d + q_len %d) exceeds MaxPositions = %d (the RoPE table): %w", i, r.Seq, uint64(cached)+uint64(qLen), cached, qLen, p.MaxPositions, kvcache.ErrPositionOutOfRange)
		}
		if r.Phase == Context { // q_len <= MaxPositions now: the sums stay far from overflowing
			ctxTokens += qLen
		} else {
			genTokens += qLen
		}
		kv := cached + qLen
		seqs[i], qLens[i], kvLens[i], cacheds[i], creates[i] = r.Seq, int32(qLen), int32(kv), int32(cached), !known
		kvTotal += int64(kv)
		maxKV = max(maxKV, kv)
	}
	pl.numCtx, pl.ctxTokens, pl.genTokens, pl.genSeqLen = numCtx, ctxTokens, genTokens, genSeqLen
	pl.maxPages = (maxKV + p.PageSize - 1) >> pl.pageShift // the widest row's pages
	tokens := int64(ctxTokens) + int64(genTokens)
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
	pr.planned = true
	return pl, nil
}

// repeatedDecode is planBatch's pass for the batch a decode loop repeats:
// the last plan's sequences (last) again, in order, every request a valid
// generation request of one query length, every lookup a known sequence
// whose new kv_len fits MaxPositions. It sets the lengths and returns
// their sums, or ok false as soon as a request is otherwise, having
// refused nothing: planBatch's general pass then plans the batch.
func repeatedDecode(reqs []Request, lookups []kvcache.SequenceLookup, last []uint64, maxPositions int, qLens, kvLens, cacheds []int32, creates []bool) (genSeqLen, maxKV int, kvTotal int64, ok bool) {
	mtp := reqs[0].MTP
	if mtp < 0 || mtp >= math.MaxInt32 {
		return 0, 0, 0, false
	}
	qLen := 1 + mtp
	maxCached := maxPositions - qLen
	n := len(reqs)
	lookups, last, qLens, kvLens, cacheds, creates = lookups[:n], last[:n], qLens[:n], kvLens[:n], cacheds[:n], creates[:n]
	for i := range reqs {
		r, l := &reqs[i], &lookups[i]
		if r.Phase != Generation || r.MTP != mtp || (r.NewTokens != 0 && r.NewTokens != qLen) ||
			r.Seq != last[i] || l.ID != r.Seq || l.Err != nil || l.Length < 0 || l.Length > maxCached {
			return 0, 0, 0, false
		}
		kv := l.Length + qLen
		qLens[i], kvLens[i], cacheds[i], creates[i] = int32(qLen), int32(kv), int32(l.Length), false
		kvTotal += int64(kv)
		maxKV = max(maxKV, kv)
	}
	return qLen, maxKV, kvTotal, true
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
func (p *Plan) Needs() []Need { return p.AppendNeeds(nil) }

// Len is the number of requests of the batch.
func (p *Plan) Len() int { return len(p.seqs) }

// Need is Needs()[i] without the slice.
func (p *Plan) Need(i int) Need {
	return Need{Seq: p.seqs[i], Length: int(p.kvLen[i]), Create: p.create[i]}
}

// AppendNeeds is Needs appending to dst.
func (p *Plan) AppendNeeds(dst []Need) []Need {
	for i, s := range p.seqs {
		dst = append(dst, Need{Seq: s, Length: int(p.kvLen[i]), Create: p.create[i]})
	}
	return dst
}

// resize returns s with length n, reusing its memory when it is large
// enough; the contents are left for the caller to overwrite.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
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
	return p.BuildAppend(nil, func(dst []int32, _ int, seq uint64) ([]int32, error) {
		pages, err := blockTable(seq)
		return append(dst, pages...), err
	})
}

// BuildAppend is Build for a source that appends a page list to a slice,
// into reused memory. appendTable(dst, b, seq) returns dst with the pages of
// seq, the sequence at batch index b, appended; it is called once per
// sequence, in batch order, with dst the metadata's own block-table row
// (empty), so the pages are copied once. A non-nil reuse is overwritten and
// returned, its slices' memory reused (on an error its contents are
// undefined); a nil one builds fresh Metadata.
func (p *Plan) BuildAppend(reuse *Metadata, appendTable func(dst []int32, b int, seq uint64) ([]int32, error)) (*Metadata, error) {
	return p.BuildKeeping(reuse, nil, appendTable, nil)
}

// BuildKeeping is BuildAppend that keeps, in reuse, the block-table rows
// whose source did not change since k's last build into it: states[b]
// names the state of request b's page list (equal numbers: the same pages,
// as kvcache.Reservation.AppendTableStates gives them; 0: unknown, always
// rebuilt). A row is kept when it is the same row of the same memory and
// width as in k's last successful build, for the same sequence, page-list
// state, pages needed and pages behind the cached positions: it then holds
// exactly what building it again would write, and passed the same checks.
// k records which rows it kept (RowKeeper.Kept), for an uploader that
// holds the last build's rows. A nil k or states keeps nothing; otherwise
// states has one entry per request. On an error k forgets everything
// (reuse's contents are undefined).
func (p *Plan) BuildKeeping(reuse *Metadata, k *RowKeeper, appendTable func(dst []int32, b int, seq uint64) ([]int32, error), states []uint64) (_ *Metadata, err error) {
	if appendTable == nil {
		return nil, errors.New("metadata: appendTable is nil")
	}
	n := len(p.seqs)
	m := reuse
	if m == nil {
		m = &Metadata{}
	}
	if k == nil || states == nil || reuse == nil {
		k, states = nil, nil
	} else {
		if len(states) != n {
			k.forget()
			return nil, fmt.Errorf("metadata: %d page-list states for a batch of %d requests", len(states), n)
		}
		defer func() {
			if err != nil {
				k.forget()
			}
		}()
	}
	*m = Metadata{
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
		Seqs:         append(m.Seqs[:0], p.seqs...),
		QLen:         append(m.QLen[:0], p.qLen...),
		KVLen:        append(m.KVLen[:0], p.kvLen...),
		Cached:       append(m.Cached[:0], p.cached...),
		CuQ:          resize(m.CuQ, n+1),
		CuKV:         resize(m.CuKV, n+1),
		CuQRows:      resize(m.CuQRows, n+1),
		MaxPages:     p.maxPages,
		BlockTables:  resize(m.BlockTables, n*p.maxPages),
		Scheduler:    p.scheduler,
	}
	m.CuQ[0], m.CuKV[0], m.CuQRows[0] = 0, 0, 0
	heads := int32(p.params.Heads)
	// Sliced to one length so that the loops run without bounds checks.
	cuQ := m.CuQ[1:]
	cuKV, cuQRows, qLen, kvLen := m.CuKV[1:len(cuQ)+1], m.CuQRows[1:len(cuQ)+1], p.qLen[:len(cuQ)], p.kvLen[:len(cuQ)]
	var q, kv, rows int32
	for b := range cuQ {
		q += qLen[b]
		kv += kvLen[b]
		rows += qLen[b] * heads
		cuQ[b], cuKV[b], cuQRows[b] = q, kv, rows
	}
	if k == nil {
		for b := range n {
			if err := p.buildRow(m, b, appendTable); err != nil {
				return nil, err
			}
		}
		return m, nil
	}
	// The rows to rebuild first, in one pass over the keys; then those
	// rows, in batch order.
	keeping := k.canKeep(m.BlockTables, m.MaxPages)
	keys, rebuilt := k.begin(n)[:len(cuQ)], k.rebuilt[:0]
	seqs, cached, states := p.seqs[:len(cuQ)], p.cached[:len(cuQ)], states[:len(cuQ)]
	shift, pageSize := p.pageShift&63, p.params.PageSize
	for b, seq := range seqs {
		need := (int(kvLen[b]) + pageSize - 1) >> shift
		key := rowKey{state: states[b], seq: seq, need: need, behind: min(int(cached[b])>>shift, need)}
		if keeping && key.state != 0 && keys[b] == key {
			continue
		}
		keys[b] = key
		rebuilt = append(rebuilt, int32(b))
	}
	k.rebuilt = rebuilt
	for _, b := range rebuilt {
		if err := p.buildRow(m, int(b), appendTable); err != nil {
			return nil, err
		}
	}
	k.done(m.BlockTables, m.MaxPages)
	return m, nil
}

// buildRow writes row b of m's block tables: the pages appendTable gives
// for the pages the sequence needs, -1 past them.
func (p *Plan) buildRow(m *Metadata, b int, appendTable func(dst []int32, b int, seq uint64) ([]int32, error)) error {
	seq := p.seqs[b]
	row := m.BlockTables[b*m.MaxPages : (b+1)*m.MaxPages : (b+1)*m.MaxPages]
	need := (int(p.kvLen[b]) + p.params.PageSize - 1) >> p.pageShift
	// A sliding-window cache frees the pages no query reads any more:
	// their entries are -1. Only pages wholly before the cached
	// positions may be: every new token's page must be real.
	behind := min(int(p.cached[b])>>p.pageShift, need)
	pages, err := appendTable(row[:0], b, seq)
	if err != nil {
		return fmt.Errorf("metadata: request %d (seq %d): block table: %w", b, seq, err)
	}
	if len(pages) < need {
		return requestError(b, seq, "block table has %d pages, kv_len %d needs %d pages of %d", len(pages), p.kvLen[b], need, p.params.PageSize)
	}
	if len(pages) == 0 || len(row) == 0 || &pages[0] != &row[0] {
		copy(row, pages[:need]) // a table longer than the row was appended elsewhere
	}
	// One pass finds whether any entry is negative (none is, except
	// where a window freed pages); only then a second one checks the
	// bounds exactly.
	if anyNegative(row[:need]) {
		if j := firstBadEntry(row[:need], behind); j >= 0 {
			return requestError(b, seq, "block table entry %d is page %d, must be >= 0 (or -1 for a page freed behind the cached positions, before entry %d)", j, row[j], behind)
		}
	}
	for j := need; j < len(row); j++ {
		row[j] = -1
	}
	return nil
}

// seqIndex finds duplicate sequence ids in a batch: an open-addressing
// table (linear probing, at most half full) of request indices keyed by id,
// cheaper than a map for the one pass NewPlan makes.
type seqIndex struct {
	ids   []uint64
	at    []int // request index + 1; 0 marks an empty entry
	shift uint  // 64 - log2(len(ids))
}

// reset empties the index and sizes it for n ids (keeping a larger table).
func (x *seqIndex) reset(n int) {
	size := 1 << bits.Len(uint(2*n-1)) // >= 2n, a power of two
	if len(x.ids) >= size {
		clear(x.at)
		return
	}
	*x = seqIndex{ids: make([]uint64, size), at: make([]int, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
}

// insert records id at request index i, or returns the index that holds
// it already.
func (x *seqIndex) insert(id uint64, i int) (int, bool) {
	mask := uint64(len(x.ids) - 1)
	// Fibonacci hashing of a mixed id: consecutive and strided ids spread.
	h := (id ^ id>>29) * 0x9E3779B97F4A7C15 >> x.shift
	for ; x.at[h] != 0; h = (h + 1) & mask {
		if x.ids[h] == id {
			return x.at[h] - 1, true
		}
	}
	x.ids[h], x.at[h] = id, i+1
	return 0, false
}

// firstBadEntry returns the index of the first entry of row below its
// bound (-1 before behind, 0 from there), or -1.
func firstBadEntry(row []int32, behind int) int {
	for j, pg := range row {
		if pg < -1 || (pg < 0 && j >= behind) {
			return j
		}
	}
	return -1
}

// anyNegative reports whether some entry of v is negative: it ORs the
// entries two at a time as 64-bit words into four accumulators and tests
// the sign bits once (a block-table pass over every page of the batch is
// on every iteration's path).
func anyNegative(v []int32) bool {
	const signs = 0x8000_0000_8000_0000
	var a0, a1, a2, a3 uint64
	if len(v) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(v)))%8 != 0 {
		a0 = uint64(uint32(v[0])) // the words must be 8-byte aligned
		v = v[1:]
	}
	if len(v)%2 != 0 {
		a1 = uint64(uint32(v[len(v)-1]))
	}
	if n := len(v) / 2; n > 0 {
		w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(v))), n)
		for len(w) >= 4 {
			a0 |= w[0]
			a1 |= w[1]
			a2 |= w[2]
			a3 |= w[3]
			w = w[4:]
		}
		for _, x := range w {
			a0 |= x
		}
	}
	return (a0|a1|a2|a3)&signs != 0
}
