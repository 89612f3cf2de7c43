package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/weights"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // a refused line, a verify difference, an engine error
	exitUsage = 2 // bad flags
)

// Defaults chosen so that the default run shows DeepSeek-V4's layer and
// replays in seconds on two CPU cores: V4-Flash's first four layers
// (compress ratios 0, 0, 4, 128: the compressor of both ratios), and a pool
// with room for the projected default trace's peak (467 pages of 64
// tokens).
const (
	defaultLayers = 4
	defaultPages  = 1024
)

type options struct {
	tracePath    string
	model        string
	layers       int
	backend      string
	device       int
	cacheFormat  kvcache.Format
	kvScale      float64
	qFormat      string
	qScale       float64
	pageSize     int
	pages        int
	window       int
	compress     bool
	compPages4   int
	compPages128 int
	maxDrafts    int
	compSeqs     int
	topkScratch  int
	idxFormat    string
	ropePos      int
	ropeMode     dsv4.RopeMode
	maxSeqs      int
	maxTokens    int
	seed         uint64
	cpuWorkers   int
	verify       bool
	dumpDir      string
	dumpIters    string
	dumpLayers   string
	jsonOut      bool
	graph        bool
	logLevel     string
	noIterations bool
	input        engine.InputMode
	checkpoint   string
	weightSeed   uint64
	heads        string
	memoryLimit  string
	set          map[string]bool // the flags given on the command line
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.tracePath, "trace", "", "JSON Lines batch trace (- for stdin); empty: the embedded chain trace (--input hidden: MTP with accept lists, a prompt long enough for the window and both ratios) or the embedded default trace (--input projected)")
	fs.StringVar(&o.model, "model", "flash", "model: flash, pro, or the path of a checkpoint's config.json")
	fs.IntVar(&o.layers, "layers", defaultLayers, "attention layers to run (0: all, MTP layers included)")
	fs.StringVar(&o.backend, "backend", engine.BackendAuto, "backend: "+strings.Join(engine.Backends(), ", "))
	fs.IntVar(&o.device, "device", 0, "GPU ordinal for accelerator backends")
	fs.TextVar(&o.cacheFormat, "cache-format", kvcache.FormatFP8UE8M0, "KV cache format: fp8_ue8m0, bf16 or fp8_pertensor")
	fs.Float64Var(&o.kvScale, "kv-scale", 1, "per-tensor KV scale (fp8_pertensor)")
	fs.StringVar(&o.qFormat, "q-format", "fp8", "Q buffer format: fp8 or bf16")
	fs.Float64Var(&o.qScale, "q-scale", 1, "per-tensor Q scale (fp8)")
	fs.IntVar(&o.pageSize, "page-size", kvcache.DefaultPageSize, "KV cache page size in tokens (a power of two)")
	fs.IntVar(&o.pages, "pages", defaultPages, "KV cache pool size in pages (per layer)")
	fs.BoolVar(&o.compress, "compress", true, "run DeepSeek-V4's KV compressor and compressed caches in the ratio-4 and ratio-128 layers (engine Config.Compressor; the first two Flash layers have none)")
	fs.IntVar(&o.compPages4, "compressed-pages-4", 0, "pages of 64 entries in each ratio-4 layer's compressed pool (0: what the trace needs at its peak)")
	fs.IntVar(&o.compPages128, "compressed-pages-128", 0, "pages of 64 entries in each ratio-128 layer's compressed pool (0: what the trace needs at its peak)")
	fs.IntVar(&o.maxDrafts, "max-drafts", 0, "most MTP drafts of a generation step the compressor can roll back (0: the engine's default, 7)")
	fs.IntVar(&o.compSeqs, "compressor-sequences", 0, "most live sequences the compressor holds state for; the rings add one slot per chunk a batch can move (0: 2 x --max-seqs)")
	fs.IntVar(&o.topkScratch, "topk-scratch", 0, "the indexer's top-k scratch space in 4-byte keys; a batch whose scores need more is refused (0: --max-tokens rows at the RoPE table's last position, at most 2^26)")
	fs.StringVar(&o.idxFormat, "indexer-query-format", "mxfp4", "the indexer query's layout: mxfp4 (the reference's numerics, read by the engine's top-k selection) or fp8 (128 e4m3 bytes a head, the scale folded into float32 head weights, for a server's own FP8 selection: the engine then selects nothing)")
	fs.IntVar(&o.window, "window", kvcache.DSv4Window, "sliding window in tokens: pages whose positions all lie below length-window go back to the pool when an iteration ends (128: DeepSeek-V4; 0: keep every token)")
	fs.IntVar(&o.ropePos, "rope-positions", 0, "RoPE table length (0: min(max_position_embeddings, pages*page-size))")
	fs.TextVar(&o.ropeMode, "rope-mode", dsv4.RopeReference, "RoPE table: reference (float32 angles, as DeepSeek's reference code) or exact (float64)")
	fs.IntVar(&o.maxSeqs, "max-seqs", 0, "capacity in sequences per batch (0: the trace's largest batch)")
	fs.IntVar(&o.maxTokens, "max-tokens", 0, "capacity in tokens per batch (0: the trace's largest batch)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the synthetic activations (hidden states, or the projections' outputs with --input projected)")
	fs.IntVar(&o.cpuWorkers, "cpu-workers", 0, "goroutines of the cpu backend (0: GOMAXPROCS)")
	fs.BoolVar(&o.verify, "verify", false, "also run every iteration on the cpu backend and compare every byte of Q and of the cache pages written")
	fs.StringVar(&o.dumpDir, "dump", "", "write safetensors dumps of chosen iterations and layers into this directory")
	fs.StringVar(&o.dumpIters, "dump-iters", "0", "iterations to dump: all, or a list like 0,5,10-12")
	fs.StringVar(&o.dumpLayers, "dump-layers", "all", "layers to dump: all, or a list like 0,2")
	fs.BoolVar(&o.jsonOut, "json", false, "print a JSON report on stdout instead of text")
	fs.BoolVar(&o.graph, "graph", true, "replay generation-only iterations through CUDA graphs, padded to power-of-two buckets (engine Config.Eager unset; an error with --backend cpu, which captures none)")
	fs.TextVar(&o.input, "input", engine.InputHidden, "where each layer starts: hidden (hidden states through the GEMM chain on the checkpoint's weights) or projected (synthetic A and q_b projection outputs, the prologue alone)")
	fs.StringVar(&o.checkpoint, "checkpoint", "", "DeepSeek-V4 checkpoint directory whose attention weights --input hidden runs on (its config.json must match --model); empty: synthetic weights from --weight-seed, asked for by name (engine Config.SyntheticWeights)")
	fs.Uint64Var(&o.weightSeed, "weight-seed", 1, "seed of the synthetic weights without --checkpoint (the generator of the synthetic checkpoint writer; the kv_a_layernorm and compressor norm weights with --input projected); an error with --checkpoint")
	fs.StringVar(&o.heads, "heads", "", "head range h0:h1 this engine computes (head-sharded tensor parallelism); empty: all heads")
	fs.StringVar(&o.memoryLimit, "memory-limit", "0", "most memory the engine may allocate (and as much again for --verify's reference), like 64GiB; 0: what the machine has (the backend's free memory: the device's on CUDA, the host's available memory on cpu)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.BoolVar(&o.noIterations, "summary-only", false, "print only the summary, not a line per iteration")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: decode [flags]\n\nReplays a batch trace through the MLA prologue engine. Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (the trace goes in --trace)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	return o, nil
}

