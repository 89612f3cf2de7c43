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

// stateBytes is compressor.Layer.StateBytes of a layer of the ratio whose
// states keep maxDrafts+1 extra rows (one more than the drafts, so a whole
// step can roll back), without building the layer.
func stateBytes(ratio, maxDrafts int) int64 {
	rows := compressor.Overlap(ratio)*ratio + maxDrafts + 1
	return int64(rows) * int64(compressor.Overlap(ratio)*compressor.Dim) * 2 * 4
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

// compressState is what the compressor adds to an engine.
type compressState struct {
	cfg    CompressorConfig
	ratios []int
	caches map[int]*kvcache.Cache // entry bookkeeping per ratio
	layers []*compLayer           // per engine layer; nil for ratio 0
	// states holds each live sequence's state per layer (nil entries for
	// ratio-0 layers). Guarded by Engine.mu; an iteration's sequences are
	// only touched by the step loop.
	states map[uint64][]*compressor.State
}

// compLayer is one compressed layer's compressor.
type compLayer struct {
	ratio int
	comp  *compressor.Layer
	proj  *compressor.Projection // Input = hidden: the projections' weights; nil on the projected path
	pool  mla.Buffer             // the compressed pool
	norm  []float32              // the entry RMSNorm weight
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

// newCompressor sets up the compressor: one pool per compressed layer,
// the bookkeeping per ratio, and each layer's compressor (with its
// projection weights on the hidden-state path, from proj).
func (e *Engine) newCompressor(alloc func(what string, n int, fill byte) (mla.Buffer, error), proj func(layer int) (*compressor.Projection, []float32, error)) error {
	cfg := e.cfg
	c := &compressState{cfg: cfg.Compressor, ratios: cfg.compressedRatios(), caches: map[int]*kvcache.Cache{},
		layers: make([]*compLayer, cfg.Layers), states: map[uint64][]*compressor.State{}}
	for _, r := range c.ratios {
		cache, err := kvcache.New(kvcache.Config{PageSize: CompressedPageSize, NumPages: c.cfg.pagesFor(r)})
		if err != nil {
			return &ConfigError{Field: pagesField(r), Err: err}
		}
		c.caches[r] = cache
	}
	for l := range cfg.Layers {
		r, _ := cfg.Model.CompressRatio(l)
		if compressor.Overlap(r) == 0 {
			continue
		}
		cl := &compLayer{ratio: r, norm: DefaultCompressorNorm(cfg.WeightSeed, l)}
		if proj != nil {
			p, norm, err := proj(l)
			if err != nil {
				return err
			}
			cl.proj, cl.norm = p, norm
		}
		if err := cl.build(cfg, e.ropeHost[e.layerRope[l]]); err != nil {
			return fmt.Errorf("engine: layer %d compressor: %w", l, err)
		}
		pages := c.cfg.pagesFor(r)
		var err error
		if cl.pool, err = alloc(fmt.Sprintf("layer %d ratio-%d compressed pool", l, r), pages*kvcache.FormatFP8UE8M0.PageBytes(CompressedPageSize), 0); err != nil {
			return err
		}
		c.layers[l] = cl
	}
	e.comp = c
	return nil
}

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
	return e.comp.layers[layer].comp.Width()
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
	out := make([]byte, cl.pool.Len())
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	if err := e.backend.Read(out, cl.pool, 0); err != nil {
		return nil, fmt.Errorf("engine: reading layer %d compressed pool: %w", layer, err)
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

// CompressorState returns a copy of seq's compressor state in a layer.
func (e *Engine) CompressorState(layer int, seq uint64) (*compressor.State, error) {
	if _, err := e.compLayer(layer); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.comp.states[seq]
	if !ok {
		return nil, fmt.Errorf("engine: CompressorState: %w %d", kvcache.ErrUnknownSequence, seq)
	}
	return st[layer].Clone(), nil
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
	res    map[int]*kvcache.Reservation // per ratio
	tables map[int][][]int32            // per ratio, per batch index: the block table with the reservation
	states [][]*compressor.State        // per batch index: the sequence's states (shared with compressState.states)
	saved  [][]*compressor.State        // per batch index, per layer: a context sequence's state before this iteration
	ran    []bool                       // layers whose compressor ran
	inputs struct {                     // SetCompressorInputs
		layer int // -1: none
		k, g  [][]float32
	}
}

// beginCompressor reserves the compressed entries of the batch, all
// ratios or none, and gathers the states (fresh ones for created
// sequences). Called with e.mu held, after the KV reservation; on an error
// nothing of the compressor changed.
func (e *Engine) beginCompressor(reqs []metadata.Request, numSeqs int, needs []metadata.Need) (_ *iterComp, err error) {
	c := e.comp
	for _, r := range reqs {
		if r.Phase == metadata.Generation && r.MTP > c.cfg.MaxDrafts {
			return nil, fmt.Errorf("engine: Begin: %w: sequence %d has %d MTP drafts, more than Compressor.MaxDrafts = %d",
				ErrBatchTooLarge, r.Seq, r.MTP, c.cfg.MaxDrafts)
		}
	}
	created := 0
	for _, n := range needs {
		if n.Create {
			created++
		}
	}
	if live := len(c.states); created > c.cfg.MaxSequences-live {
		return nil, fmt.Errorf("engine: Begin: compressor state: %w: %d live sequences + %d new, more than Compressor.MaxSequences = %d",
			kvcache.ErrCacheFull, live, created, c.cfg.MaxSequences)
	}
	ic := &iterComp{res: map[int]*kvcache.Reservation{}, tables: map[int][][]int32{}}
	ic.inputs.layer = -1
	defer func() {
		if err != nil {
			for _, res := range ic.res {
				res.Rollback()
			}
		}
	}()
	for _, r := range c.ratios {
		kn := make([]kvcache.Need, len(needs))
		for i, n := range needs {
			kn[i] = kvcache.Need{ID: n.Seq, NewLength: n.Length / r, Create: n.Create}
		}
		res, err := c.caches[r].Reserve(kn)
		if err != nil {
			return nil, fmt.Errorf("engine: Begin: ratio-%d compressed pool: %w", r, err)
		}
		ic.res[r] = res
		tables := make([][]int32, len(needs))
		for i, n := range needs {
			if tables[i], err = c.caches[r].BlockTable(n.Seq); err != nil {
				return nil, fmt.Errorf("engine: Begin: ratio-%d compressed pool: %w", r, err)
			}
		}
		ic.tables[r] = tables
	}
	ic.states = make([][]*compressor.State, numSeqs)
	ic.saved = make([][]*compressor.State, numSeqs)
	ic.ran = make([]bool, e.cfg.Layers)
	for b, n := range needs {
		st, ok := c.states[n.Seq]
		if !ok {
			st = make([]*compressor.State, e.cfg.Layers)
			for l, cl := range c.layers {
				if cl != nil {
					st[l] = cl.comp.NewState()
				}
			}
			c.states[n.Seq] = st
		}
		ic.states[b] = st
		ic.saved[b] = make([]*compressor.State, e.cfg.Layers)
	}
	return ic, nil
}

// undoBeginCompressor undoes beginCompressor when Begin fails after it.
// Called with e.mu held.
func (e *Engine) undoBeginCompressor(ic *iterComp, needs []metadata.Need) {
	for _, res := range ic.res {
		res.Rollback()
	}
	for _, n := range needs {
		if n.Create {
			delete(e.comp.states, n.Seq)
		}
	}
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

// SetCompressorInputs gives a compressed layer's compressor projections on
// the projected path (Config.Input = projected): k and g hold Tokens() rows
// of CompressorWidth(layer) little-endian float32 values each, K[t] = x_t .
// wkv^T and G[t] = x_t . wgate^T + ape[pos mod r] (DESIGN.md section 8).
// RunLayer of that layer consumes them.
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
	want := it.meta.Tokens * cl.comp.Width() * 4
	if len(k) != want || len(g) != want {
		return fmt.Errorf("engine: SetCompressorInputs(layer %d): k has %d bytes and g %d, %d tokens of %d float32 need %d each",
			layer, len(k), len(g), it.meta.Tokens, cl.comp.Width(), want)
	}
	it.comp.inputs.layer = layer
	it.comp.inputs.k = f32Rows(k, cl.comp.Width())
	it.comp.inputs.g = f32Rows(g, cl.comp.Width())
	return nil
}

func f32Rows(b []byte, width int) [][]float32 {
	rows := make([][]float32, len(b)/(4*width))
	for t := range rows {
		rows[t] = make([]float32, width)
		for i := range rows[t] {
			rows[t][i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*(t*width+i):]))
		}
	}
	return rows
}

// projections returns the layer's K and G rows for this iteration: the
// caller's (projected path) or the projection of the hidden rows.
func (it *Iteration) projections(ctx context.Context, layer int, cl *compLayer) (K, G [][]float32, err error) {
	e := it.e
	m := it.meta
	if e.chain == nil {
		if it.comp.inputs.layer != layer {
			return nil, nil, fmt.Errorf("layer %d is a ratio-%d layer: its compressor needs SetCompressorInputs(%d, ...) first", layer, cl.ratio, layer)
		}
		return it.comp.inputs.k, it.comp.inputs.g, nil
	}
	H := e.cfg.Model.HiddenSize
	if err := e.backend.Synchronize(ctx); err != nil {
		return nil, nil, err
	}
	raw := make([]byte, m.Tokens*H*2)
	if err := e.backend.Read(raw, e.chain.hidden, 0); err != nil {
		return nil, nil, fmt.Errorf("reading the hidden rows: %w", err)
	}
	x := make([]uint16, m.Tokens*H)
	for i := range x {
		x[i] = binary.LittleEndian.Uint16(raw[2*i:])
	}
	K, G = make([][]float32, 0, m.Tokens), make([][]float32, 0, m.Tokens)
	for b := range m.NumSeqs {
		lo, hi := int(m.CuQ[b]), int(m.CuQ[b+1])
		k, g, err := cl.proj.Project(x[lo*H:hi*H], int(m.Cached[b]))
		if err != nil {
			return nil, nil, err
		}
		K, G = append(K, k...), append(G, g...)
	}
	return K, G, nil
}

// runCompressor runs a compressed layer's compressor over the iteration
// (after its prologue): the states take the iteration's rows and the
// entries they complete go into the layer's compressed pool.
func (it *Iteration) runCompressor(ctx context.Context, layer int) error {
	e := it.e
	if e.comp == nil || e.comp.layers[layer] == nil {
		return nil
	}
	cl := e.comp.layers[layer]
	K, G, err := it.projections(ctx, layer, cl)
	if err != nil {
		return fmt.Errorf("compressor: %w", err)
	}
	if it.comp.ran[layer] {
		if err := it.rewindLayer(layer); err != nil {
			return err
		}
	}
	m := it.meta
	a := &mla.CompressArgs{Layer: cl.comp, K: K, G: G, Pool: cl.pool, PageSize: CompressedPageSize, NumPages: e.comp.cfg.pagesFor(cl.ratio)}
	for b := range m.NumSeqs {
		st := it.comp.states[b][layer]
		if b < m.NumCtx && it.comp.saved[b][layer] == nil {
			it.comp.saved[b][layer] = st.Clone() // a chunk may be longer than Accept can undo
		}
		a.Seqs = append(a.Seqs, mla.CompressSeq{Row: int(m.CuQ[b]), Rows: int(m.QLen[b]), StartPos: int(m.Cached[b]),
			State: st, Table: it.comp.tables[cl.ratio][b]})
	}
	it.comp.ran[layer] = true
	if _, err := mla.Compress(ctx, e.backend, a); err != nil {
		return fmt.Errorf("compressor: %w", err)
	}
	return nil
}

// rewindLayer returns every state of the batch in a layer to its length
// before the iteration.
func (it *Iteration) rewindLayer(layer int) error {
	m := it.meta
	for b := range m.NumSeqs {
		st := it.comp.states[b]
		cached := int(m.Cached[b])
		if st[layer].Len() == cached {
			continue
		}
		if saved := it.comp.saved[b][layer]; saved != nil {
			st[layer] = saved.Clone()
			continue
		}
		if _, err := st[layer].Accept(cached); err != nil {
			return fmt.Errorf("compressor: rolling sequence %d back to %d in layer %d: %w", m.Seqs[b], cached, layer, err)
		}
	}
	return nil
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
	if commit {
		for _, r := range c.ratios {
			var lengths map[uint64]int
			if it.lengths != nil {
				lengths = make(map[uint64]int, len(it.lengths))
				for seq, n := range it.lengths {
					lengths[seq] = n / r
				}
			}
			errs = append(errs, ic.res[r].CommitLengths(lengths))
		}
		for b, seq := range m.Seqs {
			n, ok := it.lengths[seq]
			if !ok || n == int(m.KVLen[b]) {
				continue
			}
			for l, st := range ic.states[b] {
				if st == nil {
					continue
				}
				if _, err := st.Accept(n); err != nil {
					errs = append(errs, fmt.Errorf("engine: compressor: accepting %d tokens of sequence %d in layer %d: %w", n, seq, l, err))
				}
			}
		}
		return errors.Join(errs...)
	}
	for _, r := range c.ratios {
		errs = append(errs, ic.res[r].Rollback())
	}
	for b, seq := range m.Seqs {
		if m.Cached[b] == 0 && it.created[seq] {
			delete(c.states, seq)
		}
	}
	for l, ran := range ic.ran {
		if ran {
			errs = append(errs, it.rewindLayer(l))
		}
	}
	return errors.Join(errs...)
}

// finishCompressor drops a finished sequence's states and entries.
// Called with e.mu held.
func (e *Engine) finishCompressor(seq uint64, retire bool) error {
	c := e.comp
	if c == nil {
		return nil
	}
	delete(c.states, seq)
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
// pool and a state at its length in every compressed layer, and no other
// sequence holds entries or state (nothing leaks when sequences finish).
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
	if len(c.states) != len(lengths) {
		return fmt.Errorf("engine invariant: compressor states for %d sequences, %d live", len(c.states), len(lengths))
	}
	for seq, n := range lengths {
		st, ok := c.states[seq]
		if !ok {
			return fmt.Errorf("engine invariant: live sequence %d has no compressor state", seq)
		}
		for l, s := range st {
			if (s == nil) != (c.layers[l] == nil) {
				return fmt.Errorf("engine invariant: sequence %d layer %d: state present %v, compressor present %v", seq, l, s != nil, c.layers[l] != nil)
			}
			if s != nil && s.Len() != n {
				return fmt.Errorf("engine invariant: sequence %d layer %d: state at length %d, sequence at %d", seq, l, s.Len(), n)
			}
		}
	}
	return nil
}

// CompressorSequences returns the sequences the compressor holds state
// for (0 when it is off).
func (e *Engine) CompressorSequences() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.comp == nil {
		return 0
	}
	return len(e.comp.states)
}
