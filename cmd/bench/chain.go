package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// The whole chain of DESIGN.md section 7 per layer, the way the engine
// issues it from hidden states (engine/chain.go): act_quant, the fused
// [wq_a; wkv] GEMM, the KV prologue forked onto the backend's second stream,
// q_norm with its act_quant, the wq_b GEMM, the Q prologue, the join. It
// is issued here through the backend's methods, as the engine does, so that
// every layer of a graph gets its own weights, hidden states, activations,
// outputs and cache pool (the engine has one set of activation buffers).

// chainKV says what a chain graph does with the KV prologue.
type chainKV int

const (
	kvForked    chainKV = iota // on the side stream under q_norm and wq_b (the engine's way)
	kvNone                     // left out: the chain's time without the KV work
	kvSerial                   // in order on the main stream after the fused GEMM
	kvAlone                    // only the KV prologue of every layer (what the fork hides)
	kvCompAlone                // only the KV compressor of every layer (its projection GEMM and step)
	kvCompGEMM                 // only the compressor's projection GEMM of every layer
)

func (k chainKV) String() string {
	switch k {
	case kvForked:
		return "KV forked"
	case kvNone:
		return "no KV"
	case kvSerial:
		return "KV in order"
	case kvAlone:
		return "KV alone"
	case kvCompAlone:
		return "compressor alone"
	case kvCompGEMM:
		return "compressor GEMM alone"
	}
	return fmt.Sprintf("chainKV(%d)", int(k))
}

// chainLayerWeights are one layer's GEMM weights and q_norm weight on the
// device.
type chainLayerWeights struct {
	fused mla.FP8Weight // [wq_a; wkv]: q_lora_rank+512 rows of hidden
	wqB   mla.FP8Weight // heads*512 rows of q_lora_rank
	qNorm mla.Buffer    // q_lora_rank float32
}

// chainWeights are the distinct weights of every layer of a chain graph.
type chainWeights struct {
	layers []chainLayerWeights
	bufs   []mla.Buffer
}

// chainDims are the chain's sizes of a model.
type chainDims struct {
	hidden, qLora, heads int
	fusedN, qN           int // output widths of the two GEMMs
}

func chainDimsOf(md model) chainDims {
	return chainDims{hidden: md.cfg.HiddenSize, qLora: md.QLora, heads: md.Heads,
		fusedN: md.QLora + numerics.HeadDim, qN: md.Heads * numerics.HeadDim}
}

// fp8WeightBytes is an FP8 matrix's bytes with its float32 128x128 block
// scales.
func fp8WeightBytes(n, k int) int64 {
	return int64(n)*int64(k) + 4*int64((n+127)/128)*int64((k+127)/128)
}

// weightBytes is what one layer's chain reads of weights: both GEMM
// matrices with their scales and the q_norm weight (the kv_norm weight is
// the prologue's).
func (cd chainDims) weightBytes() int64 {
	return fp8WeightBytes(cd.fusedN, cd.hidden) + fp8WeightBytes(cd.qN, cd.qLora) + 4*int64(cd.qLora)
}

// ioBytes is the least one layer's chain must move besides the weights,
// for t tokens: the hidden rows read, the FP8 Q and the cache rows written.
func (cd chainDims) ioBytes(t int, f kvcache.Format) int64 {
	return int64(t) * (2*int64(cd.hidden) + int64(cd.qN) + int64(f.BytesPerToken()))
}

// actBytesPerRow is the device memory of one token row of a layer's chain
// buffers beyond what setupLayers allocates: the hidden row, its e4m3 copy
// and scales, q_norm's e4m3 output and scales.
func (cd chainDims) actBytesPerRow() int64 {
	return 2*int64(cd.hidden) + int64(cd.hidden) + 4*int64(cd.hidden/128) + int64(cd.qLora) + 4*int64(cd.qLora/128)
}

