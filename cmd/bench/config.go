package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
)

// config is one benchmark run, read from the command line; nothing else
// carries state between the parts of a run.
type config struct {
	Out      string // JSON report
	CheckDir string // where the check cases go ("" = none)
	Reps     int    // timed repetitions of a cold single launch (median)
	// GraphReps are the replays of a many-layer graph (median).
	GraphReps int

	Models  []model
	Formats []kvcache.Format // cache formats of the cold single launches

	GenBatches []int // generation batch sizes
	MTPs       []int // draft tokens per generation sequence
	CtxTokens  []int // context batch sizes in tokens

	Main     variant   // the main kernel options
	Variants []variant // extra option sets
	// VariantKernels times every kernel under the variants too, not only
	// the decode iteration.
	VariantKernels bool
	// ContiguousLatent reads the latent from a dense [T][512] buffer instead
	// of the fused rows (a diagnostic of the stride's cost).
	ContiguousLatent bool
	Verbose          bool
	Quick            bool

	Kernels   bool // the cold single launches
	Iteration bool // the eager and graph decode iteration at b=32 MTP 3
	// IterationReps is the timed repetitions of each decode iteration
	// (median); many, with CPUProfile, give the profile enough samples.
	IterationReps int
	// CPUProfile is a file for a CPU profile (runtime/pprof) of the
	// measurements, empty for none.
	CPUProfile string
	Graph      bool // the many-layer graph sweep
	// GraphMemBytes bounds the device memory of one many-layer graph's
	// inputs; past it, layers cycle over fewer input sets.
	GraphMemBytes int64
	// CtxGraphLayers caps the layers of a context shape's graph: a context
	// layer is long enough that a few layers amortize the graph launch.
	CtxGraphLayers int

	// Chain times the whole chain of DESIGN.md section 7 per layer (act_quant,
	// the two GEMMs, q_norm, the prologue) in CUDA graphs of ChainLayers
	// layers with distinct weights, over ChainBatches (at every MTP) and
	// ChainCtxTokens.
	Chain          bool
	ChainLayers    int
	ChainBatches   []int
	ChainCtxTokens []int
	// ChainCompress also times each chain shape with the KV compressor of a
	// ratio-4 and of a ratio-128 layer in every layer (the projection GEMM
	// and the step on the side stream, as the engine runs them), and the
	// compressor alone.
	ChainCompress bool

	// Indexer times a ratio-4 layer from hidden states without the
	// indexer, with its prologue and with its top-k selection too (issue
	// 23), and the indexer's work alone, over IndexerBatches at IndexerMTP
	// and IndexerCtxTokens, in graphs of ChainLayers layers.
	Indexer          bool
	IndexerBatches   []int
	IndexerMTP       int
	IndexerCtxTokens []int
	// IndexerContexts are the generation shapes' contexts: 0 for the
	// chain's random lengths below maxGenCached, N for every sequence's
	// last token just below position N (longGenerationShape).
	IndexerContexts []int
	// IndexerNoTopK leaves the selection's modes out (the prologue's
	// figures in less device time).
	IndexerNoTopK bool
	// IndexerPrologueOnly times only (a), (b), (b-q) and the query step
	// alone of the indexer's modes (repeated A/B runs of one knob).
	IndexerPrologueOnly bool
	IndexerPrologueReps int

	HostCost bool // the engine's Begin/End host cost
	HostReps int
	// HostPrefill is the context length each sequence of the host-cost
	// engine starts with (its block table width).
	HostPrefill int
}

// Defaults of the shape lists (issue 11's generation and context shapes).
const (
	defaultGenBatches = "1,2,4,8,16,32,64,128,256"
	defaultMTPs       = "0,3"
	defaultCtxTokens  = "1024,4096,16384,65536"
	quickGenBatches   = "1,32,256"
	quickCtxTokens    = "4096"
	// Issue 9's shapes of the chain.
	defaultChainBatches   = "1,8,32,128,256"
	defaultChainCtxTokens = "1024,4096,16384"
	quickChainBatches     = "1,32"
	quickChainCtxTokens   = "4096"
	// Issue 23's shapes of the indexer.
	defaultIndexerBatches   = "32"
	defaultIndexerMTP       = 3
	defaultIndexerCtxTokens = "4096,16384"
	// minIndexerContext is the shortest long context: room for the 64
	// positions of jitter and the step's tokens.
	minIndexerContext = 128
)

