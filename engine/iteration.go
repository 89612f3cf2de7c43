package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// Iteration is one batch between Begin and End (or Abort). Its metadata is
// on the device already; each layer's inputs go into the engine's input
// buffers, then RunLayer runs that layer's prologue. Its methods are called
// from the goroutine that called Begin.
type Iteration struct {
	e        *Engine
	index    int
	meta     *metadata.Metadata
	launches []mla.Launch
	graph    bool                      // layers replay captured graphs (Config.Eager unset)
	res      *kvcache.Reservation      // the SWA pages' part of mres
	mres     *kvcache.ModelReservation // every pool's
	ran      []bool                    // layers whose prologue ran
	// The memory of launches and, up to 64 layers, of ran: part of the
	// Iteration's own allocation (Begin allocates nothing else for them).
	launchMem [2]mla.Launch
	ranMem    [64]bool
	inputsFor int // layer of the last SetInputs, -1 before any
	// idxProjected is the layer of the last StageIndexerGEMMs, -1 before
	// any.
	idxProjected int
	census       mla.Census
	err          error           // the first RunLayer failure
	lengths      map[uint64]int  // Accept: the lengths End commits (cached + accepted), nil for all
	comp         *iterComp       // the compressor's part; nil when it is off
	created      map[uint64]bool // sequences this iteration creates; nil when none
	done         bool

	// The layer RunLayer hands to the backend's owner thread (mla.Batch):
	// batched is runBatched, bound on first use, so that the hand-over of
	// each layer allocates nothing.
	batched    func() error
	batchCtx   context.Context
	batchLayer int
}

// Index is the iteration's number, counting every Begin that succeeded.
func (it *Iteration) Index() int { return it.index }

// Metadata is the iteration's metadata, as uploaded. It is shared: do not
// modify it. The next Begin reuses its memory, so it is valid only until
// then, as is IterationDebug.WrittenPages.
func (it *Iteration) Metadata() *metadata.Metadata { return it.meta }

// Launches returns the launches each layer issues (one per phase present).
func (d IterationDebug) Launches() []mla.Launch {
	it := d.it
	return slices.Clone(it.launches)
}

// Census counts the KV and Q work issued so far by this iteration, by phase
// (two units per launch, see mla.Census).
func (d IterationDebug) Census() mla.Census { return d.it.census }

// WrittenPages returns, in ascending order, the pages this iteration writes:
// those holding a slot of one of its tokens. It is computed on each call,
// from the metadata, so Begin does not pay for it: call it before the next
// Begin.
func (d IterationDebug) WrittenPages() []int32 {
	it := d.it
	return writtenPages(it.meta)
}

// Tokens is the number of real token rows; Rows counts the padding too.
func (it *Iteration) Tokens() int { return it.meta.Tokens }

// Rows is the number of token rows the launches cover, padding included.
func (it *Iteration) Rows() int { return it.meta.PaddedTokens }

func (it *Iteration) check(layer int) error {
	if it.done {
		return fmt.Errorf("engine: iteration %d: %w", it.index, ErrIterationDone)
	}
	return it.e.checkLayer(layer)
}

