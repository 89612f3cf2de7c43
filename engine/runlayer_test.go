package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// eagerIteration opens an engine on the kernel-less backend (hostOnlyBackend)
// with the given layers, eager (no graphs), and begins a decode iteration of
// nb sequences with MTP 3.
func eagerIteration(tb testing.TB, layers, nb int) *engine.Iteration {
	tb.Helper()
	const pageSize, perSeq = 64, 4
	cfg := engine.Config{
		SyntheticWeights: &engine.SyntheticWeights{},
		Model:            smallModel(),
		Cache:            kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: pageSize, NumPages: nb * perSeq},
		Backend:          hostOnlyName,
		Layers:           layers,
		MaxSeqs:          nb,
		MaxTokens:        nb * 8,
		RopePositions:    perSeq * pageSize,
		Input:            engine.InputProjected,
		FullCache:        true,
		Compressor:       engine.CompressorConfig{Off: true},
		Eager:            true,
	}
	hostOnlyOpening = true
	e := newEngine(tb, cfg)
	hostOnlyOpening = false
	ctx := context.Background()
	reqs := make([]metadata.Request, nb)
	for s := range reqs {
		reqs[s] = ctxReq(uint64(s+1), 8)
	}
	it, err := e.Begin(ctx, reqs)
	require.NoError(tb, err)
	for l := range layers {
		require.NoError(tb, it.RunLayer(ctx, l))
	}
	require.NoError(tb, it.End(ctx))
	for s := range reqs {
		reqs[s] = genReq(uint64(s+1), 3)
	}
	it, err = e.Begin(ctx, reqs)
	require.NoError(tb, err)
	tb.Cleanup(it.Abort)
	return it
}

// BenchmarkRunLayer is the engine's own host cost of an eager layer
// (Iteration.RunLayer on a backend whose kernels do nothing): the checks,
// the hand-over to mla.Batch, the layer's validation, the bookkeeping.
func BenchmarkRunLayer(b *testing.B) {
	const layers = 8
	it := eagerIteration(b, layers, 32)
	ctx := context.Background()
	b.ReportAllocs()
	l := 0
	for b.Loop() {
		if err := it.RunLayer(ctx, l); err != nil {
			b.Fatal(err)
		}
		l = (l + 1) % layers
	}
}

// TestEagerRunLayerAllocatesNothing: the engine's part of an eager layer
// allocates nothing (the backend's part is attention/mla/cuda's
// TestEagerLayerAllocatesNothing).
func TestEagerRunLayerAllocatesNothing(t *testing.T) {
	const layers = 3
	it := eagerIteration(t, layers, 5)
	ctx := context.Background()
	l := 0
	allocs := testing.AllocsPerRun(50, func() {
		if err := it.RunLayer(ctx, l); err != nil {
			panic(err)
		}
		l = (l + 1) % layers
	})
	require.Zero(t, allocs)
}
