package engine

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/internal/bytediff"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// Errors of the engine; test with errors.Is. The cache's errors
// (kvcache.ErrCacheFull, kvcache.ErrUnknownSequence,
// kvcache.ErrFinishedSequence, kvcache.ErrPositionOutOfRange) come through
// wrapped, whether the cache or the metadata pass refused, and so do the
// indexer's top-k refusals of a batch (mla.ErrTopKScratch: its scores do
// not fit Compressor.IndexerTopKScratch; mla.ErrTopKContext).
var (
	// ErrCacheFull is kvcache.ErrCacheFull: the free pages cannot hold the
	// batch. Nothing was allocated.
	ErrCacheFull = kvcache.ErrCacheFull
	// ErrBatchTooLarge: the batch has more sequences than MaxSeqs or more
	// tokens than MaxTokens.
	ErrBatchTooLarge = errors.New("engine: batch exceeds the engine's capacity")
	// ErrIterationOpen: Begin while another iteration is neither ended nor
	// aborted.
	ErrIterationOpen = errors.New("engine: an iteration is already open")
	// ErrIterationDone: a method of an iteration that was ended or aborted.
	ErrIterationDone = errors.New("engine: iteration already ended or aborted")
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("engine: closed")
)

// Engine runs the DSv4 MLA prologue of a batch, layer after layer, on one
// backend, and owns the paged KV cache it writes.
//
// Begin, the Iteration's methods and Close are called from one goroutine
// (the server's step loop). Finish and the read-only accessors may be called
// from any goroutine at any time.
type Engine struct {
	cfg     Config
	log     zerolog.Logger
	backend mla.Backend
	model   *kvcache.Model // every pool's bookkeeping (Config.CacheLayout)
	cache   *kvcache.Cache // the model's SWA pages: ids, lengths, block tables
	params  metadata.Params

	pools      []mla.Buffer // one KV cache pool per layer
	meta       *mla.MetadataBuffers
	ropeHost   map[dsv4.RopeKind]*dsv4.RopeTable
	ropeBufs   map[dsv4.RopeKind]mla.Buffer
	layerRope  []dsv4.RopeKind
	weightBufs []mla.Buffer
	fusedA     mla.Buffer // [MaxTokens][q_lora_rank+512] bf16
	qIn        mla.Buffer // [MaxTokens][heads][512] bf16
	qOut       mla.Buffer // [MaxTokens][heads][512] of QFormat
	args       []*mla.LayerArgs
	allocated  []mla.Buffer // everything to free on Close

	chain *chainState    // nil on the projected path (Config.Input)
	comp  *compressState // nil unless Config.Compresses()
	// compTables is the backend copy of the compressed block tables (nil
	// without compressed layers); handoff describes the buffers attention
	// reads.
	compTables *compDeviceTables
	handoff    *Handoff
	// compWeights holds the compressor weights the chain's weight source
	// read, until newCompressor takes them.
	compWeights map[int]*weights.Compressor
	// idxWeights holds the ratio-4 layers' indexer weights the chain's
	// weight source gave, until newIndexer uploads them; idx is the
	// indexer's compute (indexer.go), nil when it is off.
	idxWeights map[int]*weights.IndexerWeights
	idx        *indexerCompute
	capturer   mla.GraphCapturer      // nil when Eager or the backend captures no graphs
	graphs     map[graphKey]mla.Graph // captured per (layer, bucket); replayed by graph iterations

	mu      sync.Mutex
	weights [][]float32 // host copies of the kv_a_layernorm weights (nil: never set)
	// unset counts the kv_a_layernorm and compressor norm weights never
	// set (the projected path without SyntheticWeights): Begin refuses
	// while it is not 0 (ErrNoWeights).
	unset      int
	open       *Iteration
	deferred   []uint64 // Finish calls waiting for the open iteration to end
	closed     bool
	census     mla.Census
	iterations int // iterations begun

	// Begin's memory, reused by the next Begin: the planner, the needs, and
	// the last iteration's metadata (Iteration.Metadata says so).
	planner     metadata.Planner
	needScratch []kvcache.Need
	batch       kvcache.Batch            // the model's view of the batch: needScratch and each need's cached length
	lookups     []kvcache.SequenceLookup // also the next batch's handle hints
	lastMeta    *metadata.Metadata
	// rows keeps lastMeta's block-table rows whose page lists did not
	// change from one Begin to the next (metadata.RowKeeper), by their
	// states (kvcache.Reservation.AppendTableStates).
	rows        metadata.RowKeeper
	tableStates []uint64
	// verifyKeptRows (tests: VerifyKeptRows) checks after every upload that
	// the kept rows and the uploaded bytes are what a full build gives.
	verifyKeptRows bool
}

