package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/rs/zerolog"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// Defaults of the capacity fields.
const (
	DefaultMaxSeqs   = 256
	DefaultMaxTokens = 4096
)

// Config describes an engine. The zero value of every optional field picks
// the documented default, and with Model set the zero Config is
// DeepSeek-V4's real attention layer: hidden-state input (the engine runs
// the GEMM chain on Checkpoint's weights), the 128-token sliding window,
// the KV compressor and its compressed caches in the ratio-4 and ratio-128
// layers, and CUDA graphs for generation-only iterations where the backend
// captures them. What other MLA models or tests need is asked for by
// name: InputProjected, FullCache, Compressor.Off, Eager. New reports a
// bad field by name and value.
type Config struct {
	// Model supplies heads, q_lora_rank, the RoPE parameters and the
	// per-layer compress ratios (dsv4.Flash, dsv4.Pro or dsv4.Load).
	Model dsv4.Config
	// Cache is the KV cache pool: format, page size, number of pages (and
	// KVScale for fp8_pertensor). Every layer has its own pool of this
	// size; the page bookkeeping (block tables) is shared by all layers.
	// Cache.PageSize 0 = kvcache.DefaultPageSize (64). Cache.Window is the
	// sliding window: 0 = kvcache.DSv4Window (128), DeepSeek-V4's, whose
	// attention reads raw KV of the last 128 positions only, so the pages
	// behind it go back to the pool when an iteration ends (FullCache keeps
	// every token instead). Cache.NumPages 0 = room for the windows of
	// 2*MaxSeqs live sequences and one full batch: 2*MaxSeqs*(ceil(W/P)+1)
	// + ceil(MaxTokens/P) + MaxSeqs pages (with FullCache it must be set).
	Cache kvcache.Config
	// FullCache keeps every token's KV for the life of its sequence (no
	// sliding window: DeepSeek-V3's MLA, or a test of the plain prologue);
	// Cache.Window must then be 0 and Cache.NumPages set.
	FullCache bool

	// Backend is "auto" (or ""), "cpu", or a registered name ("cuda" once
	// attention/mla/cuda is linked in). See mla.Register.
	Backend string
	// Device is the accelerator ordinal for registered backends.
	Device int
	// CPUWorkers is the goroutine count of the cpu backend; 0 = GOMAXPROCS.
	CPUWorkers int

	// Layers is how many attention layers the engine runs, [0, Layers);
	// 0 = all of them (Model.NumAttentionLayers, MTP layers included).
	Layers int

	// QFormat is the attention Q buffer's type (zero value: fp8 e4m3).
	QFormat mla.QFormat
	// QScale is the per-tensor scale applied before e4m3; 0 = 1.
	QScale float32

	// MaxSeqs and MaxTokens are the capacity of the fixed-address buffers
	// (metadata, inputs, Q output), allocated once; a batch beyond them is
	// refused with ErrBatchTooLarge. 0 = DefaultMaxSeqs, DefaultMaxTokens.
	// The input and output buffers hold MaxTokens*Heads*512 elements each:
	// size MaxTokens to the largest iteration the server runs. At most
	// 65536 sequences and 2^24 tokens, and within MemoryLimit.
	MaxSeqs, MaxTokens int

	// RopePositions is the length of the RoPE tables, the bound on every
	// position; 0 = min(Model.MaxPositionEmbeddings, NumPages*PageSize).
	// With a sliding window (Cache.Window) a sequence may be far longer
	// than the pool: set it to the longest sequence served.
	// At most 2^24, and within MemoryLimit.
	RopePositions int
	// RopeMode is how the RoPE tables are computed (docs/DESIGN.md section 2):
	// the zero value dsv4.RopeReference (float32 angles, as DeepSeek's
	// reference code), or dsv4.RopeExact. Every backend reads the same
	// table, and dumps record the mode.
	RopeMode dsv4.RopeMode

	// Scheduler holds the FMHA scheduler inputs; the zero value means
	// metadata.DefaultSchedulerParams.
	Scheduler metadata.SchedulerParams

	// SyntheticWeights, when set, gives the engine generated weights
	// instead of a model's: every layer's kv_a_layernorm and compressor
	// norm weight (SyntheticLayerWeight, SyntheticCompressorNorm) and, with
	// Input = hidden, the chain's and the compressor's projections
	// (weights.SyntheticLayer, the synthetic checkpoint writer's
	// generator), all from its Seed. It is for tests, benchmarks and
	// demos. Nil (the zero value) means real weights: Checkpoint on the
	// hidden-state path (New refuses an engine with neither, ErrNoWeights),
	// SetLayerWeight and SetCompressorNorm on the projected path (Begin
	// refuses to run before every layer has them, ErrNoWeights).
	SyntheticWeights *SyntheticWeights

	// Eager runs every iteration launch by launch. Without it (the zero
	// value) generation-only iterations go through CUDA graphs where the
	// backend can capture them (mla.GraphCapturer): such a batch is padded
	// to the smallest power-of-two bucket of at least 16 tokens that holds
	// it (at most MaxTokens), its launches read their counts from the
	// device header (mla.Launch.FromHeader), and each layer replays a graph
	// captured once per (layer, bucket). Context and mixed batches, and
	// backends without graphs (cpu), run launch by launch either way.
	Eager bool

	// MemoryLimit bounds, in bytes, what New allocates (Config.Footprint):
	// pools, metadata, RoPE tables, weights, inputs and the Q output, on the
	// backend and their host copies. A configuration past it is refused
	// before anything is allocated, with an error (wrapping ErrMemoryLimit)
	// that says how much it would take and which field drives the most.
	// 0 = what the machine has: the backend's free memory when New opens it
	// (mla.MemoryReporter: on CUDA the device's free memory less the GEMM
	// workspaces the backend allocates at its first GEMMs; on the cpu
	// backend the host's available memory, cpu.AvailableMemory: MemAvailable
	// within the cgroup's limit), or FallbackMemoryLimit (32 GiB) for a
	// backend that cannot say (cpu where /proc/meminfo cannot be read).
	// Resolve fills it for the cpu backend; for another it stays 0 until New.
	MemoryLimit int64
	// limitFrom says where a MemoryLimit of 0 was taken from, for errors.
	limitFrom string

	// Compressor is DSv4's KV compressor and its compressed caches in the
	// ratio-4 and ratio-128 layers (DESIGN.md section 8): on, with pools
	// sized by its defaults, unless Compressor.Off.
	Compressor CompressorConfig

	// Logger receives the engine's logs; the zero value discards them.
	Logger zerolog.Logger

	// Input is where a layer starts: InputHidden (the zero value: the
	// engine runs the GEMM chain from the hidden states on the layer's
	// weights; see chain.go) or InputProjected (the server hands over the
	// projections' outputs and the engine runs the prologue alone).
	Input InputMode
	// Checkpoint is a DeepSeek-V4 checkpoint directory whose attention
	// weights the hidden-state chain runs on (read for the engine's layers
	// and head range only, checked against Model). Empty on the
	// hidden-state path is refused (ErrNoWeights) unless SyntheticWeights
	// asks for generated weights instead.
	Checkpoint string
	// HeadBegin and HeadEnd are the Q heads [HeadBegin, HeadEnd) this
	// engine computes, for head-sharded tensor parallelism: only those
	// heads' rows of wq_b are loaded and only those heads of Q are written
	// (the Q input and output buffers hold HeadEnd-HeadBegin heads); the
	// hidden states, wq_a, wkv, the latent and the KV cache are the same on
	// every shard. 0, 0 = all heads.
	HeadBegin, HeadEnd int
}

