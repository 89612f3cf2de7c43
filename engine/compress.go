package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// CompressedPageSize is the entries of one compressed-cache page
// (kvcache.DSv4CompressedPageSize: 64 entries of 584 bytes in the
// fp8_ue8m0 layout; a ratio-4 page covers 256 tokens, a ratio-128 page
// 8192).
const CompressedPageSize = kvcache.DSv4CompressedPageSize

// DefaultMaxDrafts is CompressorConfig.MaxDrafts's default.
const DefaultMaxDrafts = 7

// CompressorConfig is DSv4's KV compressor and its compressed caches
// (DESIGN.md section 8) in every layer whose compress ratio is 4 or 128:
// on unless Off (an engine none of whose layers has one runs none).
type CompressorConfig struct {
	// Off leaves the compressor out: the engine is a plain KV prologue (a
	// test of it, or another MLA model); the other fields must then be 0.
	Off bool
	// Ratio4Pages and Ratio128Pages are the pages of each ratio's
	// compressed pool (CompressedPageSize entries each). Every layer of a
	// ratio has its own pool of that size; the block tables (by entry
	// index) are shared by the layers of the ratio. A ratio the engine's
	// layers do not use must be 0. 0 for one they use = room for as many
	// tokens as the SWA pool's pages cover (Cache.NumPages*PageSize, over
	// all sequences) plus a partly filled page per live sequence
	// (MaxSequences): ceil(NumPages*PageSize/(ratio*64)) + MaxSequences.
	Ratio4Pages, Ratio128Pages int
	// MaxDrafts is the most MTP drafts of a generation step (a deeper step
	// is refused): each state keeps that many positions more, so Accept can
	// roll a step back. 0 = DefaultMaxDrafts; at most
	// compressor.MaxDraftsLimit - 1.
	MaxDrafts int
	// MaxSequences bounds the live sequences the compressor holds state
	// for (host memory, Layer.StateBytes per sequence and compressed
	// layer); a batch that would create more is refused with ErrCacheFull
	// naming the compressor state. 0 = 2*MaxSeqs. A chunk of more than
	// 1 + MaxDrafts tokens after earlier ones writes its state to a fresh
	// slot (so an aborted chunk leaves the old one whole), and the rings
	// hold one such slot for every chunk a batch can carry beyond
	// MaxSequences: min(MaxSeqs, MaxTokens/(MaxDrafts+2)) more
	// (kvcache.SlotsFor). So a batch of live sequences is never refused
	// for want of a state slot, whatever their chunks.
	MaxSequences int
	// IndexerTopKScratch is the indexer's top-k selection's scratch space,
	// in 4-byte keys (mla.TopKShape.ScratchEntries): a batch's rows that
	// see more than index_topk entries need as many keys as they see
	// (rounded up to 4 per row, mla.TopKPlan.ScratchEntries), and a batch
	// needing more is refused by Begin (mla.ErrTopKScratch), nothing
	// changed. 0 = MaxTokens rows seeing the most entries the RoPE table's
	// positions allow, capped at DefaultTopKScratchCap keys; it must be 0
	// without the indexer's compute (Config.IndexerEnabled, Input = hidden).
	IndexerTopKScratch int
	// IndexerQueryFormat is the layout of the indexer's query and head
	// weights (Engine.IndexerQuery; DESIGN.md section 9): the zero value,
	// mla.IndexerQueryMXFP4, is the reference's numerics, which the
	// engine's own top-k selection reads. mla.IndexerQueryFP8 (128 e4m3
	// bytes a head, the scale folded into float32 head weights, what an
	// FP8 logits kernel such as DeepGEMM's fp8_mqa_logits takes) is for a
	// server that runs its own selection: the engine then runs none (no
	// indices: Engine.IndexerTopK is nil, IndexTopK 0, the hand-off has no
	// "indices"), and IndexerTopKScratch must be 0. It must be the zero
	// value without the indexer's compute (IndexerEnabled and Input =
	// hidden).
	IndexerQueryFormat mla.IndexerQueryFormat
}

// DefaultTopKScratchCap caps CompressorConfig.IndexerTopKScratch's default:
// 2^26 keys, 256 MiB (a batch of 64 rows at 1M positions each, or 4096
// rows at 64K).
const DefaultTopKScratchCap = 1 << 26

// pagesFor returns the configured pages of a ratio's pool.
func (c CompressorConfig) pagesFor(ratio int) int {
	if ratio == 4 {
		return c.Ratio4Pages
	}
	return c.Ratio128Pages
}

func pagesField(ratio int) string { return fmt.Sprintf("Compressor.Ratio%dPages", ratio) }