// graphKey names a captured layer: its launches differ only by the padded
// row count, since the batch's counts come from the device header.
type graphKey struct{ layer, rows int }

// New opens the backend and allocates, once, everything an iteration uses:
// one zeroed KV cache pool per layer, the fixed-address metadata buffer,
// one RoPE table per kind the layers use, the kv_a_layernorm weights (the
// checkpoint's, the synthetic ones, or set later by SetLayerWeight), the
// input buffers and the Q
// output buffer. Nothing is allocated later, so buffer addresses never
// change.
func New(ctx context.Context, cfg Config) (_ *Engine, err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("engine: New: %w", err)
	}
	if cfg, err = cfg.resolve(true); err != nil {
		return nil, err
	}
	b, err := openBackend(cfg.Backend, Options{Device: cfg.Device, Logger: cfg.Logger}, cfg.CPUWorkers)
	if err != nil {
		return nil, err
	}
	if cfg.MemoryLimit == 0 { // now that the backend can say what it has
		cfg = cfg.defaultLimit(b)
		fp, err := cfg.footprint()
		if err == nil {
			err = cfg.checkMemory(fp)
		}
		if err != nil {
			return nil, errors.Join(err, b.Close())
		}
	}
	e := &Engine{cfg: cfg, log: cfg.Logger.With().Str("component", "engine").Logger(), backend: b, params: cfg.params()}
	if gc, ok := b.(mla.GraphCapturer); ok && !cfg.Eager {
		e.capturer, e.graphs = gc, map[graphKey]mla.Graph{}
	}
	defer func() {
		if err != nil {
			e.release()
		}
	}()
	if e.model, err = cfg.newModel(); err != nil {
		return nil, err
	}
	e.cache = e.model.SWA()
	alloc := func(what string, n int, fill byte) (mla.Buffer, error) {
		buf, err := b.Alloc(n)
		if err != nil {
			return nil, fmt.Errorf("engine: allocating %s (%d bytes) on %s: %w", what, n, b.Name(), err)
		}
		e.allocated = append(e.allocated, buf)
		if err := b.Fill(buf, 0, n, fill); err != nil {
			return nil, fmt.Errorf("engine: clearing %s on %s: %w", what, b.Name(), err)
		}
		return buf, nil
	}

	heads := cfg.heads()
	for l := range cfg.Layers {
		pool, err := alloc(fmt.Sprintf("layer %d KV cache pool", l), cfg.Cache.PoolBytes(), 0)
		if err != nil {
			return nil, err
		}
		e.pools = append(e.pools, pool)
	}
	if e.meta, err = mla.NewMetadataBuffers(b, cfg.MaxSeqs, cfg.pageStride()); err != nil {
		return nil, fmt.Errorf("engine: metadata buffers: %w", err)
	}
	e.allocated = append(e.allocated, e.meta.Buf)

	e.ropeHost = map[dsv4.RopeKind]*dsv4.RopeTable{}
	e.ropeBufs = map[dsv4.RopeKind]mla.Buffer{}
	for l := range cfg.Layers {
		kind, err := cfg.Model.LayerRope(l)
		if err != nil {
			return nil, fmt.Errorf("engine: layer %d: %w", l, err)
		}
		e.layerRope = append(e.layerRope, kind)
		if _, ok := e.ropeHost[kind]; ok {
			continue
		}
		t, err := dsv4.NewRopeTable(cfg.Model, kind, cfg.RopeMode, cfg.RopePositions)
		if err != nil {
			return nil, fmt.Errorf("engine: %v RoPE table: %w", kind, err)
		}
		raw := t.Bytes()
		buf, err := alloc(fmt.Sprintf("%v RoPE table", kind), len(raw), 0)
		if err != nil {
			return nil, err
		}
		if err := b.Write(buf, 0, raw); err != nil {
			return nil, fmt.Errorf("engine: uploading the %v RoPE table: %w", kind, err)
		}
		e.ropeHost[kind], e.ropeBufs[kind] = t, buf
	}

	e.weights = make([][]float32, cfg.Layers)
	for l := range cfg.Layers {
		buf, err := alloc(fmt.Sprintf("layer %d kv_a_layernorm weight", l), numerics.HeadDim*4, 0)
		if err != nil {
			return nil, err
		}
		e.weightBufs = append(e.weightBufs, buf)
		if cfg.SyntheticWeights == nil || cfg.Input == InputHidden {
			e.unset++ // the weights' kv_norm (newChain), or SetLayerWeight
			continue
		}
		if err := e.setLayerWeight(l, SyntheticLayerWeight(cfg.SyntheticWeights.Seed, l)); err != nil {
			return nil, err
		}
	}

	if e.fusedA, err = alloc("fused A input", cfg.MaxTokens*cfg.fusedRowElems()*2, 0); err != nil {
		return nil, err
	}
	if e.qIn, err = alloc("Q input", cfg.MaxTokens*heads*numerics.HeadDim*2, 0); err != nil {
		return nil, err
	}
	if e.qOut, err = alloc("Q output", cfg.MaxTokens*heads*numerics.HeadDim*cfg.QFormat.ElemBytes(), 0); err != nil {
		return nil, err
	}

	if cfg.Input == InputHidden {
		if err := e.newChain(alloc); err != nil {
			return nil, err
		}
	}
	if cfg.Compresses() {
		var proj func(int) (*compressor.Projection, []float32, error)
		if cfg.Input == InputHidden {
			proj = e.compressorWeights
		}
		if err := e.newCompressor(alloc, proj); err != nil {
			return nil, err
		}
		if err := e.newCompTables(alloc); err != nil {
			return nil, err
		}
		e.compWeights = nil
		if err := e.newIndexer(alloc); err != nil {
			return nil, err
		}
		e.idxWeights = nil
	}

	for l := range cfg.Layers {
		e.args = append(e.args, &mla.LayerArgs{
			Heads:         heads,
			Latent:        e.fusedA,
			LatentOffset:  cfg.Model.QLoraRank * 2,
			LatentStride:  cfg.fusedRowElems(),
			QIn:           e.qIn,
			QOut:          e.qOut,
			QFormat:       cfg.QFormat,
			QScale:        cfg.QScale,
			KVWeight:      e.weightBufs[l],
			Eps:           float32(cfg.Model.RMSNormEps),
			Rope:          e.ropeBufs[e.layerRope[l]],
			RopePositions: cfg.RopePositions,
			Cache:         e.pools[l],
			CacheConfig:   cfg.Cache,
			Meta:          e.meta,
			Scheduler:     cfg.Scheduler,
		})
	}
	e.handoff = e.buildHandoff()
	total := 0
	for _, buf := range e.allocated {
		total += buf.Len()
	}
	e.log.Info().Str("backend", b.Name()).Str("model", cfg.Model.Name).Int("layers", cfg.Layers).
		Int("heads", heads).Stringer("cache_format", cfg.Cache.Format).Int("page_size", cfg.Cache.PageSize).
		Int("pages", cfg.Cache.NumPages).Int("max_seqs", cfg.MaxSeqs).Int("max_tokens", cfg.MaxTokens).
		Int("rope_positions", cfg.RopePositions).Stringer("rope_mode", cfg.RopeMode).Int("bytes", total).Int64("memory_limit", cfg.MemoryLimit).Msg("engine ready")
	return e, nil
}