// idleFlag refuses a flag given on the command line that does nothing in
// the chosen mode: it names the flag and says why.
func (o *options) idleFlag(name, why string) error {
	if !o.set[name] {
		return nil
	}
	return usageError{fmt.Errorf("--%s does nothing %s", name, why)}
}

// checkIdleFlags refuses the flags that do nothing with the others given
// (those of the compressor are checked by compressorConfig, which knows
// the layers).
func (o *options) checkIdleFlags(qf mla.QFormat) error {
	type idle struct {
		name, why string
		when      bool
	}
	for _, c := range []idle{
		{"weight-seed", "with --checkpoint (it seeds synthetic weights; the checkpoint's are used)", o.checkpoint != ""},
		{"kv-scale", fmt.Sprintf("with --cache-format %v (only fp8_pertensor has a per-tensor scale)", o.cacheFormat), o.cacheFormat != kvcache.FormatFP8PerTensor},
		{"q-scale", fmt.Sprintf("with --q-format %v (only fp8 Q is scaled)", qf), qf != mla.QFP8},
		{"dump-iters", "without --dump", o.dumpDir == ""},
		{"dump-layers", "without --dump", o.dumpDir == ""},
		{"device", "with --backend cpu", o.backend == engine.BackendCPU},
		{"graph", "with --backend cpu (it captures no CUDA graphs)", o.backend == engine.BackendCPU},
		{"summary-only", "with --json (the report has no per-iteration lines to leave out)", o.jsonOut},
	} {
		if !c.when {
			continue
		}
		if err := o.idleFlag(c.name, c.why); err != nil {
			return err
		}
	}
	return nil
}