// compressedRatios lists the compress ratios of the engine's layers that
// have a compressor, ascending.
func (c Config) compressedRatios() []int {
	var out []int
	for l := range c.Layers {
		if r, err := c.Model.CompressRatio(l); err == nil && compressor.Overlap(r) > 0 && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}

// Compresses reports whether an engine of c runs the compressor: it is not
// Off, and a layer of the engine has compress ratio 4 or 128.
func (c Config) Compresses() bool {
	if c.Compressor.Off {
		return false
	}
	layers := c.Layers
	if layers == 0 {
		layers = c.Model.NumAttentionLayers()
	}
	for l := range layers {
		if r, err := c.Model.CompressRatio(l); err == nil && compressor.Overlap(r) > 0 {
			return true
		}
	}
	return false
}

// resolveCompressor checks Compressor against the layers and fills its
// defaults. A resolved config's layers all have a compressor or ratio 0.
func (c Config) resolveCompressor() (Config, error) {
	cc := &c.Compressor
	if cc.Off {
		if *cc != (CompressorConfig{Off: true}) {
			return c, fieldError("Compressor.Off", "set, but other Compressor fields are set too (%+v): leave them zero, or the compressor on", *cc)
		}
		return c, nil
	}
	for l := range c.Layers {
		r, err := c.Model.CompressRatio(l)
		if err != nil {
			return c, &ConfigError{Field: "Model", Err: err}
		}
		if r != 0 && compressor.Overlap(r) == 0 {
			return c, fieldError("Model", "layer %d has compress ratio %d, which has no compressor (want 0, 4 or 128; or set Compressor.Off)", l, r)
		}
	}
	ratios := c.compressedRatios()
	if len(ratios) == 0 {
		if *cc != (CompressorConfig{}) {
			return c, fieldError("Compressor", "%+v set, but no layer of the engine has compress ratio 4 or 128: leave it zero", *cc)
		}
		return c, nil
	}
	if cc.MaxSequences == 0 {
		cc.MaxSequences = 2 * c.MaxSeqs
	}
	if cc.MaxSequences < 0 || cc.MaxSequences > 1<<20 {
		return c, fieldError("Compressor.MaxSequences", "%d, must be in [1, %d] (0: 2*MaxSeqs)", cc.MaxSequences, 1<<20)
	}
	for _, r := range []int{4, 128} {
		n := cc.pagesFor(r)
		used := slices.Contains(ratios, r)
		switch {
		case n < 0 || n > math.MaxInt32:
			return c, fieldError(pagesField(r), "%d, must be in [0, %d]", n, math.MaxInt32)
		case !used && n != 0:
			return c, fieldError(pagesField(r), "%d, but no layer of the engine has ratio %d: leave it 0", n, r)
		case used && n == 0:
			tokens := int64(c.Cache.NumPages) * int64(c.Cache.PageSize)
			per := int64(r) * CompressedPageSize
			n := min((tokens+per-1)/per+int64(cc.MaxSequences), math.MaxInt32)
			if r == 4 {
				cc.Ratio4Pages = int(n)
			} else {
				cc.Ratio128Pages = int(n)
			}
		}
	}
	if cc.MaxDrafts == 0 {
		cc.MaxDrafts = DefaultMaxDrafts
	}
	if cc.MaxDrafts < 0 || cc.MaxDrafts >= compressor.MaxDraftsLimit {
		return c, fieldError("Compressor.MaxDrafts", "%d, must be in [1, %d] (0: %d)", cc.MaxDrafts, compressor.MaxDraftsLimit-1, DefaultMaxDrafts)
	}
	if n := cc.IndexerTopKScratch; n < 0 || n > mla.MaxTopKScratchEntries || (n != 0 && !c.indexerRunning()) {
		return c, fieldError("Compressor.IndexerTopKScratch", "%d, must be in [0, %d], and 0 without the indexer's compute (IndexerEnabled and Input = hidden)", n, mla.MaxTopKScratchEntries)
	}
	switch f := cc.IndexerQueryFormat; {
	case f.RowBytes() == 0:
		return c, fieldError("Compressor.IndexerQueryFormat", "%v, want mxfp4 or fp8", f)
	case f != mla.IndexerQueryMXFP4 && !c.indexerRunning():
		return c, fieldError("Compressor.IndexerQueryFormat", "%v without the indexer's compute (IndexerEnabled and Input = hidden)", f)
	case f == mla.IndexerQueryFP8 && cc.IndexerTopKScratch != 0:
		return c, fieldError("Compressor.IndexerTopKScratch", "%d with IndexerQueryFormat fp8, which runs no top-k selection: must be 0", cc.IndexerTopKScratch)
	}
	return c, nil
}

// stateBytes is one sequence's ring slot in a compressed layer of the
// ratio: mla.RingRows rows of K and G.
func stateBytes(ratio, maxDrafts int) int64 {
	return int64(mla.RingRows(ratio, maxDrafts)) * int64(compressor.Overlap(ratio)*compressor.Dim) * 2 * 4
}

// SequenceMemory is what one sequence of a given length holds between
// iterations, in bytes, over the engine's layers (DESIGN.md section 8).
type SequenceMemory struct {
	Length int
	SWA    int64         // the KV pages of the last Window positions (every position without a window), every layer
	Ratio  map[int]int64 // per ratio: the compressed pages of floor(L/r) entries, every layer of the ratio
	State  int64         // the compressor states, every compressed layer
	// Indexer is the indexer's keys in the ratio-4 layers (the pages of
	// floor(L/4) 68-byte entries, DESIGN.md section 9), IndexerState its
	// compressor's states; 0 without the indexer (Config.IndexerEnabled).
	Indexer, IndexerState int64
}

// Total is the sum of the parts.
func (m SequenceMemory) Total() int64 {
	t := addSat(addSat(m.SWA, m.State), addSat(m.Indexer, m.IndexerState))
	for _, b := range m.Ratio {
		t = addSat(t, b)
	}
	return t
}

// SequenceMemory returns what a sequence of length tokens holds between
// iterations, in whole pages, for a server's scheduler: SWA pages (with a
// window, at most ceil(W/P)+1 per layer), compressed pages per ratio and
// the compressor states: the sum of the cache model's rows
// (Config.CacheLayout). A length past the model's max_position_embeddings
// is refused (kvcache.ErrPositionOutOfRange): no sequence gets there.
func (c Config) SequenceMemory(length int) (SequenceMemory, error) {
	r, err := c.resolve(false)
	if err != nil {
		return SequenceMemory{}, err
	}
	if length < 0 || length > r.Model.MaxPositionEmbeddings {
		return SequenceMemory{}, fmt.Errorf("engine: SequenceMemory: length %d: %w (want [0, %d], max_position_embeddings)",
			length, kvcache.ErrPositionOutOfRange, r.Model.MaxPositionEmbeddings)
	}
	m := SequenceMemory{Length: length, Ratio: map[int]int64{}}
	layout := r.cacheLayout()
	for i, s := range layout {
		b := layout.SequenceBytes(i, length)
		switch partOf(s) {
		case partSWA:
			m.SWA = addSat(m.SWA, b)
		case partCompressed:
			m.Ratio[s.Ratio] = addSat(m.Ratio[s.Ratio], b)
		case partIndexer:
			m.Indexer = addSat(m.Indexer, b)
		case partIndexerState:
			m.IndexerState = addSat(m.IndexerState, b)
		default:
			m.State = addSat(m.State, b)
		}
	}
	return m, nil
}

// poolPart is the part of SequenceMemory and Footprint a row of the cache
// model counts in; partOf is the one classification both use.
type poolPart int

const (
	partSWA          poolPart = iota // window (or full-token) pages
	partCompressed                   // a ratio's compressed entries
	partIndexer                      // the indexer's key entries
	partIndexerState                 // the indexer compressor's states
	partState                        // the main compressors' states
)

func partOf(s kvcache.PoolSpec) poolPart {
	switch {
	case s.Kind == kvcache.PoolPositions:
		return partSWA
	case s.Kind == kvcache.PoolEntries:
		return partCompressed
	case s.Name == kvcache.DSv4Indexer:
		return partIndexer
	case s.Name == kvcache.DSv4IndexerState:
		return partIndexerState
	default:
		return partState
	}
}

// IndexerEnabled reports whether the engine keeps the lightning indexer's
// key cache and compressor states (DESIGN.md section 9): with the
// compressor on, ratio-4 layers among the engine's and the model's
// index_n_heads > 0.
func (c Config) IndexerEnabled() bool {
	return c.Compresses() && c.Model.IndexNHeads > 0 && slices.Contains(c.compressedRatios(), kvcache.DSv4IndexerRatio)
}

// indexerWidth is the float32 values of one K or G row of the indexer's
// compressor (coff*128).
func indexerWidth() int { return compressor.Overlap(kvcache.DSv4IndexerRatio) * mla.IndexerDim }

// indexerStateBytes is one sequence's ring slot of the indexer's
// compressor in a ratio-4 layer: mla.RingRows rows of K and G at width
// indexerWidth.
func indexerStateBytes(maxDrafts int) int64 {
	return int64(mla.RingRows(kvcache.DSv4IndexerRatio, maxDrafts)) * int64(indexerWidth()) * 2 * 4
}

// CacheLayout returns the cache model of c (DESIGN.md sections 8 and 9),
// with the defaults filled in: the SWA pages of every layer, with the
// compressor each ratio's compressed pool and the state slots, one row per
// pool (kvcache.DSv4Layout). Footprint, SequenceMemory and Engine.Pools are
// sums over its rows.
func (c Config) CacheLayout() (kvcache.Layout, error) {
	r, err := c.resolve(false)
	if err != nil {
		return nil, err
	}
	return r.cacheLayout(), nil
}

// newModel returns the empty cache model of a resolved config, a bad
// pool's size refused naming its field.
func (c Config) newModel() (*kvcache.Model, error) {
	layout := c.cacheLayout()
	for _, s := range layout {
		if s.Kind != kvcache.PoolPositions && s.Kind != kvcache.PoolEntries {
			continue
		}
		if err := s.Cache.Validate(); err != nil {
			if s.Kind == kvcache.PoolPositions {
				return nil, fmt.Errorf("engine: Config.Cache: %w", err)
			}
			return nil, &ConfigError{Field: pagesField(s.Ratio), Err: err}
		}
	}
	m, err := kvcache.NewModel(layout)
	if err != nil {
		return nil, fmt.Errorf("engine: the cache model: %w", err)
	}
	return m, nil
}

// cacheLayout is CacheLayout of a resolved config.
func (c Config) cacheLayout() kvcache.Layout {
	p := kvcache.DSv4Pools{SWA: c.Cache, Layers: c.Layers}
	if c.Compresses() {
		p.RatioLayers, p.RatioPages, p.StateBytes = map[int]int{}, map[int]int{}, map[int]int64{}
		for l := range c.Layers {
			r, _ := c.Model.CompressRatio(l)
			if compressor.Overlap(r) == 0 {
				continue
			}
			p.RatioLayers[r]++
			p.RatioPages[r] = c.Compressor.pagesFor(r)
			p.StateBytes[r] = stateBytes(r, c.Compressor.MaxDrafts)
		}
		p.InPlace = mla.InPlaceRows(4, mla.RingRows(4, c.Compressor.MaxDrafts)) // the same for every ratio: 1 + MaxDrafts
		p.Live = c.Compressor.MaxSequences
		p.Slots = kvcache.SlotsFor(p.Live, p.InPlace, c.MaxSeqs, c.MaxTokens)
		if c.IndexerEnabled() {
			p.IndexerStateBytes = indexerStateBytes(c.Compressor.MaxDrafts)
		}
	}
	return kvcache.DSv4Layout(p)
}

// compressState is what the compressor adds to an engine. The states live
// on the backend: each compressed layer has a ring of state slots
// (mla.CompressStepArgs), and every live sequence holds one slot index, the
// same in every layer. The bookkeeping (entries per ratio, slots) is the
// cache model's (Engine.model); this is the compute that writes them.
type compressState struct {
	cfg     CompressorConfig
	ratios  []int
	entries map[int]*kvcache.EntryCache // per ratio: its row of the cache model
	rows    []int                       // per ratio (index in ratios): its row's index
	slots   *kvcache.SlotPool           // the cache model's state slots
	slotRow int                         // their row's index
	layers  []*compLayer                // per engine layer; nil for ratio 0
	stepper mla.CompressStepper
	gemm    mla.BF16GEMMBackend // Input = hidden: the projection GEMM
	side    mla.SideRunner      // nil: the compressor runs in order on the main stream
	// plan holds each ratio's plan of the open iteration at planOff[ratio],
	// encoded for MaxSeqs sequences and maxJobs[ratio] entries.
	plan    mla.Buffer
	planOff map[int]int
	maxJobs map[int]int
	// planRaw and planScratch are Begin's reused host memory for the plans.
	planRaw     []byte
	planScratch mla.CompressPlan
	// Begin's reused memory for the block tables: per ratio (index in
	// ratios) the block tables of the batch, rows of tableBuf ending at
	// rowEnds.
	tables   [][][]int32
	tableBuf [][]int32
	rowEnds  []int
	// kg holds the projections of the layer running: MaxTokens rows of
	// that layer's projection GEMM output (compLayer.projN float32: K then
	// G, and in a ratio-4 layer with the indexer the indexer's columns
	// after them), sized for the widest (Config.projRowElems).
	kg mla.Buffer
	// scratch is the steps' working memory, for the most entries of any
	// ratio (mla.CompressScratchBytes).
	scratch mla.Buffer
	// idxScratch is the indexer steps' own (they may run beside the main
	// compressor's), nil without the indexer.
	idxScratch mla.Buffer
}

// compLayer is one compressed layer's compressor.
type compLayer struct {
	ratio   int
	comp    *compressor.Layer // the entry math's parameters (norm, eps, RoPE): reads the states back
	norm    []float32         // the entry RMSNorm weight
	normBuf mla.Buffer        // its backend copy
	// wkvg (Input = hidden) is the layer's projection weight, [projN][hidden]
	// bf16: wkv's rows then wgate's, and in a ratio-4 layer with the indexer
	// the indexer compressor's wkv and wgate rows and weights_proj's after
	// them (Config.projN), so one GEMM projects the hidden rows for all
	// three (DESIGN.md section 9). projN is 0 on the projected path.
	wkvg  mla.Buffer
	projN int
	ape   mla.Buffer // Input = hidden: [ratio][Width] float32
	ring  mla.Buffer // the states: slots of RingRows rows of 2*Width float32
	pool  mla.Buffer // the compressed pool
	// The indexer's (ratio-4 layers with the indexer on, else nil): its key
	// cache, pages of the ratio-4 page ids holding 64 68-byte entries, and
	// its compressor's states, slots of RingRows rows of 2*indexerWidth
	// float32 at the main ring's slot indices.
	idxPool, idxRing mla.Buffer
}

// SyntheticCompressorNorm is a compressed layer's entry RMSNorm weight on
// the projected path with Config.SyntheticWeights: SyntheticLayerWeight's
// recipe on its own stream, (seed, layer + 2^32).
func SyntheticCompressorNorm(seed uint64, layer int) []float32 {
	rng := rand.New(rand.NewPCG(seed, uint64(layer)+1<<32))
	w := make([]float32, numerics.HeadDim)
	for i := range w {
		w[i] = numerics.RoundBF16(float32(1 + (rng.Float64()-0.5)/4))
	}
	return w
}

// newCompressor sets up the compressor: one pool and one ring of states per
// compressed layer, the bookkeeping per ratio, the plan and projection
// buffers, and each layer's compressor (with its projection weights on the
// backend on the hidden-state path, from proj).
func (e *Engine) newCompressor(alloc func(what string, n int, fill byte) (mla.Buffer, error), proj func(layer int) (*compressor.Projection, []float32, error)) error {
	cfg := e.cfg
	stepper, ok := e.backend.(mla.CompressStepper)
	if !ok {
		return fmt.Errorf("engine: Config.Compressor: backend %s does not run the compressor step (mla.CompressStepper)", e.backend.Name())
	}
	c := &compressState{cfg: cfg.Compressor, ratios: cfg.compressedRatios(), entries: map[int]*kvcache.EntryCache{},
		layers: make([]*compLayer, cfg.Layers), stepper: stepper, planOff: map[int]int{}, maxJobs: map[int]int{}}
	if proj != nil {
		if c.gemm, ok = e.backend.(mla.BF16GEMMBackend); !ok {
			return fmt.Errorf("engine: Config.Compressor with Input = hidden: backend %s does not run the projection GEMM (mla.BF16GEMMBackend)", e.backend.Name())
		}
		if _, fork := e.backend.(mla.KVForker); fork {
			c.side, _ = e.backend.(mla.SideRunner)
		}
	}
	layout := e.model.Layout()
	planBytes := 0
	for _, r := range c.ratios {
		row := layout.Index(kvcache.DSv4RatioPool(r))
		c.rows = append(c.rows, row)
		c.entries[r] = e.model.Pool(row).(*kvcache.EntryCache)
		c.maxJobs[r] = mla.MaxCompressJobs(r, cfg.MaxSeqs, cfg.MaxTokens)
		c.planOff[r] = planBytes
		planBytes += align16(mla.CompressPlanBytes(cfg.MaxSeqs, c.maxJobs[r]))
	}
	c.slotRow = layout.Index(kvcache.DSv4StatePool(c.ratios[0]))
	c.slots = e.model.Pool(c.slotRow).(*kvcache.SlotPool)
	var err error
	if c.plan, err = alloc("compressor plans", planBytes, 0); err != nil {
		return err
	}
	if c.kg, err = alloc("compressor projections", cfg.MaxTokens*cfg.projRowElems()*4, 0); err != nil {
		return err
	}
	mostJobs := 0
	for _, r := range c.ratios {
		mostJobs = max(mostJobs, c.maxJobs[r])
	}
	if c.scratch, err = alloc("compressor scratch", mla.CompressScratchBytes(mostJobs), 0); err != nil {
		return err
	}
	if cfg.IndexerEnabled() {
		if c.idxScratch, err = alloc("indexer scratch", mla.CompressScratchBytes(c.maxJobs[kvcache.DSv4IndexerRatio]), 0); err != nil {
			return err
		}
	}
	for l := range cfg.Layers {
		r, _ := cfg.Model.CompressRatio(l)
		if compressor.Overlap(r) == 0 {
			continue
		}
		cl := &compLayer{ratio: r}
		if cfg.SyntheticWeights != nil {
			cl.norm = SyntheticCompressorNorm(cfg.SyntheticWeights.Seed, l)
		}
		w := compressor.Overlap(r) * compressor.Dim
		if proj != nil {
			p, norm, err := proj(l)
			if err != nil {
				return err
			}
			cl.norm = norm
			cl.projN = cfg.projN(r)
			raw := make([]byte, 0, cl.projN*cfg.Model.HiddenSize*2)
			raw = appendU16s(appendU16s(raw, p.WKV), p.WGate)
			what := fmt.Sprintf("layer %d compressor wkv and wgate", l)
			if cl.projN > 2*w {
				// The indexer's two bf16 projections of the same rows join
				// the GEMM (one GEMM of the three: 1.5 us added at 128 rows
				// against 12.1 for separate ones, BENCHMARKS.md); its host
				// weights stay per matrix for the CPU reference.
				iw := e.idxWeights[l]
				if err := checkIndexerWeights(l, iw, cfg.Model.HiddenSize, cfg.Model.QLoraRank); err != nil {
					return err
				}
				raw = appendU16s(appendU16s(raw, iw.Compressor.WKV.Data), iw.Compressor.WGate.Data)
				raw = appendU16s(raw, iw.WeightsProj.Data)
				what = fmt.Sprintf("layer %d projection weights (compressor wkv, wgate; indexer compressor wkv, wgate; weights_proj)", l)
			}
			if cl.wkvg, err = e.upload(alloc, what, raw); err != nil {
				return err
			}
			if cl.ape, err = e.upload(alloc, fmt.Sprintf("layer %d compressor ape", l), numerics.F32Bytes(p.APE)); err != nil {
				return err
			}
		}
		if cl.norm == nil { // the projected path: SetCompressorNorm sets it
			e.unset++
			if cl.normBuf, err = alloc(fmt.Sprintf("layer %d compressor norm weight", l), numerics.HeadDim*4, 0); err != nil {
				return err
			}
		} else {
			if err := cl.build(cfg, e.ropeHost[e.layerRope[l]]); err != nil {
				return fmt.Errorf("engine: layer %d compressor: %w", l, err)
			}
			if cl.normBuf, err = e.upload(alloc, fmt.Sprintf("layer %d compressor norm weight", l), numerics.F32Bytes(cl.norm)); err != nil {
				return err
			}
		}
		row := c.rows[slices.Index(c.ratios, r)]
		if cl.pool, err = alloc(fmt.Sprintf("layer %d ratio-%d compressed pool", l, r), layout.Units(row)*int(layout.UnitBytes(row)), 0); err != nil {
			return err
		}
		ringRows := mla.RingRows(r, c.cfg.MaxDrafts)
		if cl.ring, err = alloc(fmt.Sprintf("layer %d compressor states", l), c.slots.Slots()*ringRows*2*w*4, 0); err != nil {
			return err
		}
		if idx := layout.Index(kvcache.DSv4Indexer); idx >= 0 && r == kvcache.DSv4IndexerRatio {
			if cl.idxPool, err = alloc(fmt.Sprintf("layer %d indexer cache", l), layout.Units(idx)*int(layout.UnitBytes(idx)), 0); err != nil {
				return err
			}
			st := layout.Index(kvcache.DSv4IndexerState)
			if cl.idxRing, err = alloc(fmt.Sprintf("layer %d indexer states", l), layout.Units(st)*int(layout.UnitBytes(st)), 0); err != nil {
				return err
			}
		}
		c.layers[l] = cl
	}
	e.comp = c
	return nil
}

// upload allocates a buffer for raw and writes it.
func (e *Engine) upload(alloc func(what string, n int, fill byte) (mla.Buffer, error), what string, raw []byte) (mla.Buffer, error) {
	buf, err := alloc(what, len(raw), 0)
	if err != nil {
		return nil, err
	}
	if err := e.backend.Write(buf, 0, raw); err != nil {
		return nil, fmt.Errorf("engine: uploading the %s: %w", what, err)
	}
	return buf, nil
}

func appendU16s(dst []byte, v []uint16) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint16(dst, x)
	}
	return dst
}