// release frees every buffer and closes the backend.
func (e *Engine) release() error {
	var errs []error
	for _, g := range e.graphs {
		errs = append(errs, g.Close())
	}
	e.graphs = nil
	for _, buf := range e.allocated {
		if err := e.backend.Free(buf); err != nil {
			errs = append(errs, err)
		}
	}
	e.allocated = nil
	if err := e.backend.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Close aborts an open iteration, frees every buffer and closes the backend.
// A second Close returns nil.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	it := e.open
	e.mu.Unlock()
	if it != nil {
		it.Abort()
	}
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	return e.release()
}

// Config returns the configuration with every default filled in.
func (e *Engine) Config() Config { return e.cfg }

// Backend returns the backend the engine runs on.
func (e *Engine) Backend() mla.Backend { return e.backend }

// EventTimer returns the backend's device timer when it has one.
func (e *Engine) EventTimer() (EventTimer, bool) {
	t, ok := e.backend.(EventTimer)
	return t, ok
}

// Layers is the number of layers the engine runs.
func (e *Engine) Layers() int { return e.cfg.Layers }

// Heads is the number of Q heads the engine computes: all of the model's,
// or its head range's (Config.HeadBegin, HeadEnd).
func (e *Engine) Heads() int { return e.cfg.heads() }

