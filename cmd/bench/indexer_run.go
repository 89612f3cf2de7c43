package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/dsv4mla/prologue/attention/mla"
)

// IndexerGoalPct is issue 23's goal: the indexer's prologue adds at most
// this share to a ratio-4 layer's time through the graph.
const IndexerGoalPct = 15

// VLLMIndexerQueryUs is vLLM's fused indexer-query kernel as quoted by
// issue 23 (vLLM PR #42899, GPU not named): 128 tokens, RoPE, FP8
// quantization and the head-weight scaling after its separate GEMM, no
// Hadamard. Quoted, not measured.
const VLLMIndexerQueryUs = 7.84

// IndexerResult is one shape's ratio-4 layer with and without the
// indexer, every layer in one CUDA graph with its own weights, the L2
// flushed before each replay (median), time per layer.
type IndexerResult struct {
	Model  string `json:"model"`
	Phase  string `json:"phase"`
	Batch  int    `json:"batch"`
	MTP    int    `json:"mtp"`
	Tokens int    `json:"tokens"`
	// Context is a long-context generation shape's length (0: the chain's
	// random lengths).
	Context int `json:"context,omitempty"`
	Rows    int `json:"rows"`
	Layers  int `json:"layers"`
	Sets    int `json:"sets"`
	// TopK is index_topk; Visible the most compressed entries a token of
	// the shape sees; ScoredRows the token rows that see more than TopK
	// (the others select every entry without a score).
	TopK       int `json:"topk"`
	Visible    int `json:"visible"`
	ScoredRows int `json:"scored_rows"`
	// ChainUs is the chain alone (no compressor, no indexer), for
	// reference. BaseUs (a) is the ratio-4 layer without the indexer: the
	// chain with its ratio-4 compressor forked. PrologueUs (b) adds the
	// indexer's prologue, TopKUs (c) the selection too.
	ChainUs    float64 `json:"chain_us"`
	BaseUs     float64 `json:"base_us"`
	PrologueUs float64 `json:"prologue_us"`
	TopKUs     float64 `json:"topk_us"`
	// Stream is where (b) runs the indexer's query path, the engine's way
	// under the run's knobs (cudatune.Knobs.IndexerStream): "main" or
	// "third". MainQUs (b1) is (b) with it on the main stream (the wq_b
	// GEMM after the Q prologue, the query step after the join), AuxUs
	// (b3) on the third stream (forked after q_norm, the query step after
	// the side stream's projection GEMM), AuxGEMMUs (b3g) only its wq_b
	// GEMM there (the query step after the join); the *AddedPct their
	// shares.
	Stream          string  `json:"stream"`
	MainQUs         float64 `json:"main_q_us"`
	MainQAddedPct   float64 `json:"main_q_added_pct"`
	AuxUs           float64 `json:"aux_us"`
	AuxAddedPct     float64 `json:"aux_added_pct"`
	AuxGEMMUs       float64 `json:"aux_gemm_us"`
	AuxGEMMAddedPct float64 `json:"aux_gemm_added_pct"`
	// SideUs (b') is (b) with the query's GEMMs and step on the side
	// stream after q_norm and weights_proj after the keys (not the
	// engine's way: whether the overlap pays); SideAddedPct its share.
	SideUs       float64 `json:"side_us"`
	SideAddedPct float64 `json:"side_added_pct"`
	// SeparateUs (b'') is (b) with the main compressor's, the indexer
	// compressor's and weights_proj's projections as three bf16 GEMMs (the
	// engine before its one GEMM of the three); SeparateAddedPct its share.
	SeparateUs       float64 `json:"separate_us"`
	SeparateAddedPct float64 `json:"separate_added_pct"`
	// NoKeysUs (b-k) is (b) without the indexer's key step (its
	// compressor step on the side stream): PrologueUs - NoKeysUs is what
	// the step costs the layer through the graph, 0 where the main stream
	// hides it.
	NoKeysUs float64 `json:"no_keys_us,omitempty"`
	// NoQueryUs (b-q), NoWqBUs (b-g), NarrowProjUs (b-p) and KeysOnlyUs
	// (b-qg) are (b) without the query step, without the wq_b GEMM, with
	// the projection GEMM at the compressor's width, and without both the
	// GEMM and the step: PrologueUs minus each is what that piece costs
	// the layer through the graph.
	NoQueryUs    float64 `json:"no_query_us,omitempty"`
	NoWqBUs      float64 `json:"no_wqb_us,omitempty"`
	NarrowProjUs float64 `json:"narrow_proj_us,omitempty"`
	KeysOnlyUs   float64 `json:"keys_only_us,omitempty"`
	// ColdBaseUs, ColdPrologueUs and ColdTopKUs are (a), (b) and (c) of
	// one layer alone in its graph, the L2 flushed before each replay: no
	// neighbour layer overlaps its start or end. ColdAddedPct is
	// 100 (b - a) / a of those.
	ColdBaseUs     float64 `json:"cold_base_us"`
	ColdPrologueUs float64 `json:"cold_prologue_us"`
	ColdTopKUs     float64 `json:"cold_topk_us"`
	ColdAddedPct   float64 `json:"cold_added_pct"`
	// AloneUs is the indexer's prologue alone in the same graph form (its
	// three GEMMs and two steps in order on one stream); QueryAloneUs the
	// query step alone, TopKAloneUs the selection alone.
	AloneUs      float64 `json:"alone_us"`
	QueryAloneUs float64 `json:"query_alone_us"`
	TopKAloneUs  float64 `json:"topk_alone_us"`
	// BaseWeightBytes is a ratio-4 layer's weights without the indexer
	// (the chain's and the compressor's projection), AddedWeightBytes the
	// indexer's; the floors are those bytes at the copy rate measured in
	// the same run (the weight-streaming floors).
	BaseWeightBytes  int64   `json:"base_weight_bytes"`
	AddedWeightBytes int64   `json:"added_weight_bytes"`
	BaseFloorUs      float64 `json:"base_floor_us"`
	AddedFloorUs     float64 `json:"added_floor_us"`
	// AddedUs = b - a and AddedPct = 100 (b - a) / a, against the goal;
	// TopKAddedUs and TopKAddedPct the same for c.
	AddedUs      float64 `json:"added_us"`
	AddedPct     float64 `json:"added_pct"`
	TopKAddedUs  float64 `json:"topk_added_us"`
	TopKAddedPct float64 `json:"topk_added_pct"`
	GoalPct      float64 `json:"goal_pct"`
	GoalMet      bool    `json:"goal_met"`
}

