package engine

import (
	"context"
	"encoding/binary"
	"errors"
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
)

// CompressedPageSize is the entries of one compressed-cache page: 64
// entries of 584 bytes in the fp8_ue8m0 layout (a ratio-4 page covers 256
// tokens, a ratio-128 page 8192).
const CompressedPageSize = 64

// DefaultMaxDrafts is CompressorConfig.MaxDrafts's default.
const DefaultMaxDrafts = 7

// CompressorConfig turns on DSv4's KV compressor and its compressed caches
// (DESIGN.md section 8) in every layer whose compress ratio is 4 or 128.
type CompressorConfig struct {
	// Enabled runs the compressor; false (the zero value) keeps the engine
	// a plain KV prologue.
	Enabled bool
	// Ratio4Pages and Ratio128Pages are the pages of each ratio's
	// compressed pool (CompressedPageSize entries each). Every layer of a
	// ratio has its own pool of that size; the block tables (by entry
	// index) are shared by the layers of the ratio. A ratio the engine's
	// layers use needs at least 1; one they do not use must be 0.
	Ratio4Pages, Ratio128Pages int
	// MaxDrafts is the most MTP drafts of a generation step (a deeper step
	// is refused): each state keeps that many positions more, so Accept can
	// roll a step back. 0 = DefaultMaxDrafts; at most
	// compressor.MaxDraftsLimit - 1.
	MaxDrafts int
	// MaxSequences bounds the live sequences the compressor holds state
	// for (host memory, Layer.StateBytes per sequence and compressed
	// layer); a batch that would create more is refused with ErrCacheFull
	// naming the state. 0 = 2*MaxSeqs.
	MaxSequences int
}

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

