package engine_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// TestNoSilentWeights: an engine that was given no weights and did not ask
// for synthetic ones refuses to run. On the hidden-state path New refuses
// it; on the projected path Begin refuses, naming the first weight never
// set, until SetLayerWeight and SetCompressorNorm have given every layer
// its weights; the engine then holds exactly those.
func TestNoSilentWeights(t *testing.T) {
	ctx := context.Background()
	hidden := chainConfig(chainModel())
	hidden.SyntheticWeights = nil
	_, err := engine.New(ctx, hidden)
	require.ErrorIs(t, err, engine.ErrNoWeights)
	require.ErrorContains(t, err, "Config.Checkpoint")

	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 31))
	cfg := compConfig() // layers 2 and 3 have a compressor
	cfg.SyntheticWeights = nil
	e := newEngine(t, cfg)
	weight := func() []float32 {
		w := make([]float32, numerics.HeadDim)
		for i := range w {
			w[i] = numerics.RoundBF16(float32(0.5 + rng.Float64()))
		}
		return w
	}
	begin := func(want string) {
		t.Helper()
		it, err := e.Begin(ctx, []metadata.Request{ctxReq(1, 20)})
		if want == "" {
			require.NoError(t, err)
			it.Abort()
			return
		}
		require.ErrorIs(t, err, engine.ErrNoWeights)
		require.ErrorContains(t, err, want)
		require.Nil(t, it)
	}
	_, err = e.Debug().LayerWeight(0)
	require.ErrorIs(t, err, engine.ErrNoWeights)
	_, err = e.Debug().CompressorNorm(2)
	require.ErrorIs(t, err, engine.ErrNoWeights)
	begin("layer 0 kv_a_layernorm weight was never set (SetLayerWeight)")
	set := map[int][]float32{}
	for l := range e.Layers() {
		set[l] = weight()
		require.NoError(t, e.SetLayerWeight(l, set[l]))
		require.NoError(t, e.SetLayerWeight(l, set[l]), "setting twice counts once")
		if l < e.Layers()-1 {
			begin("kv_a_layernorm weight was never set")
		}
	}
	begin("layer 2 compressor norm weight was never set (SetCompressorNorm)")
	norms := map[int][]float32{2: weight(), 3: weight()}
	require.NoError(t, e.SetCompressorNorm(2, norms[2]))
	begin("layer 3 compressor norm weight was never set")
	require.NoError(t, e.SetCompressorNorm(3, norms[3]))
	begin("")
	for l := range e.Layers() {
		w, err := e.Debug().LayerWeight(l)
		require.NoError(t, err)
		require.Equal(t, set[l], w)
	}
	for l, want := range norms {
		w, err := e.Debug().CompressorNorm(l)
		require.NoError(t, err)
		require.Equal(t, want, w)
	}
	_, err = e.Debug().CompressorNorm(1)
	require.ErrorContains(t, err, "no compressor")
}

// TestSyntheticWeightsAskedFor: with SyntheticWeights the projected path
// holds SyntheticLayerWeight and SyntheticCompressorNorm of its seed.
func TestSyntheticWeightsAskedFor(t *testing.T) {
	seed := testSeed(t)
	cfg := compConfig()
	cfg.SyntheticWeights = &engine.SyntheticWeights{Seed: seed}
	e := newEngine(t, cfg)
	for l := range e.Layers() {
		w, err := e.Debug().LayerWeight(l)
		require.NoError(t, err)
		require.Equal(t, engine.SyntheticLayerWeight(seed, l), w)
		if e.CompressorWidth(l) > 0 {
			n, err := e.Debug().CompressorNorm(l)
			require.NoError(t, err)
			require.Equal(t, engine.SyntheticCompressorNorm(seed, l), n)
			require.NotEqual(t, w, n, "each on its own stream")
		}
	}
}

// TestSetWeightsRefuseNonFinite: a NaN or infinite value in a weight set
// directly is refused naming the weight and its first bad index, and the
// weight held before is kept.
func TestSetWeightsRefuseNonFinite(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 32))
	cfg := compConfig()
	cfg.SyntheticWeights = &engine.SyntheticWeights{Seed: seed}
	e := newEngine(t, cfg)
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		i := rng.IntN(numerics.HeadDim)
		w := engine.SyntheticLayerWeight(seed+1, 0)
		w[i] = bad
		err := e.SetLayerWeight(1, w)
		require.ErrorIs(t, err, weights.ErrNonFinite)
		require.ErrorContains(t, err, fmt.Sprintf("layer 1 kv_a_layernorm weight: element %d", i))
		held, err := e.Debug().LayerWeight(1)
		require.NoError(t, err)
		require.Equal(t, engine.SyntheticLayerWeight(seed, 1), held)

		err = e.SetCompressorNorm(3, w)
		require.ErrorIs(t, err, weights.ErrNonFinite)
		require.ErrorContains(t, err, fmt.Sprintf("layer 3 compressor norm weight: element %d", i))
		norm, err := e.Debug().CompressorNorm(3)
		require.NoError(t, err)
		require.Equal(t, engine.SyntheticCompressorNorm(seed, 3), norm)
	}
}
