package engine_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

func widen(raw []byte) []float32 {
	x := make([]float32, len(raw)/2)
	for i := range x {
		x[i] = numerics.F32FromBF16(binary.LittleEndian.Uint16(raw[2*i:]))
	}
	return x
}

// normRope is docs/DESIGN.md section 4 steps 1-4 for one row (w nil: the Q side).
func normRope(x []float32, w []float32, table *dsv4.RopeTable, pos int, eps float32) *[512]float32 {
	r := numerics.RMSInv(numerics.SumSquares(x), eps)
	var y [512]float32
	for i := range y {
		v := float32(x[i] * r)
		if w != nil {
			v = float32(v * w[i])
		}
		y[i] = numerics.RoundBF16(v)
	}
	for k := range numerics.RopePairs {
		c, s := table.At(pos, k)
		i := numerics.NopeDim + 2*k
		y[i], y[i+1] = numerics.Rope(y[i], y[i+1], c, s)
	}
	return &y
}

// TestLayersReadTheirOwnInputs checks, against docs/DESIGN.md section 4 computed
// here row by row, that every layer reads the latent in place from the fused
// row, uses its own kv_a_layernorm weight and RoPE kind (Flash layers 0, 1
// plain, layer 2 YaRN) and writes its own pool at the slots of a chunked
// prefill and an MTP generation step, and that the Q output holds the layer
// that ran last. The model's rms_norm_eps is not the default 1e-6, so an
// engine or backend that ignores it fails.
func TestLayersReadTheirOwnInputs(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 10))
	cfg := smallConfig()
	cfg.QScale = 0.5
	cfg.Model.RMSNormEps = 1e-5
	const eps = float32(1e-5)
	e := newEngine(t, cfg)
	custom := make([]float32, 512)
	for i := range custom {
		custom[i] = numerics.RoundBF16(float32(0.5 + rng.Float64()))
	}
	require.NoError(t, e.SetLayerWeight(1, custom))
	for l, want := range []dsv4.RopeKind{dsv4.RopePlain, dsv4.RopePlain, dsv4.RopeYaRN} {
		tb, err := e.Debug().RopeTable(l)
		require.NoError(t, err)
		require.Equal(t, want, tb.Kind, "layer %d", l)
	}

	ctx := context.Background()
	step(t, rng, e, ctxReq(1, 20), ctxReq(2, 5))
	it, err := e.Begin(ctx, []metadata.Request{ctxReq(1, 13), genReq(2, 2)})
	require.NoError(t, err)
	m := it.Metadata()
	wantPos := []int32{20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 5, 6, 7}
	require.Equal(t, wantPos, m.Positions())

	fused := make([][]byte, e.Layers())
	for l := range e.Layers() {
		f, q := inputs(rng, e, it)
		fused[l] = f
		require.NoError(t, it.SetInputs(l, f, q))
		require.NoError(t, it.RunLayer(ctx, l))
		got, err := it.Debug().ReadQ()
		require.NoError(t, err)
		table, err := e.Debug().RopeTable(l)
		require.NoError(t, err)
		heads := e.Heads()
		for row := range it.Tokens() {
			for h := range heads {
				i := row*heads + h
				y := normRope(widen(q[i*1024:(i+1)*1024]), nil, table, int(wantPos[row]), eps)
				for j, v := range y {
					want := numerics.E4M3FromF32(float32(v * 0.5))
					require.Equal(t, want, got[i*512+j], "layer %d token %d head %d element %d", l, row, h, j)
				}
			}
		}
	}
	require.NoError(t, it.End(ctx))
	require.Equal(t, mla.Census{ContextKV: 3, ContextQ: 3, GenerationKV: 3, GenerationQ: 3}, it.Debug().Census())

	cc := e.Config().Cache
	row := e.FusedRowElems() * 2
	for l := range e.Layers() {
		w, err := e.Debug().LayerWeight(l)
		require.NoError(t, err)
		if l == 1 {
			require.Equal(t, custom, w)
		} else {
			require.Equal(t, engine.SyntheticLayerWeight(0, l), w)
		}
		table, err := e.Debug().RopeTable(l)
		require.NoError(t, err)
		for tok := range it.Tokens() {
			slot := m.Slot(tok)
			page, off := int(slot)/cc.PageSize, int(slot)%cc.PageSize
			got, err := e.Debug().ReadPage(l, page)
			require.NoError(t, err)
			latent := fused[l][tok*row+2*cfg.Model.QLoraRank : (tok+1)*row]
			y := normRope(widen(latent), w, table, int(wantPos[tok]), eps)
			want := append([]byte(nil), got...)
			require.NoError(t, kvcache.EncodeToken(cc.Format, want, cc.PageSize, off, y, cc.KVScale))
			require.Equal(t, want, got, "layer %d token %d (page %d offset %d): the stored bytes are not the reference encoding", l, tok, page, off)
			require.Contains(t, it.Debug().WrittenPages(), int32(page))
		}
	}
	n, err := e.SequenceLength(1)
	require.NoError(t, err)
	require.Equal(t, 33, n)
	n, err = e.SequenceLength(2)
	require.NoError(t, err)
	require.Equal(t, 8, n)
}