func loadModel(name string) (dsv4.Config, error) {
	switch strings.ToLower(name) {
	case "flash":
		return dsv4.Flash(), nil
	case "pro":
		return dsv4.Pro(), nil
	}
	if !strings.HasSuffix(name, ".json") {
		if _, err := os.Stat(name); err != nil {
			return dsv4.Config{}, fmt.Errorf("--model %q: not flash, pro or a config.json file", name)
		}
	}
	m, err := dsv4.Load(name)
	if err != nil {
		return dsv4.Config{}, fmt.Errorf("--model %q: %w", name, err)
	}
	return m, nil
}

func loadTrace(path string, stdin io.Reader, input engine.InputMode) ([]trace.Step, string, error) {
	switch path {
	case "":
		if input == engine.InputHidden {
			s, err := trace.DefaultChain()
			return s, "embedded chain trace", err
		}
		s, err := trace.Default()
		return s, "embedded default trace", err
	case "-":
		s, err := trace.Parse(stdin)
		return s, "stdin", err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, path, err
	}
	defer f.Close()
	s, err := trace.Parse(f)
	return s, path, err
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newLogger(level string, stderr io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	var w io.Writer = stderr
	if isTerminal(stderr) {
		w = zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// run is the whole command; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "decode:", err)
		return exitUsage
	}
	log, err := newLogger(o.logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "decode:", err)
		return exitUsage
	}
	cfg, steps, name, err := o.config(log)
	if err != nil {
		fmt.Fprintln(stderr, "decode:", err)
		var ue usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitError
	}
	if err := replayTrace(ctx, o, cfg, steps, name, stdout, stderr); err != nil {
		log.Error().Err(err).Msg("replay stopped")
		fmt.Fprintln(stderr, "decode:", err)
		return exitError
	}
	return exitOK
}

