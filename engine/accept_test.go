package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// positionInputs draws a layer's inputs row by row from (seed, seq,
// position, layer), so that a token's inputs do not depend on how it was
// batched, or on whether it ran before as a rejected draft.
func positionInputs(seed uint64, e *engine.Engine, it *engine.Iteration, layer int) (fusedA, q []byte) {
	m := it.Metadata()
	for row := range it.Tokens() {
		b, pos, _ := m.Row(row)
		rng := rand.New(rand.NewPCG(seed^m.Seqs[b]*0x9e3779b97f4a7c15, uint64(pos)<<16|uint64(layer)))
		fusedA = append(fusedA, randomBF16(rng, e.FusedRowElems())...)
		q = append(q, randomBF16(rng, e.Heads()*512)...)
	}
	return fusedA, q
}

// requireSameLive checks that two engines hold the same bytes for every
// position of seq a query can still read, the same length and as many
// pages.
func requireSameLive(t testing.TB, a, b *engine.Engine, seq uint64, what string) {
	t.Helper()
	n, err := a.SequenceLength(seq)
	require.NoError(t, err)
	nb, err := b.SequenceLength(seq)
	require.NoError(t, err)
	require.Equal(t, n, nb, "%s: length of seq %d", what, seq)
	cfg := a.Config().Cache
	ta, err := a.Debug().BlockTable(seq)
	require.NoError(t, err)
	tb, err := b.Debug().BlockTable(seq)
	require.NoError(t, err)
	require.Len(t, ta, len(tb), "%s: block table of seq %d", what, seq)
	for j := range ta {
		require.Equal(t, ta[j] < 0, tb[j] < 0, "%s: seq %d block %d freed in one engine only", what, seq, j)
	}
	first := 0
	if cfg.Window > 0 {
		first = max(0, n-cfg.Window)
	}
	for l := range a.Layers() {
		pa, err := a.Debug().ReadPool(l)
		require.NoError(t, err)
		pb, err := b.Debug().ReadPool(l)
		require.NoError(t, err)
		for pos := first; pos < n; pos++ {
			require.Equal(t, positionBytes(t, cfg, pb, tb, pos), positionBytes(t, cfg, pa, ta, pos), "%s: seq %d layer %d position %d", what, seq, l, pos)
		}
	}
}

// TestAcceptEqualsNeverSpeculated: sequences decoding with MTP drafts,
// each step accepting a different number of tokens per sequence (all,
// one, in between, repeatedly), end up exactly as in an engine that ran
// only the accepted tokens: same lengths, same pages freed by the window,
// same bytes at every readable position, and continuing afterwards gives
// the same bytes.
func TestAcceptEqualsNeverSpeculated(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 3))
	cfg := smallConfig()
	cfg.Cache = kvcache.Config{PageSize: 16, NumPages: 64, Window: 32}
	cfg.FullCache = false
	cfg.RopePositions = 4096
	spec, plain := newEngine(t, cfg), newEngine(t, cfg)
	seqs := []uint64{3, 4, 5}
	prompts := map[uint64]int{3: 1, 4: 30, 5: 47}
	for _, s := range seqs {
		runComp(t, seed, spec, nil, ctxReq(s, prompts[s]))
		runComp(t, seed, plain, nil, ctxReq(s, prompts[s]))
	}
	steps := 60
	if race.Enabled {
		steps = 12 // the detector sees the same goroutines; .ci/run's non-race step runs all 60
	}
	for stepNo := range steps {
		d := 1 + rng.IntN(7) // drafts 1..7
		accepted := map[uint64]int{}
		var reqs []metadata.Request
		for _, s := range seqs {
			reqs = append(reqs, genReq(s, d))
			switch rng.IntN(4) {
			case 0:
				accepted[s] = 1 + d // all
			case 1:
				accepted[s] = 1 // every draft rejected
			default:
				accepted[s] = 1 + rng.IntN(1+d)
			}
		}
		runComp(t, seed, spec, accepted, reqs...)
		// The plain engine runs exactly the accepted tokens, sequence by
		// sequence, as generation steps of that depth.
		for _, s := range seqs {
			runComp(t, seed, plain, nil, genReq(s, accepted[s]-1))
		}
		require.Equal(t, plain.FreePages(), spec.FreePages(), "step %d", stepNo)
		for _, s := range seqs {
			requireSameLive(t, spec, plain, s, "after step")
		}
	}
	for _, s := range seqs {
		require.NoError(t, spec.Finish(s))
		require.NoError(t, plain.Finish(s))
	}
	require.Equal(t, cfg.Cache.NumPages, spec.FreePages())
}

// TestAcceptRefusals: Accept names generation sequences of the iteration
// with counts in [1, 1+MTP]; anything else is refused and changes nothing.
func TestAcceptRefusals(t *testing.T) {
	seed := testSeed(t)
	e := newEngine(t, smallConfig())
	runComp(t, seed, e, nil, ctxReq(1, 5), ctxReq(2, 5))
	ctx := context.Background()
	it, err := e.Begin(ctx, []metadata.Request{ctxReq(3, 4), genReq(1, 2)})
	require.NoError(t, err)
	for _, bad := range []map[uint64]int{{1: 0}, {1: 4}, {3: 1}, {9: 1}, {1: 2, 2: 1}} {
		err := it.Accept(bad)
		require.ErrorIs(t, err, engine.ErrInvalidAccept, "%v", bad)
	}
	require.NoError(t, it.Accept(map[uint64]int{1: 2}))
	for l := range e.Layers() {
		f, q := positionInputs(seed, e, it, l)
		require.NoError(t, it.SetInputs(l, f, q))
		require.NoError(t, it.RunLayer(ctx, l))
	}
	require.NoError(t, it.End(ctx))
	n, err := e.SequenceLength(1)
	require.NoError(t, err)
	require.Equal(t, 7, n)
	n, err = e.SequenceLength(3)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.True(t, errors.Is(it.Accept(nil), engine.ErrIterationDone))
}