// graphCPU is the cpu backend with a stand-in for CUDA graphs: Capture
// records the function and each Launch runs it again, as a replayed graph
// reissues the captured launches with their captured arguments.
type graphCPU struct {
	*cpu.Backend
	captures, launches int
	rowKeys            []int // each IndexerTopK's MaxRowKeys, in call order
}

// IndexerTopK records the launch's MaxRowKeys hint, then selects.
func (b *graphCPU) IndexerTopK(ctx context.Context, a *mla.TopKArgs) error {
	b.rowKeys = append(b.rowKeys, a.MaxRowKeys)
	return b.Backend.IndexerTopK(ctx, a)
}

type replayGraph struct {
	b *graphCPU
	f func() error
}

func (g *replayGraph) Launch() error { g.b.launches++; return g.f() }
func (g *replayGraph) Close() error  { return nil }

func (b *graphCPU) Capture(f func() error) (mla.Graph, error) {
	b.captures++
	return &replayGraph{b: b, f: f}, nil
}

var (
	testGraphs   = &graphCPU{Backend: cpu.New(1)}
	testGraphsOn atomic.Bool // available only inside the test that uses it, so "auto" never picks it
)

func init() {
	engine.RegisterBackend("test-graphs", func(engine.Options) (mla.Backend, error) { return testGraphs, nil },
		func() error {
			if testGraphsOn.Load() {
				return nil
			}
			return errors.New("test backend: switched off")
		})
}