// usageError is a bad flag value (exit status 2), including those the
// engine checks; other errors of config, such as a malformed trace or a
// line that can never fit, exit with status 1.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// flagOf maps an engine.ConfigError's Field to the flag that sets it.
var flagOf = map[string]string{
	"Model":          "--model",
	"Cache.Format":   "--cache-format",
	"Cache.PageSize": "--page-size",
	"Cache.NumPages": "--pages",
	"Cache.KVScale":  "--kv-scale",
	"Cache.Window":   "--window",

	"Compressor.Ratio4Pages":        "--compressed-pages-4",
	"Compressor.Ratio128Pages":      "--compressed-pages-128",
	"Compressor.MaxDrafts":          "--max-drafts",
	"Compressor.MaxSequences":       "--compressor-sequences",
	"Compressor.IndexerTopKScratch": "--topk-scratch",
	"Compressor.IndexerQueryFormat": "--indexer-query-format",
	"Compressor.Off":                "--compress",
	"FullCache":                     "--window",
	"Eager":                         "--graph",
	"Layers":                        "--layers",
	"QFormat":                       "--q-format",
	"QScale":                        "--q-scale",
	"Device":                        "--device",
	"CPUWorkers":                    "--cpu-workers",
	"MaxSeqs":                       "--max-seqs",
	"MaxTokens":                     "--max-tokens",
	"RopePositions":                 "--rope-positions",
	"MemoryLimit":                   "--memory-limit",
	"HeadBegin":                     "--heads",
	"HeadEnd":                       "--heads",
	"Input":                         "--input",
	"Checkpoint":                    "--checkpoint",
	"SyntheticWeights":              "--weight-seed",
}

// flagError words an engine configuration error in flags: a usage error
// (exit 2) that names the flag to change.
func flagError(err error) error {
	var ce *engine.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	name := flagOf[ce.Field]
	if name == "" {
		name = "flags"
	}
	msg := fmt.Sprintf("%s: %v", name, err)
	if errors.Is(err, engine.ErrMemoryLimit) {
		msg += " (engine.Config." + ce.Field + " is " + name + "; MemoryLimit is --memory-limit)"
	}
	return usageError{errors.New(msg)}
}

