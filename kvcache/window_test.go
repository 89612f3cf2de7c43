package kvcache

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWindowInvariantsCatchCorruption: the checker sees a page kept behind
// the window and a hole in front of it.
func TestWindowInvariantsCatchCorruption(t *testing.T) {
	build := func(t *testing.T) *Cache {
		c, err := New(Config{PageSize: 4, NumPages: 8, Window: 8})
		require.NoError(t, err)
		r, err := c.Reserve([]Need{{ID: 1, NewLength: 17, Create: true}})
		require.NoError(t, err)
		require.NoError(t, r.Commit())
		require.NoError(t, c.CheckInvariants())
		require.Equal(t, []int32{-1, -1, 2, 3, 4}, c.seqs[1].pages)
		return c
	}
	tests := []struct {
		name    string
		corrupt func(c *Cache)
		want    string
	}{
		{"page kept behind the window", func(c *Cache) {
			c.seqs[1].pages[1] = c.free[len(c.free)-1]
			c.free = c.free[:len(c.free)-1]
			c.seqs[1].freed = 1
		}, "1 pages freed by the window at length 17, want 2"},
		{"hole in front of the window", func(c *Cache) {
			c.free = append(c.free, c.seqs[1].pages[2])
			c.seqs[1].pages[2] = -1
		}, "page -1 outside [0, 8)"},
		{"freed entry not -1", func(c *Cache) { c.seqs[1].pages[0] = 7; c.free = c.free[:len(c.free)-1] }, "keeps page 7 at block 0, behind the window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := build(t)
			tt.corrupt(c)
			require.ErrorContains(t, c.CheckInvariants(), tt.want)
		})
	}
}

// TestWindowEdges: a prompt of each length, then decode token by token
// across positions 127/128 and page edges: between iterations exactly the
// pages with a position at or past len-128 are held, every such position
// has a slot, and every position of a freed page is refused.
func TestWindowEdges(t *testing.T) {
	for _, prompt := range []int{1, 127, 128, 129, 255, 256, 1000} {
		c, err := New(Config{PageSize: 64, NumPages: 40, Window: DSv4Window})
		require.NoError(t, err)
		r, err := c.Reserve([]Need{{ID: 9, NewLength: prompt, Create: true}})
		require.NoError(t, err)
		require.NoError(t, r.Commit())
		for n := prompt; n < prompt+200; n++ {
			if n > prompt {
				r, err := c.Reserve([]Need{{ID: 9, NewLength: n}})
				require.NoError(t, err)
				require.NoError(t, r.Commit())
			}
			checkWindow(t, c, 9, n)
		}
	}
}

// checkWindow checks sequence id at committed length n against the rule of
// DESIGN.md section 8, computed here position by position.
func checkWindow(t *testing.T, c *Cache, id uint64, n int) {
	t.Helper()
	cfg := c.Config()
	table, err := c.BlockTable(id)
	require.NoError(t, err)
	require.Len(t, table, (n+cfg.PageSize-1)/cfg.PageSize, "length %d", n)
	held := 0
	for j, page := range table {
		last := min(n, (j+1)*cfg.PageSize) - 1 // the page's last position in use
		readable := cfg.Window == 0 || last >= n-cfg.Window
		if readable {
			require.GreaterOrEqual(t, page, int32(0), "length %d: block %d (positions up to %d) freed", n, j, last)
			held++
		} else {
			require.Equal(t, int32(-1), page, "length %d: block %d (positions up to %d) kept", n, j, last)
		}
		for pos := j * cfg.PageSize; pos <= last; pos++ {
			_, err := c.Slot(id, pos)
			if readable {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrPositionOutOfRange)
			}
		}
	}
	require.Equal(t, cfg.LivePages(n), held, "length %d", n)
	if cfg.Window > 0 {
		require.LessOrEqual(t, held, (cfg.Window+cfg.PageSize-1)/cfg.PageSize+1, "length %d", n)
	}
}

// TestWindowRandom runs random reservations (creates, chunks, MTP steps
// committed with random accepted lengths, rollbacks, finishes) against a
// windowed cache; after every step the invariants hold, every sequence's
// table follows the window rule, and when all sequences are finished every
// page is free.
func TestWindowRandom(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, window := range []int{0, 8, 13} {
		c, err := New(Config{PageSize: 4, NumPages: 64, Window: window})
		require.NoError(t, err)
		live := map[uint64]int{}
		next := uint64(1)
		for step := range 3000 {
			var needs []Need
			if rng.IntN(3) == 0 || len(live) == 0 {
				needs = append(needs, Need{ID: next, NewLength: 1 + rng.IntN(40), Create: true})
				next++
			}
			for id, n := range live {
				if rng.IntN(2) == 0 {
					needs = append(needs, Need{ID: id, NewLength: n + 1 + rng.IntN(8)})
				}
			}
			res, err := c.Reserve(needs)
			if err != nil {
				require.ErrorIs(t, err, ErrCacheFull, "step %d", step)
			} else if rng.IntN(8) == 0 {
				require.NoError(t, res.Rollback())
			} else {
				lengths := map[uint64]int{}
				for _, nd := range needs {
					old := live[nd.ID]
					if rng.IntN(2) == 0 {
						lengths[nd.ID] = old + 1 + rng.IntN(nd.NewLength-old)
					}
				}
				require.NoError(t, res.CommitLengths(lengths))
				for _, nd := range needs {
					live[nd.ID] = nd.NewLength
					if n, ok := lengths[nd.ID]; ok {
						live[nd.ID] = n
					}
				}
			}
			for id := range live {
				if rng.IntN(10) == 0 {
					require.NoError(t, c.Finish(id))
					delete(live, id)
				}
			}
			require.NoError(t, c.CheckInvariants(), "step %d", step)
			held := 0
			for id, n := range live {
				checkWindow(t, c, id, n)
				held += c.Config().LivePages(n)
			}
			require.Equal(t, held, c.UsedPages(), "step %d", step)
		}
		for id := range live {
			require.NoError(t, c.Finish(id))
		}
		require.Equal(t, 64, c.FreePages())
	}
}

// TestLivePagesNearMaxInt: the page count of the longest lengths does not
// overflow, with and without a window.
func TestLivePagesNearMaxInt(t *testing.T) {
	const n = math.MaxInt
	for _, tc := range []struct {
		cfg  Config
		want int
	}{
		{Config{PageSize: 64, NumPages: 1}, n/64 + 1},
		{Config{PageSize: 64, NumPages: 1, Window: DSv4Window}, 3},
		{Config{PageSize: 1, NumPages: 1, Window: DSv4Window}, 128},
	} {
		require.Equal(t, tc.want, tc.cfg.LivePages(n), "%+v", tc.cfg)
	}
}