// SetInputs copies one layer's inputs into the input buffers: fusedA holds
// Tokens() fused A projection rows of q_lora_rank+512 bf16 (little-endian;
// the prologue reads the last 512 of each row in place) and q holds
// Tokens() rows of heads*512 bf16. It first waits for the launches already
// issued, which read the same buffers. RunLayer must then run the same
// layer: a mismatch is refused.
//
// Producers that write the inputs on the device use Engine.Inputs instead.
func (it *Iteration) SetInputs(layer int, fusedA, q []byte) error {
	if err := it.check(layer); err != nil {
		return err
	}
	e := it.e
	if want := it.meta.Tokens * e.cfg.fusedRowElems() * 2; len(fusedA) != want {
		return fmt.Errorf("engine: SetInputs(layer %d): fusedA has %d bytes, %d tokens of %d bf16 need %d",
			layer, len(fusedA), it.meta.Tokens, e.cfg.fusedRowElems(), want)
	}
	if want := it.meta.Tokens * e.cfg.heads() * numerics.HeadDim * 2; len(q) != want {
		return fmt.Errorf("engine: SetInputs(layer %d): q has %d bytes, %d tokens x %d heads x 512 bf16 need %d",
			layer, len(q), it.meta.Tokens, e.cfg.heads(), want)
	}
	if e.chain != nil {
		return fmt.Errorf("engine: SetInputs(layer %d): Config.Input is hidden: the chain computes these buffers from SetHidden's rows", layer)
	}
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return fmt.Errorf("engine: SetInputs(layer %d): waiting for earlier launches: %w", layer, err)
	}
	if err := e.backend.Write(e.fusedA, 0, fusedA); err != nil {
		return fmt.Errorf("engine: SetInputs(layer %d): fusedA: %w", layer, err)
	}
	if err := e.backend.Write(e.qIn, 0, q); err != nil {
		return fmt.Errorf("engine: SetInputs(layer %d): q: %w", layer, err)
	}
	it.inputsFor = layer
	return nil
}

// RunLayer issues one layer's prologue over the batch: for each phase, the
// KV norm-RoPE-store kernel into the layer's cache pool, then the Q
// norm-RoPE-quant kernel into the Q output buffer, with the layer's RoPE
// table (plain or YaRN by its compress ratio). On a backend that queues
// work, it returns once the work is issued; End waits for it. A failure
// marks the iteration failed: End then rolls it back.
func (it *Iteration) RunLayer(ctx context.Context, layer int) error {
	if err := it.check(layer); err != nil {
		return err
	}
	if it.inputsFor >= 0 && it.inputsFor != layer {
		return fmt.Errorf("engine: RunLayer(%d): the input buffers hold layer %d's inputs (SetInputs)", layer, it.inputsFor)
	}
	if err := it.compressorReady(layer); err != nil {
		return fmt.Errorf("engine: RunLayer(%d): %w", layer, err)
	}
	if err := ctx.Err(); err != nil {
		it.fail(err)
		return fmt.Errorf("engine: RunLayer(%d): %w", layer, err)
	}
	var err error
	if it.graph {
		err = it.replay(ctx, layer)
	} else {
		// One hand-over to the driver thread for all of the layer's launches.
		if it.batched == nil {
			it.batched = it.runBatched
		}
		it.batchCtx, it.batchLayer = ctx, layer
		err = mla.Batch(it.e.backend, it.batched)
		it.batchCtx = nil
	}
	if err != nil {
		it.fail(err)
		return fmt.Errorf("engine: RunLayer(%d): %w", layer, err)
	}
	if it.comp != nil && it.e.chain != nil && it.e.comp.layers[layer] != nil {
		it.comp.projected = layer // its projections are in the buffer (ReadChain)
	}
	it.markRan(layer)
	return nil
}

// runBatched issues the layer RunLayer set up (batchCtx, batchLayer).
func (it *Iteration) runBatched() error {
	return it.e.runLayer(it.batchCtx, it.batchLayer, it.launches)
}

// markRan records that a layer's prologue ran and counts its launches.
func (it *Iteration) markRan(layer int) {
	it.ran[layer] = true
	it.census.Add(it.launches)
	it.e.mu.Lock()
	it.e.census.Add(it.launches)
	it.e.mu.Unlock()
}

// runLayer issues one layer: the chain from the hidden states, or the
// prologue alone on the projected inputs.
func (e *Engine) runLayer(ctx context.Context, layer int, launches []mla.Launch) error {
	if e.chain != nil {
		return e.runChain(ctx, layer, launches)
	}
	if err := mla.RunLayer(ctx, e.backend, launches, e.args[layer]); err != nil {
		return err
	}
	if e.comp != nil {
		if err := e.compressStep(ctx, layer); err != nil {
			return fmt.Errorf("compressor step: %w", err)
		}
	}
	return nil
}

// GraphPath reports whether the iteration's layers replay CUDA graphs.
func (d IterationDebug) GraphPath() bool { return d.it.graph }