// modeUs is where the time of a mode's graph goes.
func (r *IndexerResult) modeUs(m idxMode) *float64 {
	switch m {
	case idxOff:
		return &r.BaseUs
	case idxPrologue:
		return &r.PrologueUs
	case idxTopK:
		return &r.TopKUs
	case idxSide:
		return &r.SideUs
	case idxSeparate:
		return &r.SeparateUs
	case idxNoKeys:
		return &r.NoKeysUs
	case idxNoQuery:
		return &r.NoQueryUs
	case idxNoWqB:
		return &r.NoWqBUs
	case idxNarrowProj:
		return &r.NarrowProjUs
	case idxKeysOnly:
		return &r.KeysOnlyUs
	case idxMainQ:
		return &r.MainQUs
	case idxAux:
		return &r.AuxUs
	case idxAuxGEMM:
		return &r.AuxGEMMUs
	case idxAlone:
		return &r.AloneUs
	case idxQueryAlone:
		return &r.QueryAloneUs
	case idxTopKAlone:
		return &r.TopKAloneUs
	}
	panic(fmt.Sprintf("no time for %v", m))
}

// coldUs is where the time of a mode's one-layer graph goes (nil: not
// timed alone).
func (r *IndexerResult) coldUs(m idxMode) *float64 {
	switch m {
	case idxOff:
		return &r.ColdBaseUs
	case idxPrologue:
		return &r.ColdPrologueUs
	case idxTopK:
		return &r.ColdTopKUs
	}
	return nil
}