func align16(n int) int { return (n + 15) &^ 15 }

// build makes the layer's compressor from its norm weight.
func (cl *compLayer) build(cfg Config, t *dsv4.RopeTable) error {
	l, err := compressor.NewLayer(compressor.Params{Ratio: cl.ratio, NormWeight: cl.norm, Eps: float32(cfg.Model.RMSNormEps),
		Rope: t, MaxDrafts: cfg.Compressor.MaxDrafts + 1})
	if err != nil {
		return err
	}
	cl.comp = l
	return nil
}

// width is the values of one K or G row.
func (cl *compLayer) width() int { return compressor.Overlap(cl.ratio) * compressor.Dim }

// SetCompressorNorm replaces a compressed layer's entry RMSNorm weight
// (compressor.norm.weight, 512 values). It must not run while an
// iteration is open. On the hidden-state path the checkpoint's weight is
// loaded already.
func (e *Engine) SetCompressorNorm(layer int, w []float32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrClosed
	}
	if e.open != nil {
		return fmt.Errorf("engine: SetCompressorNorm(%d) while iteration %d is open: %w", layer, e.open.index, ErrIterationOpen)
	}
	cl, err := e.compLayer(layer)
	if err != nil {
		return err
	}
	if len(w) != numerics.HeadDim {
		return fmt.Errorf("engine: SetCompressorNorm(%d): weight has %d values, want %d", layer, len(w), numerics.HeadDim)
	}
	if err := weights.CheckFinite(fmt.Sprintf("layer %d compressor norm weight", layer), w); err != nil {
		return fmt.Errorf("engine: SetCompressorNorm(%d): %w", layer, err)
	}
	old, oldComp := cl.norm, cl.comp
	cl.norm = slices.Clone(w)
	if err := cl.build(e.cfg, e.ropeHost[e.layerRope[layer]]); err != nil {
		cl.norm, cl.comp = old, oldComp
		return fmt.Errorf("engine: SetCompressorNorm(%d): %w", layer, err)
	}
	if err := e.backend.Write(cl.normBuf, 0, numerics.F32Bytes(cl.norm)); err != nil {
		cl.norm, cl.comp = old, oldComp
		return fmt.Errorf("engine: SetCompressorNorm(%d): %w", layer, err)
	}
	if old == nil && e.unset > 0 {
		e.unset--
	}
	return nil
}