// replay launches the layer's graph for the iteration's padded size,
// capturing it on first use. The graph reads this iteration's counts from
// the metadata header, so it serves every later batch of the same size.
func (it *Iteration) replay(ctx context.Context, layer int) error {
	e := it.e
	key := graphKey{layer: layer, rows: it.meta.PaddedTokens}
	g, ok := e.graphs[key]
	if !ok {
		launches := slices.Clone(it.launches) // the graph outlives this iteration
		ranEagerly := false
		if e.chain != nil {
			// The chain's GEMMs set up their library state and per-shape
			// plans on first use, which may allocate, and a capture may
			// not: this first time the layer runs eagerly (so that is its
			// run), then the capture records it for the next iterations.
			if err := e.runLayer(ctx, layer, launches); err != nil {
				return err
			}
			ranEagerly = true
		}
		// runLayer validates the arguments; a failed capture is ended and returned.
		var err error
		g, err = e.capturer.Capture(func() error { return e.runLayer(context.Background(), layer, launches) })
		if err != nil {
			return fmt.Errorf("capturing layer %d for %d rows: %w", layer, key.rows, err)
		}
		e.graphs[key] = g
		e.log.Debug().Int("layer", layer).Int("rows", key.rows).Msg("captured a CUDA graph")
		if ranEagerly {
			return nil
		}
	}
	return g.Launch()
}

func (it *Iteration) fail(err error) {
	if it.err == nil {
		it.err = err
	}
}

// ErrInvalidAccept: Accept named a sequence that is not a generation
// sequence of the iteration, or a count outside [1, 1+MTP].
var ErrInvalidAccept = errors.New("engine: invalid accepted count")

// Accept reports, after an MTP verify step, how many of each generation
// sequence's 1+MTP tokens verification accepted: accepted[seq] = n in [1,
// 1+MTP]. End then commits cached + n tokens for it, exactly as if the
// rejected drafts had never run (DESIGN.md section 8): positions at or past
// that length are dead (the next iteration overwrites them), pages holding
// only such positions go back to the pool, the window follows the accepted
// length only, and each compressed layer's state and entries roll back to
// it. Sequences not named keep every token; context chunks are always kept
// whole. Call it once per iteration, between Begin and End; a second call
// replaces the first. A bad entry refuses the whole call
// (ErrInvalidAccept) and changes nothing.
func (it *Iteration) Accept(accepted map[uint64]int) error {
	if it.done {
		return fmt.Errorf("engine: Accept: iteration %d: %w", it.index, ErrIterationDone)
	}
	m := it.meta
	index := make(map[uint64]int, m.NumSeqs)
	for b, seq := range m.Seqs {
		index[seq] = b
	}
	lengths := make(map[uint64]int, len(accepted))
	for seq, n := range accepted {
		b, ok := index[seq]
		switch {
		case !ok:
			return fmt.Errorf("%w: sequence %d is not in iteration %d", ErrInvalidAccept, seq, it.index)
		case b < m.NumCtx:
			return fmt.Errorf("%w: sequence %d is a context chunk in iteration %d; a chunk is kept whole", ErrInvalidAccept, seq, it.index)
		case n < 1 || n > int(m.QLen[b]):
			return fmt.Errorf("%w: sequence %d accepted %d tokens, must be in [1, %d] (1 + MTP)", ErrInvalidAccept, seq, n, m.QLen[b])
		}
		lengths[seq] = int(m.Cached[b]) + n
	}
	it.lengths = lengths
	return nil
}