// Without Eager, on a backend that captures graphs, generation-only
// iterations are padded to a power-of-two bucket and each layer replays a
// graph captured once per (layer, bucket); later batches of another size in
// the same bucket reuse it, reading their counts from the device header.
// Every byte equals the eager engine's; context and mixed batches stay eager.
func TestGraphPathMatchesEager(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 11))
	cfg := smallConfig()
	cfg.QFormat = mla.QBF16
	eager := newEngine(t, cfg)
	cfg.Backend, cfg.Eager = "test-graphs", false
	testGraphsOn.Store(true)
	graphs := newEngine(t, cfg)
	testGraphsOn.Store(false)
	*testGraphs = graphCPU{Backend: testGraphs.Backend}
	ctx := context.Background()
	gen := func(mtp int, ids ...uint64) []metadata.Request {
		var rs []metadata.Request
		for _, id := range ids {
			rs = append(rs, metadata.Request{Seq: id, Phase: metadata.Generation, MTP: mtp})
		}
		return rs
	}
	batches := []struct {
		reqs  []metadata.Request
		graph bool
		rows  int
	}{
		{[]metadata.Request{ctxReq(1, 20), ctxReq(2, 9), ctxReq(3, 40)}, false, 69},
		{gen(3, 1, 2, 3), true, 16}, // 12 tokens -> bucket 16
		{gen(3, 1, 3), true, 16},    // 8 tokens, same bucket: graphs reused
		{gen(1, 1, 2, 3), true, 16}, // seq_len 2, same bucket
		{append([]metadata.Request{ctxReq(4, 5)}, gen(2, 1, 2)...), false, 11}, // mixed: eager
		{gen(2, 1, 2, 3, 4), true, 16},                                         // 15 tokens, non-power-of-two seq_len
		{gen(3, 1, 2, 3, 4), true, 16},
		{gen(3, 1, 2, 3, 4), true, 16},
		{gen(3, 1, 2, 3, 4), true, 16},
		{gen(3, 1, 2, 3, 4), true, 16},
		{gen(0, 1, 2, 3, 4), true, 16},
	}
	for n, bt := range batches {
		ig, err := graphs.Begin(ctx, bt.reqs)
		require.NoError(t, err, "batch %d", n)
		ie, err := eager.Begin(ctx, bt.reqs)
		require.NoError(t, err)
		require.Equal(t, bt.graph, ig.Debug().GraphPath(), "batch %d", n)
		require.Equal(t, bt.rows, ig.Rows(), "batch %d", n)
		for l := range cfg.Layers {
			f, q := inputs(rng, graphs, ig)
			require.NoError(t, ig.SetInputs(l, f, q))
			require.NoError(t, ig.RunLayer(ctx, l))
			require.NoError(t, ie.SetInputs(l, f, q))
			require.NoError(t, ie.RunLayer(ctx, l))
			gq, err := ig.Debug().ReadQ()
			require.NoError(t, err)
			eq, err := ie.Debug().ReadQ()
			require.NoError(t, err)
			rowBytes := graphs.Heads() * 512 * 2
			require.Equal(t, eq[:ie.Tokens()*rowBytes], gq[:ig.Tokens()*rowBytes], "batch %d layer %d: Q", n, l)
			require.Equal(t, make([]byte, (ig.Rows()-ig.Tokens())*rowBytes), gq[ig.Tokens()*rowBytes:], "padding rows of Q are zeros")
			gp, err := graphs.Debug().ReadPool(l)
			require.NoError(t, err)
			ep, err := eager.Debug().ReadPool(l)
			require.NoError(t, err)
			require.Equal(t, ep, gp, "batch %d layer %d: cache pool", n, l)
		}
		require.NoError(t, ig.End(ctx))
		require.NoError(t, ie.End(ctx))
	}
	require.Equal(t, cfg.Layers, testGraphs.captures, "one capture per layer for the one bucket used")
	require.Equal(t, 9*cfg.Layers, testGraphs.launches)
}

// Finish from other goroutines while iterations run: sequences of the
// running batch are finished when it ends, the others at once; at the end
// every page is free again.
func TestFinishFromOtherGoroutines(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 12))
	cfg := smallConfig()
	cfg.Layers = 2
	cfg.Cache.NumPages = 64
	cfg.MaxSeqs, cfg.MaxTokens = 16, 512
	var logs syncBuffer
	cfg.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel)
	e := newEngine(t, cfg)
	const streams = 16
	var reqs []metadata.Request
	for s := range uint64(streams) {
		reqs = append(reqs, ctxReq(s, 1+int(s)*3))
	}
	step(t, rng, e, reqs...)

	var mu sync.Mutex
	finished := map[uint64]bool{}
	finish := func(s uint64) {
		if err := e.Finish(s); err != nil {
			t.Errorf("Finish(%d): %v", s, err)
		}
		mu.Lock()
		finished[s] = true
		mu.Unlock()
	}
	// Goroutines 0-2 finish their streams at random times, mostly while an
	// iteration runs; goroutine 3 finishes its streams between iterations,
	// when the main loop offers a gap.
	gap, gapDone := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		seed := rng.Uint64()
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			for s := uint64(g); s < streams; s += 4 {
				if g == 3 {
					<-gap
					finish(s)
					gapDone <- struct{}{}
					continue
				}
				time.Sleep(time.Duration(r.IntN(20000)) * time.Microsecond)
				finish(s)
			}
		})
	}
	ctx := context.Background()
	for iter := 0; ; iter++ {
		mu.Lock()
		var batch []metadata.Request
		for s := range uint64(streams) {
			if !finished[s] {
				batch = append(batch, genReq(s, 3))
			}
		}
		mu.Unlock()
		if len(batch) == 0 {
			break
		}
		it, err := e.Begin(ctx, batch)
		if errors.Is(err, kvcache.ErrFinishedSequence) {
			continue // finished between the snapshot and Begin
		}
		require.NoError(t, err, "iteration %d", iter)
		for l := range e.Layers() {
			f, q := inputs(rng, e, it)
			require.NoError(t, it.SetInputs(l, f, q))
			require.NoError(t, it.RunLayer(ctx, l))
		}
		require.NoError(t, it.End(ctx))
		select {
		case gap <- struct{}{}:
			<-gapDone
		default:
		}
	}
	wg.Wait()
	require.Equal(t, 0, e.Sequences())
	require.Equal(t, cfg.Cache.NumPages, e.FreePages())
	for s := range uint64(streams) {
		require.ErrorIs(t, e.Finish(s), kvcache.ErrFinishedSequence)
	}
	deferred := strings.Count(logs.String(), "finish deferred")
	t.Logf("%d of %d finishes landed on a running iteration and were deferred", deferred, streams)
	require.LessOrEqual(t, deferred, streams-4, "goroutine 3 finished between iterations")
}