// config turns the flags into the replay's configuration. Every size is
// checked, against its bounds and against --memory-limit, before anything
// is allocated: a bad flag value is a usageError (exit 2); a trace line that
// can never fit the pool, or whose batch alone would pass the memory limit,
// is refused by its line number (exit 1).
func (o *options) config(log zerolog.Logger) (replay.Options, []trace.Step, string, error) {
	var ro replay.Options
	model, err := loadModel(o.model)
	if err != nil {
		return ro, nil, "", usageError{err}
	}
	qf, err := mla.ParseQFormat(o.qFormat)
	if err != nil {
		return ro, nil, "", usageError{fmt.Errorf("--q-format: %w", err)}
	}
	iters, _, err := parseSelection("--dump-iters", o.dumpIters)
	if err != nil {
		return ro, nil, "", usageError{err}
	}
	layers, maxLayer, err := parseSelection("--dump-layers", o.dumpLayers)
	if err != nil {
		return ro, nil, "", usageError{err}
	}
	if o.pages <= 0 {
		return ro, nil, "", usageError{fmt.Errorf("--pages %d: must be positive (the pool the trace replays in)", o.pages)}
	}
	if o.layers < 0 {
		return ro, nil, "", usageError{fmt.Errorf("--layers %d: must be 0 (all) or positive", o.layers)}
	}
	h0, h1, err := parseHeads(o.heads)
	if err != nil {
		return ro, nil, "", usageError{err}
	}
	if o.checkpoint != "" && o.input != engine.InputHidden {
		return ro, nil, "", usageError{fmt.Errorf("--checkpoint %s needs --input hidden", o.checkpoint)}
	}
	if err := o.checkIdleFlags(qf); err != nil {
		return ro, nil, "", err
	}
	// The checkpoint's config.json is its truth: --model must agree with it.
	if o.checkpoint != "" {
		if err := weights.CheckConfig(o.checkpoint, model); errors.Is(err, dsv4.ErrMismatch) {
			return ro, nil, "", usageError{fmt.Errorf("--model %s, --checkpoint %s: %w", o.model, o.checkpoint, err)}
		} else if err != nil {
			return ro, nil, "", fmt.Errorf("--checkpoint %s: %w", o.checkpoint, err)
		}
	}
	if !slices.Contains(engine.Backends(), o.backend) {
		return ro, nil, "", usageError{fmt.Errorf("--backend %q: want one of %s", o.backend, strings.Join(engine.Backends(), ", "))}
	}
	limit, err := parseBytes(o.memoryLimit)
	if err != nil {
		return ro, nil, "", usageError{fmt.Errorf("--memory-limit %q: %w", o.memoryLimit, err)}
	}
	cfg := engine.Config{
		Model:         model,
		Cache:         kvcache.Config{Format: o.cacheFormat, PageSize: o.pageSize, NumPages: o.pages, KVScale: float32(o.kvScale), Window: o.window},
		Backend:       o.backend,
		Device:        o.device,
		CPUWorkers:    o.cpuWorkers,
		Layers:        o.layers,
		QFormat:       qf,
		QScale:        float32(o.qScale),
		MaxSeqs:       o.maxSeqs,
		MaxTokens:     o.maxTokens,
		RopePositions: o.ropePos,
		RopeMode:      o.ropeMode,
		Eager:         !o.graph,
		FullCache:     o.window == 0,
		MemoryLimit:   limit,
		Logger:        log,
		Input:         o.input,
		Checkpoint:    o.checkpoint,
		HeadBegin:     h0,
		HeadEnd:       h1,
	}
	if o.checkpoint == "" {
		// The embedded demo and the projected path: asked for, by name.
		cfg.SyntheticWeights = &engine.SyntheticWeights{Seed: o.weightSeed}
	}
	// Every flag but the capacities the trace may set, checked before the
	// trace is read.
	probe := cfg
	probe.MaxSeqs, probe.MaxTokens = max(cfg.MaxSeqs, 1), max(cfg.MaxTokens, 1)
	probe.Compressor = engine.CompressorConfig{Off: true} // its pools are the trace's too
	resolved, err := probe.Resolve()
	if err != nil {
		return ro, nil, "", flagError(err)
	}
	if maxLayer >= resolved.Layers {
		return ro, nil, "", usageError{fmt.Errorf("--dump-layers %q: layer %d is beyond --layers %d (layers 0 to %d run)",
			o.dumpLayers, maxLayer, resolved.Layers, resolved.Layers-1)}
	}

	steps, name, err := loadTrace(o.tracePath, os.Stdin, o.input)
	if err != nil {
		return ro, nil, "", fmt.Errorf("--trace %s: %w", name, err)
	}
	if len(steps) == 0 {
		return ro, nil, "", fmt.Errorf("--trace %s: no iterations", name)
	}
	if err := trace.CheckFits(steps, o.pageSize, o.pages, o.window); err != nil {
		return ro, nil, "", fmt.Errorf("--trace %s: %w (--pages %d, --page-size %d)", name, err, o.pages, o.pageSize)
	}
	st := trace.Summarize(steps)
	if o.compress {
		if cfg.Compressor, err = compressorConfig(o, model, steps); err != nil {
			return ro, nil, "", err
		}
	} else {
		for _, name := range []string{"compressed-pages-4", "compressed-pages-128", "max-drafts", "compressor-sequences", "topk-scratch", "indexer-query-format"} {
			if err := o.idleFlag(name, "with --compress=false"); err != nil {
				return ro, nil, "", err
			}
		}
		cfg.Compressor.Off = true
	}
	if cfg.Compresses() {
		drafts := cfg.Compressor.MaxDrafts
		if drafts == 0 {
			drafts = engine.DefaultMaxDrafts
		}
		if err := checkDrafts(steps, drafts, name); err != nil {
			return ro, nil, "", err
		}
	}
	if cfg.MaxSeqs == 0 {
		cfg.MaxSeqs = max(1, st.MaxSeqs)
	}
	if cfg.MaxTokens == 0 {
		cfg.MaxTokens = max(1, st.MaxTokens)
	}
	var ce *engine.ConfigError
	if _, err := cfg.Resolve(); err != nil {
		// A capacity the trace set: the line is at fault, not a flag.
		if errors.As(err, &ce) && ce.Field == "MaxTokens" && o.maxTokens == 0 {
			return ro, nil, "", fmt.Errorf("--trace %s: trace line %d: its batch of %d tokens sets --max-tokens: %w (split the line, or raise --memory-limit)",
				name, st.MaxTokensLine, st.MaxTokens, err)
		}
		if errors.As(err, &ce) && ce.Field == "MaxSeqs" && o.maxSeqs == 0 {
			return ro, nil, "", fmt.Errorf("--trace %s: the largest batch has %d sequences and sets --max-seqs: %w (split it, or raise --memory-limit)",
				name, st.MaxSeqs, err)
		}
		return ro, nil, "", flagError(err)
	}
	if o.verify {
		// The cpu reference engine allocates as much again.
		fp, err := cfg.Footprint()
		if err != nil {
			return ro, nil, "", flagError(err)
		}
		// Known here for an explicit limit and for the cpu backend, where
		// both engines take host memory; another backend's own New checks
		// its free memory, and the reference's the host's.
		if lim := resolved.MemoryLimit; lim > 0 && fp.Total() > lim/2 {
			return ro, nil, "", usageError{fmt.Errorf("--verify: the engine and its cpu reference would allocate %s, more than --memory-limit %s (%s each: %s)",
				engine.FormatBytes(2*fp.Total()), engine.FormatBytes(lim), engine.FormatBytes(fp.Total()), fp)}
		}
	}
	ev := log.Info().Str("trace", name).Int("lines", st.Lines).Int("iterations", st.Iterations).
		Int("mixed", st.MixedIterations).Int("ctx_tokens", st.ContextTokens).Int("gen_tokens", st.GenerationTokens).
		Int("sequences", st.Sequences)
	peak, longest := trace.Footprint(steps, o.pageSize, o.window)
	ev = ev.Int("peak_pages", peak).Int("longest_seq", longest)
	if peak > o.pages {
		log.Warn().Int("peak_pages", peak).Int("pages", o.pages).Msg("the trace holds more pages at its peak than the pool has: expect a cache-full refusal")
	}
	ev.Msg("trace loaded")
	return replay.Options{
		Engine: cfg, Seed: o.seed, Verify: o.verify, DumpDir: o.dumpDir,
		DumpIteration: iters, DumpLayer: layers, Logger: log,
	}, steps, name, nil
}