// CompressorNorm returns a copy of a compressed layer's entry RMSNorm
// weight (compressor.norm.weight, 512 values) as the engine holds it: the
// checkpoint's, the synthetic one, or SetCompressorNorm's. One never set
// is an error wrapping ErrNoWeights.
func (d Debug) CompressorNorm(layer int) ([]float32, error) {
	e := d.e
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cl.norm == nil {
		return nil, fmt.Errorf("engine: layer %d compressor norm weight: %w", layer, ErrNoWeights)
	}
	return slices.Clone(cl.norm), nil
}

// compLayer returns a layer's compressor or says why there is none.
func (e *Engine) compLayer(layer int) (*compLayer, error) {
	if err := e.checkLayer(layer); err != nil {
		return nil, err
	}
	if e.comp == nil {
		return nil, fmt.Errorf("engine: layer %d: the compressor is off (Config.Compressor.Off, or no compressed layer)", layer)
	}
	cl := e.comp.layers[layer]
	if cl == nil {
		r, _ := e.cfg.Model.CompressRatio(layer)
		return nil, fmt.Errorf("engine: layer %d has compress ratio %d: no compressor", layer, r)
	}
	return cl, nil
}

// CompressorWidth returns the values of one K or G row of a compressed
// layer (coff*512), or 0 for a layer without a compressor.
func (e *Engine) CompressorWidth(layer int) int {
	if e.comp == nil || layer < 0 || layer >= len(e.comp.layers) || e.comp.layers[layer] == nil {
		return 0
	}
	return e.comp.layers[layer].width()
}