// newChainWeights allocates n layers of random FP8 weights (e4m3 values of
// moderate magnitude, block scales around 2^-10) and q_norm weights.
func (d *device) newChainWeights(md model, n int) (_ *chainWeights, err error) {
	cd := chainDimsOf(md)
	w := &chainWeights{}
	defer func() {
		if err != nil {
			d.freeBufs(w.bufs)
		}
	}()
	keep := func(buf mla.Buffer, err error) (mla.Buffer, error) {
		if err == nil {
			w.bufs = append(w.bufs, buf)
		}
		return buf, err
	}
	matrix := func(rows, cols int) (mla.FP8Weight, error) {
		m := mla.FP8Weight{N: rows, K: cols}
		var err error
		if m.Data, err = keep(d.randE4M3(rows * cols)); err != nil {
			return m, err
		}
		m.Scale, err = keep(d.randF32(((rows+127)/128)*((cols+127)/128), 0.5/1024, 2.0/1024))
		return m, err
	}
	for l := range n {
		var lw chainLayerWeights
		if lw.fused, err = matrix(cd.fusedN, cd.hidden); err != nil {
			return nil, fmt.Errorf("layer %d [wq_a; wkv]: %w", l, err)
		}
		if lw.wqB, err = matrix(cd.qN, cd.qLora); err != nil {
			return nil, fmt.Errorf("layer %d wq_b: %w", l, err)
		}
		if lw.qNorm, err = keep(d.randF32(cd.qLora, 0.5, 1.5)); err != nil {
			return nil, fmt.Errorf("layer %d q_norm: %w", l, err)
		}
		w.layers = append(w.layers, lw)
	}
	return w, d.be.Synchronize(context.Background())
}

func (d *device) freeBufs(bufs []mla.Buffer) {
	for _, b := range bufs {
		_ = d.be.Free(b)
	}
}

// chainSet is one input set's chain buffers beside its LayerArgs: the
// hidden rows and the two quantized activations ([K/128][rows] scales).
type chainSet struct {
	hidden mla.Buffer
	xq, qn mla.FP8Activations
}

// chainLayout is one shape's layers: the prologue's (setupLayers) and the
// chain's buffers of each input set.
type chainLayout struct {
	ls   *layers
	sets []chainSet
	rows int       // the rows every step runs over: the graph bucket for generation
	skip chainStep // the step chainLayer leaves out (chainShape's leave-one-out timings), 0: none
}

// chainStep names one main-stream step of the chain.
type chainStep int

const (
	stepActQuant chainStep = iota + 1
	stepFusedGEMM
	stepNormQuant
	stepWqBGEMM
	stepQPrologue
)

var chainStepNames = map[chainStep]string{stepActQuant: "act_quant", stepFusedGEMM: "fused_gemm",
	stepNormQuant: "norm_quant", stepWqBGEMM: "wq_b_gemm", stepQPrologue: "q_prologue"}

// setupChain lays out a shape for the chain: setupLayers' buffers (the
// fused rows, which the first GEMM writes, the Q input, which the second
// writes, the Q output and the cache pool) and the chain's own, within
// memBytes for both.
func (d *device) setupChain(md model, s shape, layers int, memBytes int64) (_ *chainLayout, err error) {
	cd := chainDimsOf(md)
	spec := layerSpec{sets: layers, cacheFormat: kvcache.FormatFP8UE8M0}
	if s.Phase == "generation" {
		spec.padTo, spec.fromHeader = graphBucket(s.Tokens), true
	}
	// setupLayers bounds its own buffers; give it its share of memBytes.
	prologueRow := int64(md.QLora+512)*2 + 2*int64(md.Heads)*512*2
	spec.memBytes = int64(float64(memBytes) * float64(prologueRow) / float64(prologueRow+cd.actBytesPerRow()))
	ls, err := d.setupLayers(md, s, spec)
	if err != nil {
		return nil, err
	}
	cl := &chainLayout{ls: ls, rows: ls.m.PaddedTokens}
	defer func() {
		if err != nil {
			d.free(ls)
		}
	}()
	keep := func(buf mla.Buffer, err error) (mla.Buffer, error) {
		if err == nil {
			ls.bufs = append(ls.bufs, buf)
		}
		return buf, err
	}
	rows := cl.rows
	acts := func(k int) (mla.FP8Activations, error) {
		a := mla.FP8Activations{Rows: rows, K: k, ScaleStride: rows}
		var err error
		if a.Data, err = keep(d.be.Alloc(rows * k)); err != nil {
			return a, err
		}
		a.Scale, err = keep(d.be.Alloc(k / 128 * rows * 4))
		return a, err
	}
	for i := range ls.args {
		var cs chainSet
		if cs.hidden, err = keep(d.randBF16(rows*cd.hidden, cd.hidden)); err != nil {
			return nil, fmt.Errorf("input set %d hidden rows: %w", i, err)
		}
		if cs.xq, err = acts(cd.hidden); err != nil {
			return nil, fmt.Errorf("input set %d quantized hidden rows: %w", i, err)
		}
		if cs.qn, err = acts(cd.qLora); err != nil {
			return nil, fmt.Errorf("input set %d q_norm output: %w", i, err)
		}
		cl.sets = append(cl.sets, cs)
	}
	return cl, d.be.Synchronize(context.Background())
}

