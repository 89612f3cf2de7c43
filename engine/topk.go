package engine

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// The indexer's top-k selection in the ratio-4 layers (DESIGN.md section 9,
// "Selection"): each ratio-4 layer's run ends, after its indexer query
// step and (joined back from the side stream) its indexer key step, with
// mla.TopKSelector over this iteration's query and head weights and the
// layer's indexer cache, into the layer's own indices buffer
// (Engine.IndexerTopK, the hand-off's "indices"). Begin writes the plan
// (mla.TopKPlan.SetFromMetadata of the metadata and the ratio-4 block
// tables) into one fixed-address buffer the ratio-4 layers share; the
// launch's shape depends on the capacities only, so a captured graph
// replays it for every batch.

// topkState is the selection's buffers and Begin's host memory.
type topkState struct {
	sel     mla.TopKSelector
	shape   mla.TopKShape
	plan    mla.Buffer         // the encoded plan, shape.PlanBytes()
	scratch mla.Buffer         // 4*ScratchEntries bytes (nil when 0)
	out     map[int]mla.Buffer // per ratio-4 layer: [MaxTokens][TopK] int32
	ri      int                // index of ratio 4 in e.comp.ratios
	// raw is the plan's bytes (staging memory on an mla.AsyncWriter
	// backend), host the plan Begin fills, reused.
	raw  []byte
	host mla.TopKPlan
	// rowKeys is the launches' mla.TopKArgs.MaxRowKeys: the plan's own
	// bound in an eager iteration (a prefill's select sized by its rows'
	// keys, not by a 1M-token block table), 0 in a graph iteration, whose
	// capture serves the later, longer contexts too.
	rowKeys int
}

// topkScratch is Compressor.IndexerTopKScratch with its default resolved.
func (c Config) topkScratch() int {
	if n := c.Compressor.IndexerTopKScratch; n != 0 || !c.topkRunning() {
		return n
	}
	visible := mla.TopKVisible(min(c.RopePositions, mla.MaxTopKPositions) - 1)
	if visible <= c.Model.IndexTopK {
		return 0
	}
	return int(min(int64(c.MaxTokens)*int64((visible+3)&^3), DefaultTopKScratchCap))
}

// topkRunning reports whether the engine runs the top-k selection: with the
// indexer's compute in the MXFP4 query format, the only one it reads.
func (c Config) topkRunning() bool {
	return c.indexerRunning() && c.Compressor.IndexerQueryFormat == mla.IndexerQueryMXFP4
}

// topkShape is the selection's capacities for the config.
func (c Config) topkShape() mla.TopKShape {
	r := kvcache.DSv4IndexerRatio
	return mla.TopKShape{TopK: c.Model.IndexTopK, Rows: c.MaxTokens, MaxSeqs: c.MaxSeqs, PageStride: c.compTableStride(r),
		PageSize: CompressedPageSize, NumPages: c.Compressor.pagesFor(r), ScratchEntries: c.topkScratch()}
}

// topkBytes is the selection's backend memory: the plan, the scratch and
// each ratio-4 layer's indices.
func (c Config) topkBytes() int64 {
	if !c.topkRunning() {
		return 0
	}
	s := c.topkShape()
	n := int64(s.PlanBytes()) + 4*int64(s.ScratchEntries)
	for l := range c.Layers {
		if r, _ := c.Model.CompressRatio(l); r == kvcache.DSv4IndexerRatio {
			n = addSat(n, 4*int64(s.Rows)*int64(s.TopK))
		}
	}
	return n
}

// newTopK allocates the selection's buffers, after newIndexer; the shape is
// checked before anything is allocated.
func (e *Engine) newTopK(alloc func(what string, n int, fill byte) (mla.Buffer, error)) error {
	x := e.idx
	if x == nil || !e.cfg.topkRunning() {
		return nil
	}
	sel, ok := e.backend.(mla.TopKSelector)
	if !ok {
		return fmt.Errorf("engine: the indexer: backend %s has no top-k selection (mla.TopKSelector)", e.backend.Name())
	}
	tk := &topkState{sel: sel, shape: e.cfg.topkShape(), out: map[int]mla.Buffer{}}
	if err := tk.shape.Validate(); err != nil {
		return fmt.Errorf("engine: the indexer's top-k: %w", err)
	}
	for i, r := range e.comp.ratios {
		if r == kvcache.DSv4IndexerRatio {
			tk.ri = i
		}
	}
	// A backend that compiles its kernels loads them now: a graph capture
	// may not.
	if l, ok := e.backend.(interface{ LoadTopK() error }); ok {
		if err := l.LoadTopK(); err != nil {
			return fmt.Errorf("engine: the indexer's top-k: %w", err)
		}
	}
	var err error
	if tk.plan, err = alloc("indexer top-k plan", tk.shape.PlanBytes(), 0); err != nil {
		return err
	}
	if tk.shape.ScratchEntries > 0 {
		if tk.scratch, err = alloc("indexer top-k scratch", 4*tk.shape.ScratchEntries, 0); err != nil {
			return err
		}
	}
	for l := range x.layers {
		// -1 until the layer first runs: no entry selected.
		if tk.out[l], err = alloc(fmt.Sprintf("layer %d indexer top-k indices", l), 4*tk.shape.Rows*tk.shape.TopK, 0xFF); err != nil {
			return err
		}
	}
	if aw, ok := e.backend.(mla.AsyncWriter); ok {
		if tk.raw, err = aw.AllocStaging(tk.shape.PlanBytes()); err != nil {
			return fmt.Errorf("engine: staging memory for the top-k plan: %w", err)
		}
	} else {
		tk.raw = make([]byte, tk.shape.PlanBytes())
	}
	x.topk = tk
	return nil
}

