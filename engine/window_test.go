package engine_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// positionBytes returns the stored bytes (values, then the 7 exponents) of a
// position of seq in one layer's pool image, or nil for a freed page.
func positionBytes(t testing.TB, cfg kvcache.Config, pool []byte, table []int32, pos int) []byte {
	t.Helper()
	page := table[pos/cfg.PageSize]
	if page < 0 {
		return nil
	}
	base := int(page) * cfg.PageBytes()
	off := pos % cfg.PageSize
	vo := base + cfg.Format.ValueOffset(cfg.PageSize, off)
	out := append([]byte(nil), pool[vo:vo+kvcache.UE8M0ValueBytes]...)
	so := base + cfg.Format.ScaleOffset(cfg.PageSize, off)
	return append(out, pool[so:so+7]...)
}

// TestWindowEngine runs one prompt (lengths 1, 127, 128, 129, 255, 256,
// 1000) then decodes across positions 127/128 and page edges, on a windowed
// engine and on one that keeps every token, with the same inputs. Between
// iterations the windowed engine holds exactly the pages of the last 128
// positions (DESIGN.md section 8), and every position a query can still
// read has the same bytes in both.
func TestWindowEngine(t *testing.T) {
	seed := testSeed(t)
	for i, prompt := range []int{1, 127, 128, 129, 255, 256, 1000} {
		mtp := []int{0, 3}[i%2]
		cfg := smallConfig()
		cfg.Model.NumHeads = 1 // the cache does not depend on the heads
		cfg.Cache = kvcache.Config{PageSize: 64, NumPages: 24}
		cfg.MaxTokens = 1024
		full := newEngine(t, cfg)
		cfg.Cache.Window, cfg.FullCache = kvcache.DSv4Window, false
		win := newEngine(t, cfg)
		rngFull, rngWin := rand.New(rand.NewPCG(seed, uint64(prompt))), rand.New(rand.NewPCG(seed, uint64(prompt)))
		run := func(reqs ...metadata.Request) {
			step(t, rngFull, full, reqs...)
			step(t, rngWin, win, reqs...)
		}
		const seq = 5
		run(ctxReq(seq, prompt))
		end := max(prompt+70, 200)
		if race.Enabled {
			end = prompt + 70 // the 128 edge is the next prompts'; .ci/run's non-race step decodes to 200
		}
		for n := prompt; n < end; n += 1 + mtp {
			if n > prompt {
				run(genReq(seq, mtp))
			}
			got, err := win.SequenceLength(seq)
			require.NoError(t, err)
			require.Equal(t, n, got)
			require.Equal(t, cfg.Cache.NumPages-cfg.Cache.LivePages(n), win.FreePages(), "prompt %d length %d", prompt, n)
			edge := n%64 <= 1+mtp || n%64 >= 63 || (n >= 127 && n <= 132) || n == prompt
			if !edge {
				continue
			}
			tw, err := win.Debug().BlockTable(seq)
			require.NoError(t, err)
			tf, err := full.Debug().BlockTable(seq)
			require.NoError(t, err)
			for l := range win.Layers() {
				pw, err := win.Debug().ReadPool(l)
				require.NoError(t, err)
				pf, err := full.Debug().ReadPool(l)
				require.NoError(t, err)
				for pos := max(0, n-kvcache.DSv4Window); pos < n; pos++ {
					w := positionBytes(t, cfg.Cache, pw, tw, pos)
					require.NotNil(t, w, "prompt %d length %d: position %d freed", prompt, n, pos)
					require.Equal(t, positionBytes(t, cfg.Cache, pf, tf, pos), w, "prompt %d length %d layer %d position %d", prompt, n, l, pos)
				}
			}
		}
	}
}

// TestWindowLongChunk: a chunk longer than the window holds all its pages
// while the iteration runs (attention over the chunk reads them) and frees
// those behind the window at End; a refused batch frees nothing.
func TestWindowLongChunk(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	cfg := smallConfig()
	cfg.Cache = kvcache.Config{PageSize: 64, NumPages: 12, Window: kvcache.DSv4Window}
	cfg.FullCache = false
	cfg.MaxTokens = 1024
	cfg.RopePositions = 2048 // the pool no longer bounds a sequence's length
	e := newEngine(t, cfg)
	step(t, rng, e, ctxReq(1, 300)) // 5 pages in flight, 3 after
	require.Equal(t, 12-3, e.FreePages())
	it, err := e.Begin(t.Context(), []metadata.Request{ctxReq(1, 500)}) // 300+500: pages 4..12 needed, 9 free
	require.NoError(t, err)
	require.Equal(t, 12-3-8, e.FreePages())
	require.Equal(t, 500, it.Tokens())
	for l := range e.Layers() {
		f, q := inputs(rng, e, it)
		require.NoError(t, it.SetInputs(l, f, q))
		require.NoError(t, it.RunLayer(t.Context(), l))
	}
	require.NoError(t, it.End(t.Context()))
	table, err := e.Debug().BlockTable(1)
	require.NoError(t, err)
	require.Len(t, table, 13)
	for j, p := range table {
		require.Equal(t, j < (800-128)/64, p == -1, "block %d", j)
	}
	require.Equal(t, 12-3, e.FreePages())
	// 9 free pages cannot hold a 700-token chunk (11 more pages).
	before := takeSnapshot(t, e, 1)
	_, err = e.Begin(t.Context(), []metadata.Request{ctxReq(1, 700)})
	require.ErrorIs(t, err, engine.ErrCacheFull)
	requireSameSnapshot(t, before, takeSnapshot(t, e, 1))
}
