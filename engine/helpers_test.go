package engine_test

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/internal/bytediff"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

var seedFlag = flag.Uint64("seed", 0, "seed for the randomized tests (0: fresh)")

func testSeed(t testing.TB) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed=%d)", s, s)
	return s
}

// smallModel is V4-Flash with 4 heads and q_lora_rank 128: the per-layer
// RoPE pattern and the fused row layout of the real model, at a size the
// race detector can run (the projected path reads only the latent at byte
// 2*q_lora_rank of a fused row: Flash's 1024 made the tests draw and upload
// 1024 values a row that nothing reads, half their cost under -race).
func smallModel() dsv4.Config {
	m := dsv4.Flash()
	m.NumHeads = 4
	m.QLoraRank = 128
	return m
}

func smallConfig() engine.Config {
	return engine.Config{
		SyntheticWeights: &engine.SyntheticWeights{},
		Model:            smallModel(),
		Cache:            kvcache.Config{PageSize: 16, NumPages: 32},
		Backend:          engine.BackendCPU,
		Layers:           3, // layers 0, 1 plain RoPE; layer 2 YaRN
		MaxSeqs:          8,
		MaxTokens:        256,
		Input:            engine.InputProjected,
		FullCache:        true,
		Compressor:       engine.CompressorConfig{Off: true},
		Eager:            true,
	}
}

func newEngine(t testing.TB, cfg engine.Config) *engine.Engine {
	t.Helper()
	e, err := engine.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	// Not where it would change what is measured: BenchmarkBegin times the
	// engine as users run it, and TestAsyncUploads counts the waits for
	// queued copies (the check waits for the device).
	if cfg.Backend != hostOnlyName && cfg.Backend != "test-async" {
		engine.VerifyKeptRows(e)
	}
	return e
}

// randomBF16 fills n bf16 values drawn from N(0, 1) scaled by a random power
// of two per 64 values, so groups differ in magnitude.
func randomBF16(rng *rand.Rand, n int) []byte {
	out := make([]byte, 2*n)
	scale := float32(1)
	for i := range n {
		if i%64 == 0 {
			scale = numerics.Pow2(rng.IntN(12) - 6)
		}
		binary.LittleEndian.PutUint16(out[2*i:], numerics.BF16FromF32(float32(rng.NormFloat64())*scale))
	}
	return out
}

// inputs draws one layer's inputs for an iteration.
func inputs(rng *rand.Rand, e *engine.Engine, it *engine.Iteration) (fusedA, q []byte) {
	return randomBF16(rng, it.Tokens()*e.FusedRowElems()), randomBF16(rng, it.Tokens()*e.Heads()*numerics.HeadDim)
}

// step runs one whole iteration with random inputs and commits it.
func step(t testing.TB, rng *rand.Rand, e *engine.Engine, reqs ...metadata.Request) {
	t.Helper()
	ctx := context.Background()
	it, err := e.Begin(ctx, reqs)
	require.NoError(t, err)
	for l := range e.Layers() {
		f, q := inputs(rng, e, it)
		require.NoError(t, it.SetInputs(l, f, q))
		require.NoError(t, it.RunLayer(ctx, l))
	}
	require.NoError(t, it.End(ctx))
}

func ctxReq(seq uint64, n int) metadata.Request {
	return metadata.Request{Seq: seq, Phase: metadata.Context, NewTokens: n}
}

func genReq(seq uint64, mtp int) metadata.Request {
	return metadata.Request{Seq: seq, Phase: metadata.Generation, MTP: mtp}
}

// snapshot is everything a refused batch must leave as it was.
type snapshot struct {
	pools   [][]byte
	tables  map[uint64][]int32
	lengths map[uint64]string // length, or the lookup error
	free    int
	seqs    int
	census  any
}

func takeSnapshot(t testing.TB, e *engine.Engine, ids ...uint64) snapshot {
	t.Helper()
	s := snapshot{tables: map[uint64][]int32{}, lengths: map[uint64]string{}, free: e.FreePages(), seqs: e.Sequences(), census: e.Debug().Census()}
	for l := range e.Layers() {
		p, err := e.Debug().ReadPool(l)
		require.NoError(t, err)
		s.pools = append(s.pools, p)
	}
	for _, id := range ids {
		tb, err := e.Debug().BlockTable(id)
		if err == nil {
			s.tables[id] = tb
		}
		n, err := e.SequenceLength(id)
		if err != nil {
			s.lengths[id] = err.Error()
		} else {
			s.lengths[id] = fmt.Sprint(n)
		}
	}
	return s
}

func requireSameSnapshot(t testing.TB, want, got snapshot) {
	t.Helper()
	require.Equal(t, want.free, got.free, "free pages")
	require.Equal(t, want.seqs, got.seqs, "live sequences")
	require.Equal(t, want.tables, got.tables, "block tables")
	require.Equal(t, want.lengths, got.lengths, "lengths")
	require.Equal(t, want.census, got.census, "census")
	for l := range want.pools {
		if i := bytediff.First(want.pools[l], got.pools[l]); i >= 0 {
			t.Fatalf("layer %d pool byte %d changed: %#02x -> %#02x", l, i, want.pools[l][i], got.pools[l][i])
		}
	}
}