// syncBuffer is a bytes.Buffer safe for the engine's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestFinishDuringIterationIsDeferred(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 13))
	cfg := smallConfig()
	cfg.Layers = 1
	e := newEngine(t, cfg)
	ctx := context.Background()
	step(t, rng, e, ctxReq(1, 30), ctxReq(2, 3))
	free := e.FreePages()

	t.Run("end", func(t *testing.T) {
		it, err := e.Begin(ctx, []metadata.Request{ctxReq(3, 16), genReq(1, 1)})
		require.NoError(t, err)
		require.NoError(t, e.Finish(1))
		require.ErrorIs(t, e.Finish(1), kvcache.ErrFinishedSequence)
		require.NoError(t, e.Finish(2), "a sequence outside the batch finishes at once")
		n, err := e.SequenceLength(1)
		require.NoError(t, err, "pages of the running batch are kept")
		require.Equal(t, 30, n)
		f, q := inputs(rng, e, it)
		require.NoError(t, it.SetInputs(0, f, q))
		require.NoError(t, it.RunLayer(ctx, 0))
		require.NoError(t, it.End(ctx))
		_, err = e.SequenceLength(1)
		require.ErrorIs(t, err, kvcache.ErrFinishedSequence)
		n, err = e.SequenceLength(3)
		require.NoError(t, err)
		require.Equal(t, 16, n)
		require.Equal(t, free+1+2-1, e.FreePages(), "seq 1 (2 pages) and 2 (1 page) freed, seq 3 holds 1")
	})
	t.Run("abort", func(t *testing.T) {
		it, err := e.Begin(ctx, []metadata.Request{genReq(3, 0)})
		require.NoError(t, err)
		require.NoError(t, e.Finish(3))
		it.Abort()
		_, err = e.SequenceLength(3)
		require.ErrorIs(t, err, kvcache.ErrFinishedSequence)
		require.Equal(t, cfg.Cache.NumPages, e.FreePages())
	})
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(*engine.Config)
		field string // the *engine.ConfigError's Field
		want  string
	}{
		{"zero model", func(c *engine.Config) { c.Model = dsv4.Config{} }, "Model", "Config.Model"},
		{"q_lora_rank not a multiple of 8", func(c *engine.Config) { c.Model.QLoraRank = 1020 }, "Model", "q_lora_rank = 1020"},
		{"too many heads", func(c *engine.Config) { c.Model.NumHeads = 1 << 20 }, "Model", "num_attention_heads = 1048576, must be at most 1024"},
		{"huge q_lora_rank", func(c *engine.Config) { c.Model.QLoraRank = 1 << 30 }, "Model", "q_lora_rank = 1073741824, must be at most 65536"},
		{"huge MTP layer count", func(c *engine.Config) {
			c.Model.NumMTPLayers, c.Model.CompressRatios = 1<<40, c.Model.CompressRatios[:c.Model.NumLayers]
		}, "Model", "num_nextn_predict_layers 1099511627776, must be at most 1024 layers"},
		{"page size", func(c *engine.Config) { c.Cache.PageSize = 48 }, "Cache.PageSize", "PageSize 48"},
		{"page size too big", func(c *engine.Config) { c.Cache.PageSize = 2 * kvcache.MaxPageSize }, "Cache.PageSize", "PageSize 2097152"},
		{"pages", func(c *engine.Config) { c.Cache.NumPages = -1 }, "Cache.NumPages", "NumPages -1"},
		{"no pages with the full cache", func(c *engine.Config) { c.Cache.NumPages = 0 }, "Cache.NumPages", "Config.Cache.NumPages: 0 with FullCache"},
		{"a window with the full cache", func(c *engine.Config) { c.Cache.Window = 64 }, "FullCache", "Config.FullCache: set with Cache.Window = 64"},
		{"compressor off with pools", func(c *engine.Config) { c.Compressor.Ratio4Pages = 3 }, "Compressor.Off", "Config.Compressor.Off: set, but other Compressor fields are set too"},
		{"compressor pools without a compressed layer", func(c *engine.Config) {
			c.Layers, c.FullCache, c.Compressor = 2, false, engine.CompressorConfig{Ratio4Pages: 3}
		}, "Compressor", "no layer of the engine has compress ratio 4 or 128"},
		{"cache format", func(c *engine.Config) { c.Cache.Format = 7 }, "Cache.Format", "Format 7"},
		{"kv scale", func(c *engine.Config) { c.Cache.Format, c.Cache.KVScale = kvcache.FormatFP8PerTensor, -1 }, "Cache.KVScale", "KVScale -1"},
		{"layers", func(c *engine.Config) { c.Layers = 45 }, "Layers", "Config.Layers: 45, must be in [1, 44]"},
		{"negative layers", func(c *engine.Config) { c.Layers = -1 }, "Layers", "Config.Layers: -1"},
		{"q scale", func(c *engine.Config) { c.QScale = -2 }, "QScale", "Config.QScale: -2"},
		{"q format", func(c *engine.Config) { c.QFormat = 9 }, "QFormat", "Config.QFormat"},
		{"device", func(c *engine.Config) { c.Device = -1 }, "Device", "Config.Device: -1"},
		{"cpu workers", func(c *engine.Config) { c.CPUWorkers = -3 }, "CPUWorkers", "Config.CPUWorkers: -3"},
		{"max tokens", func(c *engine.Config) { c.MaxTokens = -5 }, "MaxTokens", "Config.MaxTokens: -5"},
		{"max tokens past the bound", func(c *engine.Config) { c.MaxTokens = 1<<24 + 1 }, "MaxTokens", "Config.MaxTokens: 16777217, must be in [1, 16777216]"},
		{"max seqs", func(c *engine.Config) { c.MaxSeqs = -1 }, "MaxSeqs", "Config.MaxSeqs: -1"},
		{"max seqs past the bound", func(c *engine.Config) { c.MaxSeqs = 1 << 30 }, "MaxSeqs", "Config.MaxSeqs: 1073741824, must be in [1, 65536]"},
		{"rope positions", func(c *engine.Config) { c.RopePositions = 1<<20 + 1 }, "RopePositions", "Config.RopePositions: 1048577"},
		{"default rope positions past the bound", func(c *engine.Config) {
			c.Model.MaxPositionEmbeddings, c.Model.RopeScaling.OriginalMaxPositionEmbeddings = 1<<30, 1<<16
			c.Cache.NumPages = 1 << 21
		}, "RopePositions", "0 takes min(max_position_embeddings 1073741824, NumPages*PageSize 33554432) = 33554432"},
		{"memory limit", func(c *engine.Config) { c.MemoryLimit = -1 }, "MemoryLimit", "Config.MemoryLimit: -1"},
		{"scheduler", func(c *engine.Config) { c.Scheduler = metadata.SchedulerParams{QDeq: 1} }, "Scheduler", "Scheduler.KVDeq"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := smallConfig()
			c.edit(&cfg)
			e, err := engine.New(context.Background(), cfg)
			if e != nil {
				e.Close()
			}
			require.ErrorContains(t, err, c.want)
			var ce *engine.ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, c.field, ce.Field)
			_, rerr := cfg.Resolve()
			require.Equal(t, err.Error(), rerr.Error(), "Resolve refuses what New refuses")
		})
	}
}