// CompressRatio returns a layer's compress ratio when its compressor runs,
// else 0.
func (e *Engine) CompressRatio(layer int) int {
	if e.CompressorWidth(layer) == 0 {
		return 0
	}
	return e.comp.layers[layer].ratio
}

// ReadCompressedPool returns a copy of a compressed layer's pool.
func (d Debug) ReadCompressedPool(layer int) ([]byte, error) {
	e := d.e
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	return e.readAll(cl.pool, fmt.Sprintf("layer %d compressed pool", layer))
}

// ReadCompressorSlot returns the ring slot of a compressed layer that the
// iteration writes for seq (a sequence of its batch): mla.RingRows rows of
// 2*Width float32, K then G, position p at row p mod RingRows. After the
// layer ran it holds the rows the sequence keeps.
func (d IterationDebug) ReadCompressorSlot(layer int, seq uint64) ([]byte, error) {
	it := d.it
	e := it.e
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	b := slices.Index(it.meta.Seqs, seq)
	if b < 0 || it.comp == nil {
		return nil, fmt.Errorf("engine: ReadCompressorSlot: sequence %d is not in iteration %d", seq, it.index)
	}
	n := mla.RingRows(cl.ratio, e.comp.cfg.MaxDrafts) * 2 * cl.width() * 4
	out := make([]byte, n)
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	slot := it.comp.slots.To(b)
	if err := e.backend.Read(out, cl.ring, int(slot)*n); err != nil {
		return nil, fmt.Errorf("engine: reading layer %d state slot %d: %w", layer, slot, err)
	}
	return out, nil
}