// SyntheticWeights asks for generated weights (Config.SyntheticWeights).
type SyntheticWeights struct {
	// Seed seeds every generator; the same seed gives the same weights,
	// and the hidden-state path's are those of a synthetic checkpoint
	// written with it (cmd/mkcheckpoint).
	Seed uint64
}

// ErrNoWeights: the engine has no weights to run on and was not asked for
// synthetic ones. New returns it (in a *ConfigError for Checkpoint) for a
// hidden-state engine with neither Checkpoint nor SyntheticWeights; Begin
// returns it on the projected path while a layer's kv_a_layernorm or
// compressor norm weight was never set.
var ErrNoWeights = errors.New("no weights: set Config.Checkpoint (the hidden-state path) or call SetLayerWeight and SetCompressorNorm (the projected path), or ask for Config.SyntheticWeights")

// SyntheticLayerWeight is the kv_a_layernorm weight of a layer with
// Config.SyntheticWeights (on the projected path; the hidden-state path
// takes the synthetic checkpoint's kv_norm): w[i] = bf16(1 + (u_i -
// 0.5)/4), u_i the i-th Float64 of math/rand/v2's PCG seeded with (seed,
// layer). Values lie in [0.875, 1.125], near 1 like a trained RMSNorm
// weight, and are bf16 values as a checkpoint stores them.
func SyntheticLayerWeight(seed uint64, layer int) []float32 {
	rng := rand.New(rand.NewPCG(seed, uint64(layer)))
	w := make([]float32, numerics.HeadDim)
	for i := range w {
		w[i] = numerics.RoundBF16(float32(1 + (rng.Float64()-0.5)/4))
	}
	return w
}

