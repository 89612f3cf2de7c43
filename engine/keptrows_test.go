package engine_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// TestKeptRows drives a decode loop through every way a block table
// changes between steps (a new page, MTP drafts rejected at End, an aborted
// step, the window freeing pages, a sequence finished and another
// created, the batch reordered and resized) with the engine checking after
// every Begin that its block-table rows and the uploaded metadata are what
// a full build gives (newEngine turns the check on), and that the steps in
// between keep most rows instead of rebuilding them.
func TestKeptRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 7))
	ctx := context.Background()
	for _, window := range []int{0, kvcache.DSv4Window} {
		cfg := smallConfig()
		cfg.Cache = kvcache.Config{PageSize: 16, NumPages: 96, Window: window}
		cfg.FullCache = window == 0
		cfg.Layers = 1
		e := newEngine(t, cfg)
		seqs := []uint64{1, 2, 3, 4, 5}
		for i, s := range seqs {
			step(t, rng, e, ctxReq(s, 5+7*i))
		}
		kept := 0
		for n := range 60 {
			mtp := n % 4
			reqs := make([]metadata.Request, len(seqs))
			for i, s := range seqs {
				reqs[i] = genReq(s, mtp)
			}
			switch {
			case n%13 == 5: // aborted: its pages go back, the next step takes them again
				it, err := e.Begin(ctx, reqs)
				require.NoError(t, err)
				it.Abort()
			case n%7 == 3 && mtp > 0: // drafts rejected: the pages past the kept length go back
				it, err := e.Begin(ctx, reqs)
				require.NoError(t, err)
				for l := range e.Layers() {
					f, q := inputs(rng, e, it)
					require.NoError(t, it.SetInputs(l, f, q))
					require.NoError(t, it.RunLayer(ctx, l))
				}
				acc := map[uint64]int{}
				for _, s := range seqs {
					acc[s] = 1 + rng.IntN(mtp+1)
				}
				require.NoError(t, it.Accept(acc))
				require.NoError(t, it.End(ctx))
			default:
				step(t, rng, e, reqs...)
			}
			kept += engine.KeptRows(e)
			switch n {
			case 20: // the batch reordered
				rng.Shuffle(len(seqs), func(i, j int) { seqs[i], seqs[j] = seqs[j], seqs[i] })
			case 35: // one sequence finished, another created
				require.NoError(t, e.Finish(seqs[1]))
				seqs[1] = 9
				step(t, rng, e, ctxReq(9, 30))
			case 45: // a smaller batch
				seqs = seqs[:3]
			}
		}
		require.Greater(t, kept, 60, "window %d: rows kept over 60 steps of up to 5 sequences", window)
		t.Logf("window %d: %d rows kept over 60 steps", window, kept)
	}
}