// derive fills in the floors, the ratios and the verdict from the times
// and the bytes, at copyGBps.
func (r *IndexerResult) derive(copyGBps float64) {
	r.BaseFloorUs = safeDiv(float64(r.BaseWeightBytes), copyGBps*1e3)
	r.AddedFloorUs = safeDiv(float64(r.AddedWeightBytes), copyGBps*1e3)
	r.AddedUs = r.PrologueUs - r.BaseUs
	r.AddedPct = safeDiv(100*r.AddedUs, r.BaseUs)
	r.TopKAddedUs = r.TopKUs - r.BaseUs
	r.TopKAddedPct = safeDiv(100*r.TopKAddedUs, r.BaseUs)
	r.SideAddedPct = safeDiv(100*(r.SideUs-r.BaseUs), r.BaseUs)
	r.MainQAddedPct = safeDiv(100*(r.MainQUs-r.BaseUs), r.BaseUs)
	r.AuxAddedPct = safeDiv(100*(r.AuxUs-r.BaseUs), r.BaseUs)
	r.AuxGEMMAddedPct = safeDiv(100*(r.AuxGEMMUs-r.BaseUs), r.BaseUs)
	r.SeparateAddedPct = safeDiv(100*(r.SeparateUs-r.BaseUs), r.BaseUs)
	r.ColdAddedPct = safeDiv(100*(r.ColdPrologueUs-r.ColdBaseUs), r.ColdBaseUs)
	r.GoalPct = IndexerGoalPct
	r.GoalMet = r.BaseUs > 0 && r.PrologueUs > 0 && r.AddedPct <= IndexerGoalPct
}

// IndexerQueryResult is the indexer's query step alone (RoPE, Hadamard,
// quantization, head-weight scaling; no GEMM) over Tokens tokens in one
// format, beside the quoted vLLM kernel.
type IndexerQueryResult struct {
	Model  string `json:"model"`
	Format string `json:"format"`
	Tokens int    `json:"tokens"`
	Rows   int    `json:"rows"`
	// GraphUs: Layers calls, each its own input and output buffers, in one
	// graph, the L2 flushed before each replay (median), per call.
	// WarmUs: WarmCalls calls on the same buffers in one graph (flushed
	// once before the replay), per call: the inputs stay in L2, the way a
	// kernel is timed back to back.
	Layers    int     `json:"layers"`
	GraphUs   float64 `json:"graph_us"`
	WarmCalls int     `json:"warm_calls"`
	WarmUs    float64 `json:"warm_us"`
	// Bytes read and written; FloorUs those at the copy rate (which counts
	// the bytes a copy reads and writes, as the other floors of the report).
	Bytes   int64   `json:"bytes"`
	FloorUs float64 `json:"floor_us"`
	VLLMUs  float64 `json:"vllm_quoted_us"`
}

// derive fills in the copy floor at copyGBps.
func (q *IndexerQueryResult) derive(copyGBps float64) {
	q.FloorUs = safeDiv(float64(q.Bytes), copyGBps*1e3)
}

// indexerQueryBytes is the query step's traffic over rows rows in format
// f: the bf16 query rows and float32 weights_proj outputs read, the query
// rows and head weights written.
func indexerQueryBytes(rows int, f mla.IndexerQueryFormat) int64 {
	return int64(rows) * mla.IndexerHeads * int64(mla.IndexerDim*2+4+f.RowBytes()+f.WeightBytes())
}

// indexerShapes lists the indexer's generation shapes at the chain's
// random lengths (every batch at the MTP), its context shapes, and then
// the generation shapes at each long context (the shapes first,
// so a run cut short keeps them).
func (c *config) indexerShapes() []shape {
	var out []shape
	for _, n := range c.IndexerContexts {
		if n == 0 {
			for _, nb := range c.IndexerBatches {
				out = append(out, generationShape(nb, c.IndexerMTP))
			}
		}
	}
	for _, t := range c.IndexerCtxTokens {
		out = append(out, contextShape(t))
	}
	for _, n := range c.IndexerContexts {
		if n != 0 {
			for _, nb := range c.IndexerBatches {
				out = append(out, longGenerationShape(nb, c.IndexerMTP, n))
			}
		}
	}
	return out
}