// TestMemoryLimit: a configuration whose buffers would pass MemoryLimit is
// refused before anything is allocated (these would take terabytes), with
// the size, the buffer and the field that drives it.
func TestMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(*engine.Config)
		field string
		want  string
	}{
		{"2^24 tokens", func(c *engine.Config) { c.MaxTokens = 1 << 24 }, "MaxTokens",
			"the engine would allocate 144.0 GiB (input buffers 112.0 GiB, Q output 32.0 GiB"},
		{"a billion pages", func(c *engine.Config) { c.Cache.NumPages, c.RopePositions = 1<<30, 1024 }, "Cache.NumPages",
			"the largest is the KV cache pools, 28.7 TiB: lower Cache.NumPages, or raise MemoryLimit"},
		{"every layer of a large pool", func(c *engine.Config) { c.Layers, c.Cache.NumPages, c.MemoryLimit = 0, 1<<17, 32<<30 }, "Cache.NumPages",
			"more than MemoryLimit 32.0 GiB; the largest"},
		{"past the host's memory", func(c *engine.Config) { c.Layers, c.Cache.NumPages = 0, 1<<22 }, "Cache.NumPages",
			"(0: the cpu backend's free memory); the largest is the KV cache pools, 1.6 TiB"},
		{"a small limit", func(c *engine.Config) { c.MemoryLimit = 1 << 20 }, "MaxTokens",
			"the engine would allocate 3.9 MiB (input buffers 1.8 MiB, KV cache pools 918.0 KiB, RoPE tables 768.0 KiB"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := smallConfig()
			cfg.Model.QLoraRank = dsv4.Flash().QLoraRank // the sizes above are of Flash's fused rows
			c.edit(&cfg)
			e, err := engine.New(context.Background(), cfg)
			if e != nil {
				e.Close()
			}
			require.ErrorIs(t, err, engine.ErrMemoryLimit)
			var ce *engine.ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, c.field, ce.Field)
			require.ErrorContains(t, err, c.want)
			fp, err := cfg.Footprint()
			require.NoError(t, err, "Footprint reports the size without the limit")
			require.Greater(t, fp.Total(), int64(min(cfg.MemoryLimit, 1)))
		})
	}
}