// resolveCompressor checks Compressor against the layers and fills its
// defaults. A resolved config's layers all have a compressor or ratio 0.
func (c Config) resolveCompressor() (Config, error) {
	cc := &c.Compressor
	if !cc.Enabled {
		if *cc != (CompressorConfig{}) {
			return c, fieldError("Compressor.Enabled", "false, but other Compressor fields are set (%+v): set Enabled, or leave them zero", *cc)
		}
		return c, nil
	}
	for l := range c.Layers {
		r, err := c.Model.CompressRatio(l)
		if err != nil {
			return c, &ConfigError{Field: "Model", Err: err}
		}
		if r != 0 && compressor.Overlap(r) == 0 {
			return c, fieldError("Compressor.Enabled", "layer %d has compress ratio %d, which has no compressor (want 0, 4 or 128)", l, r)
		}
	}
	ratios := c.compressedRatios()
	for _, r := range []int{4, 128} {
		n := cc.pagesFor(r)
		used := slices.Contains(ratios, r)
		switch {
		case n < 0 || n > math.MaxInt32:
			return c, fieldError(pagesField(r), "%d, must be in [0, %d]", n, math.MaxInt32)
		case used && n == 0:
			return c, fieldError(pagesField(r), "0, but the engine's layers include ratio-%d layers: give their compressed pool at least 1 page", r)
		case !used && n != 0:
			return c, fieldError(pagesField(r), "%d, but no layer of the engine has ratio %d: leave it 0", n, r)
		}
	}
	if cc.MaxDrafts == 0 {
		cc.MaxDrafts = DefaultMaxDrafts
	}
	if cc.MaxDrafts < 0 || cc.MaxDrafts >= compressor.MaxDraftsLimit {
		return c, fieldError("Compressor.MaxDrafts", "%d, must be in [1, %d] (0: %d)", cc.MaxDrafts, compressor.MaxDraftsLimit-1, DefaultMaxDrafts)
	}
	if cc.MaxSequences == 0 {
		cc.MaxSequences = 2 * c.MaxSeqs
	}
	if cc.MaxSequences < 0 || cc.MaxSequences > 1<<20 {
		return c, fieldError("Compressor.MaxSequences", "%d, must be in [1, %d] (0: 2*MaxSeqs)", cc.MaxSequences, 1<<20)
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
}

// Total is the sum of the parts.
func (m SequenceMemory) Total() int64 {
	t := addSat(m.SWA, m.State)
	for _, b := range m.Ratio {
		t = addSat(t, b)
	}
	return t
}

// SequenceMemory returns what a sequence of length tokens holds between
// iterations, in whole pages, for a server's scheduler: SWA pages (with a
// window, at most ceil(W/P)+1 per layer), compressed pages per ratio and
// the compressor states.
func (c Config) SequenceMemory(length int) (SequenceMemory, error) {
	r, err := c.resolve(false)
	if err != nil {
		return SequenceMemory{}, err
	}
	if length < 0 {
		return SequenceMemory{}, fmt.Errorf("engine: SequenceMemory: length %d is negative", length)
	}
	m := SequenceMemory{Length: length, Ratio: map[int]int64{}}
	m.SWA = mulSat(int64(r.Layers), mulSat(int64(r.Cache.LivePages(length)), int64(r.Cache.PageBytes())))
	if !r.Compressor.Enabled {
		return m, nil
	}
	pageBytes := int64(kvcache.FormatFP8UE8M0.PageBytes(CompressedPageSize))
	for l := range r.Layers {
		ratio, _ := r.Model.CompressRatio(l)
		if compressor.Overlap(ratio) == 0 {
			continue
		}
		entries := length / ratio
		pages := int64((entries + CompressedPageSize - 1) / CompressedPageSize)
		m.Ratio[ratio] = addSat(m.Ratio[ratio], mulSat(pages, pageBytes))
		m.State = addSat(m.State, stateBytes(ratio, r.Compressor.MaxDrafts))
	}
	return m, nil
}

// compressState is what the compressor adds to an engine. The states live
// on the backend: each compressed layer has a ring of Compressor.MaxSequences
// slots (mla.CompressStepArgs), and every live sequence holds one slot
// index, the same in every layer. The host keeps only the slot of each
// sequence; a sequence's length is the KV cache's.
type compressState struct {
	cfg     CompressorConfig
	ratios  []int
	caches  map[int]*kvcache.Cache // entry bookkeeping per ratio
	layers  []*compLayer           // per engine layer; nil for ratio 0
	stepper mla.CompressStepper
	gemm    mla.BF16GEMMBackend // Input = hidden: the projection GEMM
	side    mla.SideRunner      // nil: the compressor runs in order on the main stream
	// The ring slots. Guarded by Engine.mu; an iteration's sequences are
	// only touched by the step loop.
	slots map[uint64]int32 // live sequence -> its slot
	free  []int32          // slots no sequence holds (a stack)
	// plan holds each ratio's plan of the open iteration at planOff[ratio],
	// encoded for MaxSeqs sequences and maxJobs[ratio] entries.
	plan    mla.Buffer
	planOff map[int]int
	maxJobs map[int]int
	// planRaw and planScratch are Begin's reused host memory for the plans.
	planRaw     []byte
	planScratch mla.CompressPlan
	// Begin's reused memory for the reservations: the needs of one ratio,
	// and per ratio (index in ratios) the block tables of the batch, rows
	// of tableBuf ending at rowEnds.
	needScratch []kvcache.Need
	tables      [][][]int32
	tableBuf    [][]int32
	rowEnds     []int
	// kg holds the projections of the layer running: MaxTokens rows of
	// 2*Width float32 (K then G) of that layer, sized for the widest.
	kg mla.Buffer
	// scratch is the steps' working memory, for the most entries of any
	// ratio (mla.CompressScratchBytes).
	scratch mla.Buffer
}

// compLayer is one compressed layer's compressor.
type compLayer struct {
	ratio   int
	comp    *compressor.Layer // the entry math's parameters (norm, eps, RoPE): reads the states back
	norm    []float32         // the entry RMSNorm weight
	normBuf mla.Buffer        // its backend copy
	wkvg    mla.Buffer        // Input = hidden: [2*Width][hidden] bf16, wkv's rows then wgate's
	ape     mla.Buffer        // Input = hidden: [ratio][Width] float32
	ring    mla.Buffer        // the states: slots of RingRows rows of 2*Width float32
	pool    mla.Buffer        // the compressed pool
}

// DefaultCompressorNorm is a compressed layer's entry RMSNorm weight on the
// projected path until SetCompressorNorm replaces it: DefaultLayerWeight's
// recipe on its own stream, (seed, layer + 2^32).
func DefaultCompressorNorm(seed uint64, layer int) []float32 {
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
	c := &compressState{cfg: cfg.Compressor, ratios: cfg.compressedRatios(), caches: map[int]*kvcache.Cache{},
		layers: make([]*compLayer, cfg.Layers), stepper: stepper, slots: map[uint64]int32{},
		planOff: map[int]int{}, maxJobs: map[int]int{}}
	if proj != nil {
		if c.gemm, ok = e.backend.(mla.BF16GEMMBackend); !ok {
			return fmt.Errorf("engine: Config.Compressor with Input = hidden: backend %s does not run the projection GEMM (mla.BF16GEMMBackend)", e.backend.Name())
		}
		if _, fork := e.backend.(mla.KVForker); fork {
			c.side, _ = e.backend.(mla.SideRunner)
		}
	}
	for n := c.cfg.MaxSequences - 1; n >= 0; n-- {
		c.free = append(c.free, int32(n))
	}
	planBytes, width := 0, 0
	for _, r := range c.ratios {
		cache, err := kvcache.New(kvcache.Config{PageSize: CompressedPageSize, NumPages: c.cfg.pagesFor(r)})
		if err != nil {
			return &ConfigError{Field: pagesField(r), Err: err}
		}
		c.caches[r] = cache
		c.maxJobs[r] = mla.MaxCompressJobs(r, cfg.MaxSeqs, cfg.MaxTokens)
		c.planOff[r] = planBytes
		planBytes += align16(mla.CompressPlanBytes(cfg.MaxSeqs, c.maxJobs[r]))
		width = max(width, compressor.Overlap(r)*compressor.Dim)
	}
	var err error
	if c.plan, err = alloc("compressor plans", planBytes, 0); err != nil {
		return err
	}
	if c.kg, err = alloc("compressor projections", cfg.MaxTokens*2*width*4, 0); err != nil {
		return err
	}
	mostJobs := 0
	for _, r := range c.ratios {
		mostJobs = max(mostJobs, c.maxJobs[r])
	}
	if c.scratch, err = alloc("compressor scratch", mla.CompressScratchBytes(mostJobs), 0); err != nil {
		return err
	}
	for l := range cfg.Layers {
		r, _ := cfg.Model.CompressRatio(l)
		if compressor.Overlap(r) == 0 {
			continue
		}
		cl := &compLayer{ratio: r, norm: DefaultCompressorNorm(cfg.WeightSeed, l)}
		w := compressor.Overlap(r) * compressor.Dim
		if proj != nil {
			p, norm, err := proj(l)
			if err != nil {
				return err
			}
			cl.norm = norm
			raw := make([]byte, 0, 2*len(p.WKV)*2)
			raw = appendU16s(appendU16s(raw, p.WKV), p.WGate)
			if cl.wkvg, err = e.upload(alloc, fmt.Sprintf("layer %d compressor wkv and wgate", l), raw); err != nil {
				return err
			}
			if cl.ape, err = e.upload(alloc, fmt.Sprintf("layer %d compressor ape", l), numerics.F32Bytes(p.APE)); err != nil {
				return err
			}
		}
		if err := cl.build(cfg, e.ropeHost[e.layerRope[l]]); err != nil {
			return fmt.Errorf("engine: layer %d compressor: %w", l, err)
		}
		if cl.normBuf, err = e.upload(alloc, fmt.Sprintf("layer %d compressor norm weight", l), numerics.F32Bytes(cl.norm)); err != nil {
			return err
		}
		pages := c.cfg.pagesFor(r)
		if cl.pool, err = alloc(fmt.Sprintf("layer %d ratio-%d compressed pool", l, r), pages*kvcache.FormatFP8UE8M0.PageBytes(CompressedPageSize), 0); err != nil {
			return err
		}
		ringRows := mla.RingRows(r, c.cfg.MaxDrafts)
		if cl.ring, err = alloc(fmt.Sprintf("layer %d compressor states", l), c.cfg.MaxSequences*ringRows*2*w*4, 0); err != nil {
			return err
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
func (cl *compLayer) width() int { return cl.comp.Width() }

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
	old := cl.norm
	cl.norm = slices.Clone(w)
	if err := cl.build(e.cfg, e.ropeHost[e.layerRope[layer]]); err != nil {
		cl.norm = old
		return fmt.Errorf("engine: SetCompressorNorm(%d): %w", layer, err)
	}
	if err := e.backend.Write(cl.normBuf, 0, numerics.F32Bytes(cl.norm)); err != nil {
		cl.norm = old
		return errors.Join(fmt.Errorf("engine: SetCompressorNorm(%d): %w", layer, err), cl.build(e.cfg, e.ropeHost[e.layerRope[layer]]))
	}
	return nil
}

// compLayer returns a layer's compressor or says why there is none.
func (e *Engine) compLayer(layer int) (*compLayer, error) {
	if err := e.checkLayer(layer); err != nil {
		return nil, err
	}
	if e.comp == nil {
		return nil, fmt.Errorf("engine: layer %d: the compressor is off (Config.Compressor.Enabled)", layer)
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
func (e *Engine) ReadCompressedPool(layer int) ([]byte, error) {
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
func (it *Iteration) ReadCompressorSlot(layer int, seq uint64) ([]byte, error) {
	e := it.e
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	b := slices.Index(it.meta.Seqs, seq)
	if b < 0 || it.comp == nil || it.comp.to == nil {
		return nil, fmt.Errorf("engine: ReadCompressorSlot: sequence %d is not in iteration %d", seq, it.index)
	}
	n := mla.RingRows(cl.ratio, e.comp.cfg.MaxDrafts) * 2 * cl.width() * 4
	out := make([]byte, n)
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := e.backend.Read(out, cl.ring, int(it.comp.to[b])*n); err != nil {
		return nil, fmt.Errorf("engine: reading layer %d state slot %d: %w", layer, it.comp.to[b], err)
	}
	return out, nil
}

func (e *Engine) readAll(buf mla.Buffer, what string) ([]byte, error) {
	out := make([]byte, buf.Len())
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := e.backend.Read(out, buf, 0); err != nil {
		return nil, fmt.Errorf("engine: reading the %s: %w", what, err)
	}
	return out, nil
}

// CompressedBlockTable returns a copy of seq's pages in the compressed pool
// of a ratio, by entry index (page j holds entries [64j, 64j+64)).
func (e *Engine) CompressedBlockTable(ratio int, seq uint64) ([]int32, error) {
	if e.comp == nil || e.comp.caches[ratio] == nil {
		return nil, fmt.Errorf("engine: no compressed pool of ratio %d", ratio)
	}
	return e.comp.caches[ratio].BlockTable(seq)
}

// CompressedEntries returns how many compressed entries of a ratio seq
// holds (committed iterations only): floor(length/ratio).
func (e *Engine) CompressedEntries(ratio int, seq uint64) (int, error) {
	if e.comp == nil || e.comp.caches[ratio] == nil {
		return 0, fmt.Errorf("engine: no compressed pool of ratio %d", ratio)
	}
	return e.comp.caches[ratio].Lookup(seq)
}

// CompressorState returns seq's compressor state in a layer (committed
// iterations only), read back from the backend.
func (e *Engine) CompressorState(layer int, seq uint64) (*compressor.State, error) {
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	slot, ok := e.comp.slots[seq]
	e.mu.Unlock()
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

// PoolUsage is one pool's occupancy, for a server's scheduler.
type PoolUsage struct {
	Name      string // "swa" or "ratio-4" / "ratio-128"
	Layers    int    // layers with a pool of this kind (each holds Pages pages)
	Pages     int    // pages per layer
	PageBytes int
	Free      int // pages no sequence holds
}

// Pools returns the occupancy of every pool: the SWA pool and, with the
// compressor, each ratio's compressed pool.
func (e *Engine) Pools() []PoolUsage {
	out := []PoolUsage{{Name: "swa", Layers: e.cfg.Layers, Pages: e.cfg.Cache.NumPages, PageBytes: e.cfg.Cache.PageBytes(), Free: e.cache.FreePages()}}
	if e.comp == nil {
		return out
	}
	for _, r := range e.comp.ratios {
		n := 0
		for _, cl := range e.comp.layers {
			if cl != nil && cl.ratio == r {
				n++
			}
		}
		c := e.comp.caches[r]
		out = append(out, PoolUsage{Name: fmt.Sprintf("ratio-%d", r), Layers: n, Pages: c.Config().NumPages,
			PageBytes: c.Config().PageBytes(), Free: c.FreePages()})
	}
	return out
}

// iterComp is an iteration's compressor bookkeeping.
type iterComp struct {
	res       []*kvcache.Reservation // per ratio, by index in compressState.ratios
	from      []int32                // per batch index: the slot the sequence's state is read from
	to        []int32                // per batch index: the slot it is written to (!= from: a fresh one)
	taken     []int32                // slots taken from the free list by this iteration
	inputs    int                    // layer of the last SetCompressorInputs, -1 before any
	projected int                    // layer of the last StageCompressorGEMM, -1 before any
}

// beginCompressor reserves the compressed entries of the batch, all
// ratios or none. Called with e.mu held, after the KV reservation; on an
// error nothing of the compressor changed.
func (e *Engine) beginCompressor(reqs []metadata.Request, numSeqs int, needs []metadata.Need) (_ *iterComp, err error) {
	c := e.comp
	for _, r := range reqs {
		if r.Phase == metadata.Generation && r.MTP > c.cfg.MaxDrafts {
			return nil, fmt.Errorf("engine: Begin: %w: sequence %d has %d MTP drafts, more than Compressor.MaxDrafts = %d",
				ErrBatchTooLarge, r.Seq, r.MTP, c.cfg.MaxDrafts)
		}
	}
	ic := &iterComp{res: make([]*kvcache.Reservation, 0, len(c.ratios)), inputs: -1, projected: -1}
	defer func() {
		if err != nil {
			for _, res := range ic.res {
				res.Rollback()
			}
		}
	}()
	if len(c.tables) != len(c.ratios) {
		c.tables, c.tableBuf = make([][][]int32, len(c.ratios)), make([][]int32, len(c.ratios))
	}
	for ri, r := range c.ratios {
		kn := c.needScratch[:0]
		for _, n := range needs {
			kn = append(kn, kvcache.Need{ID: n.Seq, NewLength: n.Length / r, Create: n.Create})
		}
		c.needScratch = kn
		res, err := c.caches[r].Reserve(kn)
		if err != nil {
			return nil, fmt.Errorf("engine: Begin: ratio-%d compressed pool: %w", r, err)
		}
		ic.res = append(ic.res, res)
		// The block tables with the reservation, appended one after the
		// other into reused memory, then cut into rows (an append may move
		// the memory, so the rows are cut once it is complete).
		buf, tables := c.tableBuf[ri][:0], c.tables[ri][:0]
		ends := c.rowEnds[:0]
		for i := range needs {
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

// planCompressor gives each sequence of the built batch its slots (a new
// sequence a fresh one; a chunk too long to add in place, after earlier
// tokens, a fresh one too, so an aborted chunk leaves its old state whole)
// and writes each ratio's plan to the backend. Called with e.mu held, after
// beginCompressor; on an error undoBeginCompressor undoes both.
func (e *Engine) planCompressor(ic *iterComp, m *metadata.Metadata) error {
	c := e.comp
	inPlace := mla.InPlaceRows(4, mla.RingRows(4, c.cfg.MaxDrafts)) // the same for every ratio: 1 + MaxDrafts
	need := 0
	for b := range m.NumSeqs {
		_, live := c.slots[m.Seqs[b]]
		if !live || (m.Cached[b] > 0 && int(m.QLen[b]) > inPlace) {
			need++
		}
	}
	if need > len(c.free) {
		return fmt.Errorf("engine: Begin: compressor state: %w: the batch needs %d free state slots (new sequences, and chunks of more than %d tokens after earlier ones), %d of Compressor.MaxSequences = %d are free",
			kvcache.ErrCacheFull, need, inPlace, len(c.free), c.cfg.MaxSequences)
	}
	ic.from, ic.to = make([]int32, m.NumSeqs), make([]int32, m.NumSeqs)
	take := func() int32 {
		s := c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
		ic.taken = append(ic.taken, s)
		return s
	}
	for b := range m.NumSeqs {
		slot, live := c.slots[m.Seqs[b]]
		switch {
		case !live:
			slot = take()
			ic.from[b], ic.to[b] = slot, slot
		case m.Cached[b] > 0 && int(m.QLen[b]) > inPlace:
			ic.from[b], ic.to[b] = slot, take()
		default:
			ic.from[b], ic.to[b] = slot, slot
		}
	}
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
			p.Seqs = append(p.Seqs, mla.CompressPlanSeq{Row: int(m.CuQ[b]), Rows: int(m.QLen[b]), Start: int(m.Cached[b]), From: int(ic.from[b]), To: int(ic.to[b])})
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

// undoBeginCompressor undoes beginCompressor and planCompressor when Begin
// fails after them. Called with e.mu held.
func (e *Engine) undoBeginCompressor(ic *iterComp) {
	for _, res := range ic.res {
		res.Rollback()
	}
	e.returnSlots(ic)
}

// returnSlots gives the iteration's fresh slots back.
func (e *Engine) returnSlots(ic *iterComp) {
	for i := len(ic.taken) - 1; i >= 0; i-- {
		e.comp.free = append(e.comp.free, ic.taken[i])
	}
	ic.taken = nil
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
func (e *Engine) CompressorProjection(layer int) (*compressor.Projection, error) {
	cl, err := e.compLayer(layer)
	if err != nil {
		return nil, err
	}
	if cl.wkvg == nil {
		return nil, fmt.Errorf("engine: CompressorProjection(%d): Config.Input is %v; the projection weights need Config.Input = hidden", layer, e.cfg.Input)
	}
	raw, err := e.readAll(cl.wkvg, fmt.Sprintf("layer %d compressor wkv and wgate", layer))
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
// buffer. Other layers issue nothing.
func (e *Engine) compressProject(ctx context.Context, layer, rows int) error {
	cl := e.comp.layers[layer]
	if cl == nil || e.chain == nil {
		return nil
	}
	w := cl.width()
	return e.comp.gemm.BF16GEMM(ctx, &mla.BF16GEMMArgs{Rows: rows, N: 2 * w, K: e.cfg.Model.HiddenSize,
		X: e.chain.hidden, XStride: e.cfg.Model.HiddenSize, W: cl.wkvg, Y: e.comp.kg, YStride: 2 * w})
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
		Ratio: cl.ratio, KG: c.kg, KGRows: e.cfg.MaxTokens, APE: cl.ape,
		Ring: cl.ring, RingRows: mla.RingRows(cl.ratio, c.cfg.MaxDrafts), Slots: c.cfg.MaxSequences,
		Plan: c.plan, PlanOffset: c.planOff[cl.ratio], MaxSeqs: e.cfg.MaxSeqs, MaxJobs: c.maxJobs[cl.ratio],
		NormWeight: cl.normBuf, Eps: float32(e.cfg.Model.RMSNormEps), Rope: a.Rope, RopePositions: a.RopePositions,
		Pool: cl.pool, PageSize: CompressedPageSize, NumPages: c.cfg.pagesFor(cl.ratio), Scratch: c.scratch,
	})
}

// compressLayer issues a compressed layer's whole compressor: the
// projection GEMM and the step, on the side stream when the backend has
// one (the caller joins it with the KV prologue's join), else in order.
func (e *Engine) compressLayer(ctx context.Context, layer, rows int) (onSide bool, err error) {
	c := e.comp
	if c == nil || c.layers[layer] == nil {
		return false, nil
	}
	run := func() error {
		if err := e.compressProject(ctx, layer, rows); err != nil {
			return fmt.Errorf("compressor projection: %w", err)
		}
		if err := e.compressStep(ctx, layer); err != nil {
			return fmt.Errorf("compressor step: %w", err)
		}
		return nil
	}
	if c.side != nil {
		return true, c.side.Side(ctx, run)
	}
	return false, run()
}

// endCompressor commits (with the accepted lengths) or rolls back the
// compressor's part of an iteration. Called with e.mu held.
func (e *Engine) endCompressor(it *Iteration, commit bool) error {
	c, ic := e.comp, it.comp
	if c == nil || ic == nil {
		return nil
	}
	m := it.meta
	var errs []error
	if !commit {
		for _, res := range ic.res {
			errs = append(errs, res.Rollback())
		}
		e.returnSlots(ic)
		return errors.Join(errs...)
	}
	for ri, r := range c.ratios {
		var lengths map[uint64]int
		if it.lengths != nil {
			lengths = make(map[uint64]int, len(it.lengths))
			for seq, n := range it.lengths {
				lengths[seq] = n / r
			}
		}
		errs = append(errs, ic.res[ri].CommitLengths(lengths))
	}
	// The states need nothing for Accept: the ring is keyed by position, and
	// the next step of a sequence starts at its accepted length.
	if ic.from != nil {
		for b, seq := range m.Seqs {
			if old, live := c.slots[seq]; live && old != ic.to[b] {
				c.free = append(c.free, old)
			}
			c.slots[seq] = ic.to[b]
		}
	}
	ic.taken = nil
	return errors.Join(errs...)
}

// finishCompressor drops a finished sequence's state slot and entries.
// Called with e.mu held.
func (e *Engine) finishCompressor(seq uint64, retire bool) error {
	c := e.comp
	if c == nil {
		return nil
	}
	if slot, ok := c.slots[seq]; ok {
		c.free = append(c.free, slot)
		delete(c.slots, seq)
	}
	var errs []error
	for _, r := range c.ratios {
		if retire {
			errs = append(errs, c.caches[r].Retire(seq))
		} else {
			errs = append(errs, c.caches[r].Finish(seq))
		}
	}
	return errors.Join(errs...)
}

// CheckInvariants verifies the engine's bookkeeping between iterations:
// each cache's own invariants (kvcache.Cache.CheckInvariants: with a
// window, exactly the pages of the last Window positions held); with the
// compressor, every live sequence has floor(len/r) entries in each ratio's
// pool and a state slot of its own, every other slot is free, and no other
// sequence holds entries or a slot (nothing leaks when sequences finish).
func (e *Engine) CheckInvariants() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.open != nil {
		return fmt.Errorf("engine: CheckInvariants while iteration %d is open: %w", e.open.index, ErrIterationOpen)
	}
	if err := e.cache.CheckInvariants(); err != nil {
		return err
	}
	c := e.comp
	if c == nil {
		return nil
	}
	lengths := e.cache.Lengths()
	for _, r := range c.ratios {
		if err := c.caches[r].CheckInvariants(); err != nil {
			return fmt.Errorf("ratio-%d compressed pool: %w", r, err)
		}
		entries := c.caches[r].Lengths()
		if len(entries) != len(lengths) {
			return fmt.Errorf("engine invariant: the ratio-%d pool holds %d sequences, the KV cache %d", r, len(entries), len(lengths))
		}
		for seq, n := range lengths {
			if got, ok := entries[seq]; !ok || got != n/r {
				return fmt.Errorf("engine invariant: sequence %d of length %d holds %d ratio-%d entries (present %v), want %d", seq, n, got, r, ok, n/r)
			}
		}
	}
	if len(c.slots) != len(lengths) {
		return fmt.Errorf("engine invariant: compressor state slots for %d sequences, %d live", len(c.slots), len(lengths))
	}
	owner := make([]bool, c.cfg.MaxSequences)
	for seq := range lengths {
		slot, ok := c.slots[seq]
		if !ok {
			return fmt.Errorf("engine invariant: live sequence %d has no compressor state slot", seq)
		}
		if slot < 0 || int(slot) >= len(owner) || owner[slot] {
			return fmt.Errorf("engine invariant: sequence %d holds state slot %d, outside [0, %d) or held twice", seq, slot, len(owner))
		}
		owner[slot] = true
	}
	for _, s := range c.free {
		if s < 0 || int(s) >= len(owner) || owner[s] {
			return fmt.Errorf("engine invariant: free state slot %d is outside [0, %d), held or listed twice", s, len(owner))
		}
		owner[s] = true
	}
	for s, ok := range owner {
		if !ok {
			return fmt.Errorf("engine invariant: state slot %d is neither held nor free (a leak)", s)
		}
	}
	return nil
}

// CompressorSequences returns the sequences the compressor holds a state
// slot for (0 when it is off).
func (e *Engine) CompressorSequences() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.comp == nil {
		return 0
	}
	return len(e.comp.slots)
}
