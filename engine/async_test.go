package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/metadata"
)

// asyncGraphs is the CPU backend with copies that land late
// (mlatest.Async: an mla.AsyncWriter, as the CUDA backend is) and a
// stand-in for CUDA graphs that reissues the captured launches.
type asyncGraphs struct{ *mlatest.Async }

type funcGraph struct{ f func() error }

func (g funcGraph) Launch() error { return g.f() }
func (funcGraph) Close() error    { return nil }

func (asyncGraphs) Capture(f func() error) (mla.Graph, error) { return funcGraph{f}, nil }

var (
	lastAsync   atomic.Pointer[mlatest.Async]
	testAsyncOn atomic.Bool // available only inside the test that uses it, so "auto" never picks it
)

func init() {
	engine.RegisterBackend("test-async", func(engine.Options) (mla.Backend, error) {
		b := mlatest.NewAsync(cpu.New(1))
		lastAsync.Store(b)
		return asyncGraphs{b}, nil
	}, func() error {
		if testAsyncOn.Load() {
			return nil
		}
		return errors.New("test backend: switched off")
	})
}

// TestAsyncUploads: on a backend whose uploads are queued copies (the
// metadata and the compressor plans go out through mla.AsyncWriter), every
// byte the engine computes equals the CPU engine's, through decode steps on
// the graph path, steps whose inputs the producer left in place (so a
// kernel is the first thing after the copies), an iteration ended without
// running its layers (End then does not wait for the device, so the next
// Begin must wait before it rewrites the staging memory), a refused Begin
// and an aborted iteration; and no staging byte is rewritten while its
// copy is queued.
func TestAsyncUploads(t *testing.T) {
	seed := testSeed(t)
	cfg := compConfig()
	cfg.Eager = false
	ref := newEngine(t, cfg)
	cfg.Backend = "test-async"
	testAsyncOn.Store(true)
	e := newEngine(t, cfg)
	testAsyncOn.Store(false)
	ab := lastAsync.Load()
	ctx := context.Background()
	both := func(f func(e *engine.Engine)) { f(e); f(ref) }
	async := e

	both(func(e *engine.Engine) { runComp(t, seed, e, nil, ctxReq(1, 40), ctxReq(2, 70)) })
	gen := []metadata.Request{genReq(1, 2), genReq(2, 2)}
	steady := ab.Waits()
	for range 3 {
		both(func(e *engine.Engine) { runComp(t, seed, e, nil, gen...) })
	}
	require.Equal(t, steady, ab.Waits(), "steps whose End waited for the device never wait in Begin")
	// Inputs left in place: only the compressed layers get theirs.
	for range 2 {
		both(func(e *engine.Engine) {
			it, err := e.Begin(ctx, gen)
			require.NoError(t, err)
			require.Equal(t, e == async, it.Debug().GraphPath())
			for l := range e.Layers() {
				if e.CompressorWidth(l) > 0 {
					k, g := compRows(seed, e, it, l)
					require.NoError(t, it.SetCompressorInputs(l, k, g))
				}
				require.NoError(t, it.RunLayer(ctx, l))
			}
			require.NoError(t, it.End(ctx))
		})
	}
	waits := ab.Waits()
	both(func(e *engine.Engine) {
		it, err := e.Begin(ctx, gen)
		require.NoError(t, err)
		require.ErrorContains(t, it.End(ctx), "did not run")
	})
	// Another batch, so the staged bytes change.
	both(func(e *engine.Engine) { runComp(t, seed, e, nil, genReq(2, 1), genReq(1, 1)) })
	require.Greater(t, ab.Waits(), waits, "the Begin after an End that did not wait waited for the queued copies")

	both(func(e *engine.Engine) {
		_, err := e.Begin(ctx, []metadata.Request{genReq(1, 2), genReq(1, 2)})
		require.ErrorContains(t, err, "duplicate")
		it, err := e.Begin(ctx, append([]metadata.Request{ctxReq(3, 33)}, gen...))
		require.NoError(t, err)
		f, q := positionInputs(seed+1, e, it, 0)
		require.NoError(t, it.SetInputs(0, f, q))
		require.NoError(t, it.RunLayer(ctx, 0))
		it.Abort()
	})
	both(func(e *engine.Engine) { runComp(t, seed, e, map[uint64]int{1: 2}, gen...) })
	both(func(e *engine.Engine) { runComp(t, seed, e, nil, ctxReq(3, 20), genReq(1, 2), genReq(2, 2)) })

	for _, seq := range []uint64{1, 2, 3} {
		requireSameCompressed(t, e, ref, seq, "async uploads")
		requireSameLive(t, e, ref, seq, "async uploads")
	}
	for l := range cfg.Layers {
		a, err := e.Debug().ReadPool(l)
		require.NoError(t, err)
		b, err := ref.Debug().ReadPool(l)
		require.NoError(t, err)
		require.Equal(t, b, a, "layer %d pool", l)
	}
	require.Empty(t, ab.Violations(), "staging bytes rewritten while their copy was queued")
	require.Greater(t, ab.Copies(), 10, "the uploads went out as queued copies")
	t.Logf("%d queued copies, %d waits", ab.Copies(), ab.Waits())
}
