package engine

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// The lightning indexer's compute in the ratio-4 layers (DESIGN.md section
// 9), with Config.IndexerEnabled and Input = hidden. Its two bf16
// projections of the hidden rows (its compressor's [wkv; wgate], 2*256
// outputs, and weights_proj, 64) are rows of the main compressor's
// projection weight, so the layer's one bf16 GEMM (compressProject, on the
// side stream) writes them beside the compressor's K and G: one GEMM of
// 2*1024+2*256+64 outputs added 1.5 us at 128 rows where three cost 12.1
// (BENCHMARKS.md). On the same stream, after the compressor's step, the
// indexer compressor's step (mla.EntryIndexer, the ratio-4 plan, into the
// cache model's indexer cache and states: indexerStepArgs) reads its
// columns. After the Q prologue, on the main stream, the indexer's wq_b
// GEMM (FP8, on q_norm's activation; two GEMMs measured as fast as one
// fused [wq_b; indexer wq_b] at 128 rows and faster at 4096); after the
// join (weights_proj's output comes from the side stream) the query step
// (mla.IndexerQuerier), then the selection. All of it is inside the
// layer's run, so a captured graph replays it. The query and the head
// weights land in fixed-address buffers shared by the ratio-4 layers
// (IndexerQuery), as the Q output is shared by every layer.

// indexerCompute is the indexer's weights and buffers on the backend.
type indexerCompute struct {
	iq     mla.IndexerQuerier
	qIn    mla.Buffer // [MaxTokens][64*128] bf16: the indexer wq_b GEMM's output
	qOut   mla.Buffer // [MaxTokens][64][68]: the MXFP4 query
	wOut   mla.Buffer // [MaxTokens][64] bf16: the head weights
	layers map[int]*indexerLayerWeights
	topk   *topkState // the selection (topk.go)
}

// indexerLayerWeights is one ratio-4 layer's indexer weights on the
// backend, beside its bf16 projections in the layer's compLayer.wkvg.
type indexerLayerWeights struct {
	wqB  mla.FP8Weight // [64*128][q_lora_rank] e4m3 with block scales
	ape  mla.Buffer    // [4][256] float32
	norm mla.Buffer    // [128] float32: compressor.norm.weight
}

// indexerProjN is what the indexer adds to a ratio-4 layer's projection
// GEMM: its compressor's K and G (2*256), then weights_proj's 64 outputs.
const indexerProjN = 2*256 + mla.IndexerHeads

// projN is the outputs of a compressed layer's projection GEMM of ratio
// ratio (compLayer.projN): 2*Width, plus indexerProjN in a ratio-4 layer
// when the indexer runs.
func (c Config) projN(ratio int) int {
	n := 2 * compressor.Overlap(ratio) * compressor.Dim
	if ratio == kvcache.DSv4IndexerRatio && c.indexerRunning() {
		n += indexerProjN
	}
	return n
}

// projRowElems is the float32 values of a row of the projection buffer:
// the widest compressed layer's projN.
func (c Config) projRowElems() int {
	n := 0
	for _, r := range c.compressedRatios() {
		n = max(n, c.projN(r))
	}
	return n
}

// The columns of a ratio-4 layer's projection rows where the indexer's
// outputs start: its compressor's K then G, then weights_proj's.
func (cl *compLayer) indexerKGCol() int { return 2 * cl.width() }
func (cl *compLayer) indexerWPCol() int { return 2*cl.width() + 2*indexerWidth() }

// indexerRunning reports whether New sets up the indexer's compute.
func (c Config) indexerRunning() bool { return c.IndexerEnabled() && c.Input == InputHidden }

// indexerBufferBytes is the shared buffers' bytes for MaxTokens rows: the
// wq_b output, the query and the head weights in format f (the bf16
// projections' outputs are columns of the compressor's projection rows).
func indexerBufferBytes(tokens int64, f mla.IndexerQueryFormat) int64 {
	const heads = mla.IndexerHeads
	return tokens * (heads*mla.IndexerDim*2 + heads*int64(f.RowBytes()) + heads*int64(f.WeightBytes()))
}

// indexerWeightBytes is one ratio-4 layer's indexer weights on the backend.
func indexerWeightBytes(hidden, q int64) int64 {
	n := int64(mla.IndexerHeads * mla.IndexerDim)
	w := int64(indexerWidth())
	return n*q + (n+127)/128*((q+127)/128)*4 + mla.IndexerHeads*hidden*2 + 2*w*hidden*2 +
		kvcache.DSv4IndexerRatio*w*4 + mla.IndexerDim*4
}