func (e *Engine) readAll(buf mla.Buffer, what string) ([]byte, error) {
	return e.readRange(buf, 0, buf.Len(), what)
}

// readRange reads n bytes of buf from off after the work issued so far.
func (e *Engine) readRange(buf mla.Buffer, off, n int, what string) ([]byte, error) {
	out := make([]byte, n)
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := e.backend.Read(out, buf, off); err != nil {
		return nil, fmt.Errorf("engine: reading the %s: %w", what, err)
	}
	return out, nil
}

// readRows reads rows [row, row+n) of a [.][hidden] bf16 weight.
func (e *Engine) readRows(buf mla.Buffer, row, n int, what string) ([]byte, error) {
	rb := e.cfg.Model.HiddenSize * 2
	return e.readRange(buf, row*rb, n*rb, what)
}

// CompressedBlockTable returns a copy of seq's pages in the compressed pool
// of a ratio, by entry index (page j holds entries [64j, 64j+64)).
func (d Debug) CompressedBlockTable(ratio int, seq uint64) ([]int32, error) {
	e := d.e
	if e.comp == nil || e.comp.entries[ratio] == nil {
		return nil, fmt.Errorf("engine: no compressed pool of ratio %d", ratio)
	}
	return e.comp.entries[ratio].Cache().BlockTable(seq)
}

// CompressedBlockTables returns copies of the open iteration's block
// tables of a compress ratio's pools, one row per batch sequence (in
// Metadata().Seqs order): the page of entry i is row[i/CompressedPageSize],
// for every entry up to the iteration's end, as Begin reserved them (a
// sequence of the ratio's layers that holds no entry has an empty row).
// The device copy is what Engine.Handoff's compressed block table holds.
func (d IterationDebug) CompressedBlockTables(ratio int) ([][]int32, error) {
	it := d.it
	e := it.e
	if it.done {
		return nil, fmt.Errorf("engine: CompressedBlockTables: iteration %d: %w", it.index, ErrIterationDone)
	}
	ri := -1
	if e.comp != nil {
		ri = slices.Index(e.comp.ratios, ratio)
	}
	if ri < 0 || it.comp == nil {
		return nil, fmt.Errorf("engine: CompressedBlockTables: no compressed pool of ratio %d", ratio)
	}
	rows := e.compressedTables(ri)
	out := make([][]int32, it.meta.NumSeqs)
	for b := range out {
		out[b] = slices.Clone(rows[b])
	}
	return out, nil
}

// CompressedEntries returns how many compressed entries of a ratio seq
// holds (committed iterations only): floor(length/ratio).
func (d Debug) CompressedEntries(ratio int, seq uint64) (int, error) {
	e := d.e
	if e.comp == nil || e.comp.entries[ratio] == nil {
		return 0, fmt.Errorf("engine: no compressed pool of ratio %d", ratio)
	}
	return e.comp.entries[ratio].Cache().Lookup(seq)
}

// CompressorState returns seq's compressor state in a layer (committed
// iterations only), read back from the backend.
func (d Debug) CompressorState(layer int, seq uint64) (*compressor.State, error) {
	e := d.e
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	slot, ok := e.comp.slots.Slot(seq)
	if !ok {
		return nil, fmt.Errorf("engine: CompressorState: %w %d", kvcache.ErrUnknownSequence, seq)
	}
	n, err := e.cache.Lookup(seq)
	if err != nil {
		return nil, fmt.Errorf("engine: CompressorState: %w", err)
	}
	rows := mla.RingRows(cl.ratio, e.comp.cfg.MaxDrafts)
	raw := make([]byte, rows*2*cl.width()*4)
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := e.backend.Read(raw, cl.ring, int(slot)*len(raw)); err != nil {
		return nil, fmt.Errorf("engine: CompressorState: reading layer %d slot %d: %w", layer, slot, err)
	}
	return cl.comp.StateFromRing(n, numerics.F32sFromBytes(raw))
}

// PoolUsage is one pool's occupancy, for a server's scheduler: a row of
// the cache model (Config.CacheLayout).
type PoolUsage = kvcache.PoolUsage

// Pools returns the occupancy of every pool of the cache model, in its
// rows' order: the SWA pool ("swa") and, with the compressor, each ratio's
// compressed pool ("ratio-4", "ratio-128"), the indexer's keys with the
// indexer on ("indexer": the ratio-4 page ids, so the ratio-4 free count)
// and the state slots ("state-4", "state-128", "indexer-state": one slot
// index per sequence in every compressed layer, so they share their
// count, of sequences: PoolUsage.Slots).
func (e *Engine) Pools() []PoolUsage { return e.model.Usage() }

// iterComp is an iteration's compressor bookkeeping.
type iterComp struct {
	slots     *kvcache.SlotReservation // per batch index: the slot read (From) and written (To)
	inputs    int                      // layer of the last SetCompressorInputs, -1 before any
	projected int                      // layer of the last StageCompressorGEMM, -1 before any
}

