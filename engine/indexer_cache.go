package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
)

// The lightning indexer's cache (DESIGN.md section 9, "Key cache"), the
// cache model's side: with Config.IndexerEnabled every ratio-4 layer holds
// an indexer cache, pages of 64 68-byte MXFP4 entries on the page ids of the
// ratio-4 block table (indexer entry i and compressed entry i cover the
// same four tokens, so they share the table and its reservation), and a
// ring of the indexer compressor's states at the main compressor's slot
// indices (keyed by position: (K, G) of the last 8 positions and a step's
// drafts, width 2*128). The cache model's rows "indexer" and
// "indexer-state" share the ratio-4 and state rows' bookkeeping, so a
// batch is reserved, committed with its accepted lengths (entries >=
// floor(len/4) dropped), rolled back and finished with them, and refused
// naming the indexer pool when the ratio-4 pages run out. The compute that
// writes these buffers (the indexer's projections and its
// mla.CompressStepper step with mla.EntryIndexer) reads them through the
// two accessors below.

// indexerBuffers returns a ratio-4 layer's indexer cache (Ratio4Pages
// pages of mla.IndexerPageBytes(CompressedPageSize) bytes, page p at
// p*4352, entry off at off*68 inside it, the page ids those of the ratio-4
// block table) and its indexer compressor's state ring (slots of
// mla.RingRows(4, MaxDrafts) rows of 2*256 float32, K then G, position p
// at row p mod RingRows, slot s at s*indexerStateBytes, the main ring's
// slot indices); nil, nil for a layer without the indexer. The buffers
// never move.
func (e *Engine) indexerBuffers(layer int) (cache, ring mla.Buffer) {
	if e.comp == nil || layer < 0 || layer >= len(e.comp.layers) || e.comp.layers[layer] == nil {
		return nil, nil
	}
	cl := e.comp.layers[layer]
	return cl.idxPool, cl.idxRing
}

// indexerStepArgs returns a ratio-4 layer's indexer compressor step over
// the open iteration with every field but the compute's own filled in:
// Ratio 4, Entry mla.EntryIndexer, the state ring (Ring, RingRows, Slots),
// the ratio-4 plan Begin wrote (Plan, PlanOffset, MaxSeqs, MaxJobs: each
// sequence's rows, start, From and To slots, and each entry to emit with
// its page and offset, the same as the main ratio-4 step's), Eps, the
// layer's RoPE table, the indexer cache (Pool, PageSize, NumPages) and a
// scratch of the indexer's own. The caller sets KG and KGRows (the
// indexer's projection rows, 2*256 float32 each), APE (or nil when G
// includes it) and NormWeight (compressor.norm.weight, 128 float32). ok is
// false for a layer without the indexer. The host's copies of the same
// data, for a test: the ratio-4 block tables are compressedTables(index of
// 4 in e.comp.ratios), the slots it.comp.slots.From(b) and To(b).
func (e *Engine) indexerStepArgs(layer int) (a mla.CompressStepArgs, ok bool) {
	cache, ring := e.indexerBuffers(layer)
	if cache == nil {
		return a, false
	}
	c, r := e.comp, kvcache.DSv4IndexerRatio
	la := e.args[layer]
	return mla.CompressStepArgs{
		Ratio: r, Entry: mla.EntryIndexer,
		Ring: ring, RingRows: mla.RingRows(r, c.cfg.MaxDrafts), Slots: c.slots.Slots(),
		Plan: c.plan, PlanOffset: c.planOff[r], MaxSeqs: e.cfg.MaxSeqs, MaxJobs: c.maxJobs[r],
		Eps: float32(e.cfg.Model.RMSNormEps), Rope: la.Rope, RopePositions: la.RopePositions,
		Pool: cache, PageSize: CompressedPageSize, NumPages: c.cfg.pagesFor(r), Scratch: c.idxScratch,
	}, true
}

// indexerLayer returns a layer's compressor when it has the indexer, or
// says why not.
func (e *Engine) indexerLayer(layer int) (*compLayer, error) {
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	if cl.idxPool == nil {
		if !e.cfg.IndexerEnabled() {
			return nil, fmt.Errorf("engine: layer %d: the indexer is off (it needs the compressor, ratio-4 layers and Model.IndexNHeads > 0)", layer)
		}
		return nil, fmt.Errorf("engine: layer %d has compress ratio %d: no indexer", layer, cl.ratio)
	}
	return cl, nil
}

// ReadIndexerCache returns a copy of a ratio-4 layer's indexer cache: the
// pages of the ratio-4 page ids, 64 68-byte entries each.
func (d Debug) ReadIndexerCache(layer int) ([]byte, error) {
	cl, err := d.e.indexerLayer(layer)
	if err != nil {
		return nil, err
	}
	return d.e.readAll(cl.idxPool, fmt.Sprintf("layer %d indexer cache", layer))
}

// IndexerStateRing returns the indexer compressor's ring slot of a
// ratio-4 layer that seq holds (committed iterations only): mla.RingRows
// rows of 2*256 float32, K then G, position p at row p mod RingRows.
func (d Debug) IndexerStateRing(layer int, seq uint64) ([]byte, error) {
	e := d.e
	if _, err := e.indexerLayer(layer); err != nil {
		return nil, err
	}
	slot, ok := e.comp.slots.Slot(seq)
	if !ok {
		return nil, fmt.Errorf("engine: IndexerStateRing: %w %d", kvcache.ErrUnknownSequence, seq)
	}
	return e.readIndexerSlot(layer, slot)
}

// ReadIndexerSlot is IndexerStateRing of the slot the iteration writes for
// seq (a sequence of its batch).
func (d IterationDebug) ReadIndexerSlot(layer int, seq uint64) ([]byte, error) {
	it := d.it
	if _, err := it.e.indexerLayer(layer); err != nil {
		return nil, err
	}
	b := slices.Index(it.meta.Seqs, seq)
	if b < 0 || it.comp == nil {
		return nil, fmt.Errorf("engine: ReadIndexerSlot: sequence %d is not in iteration %d", seq, it.index)
	}
	return it.e.readIndexerSlot(layer, it.comp.slots.To(b))
}

func (e *Engine) readIndexerSlot(layer int, slot int32) ([]byte, error) {
	cl := e.comp.layers[layer]
	out := make([]byte, indexerStateBytes(e.comp.cfg.MaxDrafts))
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := e.backend.Read(out, cl.idxRing, int(slot)*len(out)); err != nil {
		return nil, fmt.Errorf("engine: reading layer %d indexer state slot %d: %w", layer, slot, err)
	}
	return out, nil
}