// gemmPath runs one GEMM and says which implementation ran it.
func (d *device) gemmPath(run func() error) (string, error) {
	own0, lt0 := d.be.GEMMCounts()
	wg0 := d.be.WGMMACount()
	if err := run(); err != nil {
		return "", err
	}
	own1, lt1 := d.be.GEMMCounts()
	switch {
	case d.be.WGMMACount() > wg0:
		return "wgmma", nil
	case lt1 > lt0:
		return "cublaslt", nil
	case own1 > own0:
		return "own", nil
	}
	return "none", nil
}

// chainLayer issues layer l of the layout (input set l mod sets, weights
// w) with the KV prologue as kv says. With paths non-nil it records which
// GEMM implementation ran each GEMM.
//
// With comp non-nil, the layer's compressor goes first on the side stream
// (the engine's way; kv must be kvForked, whose join ends it), or alone
// on the main stream with kvCompAlone. With idx non-nil (and comp, the
// ratio-4 compressor), the layer is a ratio-4 layer with the indexer, as
// the engine issues it (engine/chain.go runChain): one projection GEMM for
// the compressor and the indexer and both compressor steps on the side
// stream, the indexer's wq_b GEMM after the Q prologue, its query step and
// with idx.topk the selection on the main stream after the join (idx.side
// and idx.separate: the variants chainIdxStep describes).
func (d *device) chainLayer(ctx context.Context, md model, cl *chainLayout, w *chainLayerWeights, l int, kv chainKV, paths *[2]string, comp *chainComp, idx *chainIdxStep) (err error) {
	cd := chainDimsOf(md)
	set := l % len(cl.sets)
	cs := &cl.sets[set]
	a := cl.ls.withFormats(set, kvcache.FormatFP8UE8M0, mla.QFP8)
	launches := cl.ls.launches
	if err := a.Validate(cl.rows); err != nil {
		return err
	}
	if kv == kvAlone {
		return mla.KVOnly(ctx, d.be, launches, &a)
	}
	if kv == kvCompAlone || kv == kvCompGEMM {
		return d.compressLayer(ctx, md, cl, comp, l, true, kv != kvCompGEMM)
	}
	if idx != nil && comp == nil {
		return errors.New("the indexer's keys follow the ratio-4 compressor on the side stream: no compressor given")
	}
	forkComp := func() error { return nil }
	if comp != nil {
		if kv != kvForked {
			return fmt.Errorf("the compressor runs on the side stream: KV mode %v has no join", kv)
		}
		side := func() error {
			switch {
			case idx == nil:
				return d.compressLayer(ctx, md, cl, comp, l, true, true)
			case idx.separate:
				if err := d.compressLayer(ctx, md, cl, comp, l, true, true); err != nil {
					return err
				}
				return idx.x.keys(ctx, d.be, l)
			}
			if comp.ratio != kvcache.DSv4IndexerRatio || comp.width != compWidth4 {
				return fmt.Errorf("the indexer's projections join the ratio-4 compressor's: compressor of ratio %d", comp.ratio)
			}
			if err := idx.x.fusedGEMM(ctx, d.be, l, idx.narrowProj); err != nil {
				return err
			}
			if idx.aux {
				// The third stream's query step waits for weights_proj's columns.
				if err := d.be.MarkSide(ctx); err != nil {
					return err
				}
			}
			kg, stride := idx.x.mainKG()
			if err := d.compressStep(ctx, cl, comp, l, kg, stride); err != nil {
				return err
			}
			if idx.noKeys {
				return nil
			}
			return idx.x.keyStep(ctx, d.be, l)
		}
		forkComp = func() error {
			if err := d.be.Side(ctx, side); err != nil {
				return errors.Join(err, d.be.JoinKV(ctx))
			}
			return nil
		}
	}
	if comp == nil || !comp.late {
		if err := forkComp(); err != nil {
			return err
		}
	}
	gemm := func(i int, g *mla.GEMMArgs) error {
		if paths == nil {
			return d.be.GEMM(ctx, g)
		}
		p, err := d.gemmPath(func() error { return d.be.GEMM(ctx, g) })
		paths[i] = p
		return err
	}
	if cl.skip != stepActQuant {
		if err := d.be.ActQuant(ctx, &mla.ActQuantArgs{X: cs.hidden, XStride: cd.hidden, Out: cs.xq}); err != nil {
			return fmt.Errorf("act_quant: %w", err)
		}
	}
	if cl.skip != stepFusedGEMM {
		if err := gemm(0, &mla.GEMMArgs{X: cs.xq, W: &w.fused, Y: a.Latent, YStride: a.LatentStride}); err != nil {
			return fmt.Errorf("[wq_a; wkv] GEMM: %w", err)
		}
	}
	if comp != nil && comp.late {
		if err := forkComp(); err != nil {
			return err
		}
	}
	switch kv {
	case kvForked:
		if err := d.be.ForkKV(ctx, launches, &a); err != nil {
			return fmt.Errorf("forking the KV prologue: %w", err)
		}
	case kvSerial:
		if err := mla.KVOnly(ctx, d.be, launches, &a); err != nil {
			return err
		}
	}
	err = func() error {
		if cl.skip != stepNormQuant {
			if err := d.be.NormQuant(ctx, &mla.NormQuantArgs{X: a.Latent, XStride: a.LatentStride, Weight: w.qNorm,
				Eps: float32(md.cfg.RMSNormEps), Out: cs.qn}); err != nil {
				return fmt.Errorf("q_norm: %w", err)
			}
		}
		switch {
		case idx != nil && idx.side:
			if err := d.be.Side(ctx, func() error {
				if err := idx.x.wqBGEMM(ctx, d.be, l); err != nil {
					return err
				}
				return idx.x.queryStep(ctx, d.be, l, mla.IndexerQueryMXFP4)
			}); err != nil {
				return err
			}
		case idx != nil && (idx.aux || idx.auxGEMM):
			if err := d.be.Aux(ctx, func() error {
				if !idx.noWqB {
					if err := idx.x.wqBGEMM(ctx, d.be, l); err != nil {
						return err
					}
				}
				if idx.auxGEMM || idx.noQuery {
					return nil
				}
				if err := d.be.AwaitSide(ctx); err != nil {
					return err
				}
				return idx.x.queryStep(ctx, d.be, l, mla.IndexerQueryMXFP4)
			}); err != nil {
				return err
			}
		}
		if cl.skip != stepWqBGEMM {
			if err := gemm(1, &mla.GEMMArgs{X: cs.qn, W: &w.wqB, Y: a.QIn, YStride: cd.qN}); err != nil {
				return fmt.Errorf("wq_b GEMM: %w", err)
			}
		}
		if cl.skip != stepQPrologue {
			if err := mla.QOnly(ctx, d.be, launches, &a); err != nil {
				return err
			}
		}
		switch {
		case idx == nil || idx.side || idx.aux || idx.auxGEMM:
			return nil
		case idx.separate:
			return idx.x.separateQuery(ctx, d.be, l)
		case idx.noWqB:
			return nil
		}
		return idx.x.wqBGEMM(ctx, d.be, l)
	}()
	if kv == kvForked {
		// Join even after a failure: a capture must end joined.
		if jerr := d.be.JoinKV(ctx); jerr != nil {
			err = errors.Join(err, fmt.Errorf("joining the KV prologue: %w", jerr))
		}
	}
	if err != nil || idx == nil {
		return err
	}
	if !idx.side && !idx.separate && !idx.aux && !idx.noQuery {
		// After the join: weights_proj's columns come from the side stream.
		if err := idx.x.queryStep(ctx, d.be, l, mla.IndexerQueryMXFP4); err != nil {
			return err
		}
	}
	if !idx.topk {
		return nil
	}
	return idx.x.topk(ctx, d.be, l)
}

