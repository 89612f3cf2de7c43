package engine_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/weights"
)

// TestZeroConfigIsDSv4: with Model set, the zero Config resolves to
// DeepSeek-V4's real layer (hidden-state input, the 128-token window, the
// compressor with pools sized by the documented rules, graphs) and is
// refused only for want of weights.
func TestZeroConfigIsDSv4(t *testing.T) {
	_, err := engine.Config{Model: dsv4.Flash()}.Resolve()
	require.ErrorIs(t, err, engine.ErrNoWeights)
	var ce *engine.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Checkpoint", ce.Field)

	r, err := engine.Config{Model: dsv4.Flash(), SyntheticWeights: &engine.SyntheticWeights{}}.Resolve()
	require.NoError(t, err)
	require.Equal(t, engine.InputHidden, r.Input)
	require.False(t, r.FullCache)
	require.False(t, r.Eager)
	require.Equal(t, kvcache.DSv4Window, r.Cache.Window)
	require.Equal(t, kvcache.DefaultPageSize, r.Cache.PageSize)
	// 2*256 sequences' windows (ceil(128/64)+1 pages each), one batch of
	// 4096 tokens and a page per batch sequence.
	require.Equal(t, 2*256*3+4096/64+256, r.Cache.NumPages)
	require.True(t, r.Compresses())
	tokens := r.Cache.NumPages * 64
	require.Equal(t, (tokens+4*64-1)/(4*64)+512, r.Compressor.Ratio4Pages)
	require.Equal(t, (tokens+128*64-1)/(128*64)+512, r.Compressor.Ratio128Pages)
	require.Equal(t, engine.DefaultMaxDrafts, r.Compressor.MaxDrafts)
	require.Equal(t, 512, r.Compressor.MaxSequences)
	require.Equal(t, 44, r.Layers)
	require.Equal(t, min(r.Model.MaxPositionEmbeddings, tokens), r.RopePositions)
}

// TestZeroConfigRunsDSv4: an engine of the zero Config (weights asked for,
// small capacities) runs the hidden-state chain, frees the pages behind the
// window, writes compressed entries of both ratios, and replays
// generation-only iterations through graphs on a backend that has them.
func TestZeroConfigRunsDSv4(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 41))
	cfg := engine.Config{
		Model:            weights.TinyConfig(), // layers of ratio 0, 4, 128 and the MTP layer
		SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
		Backend:          "test-graphs",
		MaxSeqs:          4,
		MaxTokens:        256,
	}
	testGraphsOn.Store(true)
	e := newEngine(t, cfg)
	testGraphsOn.Store(false)
	t.Cleanup(func() { *testGraphs = graphCPU{Backend: testGraphs.Backend} })
	ctx := context.Background()
	reserved := map[int][][]int32{}
	run := func(reqs ...metadata.Request) *engine.Iteration {
		it, err := e.Begin(ctx, reqs)
		require.NoError(t, err)
		for l := range e.Layers() {
			require.NoError(t, it.SetHidden(l, randomBF16(rng, it.Tokens()*e.HiddenSize())))
			require.NoError(t, it.RunLayer(ctx, l))
		}
		for _, r := range []int{4, 128} {
			reserved[r], err = it.Debug().CompressedBlockTables(r)
			require.NoError(t, err)
		}
		_, err = it.Debug().CompressedBlockTables(16)
		require.ErrorContains(t, err, "no compressed pool of ratio 16")
		require.NoError(t, it.End(ctx))
		_, err = it.Debug().CompressedBlockTables(4)
		require.ErrorIs(t, err, engine.ErrIterationDone)
		return it
	}
	require.False(t, run(ctxReq(1, 200)).Debug().GraphPath())
	table, err := e.Debug().BlockTable(1)
	require.NoError(t, err)
	require.Equal(t, int32(-1), table[0], "positions 0-63 lie behind the window at length 200")
	for ratio, want := range map[int]int{4: 50, 128: 1} {
		n, err := e.Debug().CompressedEntries(ratio, 1)
		require.NoError(t, err)
		require.Equal(t, want, n, "ratio %d", ratio)
	}
	for r, tables := range reserved { // an iteration's tables are what it commits, here all accepted
		committed, err := e.Debug().CompressedBlockTable(r, 1)
		require.NoError(t, err)
		require.Len(t, tables, 1)
		require.Equal(t, committed, tables[0], "ratio %d", r)
		require.Len(t, committed, map[int]int{4: 1, 128: 1}[r], "50 ratio-4 entries fill one page of 64")
	}
	require.Equal(t, 1, e.Debug().CompressorSequences())
	require.True(t, run(genReq(1, 3)).Debug().GraphPath(), "a generation-only batch replays graphs")
	require.NoError(t, e.Debug().CheckInvariants())
}