// FusedRowElems is the number of bf16 elements of one fused A row,
// q_lora_rank + 512; the latent is its last 512.
func (e *Engine) FusedRowElems() int { return e.cfg.fusedRowElems() }

// Inputs returns the input buffers, for producers that write them on the
// device: fused A rows [MaxTokens][q_lora_rank+512] bf16 (the prologue reads
// the latent in place at element offset q_lora_rank) and Q rows
// [MaxTokens][heads][512] bf16. Row t is token row t of the iteration.
func (e *Engine) Inputs() (fusedA, q mla.Buffer) { return e.fusedA, e.qIn }

// RopeTable returns the host copy of the RoPE table a layer reads (its Kind
// says plain or YaRN).
func (d Debug) RopeTable(layer int) (*dsv4.RopeTable, error) {
	e := d.e
	if err := e.checkLayer(layer); err != nil {
		return nil, err
	}
	return e.ropeHost[e.layerRope[layer]], nil
}

// SetLayerWeight replaces the kv_a_layernorm weight of a layer (512 float32
// values). It must not run while an iteration is open.
func (e *Engine) SetLayerWeight(layer int, w []float32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if e.open != nil {
		return fmt.Errorf("engine: SetLayerWeight(%d) while iteration %d is open: %w", layer, e.open.index, ErrIterationOpen)
	}
	return e.setLayerWeight(layer, w)
}

func (e *Engine) setLayerWeight(layer int, w []float32) error {
	if err := e.checkLayer(layer); err != nil {
		return err
	}
	if len(w) != numerics.HeadDim {
		return fmt.Errorf("engine: SetLayerWeight(%d): weight has %d values, want %d", layer, len(w), numerics.HeadDim)
	}
	if err := weights.CheckFinite(fmt.Sprintf("layer %d kv_a_layernorm weight", layer), w); err != nil {
		return fmt.Errorf("engine: SetLayerWeight(%d): %w", layer, err)
	}
	if err := e.backend.Write(e.weightBufs[layer], 0, numerics.F32Bytes(w)); err != nil {
		return fmt.Errorf("engine: uploading layer %d kv_a_layernorm weight: %w", layer, err)
	}
	if e.weights[layer] == nil && e.unset > 0 {
		e.unset--
	}
	e.weights[layer] = append([]float32(nil), w...)
	return nil
}