// End waits for the iteration's work and commits it: the sequences now hold
// their new tokens (those Accept kept, for MTP steps). If a layer did not run, a RunLayer failed or the wait
// fails (ctx cancelled, a device error), End rolls the iteration back
// instead and returns why: the bookkeeping is exactly as before Begin, and
// only the iteration's own slots may hold its values (see the package
// documentation). Finish calls deferred for this iteration's sequences run
// last, and apply even to a sequence whose creation rolled back.
func (it *Iteration) End(ctx context.Context) error {
	if it.done {
		return fmt.Errorf("engine: End: iteration %d: %w", it.index, ErrIterationDone)
	}
	var why error
	for l, ran := range it.ran {
		if !ran {
			why = fmt.Errorf("engine: End: iteration %d: layer %d did not run; rolled back", it.index, l)
			break
		}
	}
	if it.err != nil {
		why = fmt.Errorf("engine: End: iteration %d: a layer failed, rolled back: %w", it.index, it.err)
	}
	if why == nil {
		if err := it.e.backend.Synchronize(ctx); err != nil {
			why = fmt.Errorf("engine: End: iteration %d: rolled back: %w", it.index, err)
		}
	}
	it.done = true
	e := it.e
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.closeIterationLocked(it, why == nil)
	if why != nil {
		return errors.Join(why, err)
	}
	if err != nil {
		return fmt.Errorf("engine: End: iteration %d: %w", it.index, err)
	}
	if ev := e.log.Debug(); ev.Enabled() { // the free pages cost a lock: only when logged
		ev.Int("iteration", it.index).Int("free_pages", e.cache.FreePages()).Msg("iteration committed")
	}
	return nil
}

// Abort rolls the iteration back: pages it reserved return to the pool and
// sequences it created are forgotten; the bytes of committed tokens were
// never touched, and only the iteration's own slots of the layers that ran
// may hold its values (see the package documentation). It waits for issued work first, so no launch of this
// iteration writes a page after it is freed. It does nothing after End or a
// previous Abort.
func (it *Iteration) Abort() {
	if it.done {
		return
	}
	it.done = true
	e := it.e
	if err := e.backend.Synchronize(context.Background()); err != nil {
		e.log.Warn().Err(err).Int("iteration", it.index).Msg("abort: waiting for issued work")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.closeIterationLocked(it, false); err != nil {
		e.log.Warn().Err(err).Int("iteration", it.index).Msg("abort: rollback")
	}
}

// ReadQ returns the Q output buffer's rows of this iteration, padding
// included: [Rows()][heads][512] of the engine's QFormat. It holds the last
// layer that ran.
func (d IterationDebug) ReadQ() ([]byte, error) {
	it := d.it
	e := it.e
	out := make([]byte, it.meta.PaddedTokens*e.cfg.heads()*numerics.HeadDim*e.cfg.QFormat.ElemBytes())
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := e.backend.Read(out, e.qOut, 0); err != nil {
		return nil, fmt.Errorf("engine: reading the Q output: %w", err)
	}
	return out, nil
}

// ReadLatent returns the latent rows as the KV kernel reads them, [Tokens()]
// rows of 512 bf16, taken from the fused A input buffer at its stride.
func (d IterationDebug) ReadLatent() ([]byte, error) {
	it := d.it
	e := it.e
	row := e.cfg.fusedRowElems() * 2
	fused := make([]byte, it.meta.Tokens*row)
	if err := e.backend.Read(fused, e.fusedA, 0); err != nil {
		return nil, fmt.Errorf("engine: reading the fused A input: %w", err)
	}
	out := make([]byte, it.meta.Tokens*numerics.HeadDim*2)
	off := e.cfg.Model.QLoraRank * 2
	for t := range it.meta.Tokens {
		copy(out[t*numerics.HeadDim*2:(t+1)*numerics.HeadDim*2], fused[t*row+off:])
	}
	return out, nil
}

// ReadQIn returns the Q input rows, [Tokens()][heads][512] bf16.
func (d IterationDebug) ReadQIn() ([]byte, error) {
	it := d.it
	e := it.e
	out := make([]byte, it.meta.Tokens*e.cfg.heads()*numerics.HeadDim*2)
	if err := e.backend.Read(out, e.qIn, 0); err != nil {
		return nil, fmt.Errorf("engine: reading the Q input: %w", err)
	}
	return out, nil
}

// Scheduler reads back the FMHA scheduler scalars the first launch of the
// last layer wrote into the metadata buffer.
func (d IterationDebug) Scheduler() (metadata.SchedulerScalars, error) {
	it := d.it
	if err := it.e.backend.Synchronize(context.Background()); err != nil {
		return metadata.SchedulerScalars{}, err
	}
	return it.e.meta.ReadScheduler(it.e.backend)
}