// newIndexer uploads the ratio-4 layers' indexer weights (held in
// e.idxWeights by newChain) and allocates the shared buffers.
func (e *Engine) newIndexer(alloc func(what string, n int, fill byte) (mla.Buffer, error)) error {
	cfg := e.cfg
	if !cfg.indexerRunning() || e.comp == nil {
		return nil
	}
	iq, ok := e.backend.(mla.IndexerQuerier)
	if !ok {
		return fmt.Errorf("engine: the indexer: backend %s has no indexer query step (mla.IndexerQuerier)", e.backend.Name())
	}
	x := &indexerCompute{iq: iq, layers: map[int]*indexerLayerWeights{}}
	T := cfg.MaxTokens
	const heads = mla.IndexerHeads
	f := cfg.Compressor.IndexerQueryFormat
	var err error
	for _, b := range []struct {
		dst  *mla.Buffer
		what string
		n    int
	}{
		{&x.qIn, "indexer wq_b output", T * heads * mla.IndexerDim * 2},
		{&x.qOut, "indexer query", T * heads * f.RowBytes()},
		{&x.wOut, "indexer head weights", T * heads * f.WeightBytes()},
	} {
		if *b.dst, err = alloc(b.what, b.n, 0); err != nil {
			return err
		}
	}
	for l, cl := range e.comp.layers {
		if cl == nil || cl.idxPool == nil {
			continue
		}
		w := e.idxWeights[l]
		if cl.projN != cfg.projN(kvcache.DSv4IndexerRatio) { // newCompressor checked w and joined its projections
			return fmt.Errorf("engine: layer %d: the projection GEMM has %d outputs, the indexer needs %d", l, cl.projN, cfg.projN(kvcache.DSv4IndexerRatio))
		}
		lw := &indexerLayerWeights{}
		up := func(what string, raw []byte) (mla.Buffer, error) {
			return e.upload(alloc, fmt.Sprintf("layer %d indexer %s", l, what), raw)
		}
		lw.wqB = mla.FP8Weight{N: w.WQB.N, K: w.WQB.K}
		if lw.wqB.Data, err = up("wq_b", w.WQB.Data); err != nil {
			return err
		}
		if lw.wqB.Scale, err = up("wq_b scales", numerics.F32Bytes(w.WQB.Scale)); err != nil {
			return err
		}
		c := &w.Compressor
		if lw.ape, err = up("compressor ape", numerics.F32Bytes(c.APE)); err != nil {
			return err
		}
		if lw.norm, err = up("compressor norm weight", numerics.F32Bytes(c.Norm)); err != nil {
			return err
		}
		x.layers[l] = lw
	}
	e.idx = x
	return e.newTopK(alloc)
}

// checkIndexerWeights refuses a layer's indexer weights of another shape
// than the engine runs, naming the tensor.
func checkIndexerWeights(layer int, w *weights.IndexerWeights, hidden, q int) error {
	if w == nil {
		return fmt.Errorf("engine: layer %d: the weights have no indexer (layers.%d.attn.indexer.*), which Config.IndexerEnabled needs", layer, layer)
	}
	wd := indexerWidth()
	c := &w.Compressor
	for _, s := range []struct {
		what         string
		ok           bool
		got, wantDim string
	}{
		{"index_n_heads, index_head_dim", w.Heads == mla.IndexerHeads && w.HeadDim == mla.IndexerDim, fmt.Sprint(w.Heads, w.HeadDim), fmt.Sprint(mla.IndexerHeads, mla.IndexerDim)},
		{"wq_b", w.WQB.N == mla.IndexerHeads*mla.IndexerDim && w.WQB.K == q, fmt.Sprint(w.WQB.N, w.WQB.K), fmt.Sprint(mla.IndexerHeads*mla.IndexerDim, q)},
		{"weights_proj", w.WeightsProj.N == mla.IndexerHeads && w.WeightsProj.K == hidden, fmt.Sprint(w.WeightsProj.N, w.WeightsProj.K), fmt.Sprint(mla.IndexerHeads, hidden)},
		{"compressor.wkv", c.WKV.N == wd && c.WKV.K == hidden, fmt.Sprint(c.WKV.N, c.WKV.K), fmt.Sprint(wd, hidden)},
		{"compressor.wgate", c.WGate.N == wd && c.WGate.K == hidden, fmt.Sprint(c.WGate.N, c.WGate.K), fmt.Sprint(wd, hidden)},
		{"compressor.ape", len(c.APE) == kvcache.DSv4IndexerRatio*wd, fmt.Sprint(len(c.APE)), fmt.Sprint(kvcache.DSv4IndexerRatio * wd)},
		{"compressor.norm", len(c.Norm) == mla.IndexerDim, fmt.Sprint(len(c.Norm)), fmt.Sprint(mla.IndexerDim)},
	} {
		if !s.ok {
			return fmt.Errorf("engine: layer %d indexer %s is [%s], the engine needs [%s]", layer, s.what, s.got, s.wantDim)
		}
	}
	return nil
}