// LayerWeight returns a copy of a layer's kv_a_layernorm weight; one never
// set is an error wrapping ErrNoWeights.
func (d Debug) LayerWeight(layer int) ([]float32, error) {
	e := d.e
	if err := e.checkLayer(layer); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.weights[layer] == nil {
		return nil, fmt.Errorf("engine: layer %d kv_a_layernorm weight: %w", layer, ErrNoWeights)
	}
	return append([]float32(nil), e.weights[layer]...), nil
}

// missingWeight names the first weight never set (e.unset > 0), for
// Begin's refusal. Called with e.mu held.
func (e *Engine) missingWeight() error {
	for l, w := range e.weights {
		if w == nil {
			return fmt.Errorf("engine: Begin: layer %d kv_a_layernorm weight was never set (SetLayerWeight): %w", l, ErrNoWeights)
		}
	}
	if e.comp != nil {
		for l, cl := range e.comp.layers {
			if cl != nil && cl.norm == nil {
				return fmt.Errorf("engine: Begin: layer %d compressor norm weight was never set (SetCompressorNorm): %w", l, ErrNoWeights)
			}
		}
	}
	return fmt.Errorf("engine: Begin: %w", ErrNoWeights)
}

func (e *Engine) checkLayer(layer int) error {
	if layer < 0 || layer >= e.cfg.Layers {
		return fmt.Errorf("engine: layer %d out of range [0, %d)", layer, e.cfg.Layers)
	}
	return nil
}

// ReadPage returns a copy of one page of a layer's KV cache pool.
func (d Debug) ReadPage(layer int, page int) ([]byte, error) {
	e := d.e
	if err := e.checkLayer(layer); err != nil {
		return nil, err
	}
	if page < 0 || page >= e.cfg.Cache.NumPages {
		return nil, fmt.Errorf("engine: page %d out of range [0, %d)", page, e.cfg.Cache.NumPages)
	}
	n := e.cfg.Cache.PageBytes()
	out := make([]byte, n)
	if err := e.backend.Read(out, e.pools[layer], page*n); err != nil {
		return nil, fmt.Errorf("engine: reading layer %d page %d: %w", layer, page, err)
	}
	return out, nil
}

// ReadPool returns a copy of a layer's whole KV cache pool.
func (d Debug) ReadPool(layer int) ([]byte, error) {
	e := d.e
	if err := e.checkLayer(layer); err != nil {
		return nil, err
	}
	out := make([]byte, e.cfg.Cache.PoolBytes())
	if err := e.backend.Read(out, e.pools[layer], 0); err != nil {
		return nil, fmt.Errorf("engine: reading layer %d pool: %w", layer, err)
	}
	return out, nil
}

// SequenceLength returns the tokens the cache holds for seq (committed
// iterations only).
func (e *Engine) SequenceLength(seq uint64) (int, error) { return e.cache.Lookup(seq) }

// BlockTable returns a copy of seq's pages in position order.
func (d Debug) BlockTable(seq uint64) ([]int32, error) { return d.e.cache.BlockTable(seq) }

// FreePages returns the pages no sequence owns.
func (e *Engine) FreePages() int { return e.cache.FreePages() }

// Sequences returns the number of live sequences.
func (e *Engine) Sequences() int { return e.cache.Sequences() }

// Census returns the KV and Q work issued since New, by phase (two units per
// launch; the CUDA backend issues both units of a launch as one grid).
func (d Debug) Census() mla.Census {
	e := d.e
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.census
}