// planTopK encodes the iteration's selection into the plan's host bytes,
// Begin's last refusal before it uploads anything: a token past
// max_position_embeddings (mla.ErrTopKContext) or scores over the scratch
// space (mla.ErrTopKScratch) is refused here. Called with e.mu held, after
// beginCompressor.
func (e *Engine) planTopK(m *metadata.Metadata, graph bool) error {
	if e.idx == nil || e.idx.topk == nil {
		return nil
	}
	tk := e.idx.topk
	if err := tk.host.SetFromMetadata(m, e.comp.tables[tk.ri]); err != nil {
		return fmt.Errorf("engine: Begin: %w", err)
	}
	// The last iteration's copy may still read the staging bytes.
	if aw, ok := e.backend.(mla.AsyncWriter); ok {
		if err := aw.WaitWrites(tk.raw); err != nil {
			return fmt.Errorf("engine: Begin: waiting for the last top-k plan's copy: %w", err)
		}
	}
	if err := tk.host.EncodeTo(tk.raw, &tk.shape); err != nil {
		return fmt.Errorf("engine: Begin: the indexer's top-k: %w", err)
	}
	tk.rowKeys = 0
	if !graph {
		tk.rowKeys = tk.host.MaxRowKeys(tk.shape.TopK)
	}
	return nil
}

// uploadTopK writes the plan planTopK encoded, in stream order before the
// iteration's launches.
func (e *Engine) uploadTopK() error {
	if e.idx == nil || e.idx.topk == nil {
		return nil
	}
	tk := e.idx.topk
	write := e.backend.Write
	if aw, ok := e.backend.(mla.AsyncWriter); ok {
		write = aw.WriteAsync
	}
	if err := write(tk.plan, 0, tk.raw); err != nil {
		return fmt.Errorf("engine: Begin: uploading the top-k plan: %w", err)
	}
	return nil
}

// topkArgs is a ratio-4 layer's selection over the launch's rows (the
// iteration's padded rows, which a graph's key includes): the plan and the
// scratch do not depend on the rows, so the plan Begin encoded for
// MaxTokens serves every row count.
func (e *Engine) topkArgs(layer, rows int) *mla.TopKArgs {
	tk := e.idx.topk
	cache, _ := e.indexerBuffers(layer)
	a := &mla.TopKArgs{TopKShape: tk.shape, Q: e.idx.qOut, W: e.idx.wOut, Cache: cache,
		Plan: tk.plan, Scratch: tk.scratch, Out: tk.out[layer], MaxRowKeys: tk.rowKeys}
	a.Rows = rows
	return a
}

// indexerTopK issues a ratio-4 layer's selection over rows rows on the
// main stream, after its query step and its key step (the caller has
// joined the side stream); nothing for a layer without the indexer.
func (e *Engine) indexerTopK(ctx context.Context, layer, rows int) error {
	x := e.idx
	if x == nil || x.topk == nil || x.layers[layer] == nil {
		return nil
	}
	if err := x.topk.sel.IndexerTopK(ctx, e.topkArgs(layer, rows)); err != nil {
		return fmt.Errorf("indexer top-k: %w", err)
	}
	return nil
}

// IndexerTopK returns a ratio-4 layer's indices buffer (nil for another
// layer, or with the indexer's compute off): [MaxTokens][index_topk]
// int32, row t the entry indices token row t of the iteration selects
// among its sequence's compressed entries (entry i of batch sequence b is
// compressed slot ExtraBlockTable[4][b][i/64]*64 + i%64), ascending, then
// -1; padding rows [Tokens(), Rows()) are all -1, and rows past Rows() are
// not written by the iteration. The layer's RunLayer writes it on the
// engine's stream after the layer's indexer query and key steps; it keeps
// its contents until the layer's next RunLayer (the next iteration's). The
// buffer never moves.
func (e *Engine) IndexerTopK(layer int) mla.Buffer {
	if e.idx == nil || e.idx.topk == nil {
		return nil
	}
	return e.idx.topk.out[layer]
}

// IndexTopK is the indices a row of IndexerTopK holds (the model's
// index_topk), 0 with the indexer's compute off.
func (e *Engine) IndexTopK() int {
	if e.idx == nil || e.idx.topk == nil {
		return 0
	}
	return e.idx.topk.shape.TopK
}

// ReadIndexerTopK returns a host copy of the real rows (Tokens()) of a
// ratio-4 layer's indices, after the work issued so far: Tokens() rows of
// IndexTopK() int32.
func (d IterationDebug) ReadIndexerTopK(layer int) ([]int32, error) {
	it := d.it
	buf := it.e.IndexerTopK(layer)
	if buf == nil {
		return nil, fmt.Errorf("engine: ReadIndexerTopK(%d): the layer runs no indexer", layer)
	}
	k := it.e.IndexTopK()
	raw := make([]byte, 4*it.meta.Tokens*k)
	if err := it.e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := it.e.backend.Read(raw, buf, 0); err != nil {
		return nil, fmt.Errorf("engine: reading layer %d indexer top-k: %w", layer, err)
	}
	out := make([]int32, len(raw)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out, nil
}