// TestFootprint: the footprint is exactly what New allocates on the cpu
// backend, buffer by buffer, plus the host copies it names.
func TestFootprint(t *testing.T) {
	cfg := smallConfig()
	fp, err := cfg.Footprint()
	require.NoError(t, err)
	heads, tokens := int64(cfg.Model.NumHeads), int64(cfg.MaxTokens)
	require.Equal(t, engine.Footprint{
		Pools:       3 * int64(cfg.Cache.PoolBytes()),
		Inputs:      tokens*int64(cfg.Model.QLoraRank+512)*2 + tokens*heads*512*2,
		QOutput:     tokens * heads * 512,
		RopeTables:  3 * 2 * 512 * 64 * 4, // plain and YaRN; 512 positions (the pool); backend, host and upload copy
		Metadata:    fp.Metadata,
		Weights:     2 * 3 * 512 * 4,
		Bookkeeping: 32 * 4,
	}, fp)
	require.Positive(t, fp.Metadata)
	e := newEngine(t, cfg)
	require.Equal(t, fp, mustFootprint(t, e.Config()), "the resolved config has the same footprint")
}

func mustFootprint(t *testing.T, c engine.Config) engine.Footprint {
	t.Helper()
	fp, err := c.Footprint()
	require.NoError(t, err)
	return fp
}

