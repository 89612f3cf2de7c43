package tests

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
)

// replayOptions is cmd/decode's default configuration (V4-Flash, 2 layers,
// fp8_ue8m0 pages of 64, capacity from the trace) with 2 heads instead of
// 64, so the race detector replays the whole default trace in seconds. The
// heads do not change the batch shapes, the launches or the cache layout.
func replayOptions(t *testing.T, steps []trace.Step, pages int) replay.Options {
	m := dsv4.Flash()
	m.NumHeads = 2
	st := trace.Summarize(steps)
	return replay.Options{
		Engine: engine.Config{
			SyntheticWeights: &engine.SyntheticWeights{},
			Model:            m,
			Cache:            kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 64, NumPages: pages},
			Backend:          engine.BackendCPU,
			Layers:           2,
			MaxSeqs:          st.MaxSeqs,
			MaxTokens:        st.MaxTokens,
			Input:            engine.InputProjected,
			FullCache:        true,
			Compressor:       engine.CompressorConfig{Off: true},
			Eager:            true,
		},
		Seed: 1,
	}
}

// expectedCensus counts, from the trace alone, the launches the dispatcher
// must issue: per layer, one KV and one Q launch per phase present.
func expectedCensus(steps []trace.Step, layers int) mla.Census {
	var c mla.Census
	for _, s := range steps {
		ctx, gen := s.Tokens()
		if ctx > 0 {
			c.ContextKV += layers
			c.ContextQ += layers
		}
		if gen > 0 {
			c.GenerationKV += layers
			c.GenerationQ += layers
		}
	}
	return c
}

// TestDefaultTraceReplay replays the embedded default trace on the cpu
// backend with --verify's reference engine: every iteration must be
// byte-identical (cpu against cpu), the census must match the trace, and the
// cache must end empty with every sequence finished.
func TestDefaultTraceReplay(t *testing.T) {
	steps, err := trace.Default()
	require.NoError(t, err)
	peak, _ := trace.Footprint(steps, 64, 0)
	opts := replayOptions(t, steps, peak+16)
	opts.Engine.Layers = 1 // the launches scale with the layers; CI time does too
	opts.Verify = true
	r, err := replay.New(context.Background(), opts)
	require.NoError(t, err)
	defer r.Close()

	rep, err := r.Run(context.Background(), steps, nil)
	require.NoError(t, err)
	st := trace.Summarize(steps)
	s := rep.Summary
	t.Logf("%d iterations, %d context + %d generation tokens, census %+v", s.Iterations, s.ContextTokens, s.GenerationTokens, s.Launches)

	require.Equal(t, st.Iterations, s.Iterations)
	require.Equal(t, st.Iterations, s.Verified, "every iteration verified against the cpu reference")
	require.Equal(t, st.ContextTokens, s.ContextTokens)
	require.Equal(t, st.GenerationTokens, s.GenerationTokens)
	require.Equal(t, expectedCensus(steps, 1), s.Launches)
	require.Equal(t, s.Launches, r.Engine().Debug().Census())
	mixed := 0
	for _, k := range s.ByKind {
		if k.Kind == "mixed" {
			mixed = k.Iterations
		}
	}
	require.Equal(t, st.MixedIterations, mixed)

	// Every sequence finished and every page came back, in both engines.
	require.Equal(t, st.Sequences, s.Finished)
	for _, e := range []*engine.Engine{r.Engine(), r.Reference()} {
		require.Equal(t, 0, e.Sequences())
		require.Equal(t, opts.Engine.Cache.NumPages, e.FreePages())
	}
	// The footprint's peak is counted before a line's finishes, the report's
	// free pages after them.
	require.GreaterOrEqual(t, s.MinFreePages, opts.Engine.Cache.NumPages-peak)
	require.Less(t, s.MinFreePages, opts.Engine.Cache.NumPages-peak/2)
}