// beginCompressor checks the batch against the compressor and takes the
// block tables of each ratio from the cache model's reservation. Called
// with e.mu held, after the reservation; on an error the caller rolls it
// back.
func (e *Engine) beginCompressor(reqs []metadata.Request, mres *kvcache.ModelReservation, numSeqs int) (*iterComp, error) {
	c := e.comp
	for _, r := range reqs {
		if r.Phase == metadata.Generation && r.MTP > c.cfg.MaxDrafts {
			return nil, fmt.Errorf("engine: Begin: %w: sequence %d has %d MTP drafts, more than Compressor.MaxDrafts = %d",
				ErrBatchTooLarge, r.Seq, r.MTP, c.cfg.MaxDrafts)
		}
	}
	ic := &iterComp{slots: mres.Row(c.slotRow).(*kvcache.SlotReservation), inputs: -1, projected: -1}
	if len(c.tables) != len(c.ratios) {
		c.tables, c.tableBuf = make([][][]int32, len(c.ratios)), make([][]int32, len(c.ratios))
	}
	for ri, r := range c.ratios {
		res := mres.Row(c.rows[ri]).(*kvcache.EntryReservation)
		// The block tables with the reservation, appended one after the
		// other into reused memory, then cut into rows (an append may move
		// the memory, so the rows are cut once it is complete).
		buf, tables := c.tableBuf[ri][:0], c.tables[ri][:0]
		ends := c.rowEnds[:0]
		for i := range numSeqs {
			var err error
			if buf, err = res.AppendBlockTable(buf, i); err != nil {
				return nil, fmt.Errorf("engine: Begin: ratio-%d compressed pool: %w", r, err)
			}
			ends = append(ends, len(buf))
		}
		start := 0
		for _, end := range ends {
			tables = append(tables, buf[start:end:end])
			start = end
		}
		c.tableBuf[ri], c.tables[ri], c.rowEnds = buf, tables, ends
	}
	return ic, nil
}

// planCompressor writes each ratio's plan of the built batch to the
// backend: the sequences' rows and slots (the cache model's slot
// reservation: a new sequence a fresh slot; a chunk too long to add in
// place, after earlier tokens, a fresh one too, so an aborted chunk leaves
// its old state whole) and the entries to emit. Called with e.mu held,
// after beginCompressor.
func (e *Engine) planCompressor(ic *iterComp, m *metadata.Metadata) error {
	c := e.comp
	// The plan and its bytes reuse the last iteration's memory (Begin is
	// on every step's path). On an mla.AsyncWriter backend the bytes are
	// its staging memory, copied without a wait: the last iteration's copy
	// may still read them until WaitWrites returns (free when End or
	// Abort waited for the device since).
	aw, async := e.backend.(mla.AsyncWriter)
	if c.planRaw == nil {
		if async {
			raw, err := aw.AllocStaging(c.plan.Len())
			if err != nil {
				return fmt.Errorf("engine: Begin: staging memory for the compressor plans: %w", err)
			}
			c.planRaw = raw
		} else {
			c.planRaw = make([]byte, c.plan.Len())
		}
	} else if async {
		if err := aw.WaitWrites(c.planRaw); err != nil {
			return fmt.Errorf("engine: Begin: waiting for the last compressor plans' copy: %w", err)
		}
	}
	p := &c.planScratch
	for ri, r := range c.ratios {
		p.Seqs, p.Jobs = p.Seqs[:0], p.Jobs[:0]
		tables := c.tables[ri]
		for b := range m.NumSeqs {
			p.Seqs = append(p.Seqs, mla.CompressPlanSeq{Row: int(m.CuQ[b]), Rows: int(m.QLen[b]), Start: int(m.Cached[b]),
				From: int(ic.slots.From(b)), To: int(ic.slots.To(b))})
			if err := p.PlanEntries(b, r, int(m.Cached[b]), int(m.QLen[b]), tables[b], CompressedPageSize, c.cfg.pagesFor(r)); err != nil {
				return fmt.Errorf("engine: Begin: %w", err)
			}
		}
		off := c.planOff[r]
		if err := p.EncodeTo(c.planRaw[off:off+mla.CompressPlanBytes(e.cfg.MaxSeqs, c.maxJobs[r])], e.cfg.MaxSeqs, c.maxJobs[r]); err != nil {
			return fmt.Errorf("engine: Begin: %w", err)
		}
	}
	write := e.backend.Write
	if async {
		write = aw.WriteAsync
	}
	if err := write(c.plan, 0, c.planRaw); err != nil {
		return fmt.Errorf("engine: Begin: uploading the compressor plans: %w", err)
	}
	return nil
}

// compressorWeights returns a layer's compressor projection and entry norm
// weight as the chain's weight source read them.
func (e *Engine) compressorWeights(layer int) (*compressor.Projection, []float32, error) {
	w := e.compWeights[layer]
	if w == nil {
		return nil, nil, fmt.Errorf("engine: layer %d: the weights have no compressor (compressor.wkv, wgate, ape, norm)", layer)
	}
	p := &compressor.Projection{Ratio: w.Ratio, Hidden: e.cfg.Model.HiddenSize, WKV: w.WKV.Data, WGate: w.WGate.Data, APE: w.APE}
	if err := p.Validate(); err != nil {
		return nil, nil, fmt.Errorf("engine: layer %d: %w", layer, err)
	}
	return p, w.Norm, nil
}