// Finish ends a sequence: its pages go back to the pool and later requests
// for it fail (kvcache.ErrFinishedSequence). It is safe from any goroutine.
//
// When the sequence belongs to the open iteration, its pages are still being
// written, so Finish does not free them now: it records the request, returns
// nil, and the iteration's End or Abort finishes the sequence once the
// iteration's work is committed or rolled back. Finishing it twice is an
// error wrapping kvcache.ErrFinishedSequence either way.
func (e *Engine) Finish(seq uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if it := e.open; it != nil {
		if it.res.Holds(seq) {
			for _, d := range e.deferred {
				if d == seq {
					return fmt.Errorf("engine: Finish(%d): already finishing once iteration %d ends: %w", seq, it.index, kvcache.ErrFinishedSequence)
				}
			}
			e.deferred = append(e.deferred, seq)
			e.log.Debug().Uint64("seq", seq).Int("iteration", it.index).Msg("finish deferred until the iteration ends")
			return nil
		}
	}
	if err := e.model.Finish(seq); err != nil {
		return fmt.Errorf("engine: Finish(%d): %w", seq, err)
	}
	return nil
}

// lookupBatch looks the batch's sequences up in the cache at once, through
// the handles of the last batch's sequences at the same index (a decode
// batch repeats), into e.lookups, which Begin plans the batch with. It
// also counts the batch's tokens, and whether it has
// generation requests only.
func (e *Engine) lookupBatch(reqs []metadata.Request) (tokens int, generationOnly bool) {
	ls := e.lookups
	generationOnly = len(reqs) > 0
	for i, r := range reqs {
		if r.Phase == metadata.Generation {
			tokens += 1 + r.MTP
		} else {
			tokens += r.NewTokens
			generationOnly = false
		}
		if i >= len(ls) {
			ls = append(ls, kvcache.SequenceLookup{})
		} else if ls[i].ID != r.Seq {
			ls[i].Handle = 0
		}
		ls[i].ID = r.Seq
	}
	ls = ls[:len(reqs)]
	e.lookups = ls
	e.cache.LookupAll(ls)
	return tokens, generationOnly
}