// parseFlags reads the run's command line (without the program name).
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Out, "out", "bench-go.json", "JSON report")
	fs.StringVar(&c.CheckDir, "check-dir", "", "write small cases as safetensors for bench/check_peers.py")
	fs.IntVar(&c.Reps, "reps", 50, "timed repetitions per kernel and shape (median)")
	fs.IntVar(&c.GraphReps, "graph-reps", 50, "replays of each many-layer graph (median)")
	models := fs.String("models", "flash,pro", "models: flash, pro")
	formats := fs.String("formats", "fp8_ue8m0,bf16,fp8_pertensor", "cache formats of the single launches")
	gen := fs.String("gen-batches", "", "generation batch sizes (default "+defaultGenBatches+"; --quick "+quickGenBatches+")")
	mtps := fs.String("mtp", defaultMTPs, "draft tokens per generation sequence")
	ctx := fs.String("ctx-tokens", "", "context batch sizes in tokens (default "+defaultCtxTokens+"; --quick "+quickCtxTokens+")")
	mainVariant := fs.String("variant", "", "option set of the main variant (see --variants; empty: the defaults)")
	variants := fs.String("variants", "", "extra kernel variants to time, ';'-separated option sets, e.g. 'warps=4 kvd=8;qd=6;bpsm=8'")
	fs.BoolVar(&c.Quick, "quick", false, "a few shapes only")
	fs.BoolVar(&c.Verbose, "verbose", false, "print ptxas's register report of the kernels")
	fs.BoolVar(&c.VariantKernels, "variant-kernels", true, "also time every kernel and shape under the --variants (false: only the decode iteration)")
	fs.BoolVar(&c.ContiguousLatent, "contiguous-latent", false, "diagnostic: read the latent from a contiguous [T][512] buffer instead of the fused A rows")
	fs.BoolVar(&c.Kernels, "kernels", true, "time every kernel as a cold single launch (L2 flushed)")
	fs.BoolVar(&c.Iteration, "iteration", true, "time the b=32 MTP 3 decode iteration eagerly and as a graph")
	fs.IntVar(&c.IterationReps, "iteration-reps", 20, "timed repetitions of each decode iteration (median); raise it with --cpuprofile")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile (runtime/pprof) of the measurements to this file, e.g. with --iteration-reps 5000 and only --iteration")
	fs.BoolVar(&c.Graph, "graph", true, "time every shape as a CUDA graph of many layers with distinct inputs")
	graphMem := fs.Float64("graph-mem-gb", 48, "device memory for one graph's per-layer inputs, GB")
	fs.IntVar(&c.CtxGraphLayers, "ctx-graph-layers", 8, "layers in a context shape's graph")
	fs.BoolVar(&c.Chain, "chain", true, "time the whole chain from hidden states (act_quant, GEMMs, q_norm, prologue) per layer in CUDA graphs")
	fs.IntVar(&c.ChainLayers, "chain-layers", 8, "layers, each with its own weights, in a chain graph")
	fs.BoolVar(&c.ChainCompress, "chain-compress", true, "also time the chain with the KV compressor (ratio 4, ratio 128) and the compressor alone")
	chainBatches := fs.String("chain-batches", "", "generation batch sizes of the chain (default "+defaultChainBatches+"; --quick "+quickChainBatches+")")
	chainCtx := fs.String("chain-ctx-tokens", "", "context batch sizes of the chain in tokens (default "+defaultChainCtxTokens+"; --quick "+quickChainCtxTokens+")")
	only := fs.Bool("chain-only", false, "only the chain (and the copy ceiling): the same as --kernels=false --iteration=false --graph=false --host-cost=false")
	fs.BoolVar(&c.Indexer, "indexer", false, "also time a ratio-4 layer from hidden states without the indexer, with its prologue and with its top-k (graphs of --chain-layers layers), and the indexer's work alone")
	indexerOnly := fs.Bool("indexer-only", false, "only the indexer (and the copy ceiling): the same as --indexer --chain=false --kernels=false --iteration=false --graph=false --host-cost=false")
	indexerBatches := fs.String("indexer-batches", defaultIndexerBatches, "generation batch sizes of the indexer ('none' for none)")
	fs.IntVar(&c.IndexerMTP, "indexer-mtp", defaultIndexerMTP, "draft tokens per generation sequence of the indexer's shapes")
	indexerCtx := fs.String("indexer-ctx-tokens", defaultIndexerCtxTokens, "context batch sizes of the indexer in tokens ('none' for none)")
	indexerContexts := fs.String("indexer-contexts", "0", "contexts of the indexer's generation shapes: 0 for random lengths below "+strconv.Itoa(maxGenCached)+" (the chain's), N for every sequence ending just below position N")
	fs.BoolVar(&c.IndexerNoTopK, "indexer-no-topk", false, "leave the indexer's top-k modes (c) and top-k alone out")
	fs.IntVar(&c.IndexerPrologueReps, "indexer-prologue-reps", 1, "with --indexer-prologue-only: capture (a) and (b) this many times in turn and keep their medians")
	fs.BoolVar(&c.IndexerPrologueOnly, "indexer-prologue-only", false, "time only the indexer's modes (a), (b), (b-q) and the query step alone: the layer without it, with its prologue, without the query step")
	fs.BoolVar(&c.HostCost, "host-cost", true, "measure the engine's Begin/End host cost on the CUDA backend")
	fs.IntVar(&c.HostReps, "host-reps", 30, "iterations per batch size of the host-cost measurement")
	fs.IntVar(&c.HostPrefill, "host-prefill", 2048, "tokens each host-cost sequence holds before its generation steps")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if c.Models, err = parseModels(*models); err != nil {
		return c, err
	}
	if c.Formats, err = parseFormats(*formats); err != nil {
		return c, err
	}
	if *gen == "" {
		*gen = defaultGenBatches
		if c.Quick {
			*gen = quickGenBatches
		}
	}
	if *ctx == "" {
		*ctx = defaultCtxTokens
		if c.Quick {
			*ctx = quickCtxTokens
		}
	}
	if *chainBatches == "" {
		*chainBatches = defaultChainBatches
		if c.Quick {
			*chainBatches = quickChainBatches
		}
	}
	if *chainCtx == "" {
		*chainCtx = defaultChainCtxTokens
		if c.Quick {
			*chainCtx = quickChainCtxTokens
		}
	}
	if c.ChainBatches, err = parseInts("chain-batches", *chainBatches, 1, 4096); err != nil {
		return c, err
	}
	if c.ChainCtxTokens, err = parseInts("chain-ctx-tokens", *chainCtx, 1, 1<<20); err != nil {
		return c, err
	}
	if *only && *indexerOnly {
		return c, errors.New("--chain-only and --indexer-only exclude each other")
	}
	if *only {
		if !c.Chain {
			return c, errors.New("--chain-only and --chain=false ask for nothing")
		}
		c.Kernels, c.Iteration, c.Graph, c.HostCost = false, false, false, false
	}
	if *indexerOnly {
		c.Indexer = true
		c.Chain, c.Kernels, c.Iteration, c.Graph, c.HostCost = false, false, false, false, false
	}
	if c.IndexerBatches, err = parseInts("indexer-batches", *indexerBatches, 1, 4096); err != nil {
		return c, err
	}
	if c.IndexerCtxTokens, err = parseInts("indexer-ctx-tokens", *indexerCtx, 1, 1<<20); err != nil {
		return c, err
	}
	if c.IndexerContexts, err = parseInts("indexer-contexts", *indexerContexts, 0, mla.MaxTopKPositions); err != nil {
		return c, err
	}
	for _, n := range c.IndexerContexts {
		if n != 0 && n < minIndexerContext {
			return c, fmt.Errorf("--indexer-contexts: %d is below %d (0 for the random lengths)", n, minIndexerContext)
		}
	}
	if len(c.IndexerBatches) > 0 && len(c.IndexerContexts) == 0 {
		return c, errors.New("--indexer-contexts none with --indexer-batches: say 0 for the random lengths")
	}
	if c.IndexerMTP < 0 || c.IndexerMTP > benchMaxDrafts {
		return c, fmt.Errorf("--indexer-mtp = %d, must be in [0, %d] (the compressor rings hold %d drafts)", c.IndexerMTP, benchMaxDrafts, benchMaxDrafts)
	}
	if c.Indexer && len(c.IndexerBatches)+len(c.IndexerCtxTokens) == 0 {
		return c, errors.New("--indexer with no shape: --indexer-batches and --indexer-ctx-tokens are both none")
	}
	if c.GenBatches, err = parseInts("gen-batches", *gen, 1, 4096); err != nil {
		return c, err
	}
	if c.MTPs, err = parseInts("mtp", *mtps, 0, 15); err != nil {
		return c, err
	}
	if c.CtxTokens, err = parseInts("ctx-tokens", *ctx, 1, 1<<20); err != nil {
		return c, err
	}
	if c.Main, err = parseVariant(*mainVariant); err != nil {
		return c, fmt.Errorf("--variant: %w", err)
	}
	if c.Variants, err = parseVariants(*variants); err != nil {
		return c, fmt.Errorf("--variants: %w", err)
	}
	positive := []struct {
		name string
		v    int
	}{{"reps", c.Reps}, {"graph-reps", c.GraphReps}, {"ctx-graph-layers", c.CtxGraphLayers}, {"host-reps", c.HostReps}, {"host-prefill", c.HostPrefill},
		{"chain-layers", c.ChainLayers}, {"iteration-reps", c.IterationReps}}
	for _, p := range positive {
		if p.v <= 0 || p.v > 100000 {
			return c, fmt.Errorf("--%s = %d, must be in [1, 100000]", p.name, p.v)
		}
	}
	if *graphMem <= 0 || *graphMem > 1024 {
		return c, fmt.Errorf("--graph-mem-gb = %g, must be in (0, 1024]", *graphMem)
	}
	c.GraphMemBytes = int64(*graphMem * 1e9)
	if c.ContiguousLatent && c.CheckDir != "" {
		return c, errors.New("--contiguous-latent is a diagnostic: the --check-dir cases need the fused rows")
	}
	if c.ContiguousLatent && c.Chain {
		return c, errors.New("--contiguous-latent is a diagnostic: the chain writes the fused rows (add --chain=false)")
	}
	return c, nil
}