// indexerKeys issues a ratio-4 layer's indexer compressor step into the
// indexer cache and states, from its columns of the layer's projection
// rows (compressProject), on the stream the caller chose (the main
// compressor's); nothing for a layer without the indexer.
func (e *Engine) indexerKeys(ctx context.Context, layer int) error {
	x := e.idx
	if x == nil || x.layers[layer] == nil {
		return nil
	}
	lw, cl := x.layers[layer], e.comp.layers[layer]
	a, ok := e.indexerStepArgs(layer)
	if !ok {
		return fmt.Errorf("layer %d has no indexer cache", layer)
	}
	a.KG, a.KGRows, a.APE, a.NormWeight = e.comp.kg, e.cfg.MaxTokens, lw.ape, lw.norm
	a.KGOffset, a.KGStride = 4*cl.indexerKGCol(), cl.projN
	if err := e.comp.stepper.CompressStep(ctx, &a); err != nil {
		return fmt.Errorf("indexer compressor step: %w", err)
	}
	return nil
}

// indexerOnAux reports whether layer's indexer query path runs on the
// backend's third stream (runChain): the layer runs the indexer, the
// backend's tuning says so, and the compressor (whose projection GEMM
// writes the head weights' input) runs on the side stream.
func (e *Engine) indexerOnAux(layer int) bool {
	return e.chain != nil && e.chain.aux != nil && e.idx != nil && e.idx.layers[layer] != nil &&
		e.comp != nil && e.comp.side != nil && e.comp.layers[layer] != nil
}

// indexerQueryGEMM issues a ratio-4 layer's indexer wq_b GEMM on q_norm's
// activation; nothing for a layer without the indexer.
func (e *Engine) indexerQueryGEMM(ctx context.Context, layer, rows int) error {
	x := e.idx
	if x == nil || x.layers[layer] == nil {
		return nil
	}
	qn := e.chain.qn
	qn.Rows, qn.ScaleStride = rows, rows
	if err := e.chain.cb.GEMM(ctx, &mla.GEMMArgs{X: qn, W: &x.layers[layer].wqB, Y: x.qIn, YStride: mla.IndexerHeads * mla.IndexerDim}); err != nil {
		return fmt.Errorf("indexer wq_b GEMM: %w", err)
	}
	return nil
}

// indexerQuery issues a ratio-4 layer's indexer query step over the
// launches, from the wq_b GEMM's output and weights_proj's columns of the
// layer's projection rows (so after the side stream's GEMM: the caller
// orders it); nothing for a layer without the indexer.
func (e *Engine) indexerQuery(ctx context.Context, layer int, launches []mla.Launch) error {
	x := e.idx
	if x == nil || x.layers[layer] == nil {
		return nil
	}
	const n = mla.IndexerHeads * mla.IndexerDim
	a, cl := e.args[layer], e.comp.layers[layer]
	if err := mla.RunIndexerQuery(ctx, x.iq, launches, &mla.IndexerQueryArgs{
		Format: e.cfg.Compressor.IndexerQueryFormat, Q: x.qIn, QStride: n,
		W: e.comp.kg, WOffset: 4 * cl.indexerWPCol(), WStride: cl.projN, QOut: x.qOut, WOut: x.wOut,
		Rope: a.Rope, RopePositions: a.RopePositions, Meta: a.Meta,
	}); err != nil {
		return fmt.Errorf("indexer query: %w", err)
	}
	return nil
}

// projColumns is where a projection tensor (TensorCompressorKG,
// TensorIndexerKG, TensorIndexerWeightsProj) lies in a compressed layer's
// projection rows: its first column, its values and the rows' stride, or
// an error naming what the layer lacks.
func (e *Engine) projColumns(t ChainTensor, layer int) (col, n, stride int, err error) {
	cl, err := e.compLayer(layer)
	if err != nil {
		return 0, 0, 0, err
	}
	stride = cl.projN
	if stride == 0 { // the projected path: SetCompressorInputs' packed K and G
		stride = 2 * cl.width()
	}
	switch t {
	case TensorCompressorKG:
		return 0, 2 * cl.width(), stride, nil
	case TensorIndexerKG, TensorIndexerWeightsProj:
		if !e.RunsIndexer(layer) {
			return 0, 0, 0, fmt.Errorf("layer %d runs no indexer", layer)
		}
		if t == TensorIndexerKG {
			return cl.indexerKGCol(), 2 * indexerWidth(), stride, nil
		}
		return cl.indexerWPCol(), mla.IndexerHeads, stride, nil
	}
	return 0, 0, 0, fmt.Errorf("%v is no projection", t)
}