// indexers times every indexer shape of md. A shape that fails is
// reported in rep.Errors and the next one runs.
func indexers(c *config, d *device, md model, rep *Report) error {
	if err := d.be.InitGEMM(); err != nil {
		return err
	}
	// The kernels compile now: a graph capture may not.
	if err := d.be.LoadCompressor(); err != nil {
		return err
	}
	if err := d.be.LoadTopK(); err != nil {
		return err
	}
	w, err := d.newChainWeights(md, c.ChainLayers)
	if err != nil {
		return fmt.Errorf("chain weights: %w", err)
	}
	defer d.freeBufs(w.bufs)
	var failed int
	for _, s := range c.indexerShapes() {
		if err := indexerShape(c, d, md, w, s, rep); err != nil {
			failed++
			msg := fmt.Sprintf("indexer %s %s b=%d mtp=%d %d tokens: %v", md.Name, s.Phase, s.Batch, s.MTP, s.Tokens, err)
			fmt.Println("bench:", msg)
			rep.Errors = append(rep.Errors, msg)
			continue
		}
		if err := rep.write(c.Out); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d indexer shapes of %s failed (listed above)", failed, md.Name)
	}
	return nil
}

// indexerShape times one shape's ratio-4 layer in every idxMode, and at
// 128 tokens the query step alone in both formats.
func indexerShape(c *config, d *device, md model, w *chainWeights, s shape, rep *Report) (err error) {
	ctx := context.Background()
	start := time.Now()
	// trace marks each step in the log, so that a run cut short says where.
	trace := func(format string, args ...any) {
		fmt.Printf("  indexer %s %s b=%d tokens=%d context=%d: %s [%.1f s]\n", md.Name, s.Phase, s.Batch, s.Tokens, s.Context,
			fmt.Sprintf(format, args...), time.Since(start).Seconds())
	}
	L := len(w.layers)
	cl, err := d.setupChain(md, s, L, c.GraphMemBytes)
	if err != nil {
		return err
	}
	defer d.free(cl.ls)
	comp, err := d.setupComp(md, cl, 4, L)
	if err != nil {
		return fmt.Errorf("ratio-4 compressor: %w", err)
	}
	defer d.freeComp(comp)
	in := idxInputs{m: cl.ls.m, launches: cl.ls.launches, rows: cl.rows, rope: cl.ls.args[0].Rope,
		ropePositions: cl.ls.args[0].RopePositions, meta: cl.ls.args[0].Meta, eps: float32(md.cfg.RMSNormEps)}
	for _, cs := range cl.sets {
		in.hidden = append(in.hidden, cs.hidden)
		in.qn = append(in.qn, cs.qn)
	}
	x, err := setupIndexer(d, md, in, L)
	defer d.freeBufs(x.bufs)
	if err != nil {
		return err
	}
	if err := d.be.Synchronize(ctx); err != nil {
		return err
	}
	trace("set up: %d layers, %d input sets, visible <= %d entries, %d rows score (top-k %d, %d keys of scratch)",
		L, len(cl.sets), x.Visible, x.Scored, x.tk.TopK, x.tk.ScratchEntries)
	// One eager layer of each kind first: every GEMM shape plans its
	// algorithm on each stream (a capture may not), and a wrong argument
	// fails here (the selection's before its graphs).
	eager := func(idx *chainIdxStep) error {
		if err := d.chainLayer(ctx, md, cl, &w.layers[0], 0, kvForked, nil, comp, idx); err != nil {
			return fmt.Errorf("eager layer: %w", err)
		}
		if err := d.be.Synchronize(ctx); err != nil {
			return fmt.Errorf("eager layer: %w", err)
		}
		return nil
	}
	// The engine's way (cudatune.Knobs.IndexerStream).
	engineAux := d.be.AuxQuery()
	for _, idx := range []*chainIdxStep{{x: x}, {x: x, aux: true}, {x: x, auxGEMM: true}, {x: x, side: true}, {x: x, separate: true},
		{x: x, narrowProj: true, aux: engineAux}} {
		if err := eager(idx); err != nil {
			return err
		}
	}
	trace("eager layers ran")
	// graphN times layers 0..n-1 of layer in one graph, per layer; graph
	// all L of them.
	graphN := func(what string, n int, layer func(l int) error) (float64, error) {
		total, err := d.timeGraph(c.GraphReps, func() error {
			for l := range n {
				if err := layer(l); err != nil {
					return fmt.Errorf("layer %d: %w", l, err)
				}
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("graph (%s): %w", what, err)
		}
		return total / float64(n), nil
	}
	graph := func(what string, layer func(l int) error) (float64, error) { return graphN(what, L, layer) }
	r := IndexerResult{Model: md.Name, Phase: s.Phase, Batch: s.Batch, MTP: s.MTP, Tokens: s.Tokens, Context: s.Context, Rows: cl.rows,
		Layers: L, Sets: len(cl.sets), TopK: x.tk.TopK, Visible: x.Visible, ScoredRows: x.Scored,
		BaseWeightBytes:  chainDimsOf(md).weightBytes() + compressWeightBytes(md, 4),
		AddedWeightBytes: indexerWeightBytes(md), Stream: "main"}
	if engineAux {
		r.Stream = "third"
	}
	if r.ChainUs, err = graph("chain", func(l int) error {
		return d.chainLayer(ctx, md, cl, &w.layers[l], l, kvForked, nil, nil, nil)
	}); err != nil {
		return err
	}
	trace("chain %.2f us/layer", r.ChainUs)
	// The result is kept after every mode: a run cut short keeps what ran.
	at := len(rep.Indexer)
	rep.Indexer = append(rep.Indexer, r)
	keep := func() {
		r.derive(rep.CopyGBps)
		rep.Indexer[at] = r
		if err := rep.write(c.Out); err != nil {
			fmt.Println("bench: saving the report:", err)
		}
	}
	modes := idxModes
	if c.IndexerPrologueOnly {
		// (a) and (b) captured IndexerPrologueReps times in turn (graphs of
		// the same layers differ by tens of microseconds at prefill), their
		// medians kept; then (b-q) and the query step alone.
		modes = nil
		for range max(c.IndexerPrologueReps, 1) {
			modes = append(modes, idxOff, idxPrologue)
		}
		modes = append(modes, idxNoQuery, idxQueryAlone)
	}
	samples := map[idxMode][]float64{}
	for _, mode := range modes {
		if c.IndexerNoTopK && (mode == idxTopK || mode == idxTopKAlone) {
			continue
		}
		var idx *chainIdxStep
		switch mode {
		case idxPrologue:
			idx = &chainIdxStep{x: x, aux: engineAux}
		case idxMainQ:
			idx = &chainIdxStep{x: x}
		case idxAux:
			idx = &chainIdxStep{x: x, aux: true}
		case idxAuxGEMM:
			idx = &chainIdxStep{x: x, auxGEMM: true}
		case idxTopK:
			idx = &chainIdxStep{x: x, topk: true, aux: engineAux}
			if err := eager(idx); err != nil {
				return err
			}
			trace("eager layer with the selection ran")
		case idxSide:
			idx = &chainIdxStep{x: x, side: true}
		case idxSeparate:
			idx = &chainIdxStep{x: x, separate: true}
		case idxNoKeys:
			idx = &chainIdxStep{x: x, noKeys: true, aux: engineAux}
		case idxNoQuery:
			idx = &chainIdxStep{x: x, noQuery: true, aux: engineAux}
		case idxNoWqB:
			idx = &chainIdxStep{x: x, noWqB: true, aux: engineAux}
		case idxNarrowProj:
			idx = &chainIdxStep{x: x, narrowProj: true, aux: engineAux}
		case idxKeysOnly:
			idx = &chainIdxStep{x: x, noQuery: true, noWqB: true, aux: engineAux}
		}
		if mode == idxTopK && s.Tokens == 128 && s.Phase == "generation" && s.Context == 0 {
			// The query step alone before the selection's graphs.
			if err := indexerQueryAlone(c, d, md, x, cl.rows, L, s.Tokens, rep, graph); err != nil {
				return err
			}
		}
		layer := func(l int) error { return d.chainLayer(ctx, md, cl, &w.layers[l], l, kvForked, nil, comp, idx) }
		if mode >= idxAlone {
			layer = func(l int) error { return x.alone(ctx, d.be, l, mode) }
		}
		us, err := graph(mode.String(), layer)
		if err != nil {
			return err
		}
		*r.modeUs(mode) = us
		samples[mode] = append(samples[mode], us)
		cold := r.coldUs(mode)
		if c.IndexerPrologueOnly {
			cold = nil // the repeated graphs, not one layer alone
		}
		if cold != nil {
			if *cold, err = graphN(mode.String()+", one layer", 1, layer); err != nil {
				return err
			}
		}
		keep()
		if cold != nil {
			trace("%v: %.2f us/layer, one layer %.2f", mode, us, *cold)
		} else {
			trace("%v: %.2f us/layer", mode, us)
		}
	}
	for m, v := range samples {
		if len(v) > 1 {
			slices.Sort(v)
			*r.modeUs(m) = v[len(v)/2]
		}
	}
	if len(samples[idxPrologue]) > 1 {
		keep()
		fmt.Printf("  indexer %s %s tokens=%d: medians of %d graphs: (a) %.2f, (b) %.2f us/layer (%+.1f%%)\n", md.Name, s.Phase, s.Tokens,
			len(samples[idxPrologue]), r.BaseUs, r.PrologueUs, r.AddedPct)
	}
	fmt.Println(r.line())
	return nil
}

// indexerQueryAlone times the query step alone over the shape's tokens in
// both formats (graph: one call a layer of the shape's layers).
func indexerQueryAlone(c *config, d *device, md model, x *chainIdx, rows, layers, tokens int, rep *Report,
	graph func(what string, layer func(l int) error) (float64, error)) error {
	ctx := context.Background()
	for _, f := range []mla.IndexerQueryFormat{mla.IndexerQueryMXFP4, mla.IndexerQueryFP8} {
		q := IndexerQueryResult{Model: md.Name, Format: f.String(), Tokens: tokens, Rows: rows, Layers: layers,
			WarmCalls: indexerWarmCalls, Bytes: indexerQueryBytes(rows, f), VLLMUs: VLLMIndexerQueryUs}
		var err error
		if q.GraphUs, err = graph("query step "+f.String(), func(l int) error { return x.queryStep(ctx, d.be, l, f) }); err != nil {
			return err
		}
		total, err := d.timeGraph(c.GraphReps, func() error {
			for range indexerWarmCalls {
				if err := x.queryStep(ctx, d.be, 0, f); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("graph (query step %v, back to back): %w", f, err)
		}
		q.WarmUs = total / indexerWarmCalls
		q.derive(rep.CopyGBps)
		rep.IndexerQuery = append(rep.IndexerQuery, q)
		fmt.Println(q.line())
	}
	return nil
}

// indexerWarmCalls is the back-to-back query steps of one graph.
const indexerWarmCalls = 20

// line is the result's one-line summary.
func (r *IndexerResult) line() string {
	verdict := "goal met"
	if !r.GoalMet {
		verdict = "goal missed"
	}
	return fmt.Sprintf("indexer %-5s %-10s b=%-3d mtp=%d tokens=%-6d context=%-7d rows=%-6d: chain %8.2f, (a) ratio-4 layer %8.2f, (b) with the indexer's prologue %8.2f us/layer (%+7.2f us, %+6.1f%%: <= %g%% %s; query path on the %s stream), (b1) query path on the main stream %8.2f (%+6.1f%%), (b3) on a third stream %8.2f (%+6.1f%%), (b3g) its wq_b GEMM there %8.2f (%+6.1f%%), (c) with top-k %8.2f (%+7.2f us, %+6.1f%%), (b') query on the side stream %8.2f (%+6.1f%%), (b'') three bf16 projections %8.2f (%+6.1f%%), (b-k) without the key step %8.2f (keys %+6.2f us), (b-q) without the query step %8.2f (query %+6.2f us), (b-g) without the wq_b GEMM %8.2f (GEMM %+6.2f us), (b-p) without the projection columns %8.2f (columns %+6.2f us), (b-qg) without GEMM and query %8.2f (both %+6.2f us); one layer cold: (a) %8.2f, (b) %8.2f (%+6.1f%%), (c) %8.2f; alone: prologue %7.2f, query step %6.2f, top-k %7.2f; added weights %4.1f MB, floor %5.2f us (layer's %5.1f MB: %5.2f us); visible <= %d entries, %d rows score (top-k %d)",
		r.Model, r.Phase, r.Batch, r.MTP, r.Tokens, r.Context, r.Rows, r.ChainUs, r.BaseUs, r.PrologueUs, r.AddedUs, r.AddedPct, r.GoalPct, verdict, r.Stream,
		r.MainQUs, r.MainQAddedPct, r.AuxUs, r.AuxAddedPct, r.AuxGEMMUs, r.AuxGEMMAddedPct,
		r.TopKUs, r.TopKAddedUs, r.TopKAddedPct, r.SideUs, r.SideAddedPct, r.SeparateUs, r.SeparateAddedPct, r.NoKeysUs, r.PrologueUs-r.NoKeysUs,
		r.NoQueryUs, r.PrologueUs-r.NoQueryUs, r.NoWqBUs, r.PrologueUs-r.NoWqBUs, r.NarrowProjUs, r.PrologueUs-r.NarrowProjUs, r.KeysOnlyUs, r.PrologueUs-r.KeysOnlyUs, r.ColdBaseUs, r.ColdPrologueUs, r.ColdAddedPct, r.ColdTopKUs, r.AloneUs, r.QueryAloneUs, r.TopKAloneUs,
		float64(r.AddedWeightBytes)/1e6, r.AddedFloorUs, float64(r.BaseWeightBytes)/1e6, r.BaseFloorUs, r.Visible, r.ScoredRows, r.TopK)
}

// line is the result's one-line summary.
func (q *IndexerQueryResult) line() string {
	return fmt.Sprintf("indexer query %-5s %-5s %d tokens (%d rows): %6.2f us a call in a graph of %d (L2 flushed), %6.2f us back to back (%d calls); copy floor %5.2f us; vLLM's fused kernel quoted at %.2f us (no Hadamard)",
		q.Model, q.Format, q.Tokens, q.Rows, q.GraphUs, q.Layers, q.WarmUs, q.WarmCalls, q.FloorUs, q.VLLMUs)
}

// writeIndexerTable prints the results as a Markdown table (us a layer).
func writeIndexerTable(w io.Writer, rs []IndexerResult, qs []IndexerQueryResult) error {
	var b strings.Builder
	if len(rs) > 0 {
		b.WriteString("| model | shape | (a) ratio-4 layer | (b) + prologue | (b-a)/a | goal | query path | (b1) main stream | (b3) third stream | (b3g) its GEMM there | (c) + top-k | (c-a)/a | (b') query on the side | (b'-a)/a | (b'') three bf16 projections | (b''-a)/a | prologue alone | added weights floor |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rs {
			shape := fmt.Sprintf("prefill %d", r.Tokens)
			if r.Phase == "generation" {
				shape = fmt.Sprintf("b=%d MTP %d", r.Batch, r.MTP)
				if r.Context > 0 {
					shape += fmt.Sprintf(" at %d", r.Context)
				}
			}
			verdict := "met"
			if !r.GoalMet {
				verdict = "missed"
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %+.1f%% | <= %g%%: %s | %s | %.2f (%+.1f%%) | %.2f (%+.1f%%) | %.2f (%+.1f%%) | %.2f | %+.1f%% | %.2f | %+.1f%% | %.2f | %+.1f%% | %.2f | %.2f (%.1f MB) |\n",
				r.Model, shape, r.BaseUs, r.PrologueUs, r.AddedPct, r.GoalPct, verdict, r.Stream, r.MainQUs, r.MainQAddedPct, r.AuxUs, r.AuxAddedPct,
				r.AuxGEMMUs, r.AuxGEMMAddedPct, r.TopKUs, r.TopKAddedPct, r.SideUs, r.SideAddedPct,
				r.SeparateUs, r.SeparateAddedPct, r.AloneUs,
				r.AddedFloorUs, float64(r.AddedWeightBytes)/1e6)
		}
	}
	if len(qs) > 0 {
		b.WriteString("\n| model | query format | tokens | in a graph, L2 flushed | back to back | copy floor | vLLM quoted |\n")
		b.WriteString("|---|---|---|---|---|---|---|\n")
		for _, q := range qs {
			fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %.2f | %.2f | %.2f |\n", q.Model, q.Format, q.Tokens, q.GraphUs, q.WarmUs, q.FloorUs, q.VLLMUs)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