// parseModels reads a comma-separated model list.
func parseModels(list string) ([]model, error) {
	var out []model
	for _, name := range splitList(list) {
		m, err := modelNamed(name)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--models %q: no model named", list)
	}
	return out, nil
}

// modelNamed is the model of a short name.
func modelNamed(name string) (model, error) {
	var c dsv4.Config
	switch name {
	case "flash":
		c = dsv4.Flash()
	case "pro":
		c = dsv4.Pro()
	default:
		return model{}, fmt.Errorf("unknown model %q (want flash or pro)", name)
	}
	return model{Name: name, Heads: c.NumHeads, QLora: c.QLoraRank, Layers: c.NumLayers, cfg: c}, nil
}

// parseFormats reads a comma-separated cache format list.
func parseFormats(list string) ([]kvcache.Format, error) {
	var out []kvcache.Format
	for _, name := range splitList(list) {
		f, err := kvcache.ParseFormat(name)
		if err != nil {
			return nil, fmt.Errorf("--formats: %w", err)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--formats %q: no format named", list)
	}
	return out, nil
}

// parseInts reads a comma-separated list of whole numbers in [lo, hi];
// "none" is the empty list.
func parseInts(name, list string, lo, hi int) ([]int, error) {
	var out []int
	if strings.TrimSpace(list) == "none" {
		return nil, nil
	}
	for _, s := range splitList(list) {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("--%s: %q is not a whole number", name, s)
		}
		if n < lo || n > hi {
			return nil, fmt.Errorf("--%s: %d is outside [%d, %d]", name, n, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

func splitList(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