// IndexerWeights returns host copies of a ratio-4 layer's indexer GEMM
// weights as the backend holds them: wq_b (e4m3 with block scales),
// weights_proj and the compressor's [wkv; wgate] (bf16, row-major: the
// rows of the layer's projection weight they occupy). A verifier bounds
// another backend's GEMM outputs with them (package gemm).
func (d Debug) IndexerWeights(layer int) (wqB weights.FP8Matrix, weightsProj, wkvg []uint16, err error) {
	e := d.e
	if e.idx == nil || e.idx.layers[layer] == nil {
		return wqB, nil, nil, fmt.Errorf("engine: IndexerWeights(%d): the layer runs no indexer", layer)
	}
	lw, cl := e.idx.layers[layer], e.comp.layers[layer]
	read := func(buf mla.Buffer) ([]byte, error) {
		out := make([]byte, buf.Len())
		if err := e.backend.Read(out, buf, 0); err != nil {
			return nil, fmt.Errorf("engine: reading layer %d indexer weights: %w", layer, err)
		}
		return out, nil
	}
	wqB = weights.FP8Matrix{N: lw.wqB.N, K: lw.wqB.K}
	if wqB.Data, err = read(lw.wqB.Data); err != nil {
		return
	}
	raw, err := read(lw.wqB.Scale)
	if err != nil {
		return
	}
	wqB.Scale = numerics.F32sFromBytes(raw)
	what := fmt.Sprintf("layer %d projection weights", layer)
	if raw, err = e.readRows(cl.wkvg, cl.indexerWPCol(), mla.IndexerHeads, what); err != nil {
		return
	}
	weightsProj = u16s(raw)
	if raw, err = e.readRows(cl.wkvg, cl.indexerKGCol(), 2*indexerWidth(), what); err != nil {
		return
	}
	return wqB, weightsProj, u16s(raw), nil
}

func u16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return out
}

// RunsIndexer reports whether the engine computes layer's indexer (a
// ratio-4 layer with Config.IndexerEnabled on the hidden-state path).
func (e *Engine) RunsIndexer(layer int) bool { return e.idx != nil && e.idx.layers[layer] != nil }

// IndexerQuery returns the indexer's query and head-weight buffers
// (Config.IndexerEnabled with Input = hidden; nil, nil otherwise), written
// by every ratio-4 layer's run and read by its selection before the next
// ratio-4 layer runs. In the default format (Compressor.IndexerQueryFormat
// mxfp4): query [MaxTokens][64][68] bytes (head h of token row t at
// (t*64+h)*68: 64 bytes of MXFP4 nibbles, low nibble the even value, then 4
// UE8M0 scale bytes), head weights [MaxTokens][64] bf16. In fp8: query
// [MaxTokens][64][128] e4m3 bytes (value i of head h at (t*64+h)*128+i),
// head weights [MaxTokens][64] float32 with each row's power-of-two scale
// folded in. Padding rows are zeros (DESIGN.md section 9). The buffers
// never move.
func (e *Engine) IndexerQuery() (query, headWeights mla.Buffer) {
	if e.idx == nil {
		return nil, nil
	}
	return e.idx.qOut, e.idx.wOut
}

// ReadIndexerQuery returns host copies of the real rows (Tokens()) of the
// indexer's query and head weights, after the work issued so far: the
// ratio-4 layer run last.
func (d IterationDebug) ReadIndexerQuery() (query, headWeights []byte, err error) {
	it := d.it
	x := it.e.idx
	if x == nil {
		return nil, nil, fmt.Errorf("engine: ReadIndexerQuery: the indexer's compute is off (it needs Config.IndexerEnabled and Input = hidden)")
	}
	T := it.meta.Tokens
	if err := it.e.backend.Synchronize(context.Background()); err != nil {
		return nil, nil, err
	}
	f := it.e.cfg.Compressor.IndexerQueryFormat
	query = make([]byte, T*mla.IndexerHeads*f.RowBytes())
	headWeights = make([]byte, T*mla.IndexerHeads*f.WeightBytes())
	if err := it.e.backend.Read(query, x.qOut, 0); err != nil {
		return nil, nil, fmt.Errorf("engine: reading the indexer query: %w", err)
	}
	if err := it.e.backend.Read(headWeights, x.wOut, 0); err != nil {
		return nil, nil, fmt.Errorf("engine: reading the indexer head weights: %w", err)
	}
	return query, headWeights, nil
}

// IndexerQueryOnAux reports whether layer's indexer query path runs on the
// backend's third stream (mla.AuxRunner.AuxQuery; the engine's chain
// issues it there only with the compressor on the side stream).
func (d Debug) IndexerQueryOnAux(layer int) bool { return d.e.indexerOnAux(layer) }