// parseBytes reads a size: a whole number of bytes, optionally with a
// binary unit (KiB, MiB, GiB, TiB); 0 is the engine's default.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}, {"B", 0}}
	num, shift := strings.TrimSpace(s), uint(0)
	for _, u := range units {
		if n, ok := strings.CutSuffix(num, u.suffix); ok {
			num, shift = strings.TrimSpace(n), u.shift
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > math.MaxInt64>>shift {
		return 0, fmt.Errorf("want a size like 0 (the backend's free memory), 2147483648, 512MiB or 64GiB")
	}
	return v << shift, nil
}

func replayTrace(ctx context.Context, o *options, ro replay.Options, steps []trace.Step, name string, stdout, stderr io.Writer) error {
	r, err := replay.New(ctx, ro)
	if err != nil {
		return err
	}
	defer r.Close()

	var bar *progressbar.ProgressBar
	if isTerminal(stderr) {
		bar = progressbar.NewOptions(len(steps),
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("replaying "+name),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionThrottle(100*time.Millisecond),
		)
	}
	onIteration := func(ir *replay.IterationReport) {
		if !o.jsonOut && !o.noIterations {
			if bar != nil {
				bar.Clear()
			}
			writeIteration(stdout, ir)
		}
		if bar != nil {
			bar.Add(1)
		}
	}
	rep, runErr := r.Run(ctx, steps, onIteration)
	if bar != nil {
		bar.Finish()
	}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return errors.Join(runErr, err)
		}
		return runErr
	}
	if runErr != nil {
		return runErr
	}
	writeSummary(stdout, rep, name)
	fmt.Fprintln(stdout)
	return rep.WriteBenchmark(stdout)
}