// Begin starts an iteration: it validates the batch (context requests
// first, then generation requests of one MTP depth; a context request on an
// unknown sequence creates it), reserves the cache pages it needs, builds
// the metadata and uploads it once for every layer.
//
// On any error nothing changes: no page is allocated, no sequence created,
// and every block table and pool byte is as before.
func (e *Engine) Begin(ctx context.Context, reqs []metadata.Request) (_ *Iteration, err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("engine: Begin: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return nil, ErrClosed
	case e.open != nil:
		return nil, fmt.Errorf("engine: Begin: iteration %d is neither ended nor aborted: %w", e.open.index, ErrIterationOpen)
	case len(reqs) > e.cfg.MaxSeqs:
		return nil, fmt.Errorf("%w: Begin: batch of %d sequences, more than MaxSeqs = %d", ErrBatchTooLarge, len(reqs), e.cfg.MaxSeqs)
	case e.unset > 0:
		return nil, e.missingWeight()
	}
	tokens, generationOnly := e.lookupBatch(reqs)
	params := e.params
	graph := e.capturer != nil && generationOnly && tokens <= e.cfg.MaxTokens
	if graph {
		params.PadTokensTo = e.cfg.graphBucket(tokens)
	}
	// The metadata pass takes lookupBatch's results: an unknown sequence is
	// not an error there (a context request creates it), any other
	// refusal is.
	plan, err := e.planner.PlanLookedUp(reqs, e.lookups, params)
	if err != nil {
		return nil, fmt.Errorf("engine: Begin: %w", err)
	}
	if tokens > e.cfg.MaxTokens {
		return nil, fmt.Errorf("%w: Begin: batch of %d tokens, more than MaxTokens = %d", ErrBatchTooLarge, tokens, e.cfg.MaxTokens)
	}
	kn := slices.Grow(e.needScratch[:0], plan.Len())[:plan.Len()]
	cached := slices.Grow(e.batch.Cached[:0], len(kn))[:len(kn)]
	ls := e.lookups[:len(kn)]
	creates := false
	for i := range kn { // the needs are the requests, in order
		n := plan.Need(i)
		kn[i] = kvcache.Need{ID: n.Seq, NewLength: n.Length, Create: n.Create, Handle: ls[i].Handle}
		cached[i] = 0
		if !n.Create {
			cached[i] = ls[i].Length
		}
		creates = creates || n.Create
	}
	e.needScratch = kn
	e.batch.Needs, e.batch.Cached = kn, cached
	// Every pool of the cache model at once, or none.
	mres, err := e.model.Reserve(&e.batch)
	if err != nil {
		return nil, fmt.Errorf("engine: Begin: %w", err)
	}
	res := mres.SWA()
	defer func() {
		if err != nil {
			if rerr := mres.Rollback(); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	var ic *iterComp
	if e.comp != nil {
		if ic, err = e.beginCompressor(reqs, mres, len(kn)); err != nil {
			return nil, err
		}
	}
	// The reservation's needs are the plan's, in batch order: the pages go
	// straight from the reservation into the metadata's rows.
	// The last iteration's metadata is spent (one iteration is open at a
	// time): this one reuses its memory.
	// Rows whose page list kept its state (kvcache.Reservation.TableState)
	// keep their contents from the last build: a decode step changes only
	// the rows of sequences that gained or lost a page.
	if e.tableStates, err = res.AppendTableStates(e.tableStates[:0]); err != nil {
		return nil, fmt.Errorf("engine: Begin: %w", err)
	}
	m, err := plan.BuildKeeping(e.lastMeta, &e.rows,
		func(dst []int32, b int, _ uint64) ([]int32, error) { return res.AppendBlockTable(dst, b) },
		e.tableStates)
	if err != nil {
		return nil, fmt.Errorf("engine: Begin: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("engine: Begin: %w", err)
	}
	if err := e.planTopK(m, graph); err != nil {
		return nil, err
	}
	// The uploads: on an mla.AsyncWriter backend (CUDA) they are enqueued
	// on the stream without a wait, and this iteration's launches, issued
	// after them, read the new bytes; End (or Abort) waits for the stream
	// before the next Begin rewrites the staging memory, and where it does
	// not (End of an iteration a layer of which did not run, a Begin
	// refused after the plans' copy) the rewriter waits first (see
	// mla.AsyncWriter).
	e.lastMeta = m
	if ic != nil {
		err = mla.Batch(e.backend, func() error { return e.uploadIteration(ic, m) }) // both copies in one hand-over to the driver thread
	} else {
		err = e.uploadIteration(nil, m)
	}
	if err == nil && e.verifyKeptRows {
		err = e.checkUpload(m, res)
	}
	if err != nil {
		return nil, err
	}
	it := &Iteration{
		e:         e,
		index:     e.iterations,
		meta:      m,
		graph:     graph,
		res:       res,
		mres:      mres,
		inputsFor: -1, idxProjected: -1,
		comp: ic,
	}
	it.launches = mla.AppendPlan(it.launchMem[:0], m)
	if graph {
		it.launches = mla.MarkFromHeader(it.launches)
	}
	if e.cfg.Layers <= len(it.ranMem) {
		it.ran = it.ranMem[:e.cfg.Layers]
	} else {
		it.ran = make([]bool, e.cfg.Layers)
	}
	if creates {
		it.created = map[uint64]bool{}
		for _, n := range kn {
			if n.Create {
				it.created[n.ID] = true
			}
		}
	}
	e.iterations++
	e.open = it
	if ev := e.log.Debug(); ev.Enabled() { // the free pages cost a lock: only when logged
		ev.Int("iteration", it.index).Int("ctx_tokens", m.CtxTokens).Int("gen_tokens", m.GenTokens).
			Int("seqs", m.NumSeqs).Int("free_pages", e.cache.FreePages()).Msg("iteration begun")
	}
	return it, nil
}

// uploadIteration writes the compressor plans (when ic is not nil) and
// the metadata of the iteration Begin builds.
func (e *Engine) uploadIteration(ic *iterComp, m *metadata.Metadata) error {
	if ic != nil {
		if err := e.planCompressor(ic, m); err != nil {
			return err
		}
		if err := e.uploadCompTables(m.NumSeqs); err != nil {
			return err
		}
		if err := e.uploadTopK(); err != nil {
			return err
		}
	}
	if err := e.meta.UploadKeeping(e.backend, m, e.cfg.Cache.NumPages, &e.rows); err != nil {
		return fmt.Errorf("engine: Begin: uploading metadata: %w", err)
	}
	return nil
}

// checkUpload (tests) compares the metadata on the device with the full
// encoding of m, and m's block-table rows with the page lists they were
// built from: kept rows and skipped uploads must change nothing.
func (e *Engine) checkUpload(m *metadata.Metadata, res *kvcache.Reservation) error {
	for b := range m.NumSeqs {
		pages, err := res.AppendBlockTable(nil, b)
		if err != nil {
			return err
		}
		need := (int(m.KVLen[b]) + m.PageSize - 1) / m.PageSize
		row := m.BlockTables[b*m.MaxPages : (b+1)*m.MaxPages]
		for j, got := range row {
			want := int32(-1)
			if j < need {
				want = pages[j]
			}
			if got != want {
				return fmt.Errorf("engine: block-table row %d (seq %d) entry %d is %d, its page list says %d", b, m.Seqs[b], j, got, want)
			}
		}
	}
	want, err := e.meta.Encode(m, e.cfg.Cache.NumPages)
	if err != nil {
		return err
	}
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return err
	}
	got := make([]byte, len(want))
	if err := e.backend.Read(got, e.meta.Buf, 0); err != nil {
		return err
	}
	if i := bytediff.First(got, want); i >= 0 {
		return fmt.Errorf("engine: uploaded metadata byte %d is %#x, the full encoding has %#x", i, got[i], want[i])
	}
	return nil
}

// closeIterationLocked commits or rolls back the open iteration, then runs
// the Finish calls that waited for it. Called with e.mu held.
//
// A Finish accepted for a sequence that this iteration created and then
// rolled back is applied, not dropped: the id is retired
// (kvcache.Cache.Retire), so later requests for it fail with
// kvcache.ErrFinishedSequence exactly as if the creation had committed and
// the sequence had then been finished.
func (e *Engine) closeIterationLocked(it *Iteration, commit bool) error {
	var err error
	if commit {
		err = it.mres.CommitLengths(it.lengths)
	} else {
		err = it.mres.Rollback()
	}
	if e.open == it {
		e.open = nil
	}
	var errs []error
	for _, seq := range e.deferred {
		ferr := e.model.Finish(seq)
		if errors.Is(ferr, kvcache.ErrUnknownSequence) && !commit {
			ferr = e.model.Retire(seq)
			e.log.Debug().Uint64("seq", seq).Int("iteration", it.index).Msg("finish of a sequence whose creation rolled back: id retired")
		}
		if ferr != nil {
			errs = append(errs, fmt.Errorf("engine: deferred Finish(%d): %w", seq, ferr))
		}
	}
	e.deferred = e.deferred[:0]
	return errors.Join(append([]error{err}, errs...)...)
}

// writtenPages lists, in ascending order, the pages holding a slot of the
// iteration's real rows: for each sequence, the block-table entries of its
// new positions [Cached, KVLen).
func writtenPages(m *metadata.Metadata) []int32 {
	var pages []int32
	shift := bits.TrailingZeros(uint(m.PageSize))
	for b := range m.NumSeqs {
		if m.KVLen[b] == m.Cached[b] {
			continue
		}
		first, last := int(m.Cached[b])>>shift, int(m.KVLen[b]-1)>>shift
		pages = append(pages, m.BlockTables[b*m.MaxPages+first:b*m.MaxPages+last+1]...)
	}
	slices.Sort(pages)
	return slices.Compact(pages)
}