func TestBackendErrors(t *testing.T) {
	for _, c := range []struct {
		name, backend, want string
	}{
		{"cuda not linked", "cuda", `import _ "github.com/dsv4mla/prologue/attention/mla/cuda"`},
		{"unknown backend", "tpu", `Config.Backend "tpu" is not registered`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := smallConfig()
			cfg.Backend = c.backend
			e, err := engine.New(context.Background(), cfg)
			if e != nil {
				e.Close()
			}
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestDefaultsResolved(t *testing.T) {
	cfg := smallConfig()
	cfg.Layers, cfg.MaxSeqs, cfg.MaxTokens = 0, 0, 0
	cfg.Model.NumHeads = 1
	e := newEngine(t, cfg)
	got := e.Config()
	require.Equal(t, 44, got.Layers, "43 layers + the MTP layer")
	require.Equal(t, engine.DefaultMaxSeqs, got.MaxSeqs)
	require.Equal(t, engine.DefaultMaxTokens, got.MaxTokens)
	require.Equal(t, 32*16, got.RopePositions, "the pool is shorter than max_position_embeddings")
	require.Equal(t, float32(1), got.QScale)
	require.Equal(t, metadata.DefaultSchedulerParams(), got.Scheduler)
	tb, err := e.Debug().RopeTable(43)
	require.NoError(t, err)
	require.Equal(t, dsv4.RopePlain, tb.Kind, "the MTP layer (compress ratio 0)")
	require.Equal(t, dsv4.RopeReference, tb.Mode, "the default RoPE mode")
}

// TestRopeModeReachesTables: the engine builds its tables in the configured
// mode (the bytes every backend reads), and refuses an unknown mode.
func TestRopeModeReachesTables(t *testing.T) {
	for _, mode := range dsv4.RopeModes() {
		cfg := smallConfig()
		cfg.RopeMode = mode
		e := newEngine(t, cfg)
		for l := range e.Layers() {
			got, err := e.Debug().RopeTable(l)
			require.NoError(t, err)
			want, err := dsv4.NewRopeTable(cfg.Model, got.Kind, mode, got.Positions)
			require.NoError(t, err)
			require.Equal(t, mode, got.Mode)
			require.Equal(t, want.CosSin, got.CosSin, "layer %d %v", l, mode)
		}
	}
	cfg := smallConfig()
	cfg.RopeMode = dsv4.RopeMode(7)
	_, err := engine.New(context.Background(), cfg)
	require.EqualError(t, err, "engine: Config.RopeMode = RopeMode(7) is unknown (want reference or exact)")
}

func TestSyntheticLayerWeight(t *testing.T) {
	a, b := engine.SyntheticLayerWeight(7, 3), engine.SyntheticLayerWeight(7, 4)
	require.Equal(t, a, engine.SyntheticLayerWeight(7, 3), "deterministic")
	require.NotEqual(t, a, b, "layers differ")
	for _, v := range append(a, b...) {
		require.GreaterOrEqual(t, v, float32(0.875))
		require.LessOrEqual(t, v, float32(1.125))
		require.Equal(t, numerics.RoundBF16(v), v, "a bf16 value")
	}
}

// accel is a registered test backend: the cpu backend under another name,
// available while its switch says so, counting how often it was opened.
type accel struct {
	mu        sync.Mutex
	available error
	opened    int
}

var testAccel = &accel{available: errors.New("switched off")}

func init() {
	engine.RegisterBackend("test-accel", func(opts engine.Options) (mla.Backend, error) {
		testAccel.mu.Lock()
		defer testAccel.mu.Unlock()
		testAccel.opened++
		return renamed{cpu.New(1)}, nil
	}, func() error {
		testAccel.mu.Lock()
		defer testAccel.mu.Unlock()
		return testAccel.available
	})
}

type renamed struct{ *cpu.Backend }

func (renamed) Name() string { return "test-accel" }

func TestBackendSelection(t *testing.T) {
	set := func(err error) {
		testAccel.mu.Lock()
		testAccel.available = err
		testAccel.mu.Unlock()
	}
	defer set(errors.New("switched off"))
	open := func(name string) (string, error) {
		cfg := smallConfig()
		cfg.Layers, cfg.Backend = 1, name
		e, err := engine.New(context.Background(), cfg)
		if err != nil {
			return "", err
		}
		defer e.Close()
		return e.Backend().Name(), nil
	}
	require.Contains(t, engine.Backends(), "test-accel")

	set(errors.New("no device"))
	name, err := open("auto")
	require.NoError(t, err)
	require.Equal(t, "cpu", name, "auto falls back to cpu")
	_, err = open("test-accel")
	require.ErrorContains(t, err, `Config.Backend "test-accel" is unavailable on this machine: no device`)

	set(nil)
	for _, n := range []string{"auto", "", "test-accel"} {
		name, err = open(n)
		require.NoError(t, err)
		require.Equal(t, "test-accel", name, "backend %q", n)
	}
	name, err = open("cpu")
	require.NoError(t, err)
	require.Equal(t, "cpu", name)

	for _, bad := range []string{"", "auto", "cpu", "test-accel"} {
		require.Panics(t, func() {
			engine.RegisterBackend(bad, func(engine.Options) (mla.Backend, error) { return nil, nil }, func() error { return nil })
		}, "name %q", bad)
	}
	require.Panics(t, func() { engine.RegisterBackend("x", nil, func() error { return nil }) })
}

func TestEventTimerOnlyWhenOffered(t *testing.T) {
	cfg := smallConfig()
	cfg.Layers = 1
	e := newEngine(t, cfg)
	_, ok := e.EventTimer()
	require.False(t, ok, "the cpu backend has no device timer")
}

func TestSchedulerScalarsWritten(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 14))
	cfg := smallConfig()
	cfg.Layers = 1
	cfg.Scheduler = metadata.SchedulerParams{QDeq: 0.5, KVDeq: 2, QScaling: 1, OScale: 3}
	e := newEngine(t, cfg)
	it, err := e.Begin(context.Background(), []metadata.Request{ctxReq(1, 3)})
	require.NoError(t, err)
	f, q := inputs(rng, e, it)
	require.NoError(t, it.SetInputs(0, f, q))
	require.NoError(t, it.RunLayer(context.Background(), 0))
	s, err := it.Debug().Scheduler()
	require.NoError(t, err)
	require.Equal(t, metadata.ComputeSchedulerScalars(cfg.Scheduler), s)
	require.NoError(t, it.End(context.Background()))
}

func TestCloseAbortsOpenIteration(t *testing.T) {
	cfg := smallConfig()
	cfg.Layers = 1
	e, err := engine.New(context.Background(), cfg)
	require.NoError(t, err)
	it, err := e.Begin(context.Background(), []metadata.Request{ctxReq(1, 3)})
	require.NoError(t, err)
	require.NoError(t, e.Close())
	require.ErrorIs(t, it.End(context.Background()), engine.ErrIterationDone)
	require.NoError(t, e.Close())
}

func BenchmarkDecodeIteration(b *testing.B) {
	for _, streams := range []int{8, 64} {
		b.Run(fmt.Sprintf("flash/streams=%d/mtp=3", streams), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			cfg := engine.Config{
				SyntheticWeights: &engine.SyntheticWeights{},
				Model:            dsv4.Flash(), Cache: kvcache.Config{PageSize: 64, NumPages: 1024},
				Backend: engine.BackendCPU, Layers: 1, MaxSeqs: streams, MaxTokens: 4 * streams,
				Input:      engine.InputProjected,
				FullCache:  true,
				Compressor: engine.CompressorConfig{Off: true},
				Eager:      true,
			}
			e := newEngine(b, cfg)
			var prompt, decode []metadata.Request
			for s := range uint64(streams) {
				prompt = append(prompt, ctxReq(s, 4))
				decode = append(decode, genReq(s, 3))
			}
			step(b, rng, e, prompt...)
			ctx := context.Background()
			var f, q []byte
			b.ResetTimer()
			for b.Loop() {
				it, err := e.Begin(ctx, decode)
				if err != nil {
					b.Fatal(err)
				}
				if f == nil {
					f, q = inputs(rng, e, it)
				}
				if err := it.SetInputs(0, f, q); err != nil {
					b.Fatal(err)
				}
				if err := it.RunLayer(ctx, 0); err != nil {
					b.Fatal(err)
				}
				if err := it.End(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(4*streams*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