// chainShapes lists the chain's generation shapes (every batch at every
// MTP) and then its context shapes.
func (c *config) chainShapes() []shape {
	var out []shape
	for _, mtp := range c.MTPs {
		for _, nb := range c.ChainBatches {
			out = append(out, generationShape(nb, mtp))
		}
	}
	for _, t := range c.ChainCtxTokens {
		out = append(out, contextShape(t))
	}
	return out
}

// chains times every chain shape of md. A shape that fails is reported in
// rep.Errors and the next one runs.
func chains(c *config, d *device, md model, rep *Report) error {
	if err := d.be.InitGEMM(); err != nil {
		return err
	}
	if rep.ChainGEMM == "" {
		rep.ChainGEMM = "cuBLASLt in use above the own kernel's batches"
		if err := d.be.CuBLASLtError(); err != nil {
			rep.ChainGEMM = "cuBLASLt not in use (the own kernel runs every GEMM): " + err.Error()
		}
		fmt.Println("chain GEMMs:", rep.ChainGEMM)
	}
	w, err := d.newChainWeights(md, c.ChainLayers)
	if err != nil {
		return fmt.Errorf("chain weights: %w", err)
	}
	defer d.freeBufs(w.bufs)
	var failed int
	for _, s := range c.chainShapes() {
		r, err := chainShape(c, d, md, w, s, rep.CopyGBps)
		if err != nil {
			failed++
			msg := fmt.Sprintf("chain %s %s b=%d mtp=%d %d tokens: %v", md.Name, s.Phase, s.Batch, s.MTP, s.Tokens, err)
			fmt.Println("bench:", msg)
			rep.Errors = append(rep.Errors, msg)
			continue
		}
		rep.Chain = append(rep.Chain, r)
		if err := rep.write(c.Out); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d chain shapes of %s failed (listed above)", failed, md.Name)
	}
	return nil
}