// parseHeads parses --heads h0:h1 (empty: 0, 0, all heads).
func parseHeads(s string) (h0, h1 int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	a, b, ok := strings.Cut(s, ":")
	if ok {
		h0, err = strconv.Atoi(a)
	}
	if ok && err == nil {
		h1, err = strconv.Atoi(b)
	}
	if !ok || err != nil || h0 < 0 || h1 <= h0 {
		return 0, 0, fmt.Errorf("--heads %q: want h0:h1 with 0 <= h0 < h1", s)
	}
	return h0, h1, nil
}

// firstCompressed is the first layer of m with a compressor (-1: none).
func firstCompressed(m dsv4.Config) int {
	for l := range m.NumAttentionLayers() {
		if r, err := m.CompressRatio(l); err == nil && (r == 4 || r == 128) {
			return l
		}
	}
	return -1
}

// checkDrafts refuses, by line, a generation step deeper than the
// compressor can roll back.
func checkDrafts(steps []trace.Step, maxDrafts int, name string) error {
	for _, s := range steps {
		if g := s.Generation; g != nil && g.MTP > maxDrafts {
			return fmt.Errorf("--trace %s: trace line %d: generation.mtp = %d, more than --max-drafts %d (the compressor keeps that many drafts to roll back; raise --max-drafts)",
				name, s.Line, g.MTP, maxDrafts)
		}
	}
	return nil
}

// compressorConfig sizes the compressor's pools: the flags, or the trace's
// peak for a ratio the layers use (at least one page). With no compressed
// layer among --layers the compressor stays off.
func compressorConfig(o *options, model dsv4.Config, steps []trace.Step) (engine.CompressorConfig, error) {
	layers := o.layers
	if layers == 0 {
		layers = model.NumAttentionLayers()
	}
	cc := engine.CompressorConfig{MaxDrafts: o.maxDrafts, MaxSequences: o.compSeqs, IndexerTopKScratch: o.topkScratch}
	f, err := mla.ParseIndexerQueryFormat(o.idxFormat)
	if err != nil {
		return cc, usageError{fmt.Errorf("--indexer-query-format %q: want mxfp4 or fp8", o.idxFormat)}
	}
	cc.IndexerQueryFormat = f
	flags := map[int]int{4: o.compPages4, 128: o.compPages128}
	for r, n := range flags {
		if n < 0 {
			return cc, usageError{fmt.Errorf("--compressed-pages-%d %d: must be 0 (the trace's peak) or positive", r, n)}
		}
	}
	used := map[int]bool{}
	for l := range min(layers, model.NumAttentionLayers()) {
		if r, err := model.CompressRatio(l); err == nil && (r == 4 || r == 128) {
			used[r] = true
		}
	}
	if len(used) == 0 {
		why := fmt.Sprintf("without a compressed layer among --layers %d (the first ratio-4 or ratio-128 layer of %s is layer %d)", o.layers, model.Name, firstCompressed(model))
		for _, name := range []string{"compressed-pages-4", "compressed-pages-128", "max-drafts", "compressor-sequences", "topk-scratch", "indexer-query-format"} {
			if err := o.idleFlag(name, why); err != nil {
				return cc, err
			}
		}
		return engine.CompressorConfig{}, nil
	}
	for r, n := range flags {
		if n != 0 && !used[r] {
			return cc, usageError{fmt.Errorf("--compressed-pages-%d %d does nothing: no layer among --layers %d has ratio %d", r, n, layers, r)}
		}
	}
	for r := range used {
		n := flags[r]
		if n == 0 {
			n = max(1, trace.EntryFootprint(steps, r, engine.CompressedPageSize))
		}
		if r == 4 {
			cc.Ratio4Pages = n
		} else {
			cc.Ratio128Pages = n
		}
	}
	return cc, nil
}