// CompressorProjection returns host copies of a compressed layer's
// projection weights as the backend holds them (Config.Input = hidden), for
// a verifier that bounds another backend's projections (package gemm).
func (d Debug) CompressorProjection(layer int) (*compressor.Projection, error) {
	e := d.e
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	if cl.wkvg == nil {
		return nil, fmt.Errorf("engine: CompressorProjection(%d): Config.Input is %v; the projection weights need Config.Input = hidden", layer, e.cfg.Input)
	}
	raw, err := e.readRows(cl.wkvg, 0, 2*cl.width(), fmt.Sprintf("layer %d compressor wkv and wgate", layer))
	if err != nil {
		return nil, err
	}
	ape, err := e.readAll(cl.ape, fmt.Sprintf("layer %d compressor ape", layer))
	if err != nil {
		return nil, err
	}
	half := len(raw) / 4
	u16 := func(b []byte) []uint16 {
		out := make([]uint16, len(b)/2)
		for i := range out {
			out[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
		return out
	}
	return &compressor.Projection{Ratio: cl.ratio, Hidden: e.cfg.Model.HiddenSize, WKV: u16(raw[:2*half]), WGate: u16(raw[2*half:]),
		APE: numerics.F32sFromBytes(ape)}, nil
}

// SetCompressorInputs gives a compressed layer's compressor projections on
// the projected path (Config.Input = projected): k and g hold Tokens() rows
// of CompressorWidth(layer) little-endian float32 values each, K[t] = x_t .
// wkv^T and G[t] = x_t . wgate^T + ape[pos mod r] (DESIGN.md section 8).
// RunLayer of that layer consumes them. It first waits for the launches
// already issued, which read the same buffer.
func (it *Iteration) SetCompressorInputs(layer int, k, g []byte) error {
	if err := it.check(layer); err != nil {
		return err
	}
	e := it.e
	cl, err := e.compLayer(layer)
	if err != nil {
		return fmt.Errorf("engine: SetCompressorInputs: %w", err)
	}
	if e.chain != nil {
		return fmt.Errorf("engine: SetCompressorInputs(layer %d): Config.Input is hidden: the engine projects the hidden states itself", layer)
	}
	row := cl.width() * 4
	want := it.meta.Tokens * row
	if len(k) != want || len(g) != want {
		return fmt.Errorf("engine: SetCompressorInputs(layer %d): k has %d bytes and g %d, %d tokens of %d float32 need %d each",
			layer, len(k), len(g), it.meta.Tokens, cl.width(), want)
	}
	raw := make([]byte, 0, 2*want)
	for t := range it.meta.Tokens {
		raw = append(append(raw, k[t*row:(t+1)*row]...), g[t*row:(t+1)*row]...)
	}
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return fmt.Errorf("engine: SetCompressorInputs(layer %d): waiting for earlier launches: %w", layer, err)
	}
	if err := e.backend.Write(e.comp.kg, 0, raw); err != nil {
		return fmt.Errorf("engine: SetCompressorInputs(layer %d): %w", layer, err)
	}
	it.comp.inputs = layer
	return nil
}

// compressorReady says why RunLayer of a compressed layer cannot run yet
// (the projected path without SetCompressorInputs), or nil.
func (it *Iteration) compressorReady(layer int) error {
	e := it.e
	if e.comp == nil || e.comp.layers[layer] == nil || e.chain != nil {
		return nil
	}
	if it.comp.inputs != layer {
		return fmt.Errorf("layer %d is a ratio-%d layer: its compressor needs SetCompressorInputs(%d, ...) first", layer, e.comp.layers[layer].ratio, layer)
	}
	return nil
}

// compressProject issues a compressed layer's projection GEMM over rows
// hidden rows (Input = hidden): [K | G without ape] into the projection
// buffer, rows of projN values; in a ratio-4 layer with the indexer the
// same GEMM writes the indexer compressor's [K | G] and weights_proj's
// output after them (the columns of indexerKGCol and indexerWPCol). Other
// layers issue nothing.
func (e *Engine) compressProject(ctx context.Context, layer, rows int) error {
	cl := e.comp.layers[layer]
	if cl == nil || e.chain == nil {
		return nil
	}
	return e.comp.gemm.BF16GEMM(ctx, &mla.BF16GEMMArgs{Rows: rows, N: cl.projN, K: e.cfg.Model.HiddenSize,
		X: e.chain.hidden, XStride: e.cfg.Model.HiddenSize, W: cl.wkvg, Y: e.comp.kg, YStride: cl.projN})
}

// compressStep issues a compressed layer's compressor step (the entries and
// the kept rows) from the projection buffer, with the iteration's plan.
func (e *Engine) compressStep(ctx context.Context, layer int) error {
	c := e.comp
	cl := c.layers[layer]
	if cl == nil {
		return nil
	}
	a := e.args[layer]
	return c.stepper.CompressStep(ctx, &mla.CompressStepArgs{
		Ratio: cl.ratio, KG: c.kg, KGRows: e.cfg.MaxTokens, KGStride: cl.projN, APE: cl.ape,
		Ring: cl.ring, RingRows: mla.RingRows(cl.ratio, c.cfg.MaxDrafts), Slots: c.slots.Slots(),
		Plan: c.plan, PlanOffset: c.planOff[cl.ratio], MaxSeqs: e.cfg.MaxSeqs, MaxJobs: c.maxJobs[cl.ratio],
		NormWeight: cl.normBuf, Eps: float32(e.cfg.Model.RMSNormEps), Rope: a.Rope, RopePositions: a.RopePositions,
		Pool: cl.pool, PageSize: CompressedPageSize, NumPages: c.cfg.pagesFor(cl.ratio), Scratch: c.scratch,
	})
}

// compressLayer issues a compressed layer's whole compressor: the
// projection GEMM (with the indexer's projections in a ratio-4 layer) and
// the steps, on the side stream when the backend has one (the caller joins
// it with the KV prologue's join), else in order.
func (e *Engine) compressLayer(ctx context.Context, layer, rows int) (onSide bool, err error) {
	c := e.comp
	if c == nil || c.layers[layer] == nil {
		return false, nil
	}
	run := func() error {
		if err := e.compressProject(ctx, layer, rows); err != nil {
			return fmt.Errorf("compressor projection: %w", err)
		}
		if c.side != nil && e.indexerOnAux(layer) {
			// The third stream's indexer query step reads weights_proj's
			// columns of this GEMM's output (runChain).
			if err := e.chain.aux.MarkSide(ctx); err != nil {
				return fmt.Errorf("compressor projection: %w", err)
			}
		}
		if err := e.compressStep(ctx, layer); err != nil {
			return fmt.Errorf("compressor step: %w", err)
		}
		return e.indexerKeys(ctx, layer)
	}
	if c.side != nil {
		return true, c.side.Side(ctx, run)
	}
	return false, run()
}

// CheckInvariants verifies the engine's bookkeeping between iterations,
// the cache model's (kvcache.Model.CheckInvariants): each pool's own
// invariants (with a window, exactly the pages of the last Window
// positions held); with the compressor, every live sequence has
// floor(len/r) entries in each ratio's pool and a state slot of its own,
// every other slot is free, and no other sequence holds entries or a slot
// (nothing leaks when sequences finish).
func (d Debug) CheckInvariants() error {
	e := d.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.open != nil {
		return fmt.Errorf("engine: CheckInvariants while iteration %d is open: %w", e.open.index, ErrIterationOpen)
	}
	return e.model.CheckInvariants()
}

// CompressorSequences returns the sequences the compressor holds a state
// slot for (0 when it is off).
func (d Debug) CompressorSequences() int {
	e := d.e
	if e.comp == nil {
		return 0
	}
	return e.comp.slots.Sequences()
}