// chainShape times one shape: the chain of every layer (each its own
// weights and, memory allowing, its own input set) captured in one CUDA
// graph, replayed with the L2 flushed before each replay (median), once
// per way of running the KV prologue.
func chainShape(c *config, d *device, md model, w *chainWeights, s shape, copyGBps float64) (ChainResult, error) {
	ctx := context.Background()
	cl, err := d.setupChain(md, s, len(w.layers), c.GraphMemBytes)
	if err != nil {
		return ChainResult{}, err
	}
	defer d.free(cl.ls)
	L := len(w.layers)
	cd := chainDimsOf(md)
	r := ChainResult{Model: md.Name, Phase: s.Phase, Batch: s.Batch, MTP: s.MTP, Tokens: s.Tokens, Rows: cl.rows,
		Layers: L, Sets: len(cl.sets), WeightBytes: cd.weightBytes(), IOBytes: cd.ioBytes(s.Tokens, kvcache.FormatFP8UE8M0)}
	// One eager layer first: it runs each GEMM shape once (cuBLASLt plans
	// its algorithm then; a capture may not), and records the GEMM paths.
	var paths [2]string
	if err := d.chainLayer(ctx, md, cl, &w.layers[0], 0, kvForked, &paths, nil, nil); err != nil {
		return r, fmt.Errorf("eager layer: %w", err)
	}
	if err := d.be.Synchronize(ctx); err != nil {
		return r, fmt.Errorf("eager layer: %w", err)
	}
	r.FusedGEMM, r.WqBGEMM = paths[0], paths[1]
	perLayer := map[chainKV]float64{}
	for _, kv := range []chainKV{kvForked, kvNone, kvSerial, kvAlone} {
		total, err := d.timeChainLayers(c, md, cl, w, kv, nil)
		if err != nil {
			return r, fmt.Errorf("graph (%v): %w", kv, err)
		}
		perLayer[kv] = total / float64(L)
		if kv == kvForked {
			r.TotalUs = total
		}
	}
	r.LeaveOutUs = map[string]float64{}
	for step := stepActQuant; step <= stepQPrologue; step++ {
		cl.skip = step
		total, err := d.timeChainLayers(c, md, cl, w, kvForked, nil)
		cl.skip = 0
		if err != nil {
			return r, fmt.Errorf("graph without %s: %w", chainStepNames[step], err)
		}
		r.LeaveOutUs[chainStepNames[step]] = total / float64(L)
	}
	if c.ChainCompress {
		for _, ratio := range []int{4, 128} {
			cr, err := chainCompress(c, d, md, cl, w, ratio, perLayer[kvForked])
			if err != nil {
				return r, fmt.Errorf("compressor ratio %d: %w", ratio, err)
			}
			r.Compressor = append(r.Compressor, cr)
		}
	}
	r.UsPerLayer = perLayer[kvForked]
	r.NoKVUsPerLayer = perLayer[kvNone]
	r.SerialKVUsPerLayer = perLayer[kvSerial]
	r.KVAloneUsPerLayer = perLayer[kvAlone]
	r.KVExposedUs = r.UsPerLayer - r.NoKVUsPerLayer
	r.WeightGBps = safeDiv(float64(r.WeightBytes), r.UsPerLayer*1e3)
	r.WeightFloorUs = safeDiv(float64(r.WeightBytes), copyGBps*1e3)
	r.PctWeightFloor = safeDiv(100*r.WeightFloorUs, r.UsPerLayer)
	r.FloorUs = safeDiv(float64(r.WeightBytes+r.IOBytes), copyGBps*1e3)
	fmt.Printf("chain %-5s %-10s b=%-4d mtp=%d tokens=%-6d rows=%-6d GEMMs %s/%s: %8.2f us/layer (no KV %8.2f, KV in order %8.2f, KV alone %7.2f; KV exposed %+6.2f), weights %5.1f MB at %6.0f GB/s, floor %6.2f us (%5.1f%%), with I/O %7.2f us\n",
		r.Model, r.Phase, r.Batch, r.MTP, r.Tokens, r.Rows, r.FusedGEMM, r.WqBGEMM, r.UsPerLayer, r.NoKVUsPerLayer,
		r.SerialKVUsPerLayer, r.KVAloneUsPerLayer, r.KVExposedUs, float64(r.WeightBytes)/1e6, r.WeightGBps,
		r.WeightFloorUs, r.PctWeightFloor, r.FloorUs)
	fmt.Printf("chain %-5s %-10s b=%-4d mtp=%d leave one out (us/layer, KV forked):", r.Model, r.Phase, r.Batch, r.MTP)
	for step := stepActQuant; step <= stepQPrologue; step++ {
		n := chainStepNames[step]
		fmt.Printf(" %s %.2f (%+.2f)", n, r.LeaveOutUs[n], r.LeaveOutUs[n]-r.UsPerLayer)
	}
	fmt.Println()
	return r, nil
}