// ConfigError is a Config field New refuses. Field names it as a Go
// selector relative to Config ("MaxTokens", "Cache.PageSize", "Model"); a
// command-line front end maps it to its flag. Err says why; for a
// configuration whose buffers would pass MemoryLimit it wraps
// ErrMemoryLimit, and Field is the field that drives the largest buffer.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return "engine: Config." + e.Field + ": " + e.Err.Error() }

func (e *ConfigError) Unwrap() error { return e.Err }

func fieldError(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
}

// Bounds on the sizes that drive allocations, far above any DeepSeek-V4
// configuration; each is also checked against MemoryLimit.
const (
	maxHeads         = 1024    // num_attention_heads
	maxQLoraRank     = 1 << 16 // q_lora_rank
	maxLayers        = 1024    // num_hidden_layers + num_nextn_predict_layers
	maxSeqsLimit     = 1 << 16 // Config.MaxSeqs
	maxTokensLimit   = 1 << 24 // Config.MaxTokens
	maxRopePositions = 1 << 24 // Config.RopePositions (and its default from max_position_embeddings)
	maxCPUWorkers    = 4096    // Config.CPUWorkers
)

// resolve fills the defaults and validates every field, the memory the
// buffers would take included; it allocates nothing.
func (c Config) resolve(checkMemory bool) (Config, error) {
	if err := c.Model.Validate(); err != nil {
		return c, &ConfigError{Field: "Model", Err: err}
	}
	if c.Model.QLoraRank%8 != 0 {
		return c, fieldError("Model", "q_lora_rank = %d must be a multiple of 8: the latent is read in place at byte offset 2*q_lora_rank of each fused row, which must stay 16-byte aligned", c.Model.QLoraRank)
	}
	if c.Model.NumHeads > maxHeads {
		return c, fieldError("Model", "num_attention_heads = %d, must be at most %d", c.Model.NumHeads, maxHeads)
	}
	if c.Model.QLoraRank > maxQLoraRank {
		return c, fieldError("Model", "q_lora_rank = %d, must be at most %d", c.Model.QLoraRank, maxQLoraRank)
	}
	c, err := c.resolveChain()
	if err != nil {
		return c, err
	}
	all := c.Model.NumAttentionLayers()
	if c.Model.NumMTPLayers > maxLayers || all > maxLayers {
		return c, fieldError("Model", "num_hidden_layers %d + num_nextn_predict_layers %d, must be at most %d layers",
			c.Model.NumLayers, c.Model.NumMTPLayers, maxLayers)
	}
	if c.MaxSeqs == 0 {
		c.MaxSeqs = DefaultMaxSeqs
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	if c.MaxSeqs < 0 || c.MaxSeqs > maxSeqsLimit {
		return c, fieldError("MaxSeqs", "%d, must be in [1, %d] (0: %d)", c.MaxSeqs, maxSeqsLimit, DefaultMaxSeqs)
	}
	if c.MaxTokens < 0 || c.MaxTokens > maxTokensLimit || int64(c.MaxTokens)*int64(c.Model.NumHeads) > math.MaxInt32 {
		return c, fieldError("MaxTokens", "%d, must be in [1, %d] (0: %d) with MaxTokens*heads (%d) within int32",
			c.MaxTokens, maxTokensLimit, DefaultMaxTokens, c.Model.NumHeads)
	}
	if c, err = c.resolveCache(); err != nil {
		return c, err
	}
	if err := c.Cache.Validate(); err != nil {
		return c, &ConfigError{Field: "Cache." + cacheField(c.Cache), Err: err}
	}
	if c.Layers == 0 {
		c.Layers = all
	}
	if c.Layers < 0 || c.Layers > all {
		return c, fieldError("Layers", "%d, must be in [1, %d] (%d layers + %d MTP layers), or 0 for all",
			c.Layers, all, c.Model.NumLayers, c.Model.NumMTPLayers)
	}
	if c.QFormat != mla.QFP8 && c.QFormat != mla.QBF16 {
		return c, fieldError("QFormat", "%v is unknown", c.QFormat)
	}
	if c.QScale == 0 {
		c.QScale = 1
	}
	if s := float64(c.QScale); !(s > 0) || math.IsInf(s, 0) {
		return c, fieldError("QScale", "%v, must be finite and > 0", c.QScale)
	}
	if c.Device < 0 {
		return c, fieldError("Device", "%d, must be >= 0", c.Device)
	}
	if c.CPUWorkers < 0 || c.CPUWorkers > maxCPUWorkers {
		return c, fieldError("CPUWorkers", "%d, must be in [0, %d] (0: GOMAXPROCS)", c.CPUWorkers, maxCPUWorkers)
	}
	if c, err = c.resolveCompressor(); err != nil {
		return c, err
	}
	if c.RopePositions == 0 {
		pool := int64(c.Cache.NumPages) * int64(c.Cache.PageSize)
		c.RopePositions = int(min(int64(c.Model.MaxPositionEmbeddings), pool))
		if c.RopePositions > maxRopePositions {
			return c, fieldError("RopePositions", "0 takes min(max_position_embeddings %d, NumPages*PageSize %d) = %d, more than %d: set RopePositions",
				c.Model.MaxPositionEmbeddings, pool, c.RopePositions, maxRopePositions)
		}
	}
	if c.RopePositions < 0 || c.RopePositions > c.Model.MaxPositionEmbeddings || c.RopePositions > maxRopePositions {
		return c, fieldError("RopePositions", "%d, must be in [1, %d] (max_position_embeddings, at most %d)",
			c.RopePositions, c.Model.MaxPositionEmbeddings, maxRopePositions)
	}
	if !c.RopeMode.Valid() {
		return c, fmt.Errorf("engine: Config.RopeMode = %v is unknown (want reference or exact)", c.RopeMode)
	}
	if c.Scheduler == (metadata.SchedulerParams{}) {
		c.Scheduler = metadata.DefaultSchedulerParams()
	}
	if _, err := metadata.NewPlan([]metadata.Request{{Phase: metadata.Context, NewTokens: 1}},
		func(uint64) (int, bool, error) { return 0, false, nil }, c.params()); err != nil {
		return c, &ConfigError{Field: "Scheduler", Err: err}
	}
	if c.MemoryLimit < 0 {
		return c, fieldError("MemoryLimit", "%d, must be >= 0 (0: the backend's free memory)", c.MemoryLimit)
	}
	if c.MemoryLimit == 0 && c.Backend == BackendCPU {
		c = c.defaultLimit(cpu.New(1))
	}
	fp, err := c.footprint()
	if err != nil {
		return c, err
	}
	if checkMemory {
		return c, c.checkMemory(fp)
	}
	return c, nil
}

// defaultLimit fills a MemoryLimit of 0 from what b says it can allocate,
// or FallbackMemoryLimit.
func (c Config) defaultLimit(b mla.Backend) Config {
	c.MemoryLimit, c.limitFrom = FallbackMemoryLimit, fmt.Sprintf("(0: the fallback, backend %s cannot say how much memory it has)", b.Name())
	if r, ok := b.(mla.MemoryReporter); ok {
		if n, err := r.FreeMemory(); err == nil {
			c.MemoryLimit, c.limitFrom = n, fmt.Sprintf("(0: the %s backend's free memory)", b.Name())
		} else {
			c.limitFrom = fmt.Sprintf("(0: the fallback: %v)", err)
		}
	}
	return c
}

// checkMemory refuses a footprint past MemoryLimit (0: not known yet,
// New checks once the backend is open).
func (c Config) checkMemory(fp Footprint) error {
	if total := fp.Total(); c.MemoryLimit > 0 && total > c.MemoryLimit {
		field, what := fp.largest()
		limit := FormatBytes(c.MemoryLimit)
		if c.limitFrom != "" {
			limit += " " + c.limitFrom
		}
		return &ConfigError{Field: field, Err: fmt.Errorf("%w: the engine would allocate %s (%s), more than MemoryLimit %s; the largest is %s: lower %s, or raise MemoryLimit",
			ErrMemoryLimit, FormatBytes(total), fp, limit, what, field)}
	}
	return nil
}

// resolveCache fills the SWA pool's defaults: the page size, the window
// (none with FullCache) and the pages (see Config.Cache).
func (c Config) resolveCache() (Config, error) {
	if c.Cache.PageSize == 0 {
		c.Cache.PageSize = kvcache.DefaultPageSize
	}
	if c.FullCache {
		if c.Cache.Window != 0 {
			return c, fieldError("FullCache", "set with Cache.Window = %d: a full-token cache has no window (leave Window 0)", c.Cache.Window)
		}
		if c.Cache.NumPages == 0 {
			return c, fieldError("Cache.NumPages", "0 with FullCache: every token stays in the pool, so size it to the tokens served")
		}
		return c, nil
	}
	if c.Cache.Window == 0 {
		c.Cache.Window = kvcache.DSv4Window
	}
	if c.Cache.NumPages == 0 && c.Cache.PageSize > 0 && c.Cache.PageSize <= kvcache.MaxPageSize && c.Cache.Window > 0 {
		p := int64(c.Cache.PageSize)
		n := 2*int64(c.MaxSeqs)*((int64(c.Cache.Window)+p-1)/p+1) + (int64(c.MaxTokens)+p-1)/p + int64(c.MaxSeqs)
		c.Cache.NumPages = int(min(n, math.MaxInt32))
	}
	return c, nil
}

// cacheField names the first field of a cache config that Validate refuses,
// by validating each on a config that is otherwise known to be good.
func cacheField(c kvcache.Config) string {
	good := kvcache.Config{PageSize: kvcache.DefaultPageSize, NumPages: 1, KVScale: 1}
	bad := func(edit func(*kvcache.Config)) bool {
		g := good
		edit(&g)
		return g.Validate() != nil
	}
	switch {
	case bad(func(g *kvcache.Config) { g.Format = c.Format }):
		return "Format"
	case bad(func(g *kvcache.Config) { g.PageSize = c.PageSize }):
		return "PageSize"
	case bad(func(g *kvcache.Config) { g.Format, g.KVScale = c.Format, c.KVScale }):
		return "KVScale"
	case bad(func(g *kvcache.Config) { g.Window = c.Window }):
		return "Window"
	}
	return "NumPages"
}

// params are the metadata pass parameters of every iteration.
func (c Config) params() metadata.Params {
	p := metadata.Params{
		Heads:        c.heads(),
		PageSize:     c.Cache.PageSize,
		MaxPositions: c.RopePositions,
		Scheduler:    c.Scheduler,
	}
	return p
}

// minGraphBucket is the smallest padded size of a graph iteration.
const minGraphBucket = 16

// graphBucket is the padded row count of a generation-only iteration of
// tokens rows on the graph path: the smallest power of two >= tokens and
// >= minGraphBucket, capped at MaxTokens.
func (c Config) graphBucket(tokens int) int {
	b := minGraphBucket
	for b < tokens {
		b *= 2
	}
	return min(b, c.MaxTokens)
}

// pageStride is the block-table width of the metadata buffer: the most pages
// one sequence's positions can span, bounded by the RoPE table and, without
// a window, by the pool (with one, freed entries keep their place, so a
// sequence spans more pages than the pool has).
func (c Config) pageStride() int {
	span := (c.RopePositions + c.Cache.PageSize - 1) / c.Cache.PageSize
	if c.Cache.Window > 0 {
		return span
	}
	return min(c.Cache.NumPages, span)
}

// fusedRowElems is the fused A projection row: [q_lora_rank | 448 | 64].
func (c Config) fusedRowElems() int { return c.Model.QLoraRank + numerics.HeadDim }