// timeChainLayers times one graph of every layer's chainLayer (KV as kv,
// the compressor comp or none) and returns its total over the layers.
func (d *device) timeChainLayers(c *config, md model, cl *chainLayout, w *chainWeights, kv chainKV, comp *chainComp) (float64, error) {
	ctx := context.Background()
	return d.timeGraph(c.GraphReps, func() error {
		for l := range w.layers {
			if err := d.chainLayer(ctx, md, cl, &w.layers[l], l, kv, nil, comp, nil); err != nil {
				return fmt.Errorf("layer %d: %w", l, err)
			}
		}
		return nil
	})
}

// chainCompress times the chain with every layer's compressor of a ratio
// forked (the engine's way) and the compressor alone, each in one graph
// of every layer; base is the chain's time per layer without it.
func chainCompress(c *config, d *device, md model, cl *chainLayout, w *chainWeights, ratio int, base float64) (ChainCompResult, error) {
	ctx := context.Background()
	L := len(w.layers)
	comp, err := d.setupComp(md, cl, ratio, L)
	if err != nil {
		return ChainCompResult{}, err
	}
	defer d.freeComp(comp)
	// One eager compressor first: the projection GEMM plans its algorithm.
	if err := d.compressLayer(ctx, md, cl, comp, 0, true, true); err != nil {
		return ChainCompResult{}, fmt.Errorf("eager compressor: %w", err)
	}
	if err := d.be.Synchronize(ctx); err != nil {
		return ChainCompResult{}, err
	}
	per := map[chainKV]float64{}
	var late float64
	for _, run := range []struct {
		kv   chainKV
		late bool
	}{{kvForked, false}, {kvCompAlone, false}, {kvCompGEMM, false}, {kvForked, true}} {
		kv := run.kv
		comp.late = run.late
		total, err := d.timeChainLayers(c, md, cl, w, kv, comp)
		if err != nil {
			return ChainCompResult{}, fmt.Errorf("graph (%v, late %v): %w", kv, comp.late, err)
		}
		if comp.late {
			late = total / float64(L)
			continue
		}
		per[kv] = total / float64(L)
	}
	comp.late = false
	r := ChainCompResult{Ratio: ratio, UsPerLayer: per[kvForked], AloneUsPerLayer: per[kvCompAlone], GEMMUsPerLayer: per[kvCompGEMM],
		WeightBytes: int64(2 * comp.width * chainDimsOf(md).hidden * 2), LateUsPerLayer: late}
	r.AddedUs = r.UsPerLayer - base
	r.AddedPct = safeDiv(100*r.AddedUs, base)
	fmt.Printf("chain %-5s compressor ratio %-3d: %8.2f us/layer with it (%+6.2f us, %+5.1f%%; forked after [wq_a; wkv] %8.2f), alone %7.2f us (its GEMM %7.2f us, projection weights %4.1f MB)\n",
		md.Name, ratio, r.UsPerLayer, r.AddedUs, r.AddedPct, r.LateUsPerLayer, r.AloneUsPerLayer, r.GEMMUsPerLayer, float64(r.WeightBytes)/1e6)
	return r, nil
}
