package kvcache

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	good := Config{Format: FormatFP8UE8M0, PageSize: 64, NumPages: 10}
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr string // empty: valid
	}{
		{"default", func(*Config) {}, ""},
		{"page size 1", func(c *Config) { c.PageSize = 1 }, ""},
		{"max page size", func(c *Config) { c.PageSize, c.NumPages = MaxPageSize, 1 }, ""},
		{"pertensor with scale", func(c *Config) { c.Format, c.KVScale = FormatFP8PerTensor, 0.5 }, ""},
		{"bf16 ignores scale", func(c *Config) { c.Format, c.KVScale = FormatBF16, float32(math.NaN()) }, ""},
		{"bad format", func(c *Config) { c.Format = 3 }, "Config.Format 3 is not a valid format"},
		{"page size 0", func(c *Config) { c.PageSize = 0 }, "Config.PageSize 0 must be a power of two"},
		{"page size 48", func(c *Config) { c.PageSize = 48 }, "Config.PageSize 48 must be a power of two"},
		{"page size negative", func(c *Config) { c.PageSize = -64 }, "Config.PageSize -64 must be a power of two"},
		{"page size too big", func(c *Config) { c.PageSize = 2 * MaxPageSize }, "Config.PageSize 2097152"},
		{"no pages", func(c *Config) { c.NumPages = 0 }, "Config.NumPages 0 must be in [1, 2147483647]"},
		{"pertensor zero scale", func(c *Config) { c.Format = FormatFP8PerTensor }, "Config.KVScale 0 must be finite and positive for format fp8_pertensor"},
		{"pertensor negative scale", func(c *Config) { c.Format, c.KVScale = FormatFP8PerTensor, -1 }, "Config.KVScale -1"},
		{"pertensor NaN scale", func(c *Config) { c.Format, c.KVScale = FormatFP8PerTensor, float32(math.NaN()) }, "Config.KVScale NaN"},
		{"pertensor Inf scale", func(c *Config) { c.Format, c.KVScale = FormatFP8PerTensor, float32(math.Inf(1)) }, "Config.KVScale +Inf"},
	}
	type testCase = struct {
		name    string
		edit    func(*Config)
		wantErr string
	}
	if math.MaxInt == math.MaxInt32 {
		// Only a 32-bit int can overflow: 2^31 pages of 600 MB stay below 2^63.
		tests = append(tests, testCase{"pool overflows", func(c *Config) { c.NumPages = 1 << 20 }, "overflows int"})
	} else {
		tooMany := int64(math.MaxInt32) + 1
		tests = append(tests, testCase{"too many pages", func(c *Config) { c.NumPages = int(tooMany) }, "Config.NumPages 2147483648"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.edit(&cfg)
			err := cfg.Validate()
			_, newErr := New(cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NoError(t, newErr)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			require.ErrorContains(t, newErr, tt.wantErr)
		})
	}
}

func TestConfigBytes(t *testing.T) {
	cfg := Config{PageSize: 64, NumPages: 100}
	require.Equal(t, 37440, cfg.PageBytes())
	require.Equal(t, 3744000, cfg.PoolBytes())
	cfg.Format = FormatBF16
	require.Equal(t, 6553600, cfg.PoolBytes())
}

func TestErrorsAreWrapped(t *testing.T) {
	c, err := New(Config{PageSize: 4, NumPages: 2})
	require.NoError(t, err)
	_, err = c.Lookup(42)
	require.ErrorIs(t, err, ErrUnknownSequence)
	require.ErrorContains(t, err, "42")

	r, err := c.Reserve([]Need{{ID: 42, NewLength: 3, Create: true}})
	require.NoError(t, err)
	_, err = c.Reserve([]Need{{ID: 42, NewLength: 4}})
	require.ErrorIs(t, err, ErrSequenceBusy)
	require.ErrorIs(t, c.Finish(42), ErrSequenceBusy)
	_, err = c.Reserve([]Need{{ID: 42, NewLength: 1, Create: true}})
	require.ErrorIs(t, err, ErrSequenceExists)
	require.NoError(t, r.Commit())
	require.ErrorIs(t, r.Commit(), ErrReservationDone)
	require.ErrorIs(t, r.Rollback(), ErrReservationDone)

	_, err = c.Reserve([]Need{{ID: 42, NewLength: 100}})
	require.ErrorIs(t, err, ErrCacheFull)
	require.ErrorContains(t, err, "need 24 pages, 1 free of 2")
	_, err = c.Reserve([]Need{{ID: 42, NewLength: 2}})
	require.ErrorIs(t, err, ErrInvalidNeed)
	_, err = c.Reserve([]Need{{ID: 1, Create: true}, {ID: 1, Create: true}})
	require.ErrorIs(t, err, ErrDuplicateNeed)
	_, err = c.Slot(42, 3)
	require.ErrorIs(t, err, ErrPositionOutOfRange)

	require.NoError(t, c.Finish(42))
	for _, err := range []error{
		c.Finish(42),
		func() error { _, err := c.Lookup(42); return err }(),
		func() error { _, err := c.BlockTable(42); return err }(),
		func() error { _, err := c.Slot(42, 0); return err }(),
		func() error { _, err := c.Reserve([]Need{{ID: 42, NewLength: 1}}); return err }(),
		func() error { _, err := c.Reserve([]Need{{ID: 42, NewLength: 1, Create: true}}); return err }(),
	} {
		require.ErrorIs(t, err, ErrFinishedSequence)
		require.NotErrorIs(t, err, ErrUnknownSequence)
		require.ErrorContains(t, err, "42")
	}
	_, _, err = Config{PageSize: 4, NumPages: 2}.SplitSlot(8)
	require.ErrorIs(t, err, ErrSlotOutOfPool)
}

func TestBlockTableIsACopy(t *testing.T) {
	c, err := New(Config{PageSize: 4, NumPages: 4})
	require.NoError(t, err)
	r, err := c.Reserve([]Need{{ID: 1, NewLength: 8, Create: true}})
	require.NoError(t, err)
	require.NoError(t, r.Commit())
	bt, err := c.BlockTable(1)
	require.NoError(t, err)
	bt[0] = 3
	again, err := c.BlockTable(1)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1}, again)
}

// TestSlotMatchesBlockTable checks Slot against the formula on the block
// table for random growth patterns and page sizes.
func TestSlotMatchesBlockTable(t *testing.T) {
	rng := newRand(t)
	for _, pageSize := range []int{1, 2, 16, 64} {
		c, err := New(Config{PageSize: pageSize, NumPages: 4096 / pageSize})
		require.NoError(t, err)
		lengths := map[uint64]int{}
		for step := range 200 {
			id := uint64(rng.IntN(5))
			_, live := lengths[id]
			n := Need{ID: id, NewLength: lengths[id] + rng.IntN(3*pageSize), Create: !live}
			r, err := c.Reserve([]Need{n})
			if errors.Is(err, ErrCacheFull) {
				break
			}
			require.NoError(t, err, "step %d", step)
			require.NoError(t, r.Commit())
			lengths[id] = n.NewLength
		}
		for id, n := range lengths {
			bt, err := c.BlockTable(id)
			require.NoError(t, err)
			require.Len(t, bt, (n+pageSize-1)/pageSize)
			for pos := range n {
				s, err := c.Slot(id, pos)
				require.NoError(t, err)
				require.Equal(t, int64(bt[pos/pageSize])*int64(pageSize)+int64(pos%pageSize), s)
				page, off, err := c.Config().SplitSlot(s)
				require.NoError(t, err)
				require.Equal(t, bt[pos/pageSize], page)
				require.Equal(t, pos%pageSize, off)
			}
		}
	}
}

// TestCheckInvariantsCatchesCorruption breaks the bookkeeping by hand and
// expects the checker to name the problem.
func TestCheckInvariantsCatchesCorruption(t *testing.T) {
	build := func(t *testing.T) *Cache {
		c, err := New(Config{PageSize: 4, NumPages: 6})
		require.NoError(t, err)
		r, err := c.Reserve([]Need{{ID: 1, NewLength: 8, Create: true}, {ID: 2, NewLength: 3, Create: true}})
		require.NoError(t, err)
		require.NoError(t, r.Commit())
		require.NoError(t, c.CheckInvariants())
		return c
	}
	tests := []struct {
		name    string
		corrupt func(c *Cache)
		want    string
	}{
		{"page owned twice", func(c *Cache) { c.seqs[2].pages[0] = 0 }, "page 0 held by"},
		{"page free and owned", func(c *Cache) { c.free[0] = 1 }, "page 1 held by"},
		{"page out of range", func(c *Cache) { c.seqs[1].pages[1] = 6 }, "page 6 outside [0, 6)"},
		{"page leaked", func(c *Cache) { c.free = c.free[1:] }, "3 used + 2 free pages != 6"},
		{"too few pages", func(c *Cache) { c.seqs[1].length, c.seqs[1].reserved = 9, 9 }, "2 pages for 9 reserved tokens, want 3"},
		{"length above reserved", func(c *Cache) { c.seqs[1].length = 8; c.seqs[1].reserved = 7 }, "length 8, reserved 7"},
		{"unreserved growth", func(c *Cache) { c.seqs[2].reserved = 4 }, "no pending reservation but length 3 != reserved 4"},
		{"live and finished", func(c *Cache) { c.finished.add(2, c.liveIDsLocked) }, "sequence 2 is both live and finished"},
		{"finished runs overlap", func(c *Cache) { c.finished.runs = []idRun{{10, 20}, {15, 30}} }, "finished runs [10-20 15-30] are not sorted"},
		{"finished runs adjacent", func(c *Cache) { c.finished.runs = []idRun{{10, 20}, {21, 30}} }, "finished runs [10-20 21-30] are not sorted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := build(t)
			tt.corrupt(c)
			require.ErrorContains(t, c.CheckInvariants(), tt.want)
		})
	}
}

// TestConcurrentCreateOneWinner races many goroutines to create the same
// id: exactly one reservation may succeed.
func TestConcurrentCreateOneWinner(t *testing.T) {
	c, err := New(Config{PageSize: 16, NumPages: 64})
	require.NoError(t, err)
	var wins, exists atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			r, err := c.Reserve([]Need{{ID: 7, NewLength: 20, Create: true}})
			switch {
			case err == nil:
				wins.Add(1)
				if err := r.Commit(); err != nil {
					t.Error(err)
				}
			case errors.Is(err, ErrSequenceExists):
				exists.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), wins.Load())
	require.Equal(t, int32(15), exists.Load())
	require.Equal(t, 2, c.UsedPages())
	require.NoError(t, c.CheckInvariants())
}

// TestConcurrentHammer drives one cache from many goroutines with random
// reserve/commit/rollback/finish/lookup/slot calls over overlapping ids and
// checks the invariants while they run and at the end.
func TestConcurrentHammer(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	const numPages, pageSize, workers, steps = 64, 8, 8, 1500
	c, err := New(Config{PageSize: pageSize, NumPages: numPages})
	require.NoError(t, err)
	var nextID atomic.Uint64
	var stats hammerStats
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			var mine []uint64 // ids this worker created; others may touch them too
			for step := range steps {
				if err := hammerStep(c, rng, &mine, &nextID, &stats); err != nil {
					t.Errorf("worker %d step %d: %v", w, step, err)
					return
				}
				if step%100 == 0 {
					if err := c.CheckInvariants(); err != nil {
						t.Errorf("worker %d step %d: %v", w, step, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	t.Logf("commits %d, rollbacks %d, finishes %d, cache full %d",
		stats.commits.Load(), stats.rollbacks.Load(), stats.finishes.Load(), stats.full.Load())
	// The mix must have exercised every path, or the test proves little.
	require.Positive(t, stats.commits.Load())
	require.Positive(t, stats.rollbacks.Load())
	require.Positive(t, stats.finishes.Load())
	require.Positive(t, stats.full.Load())
	require.NoError(t, c.CheckInvariants())
	require.Equal(t, numPages, c.FreePages()+c.UsedPages())
	// Every page of every live sequence is distinct.
	seen := map[int32]uint64{}
	c.mu.Lock()
	ids := make([]uint64, 0, len(c.seqs))
	for id := range c.seqs {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		bt, err := c.BlockTable(id)
		require.NoError(t, err)
		for _, p := range bt {
			other, dup := seen[p]
			require.False(t, dup, "page %d owned by %d and %d", p, other, id)
			seen[p] = id
		}
	}
	require.Len(t, seen, c.UsedPages())
}

type hammerStats struct{ commits, rollbacks, finishes, full atomic.Int64 }

// hammerStep does one random operation; it returns an error only for an
// outcome the contract forbids.
func hammerStep(c *Cache, rng *rand.Rand, mine *[]uint64, nextID *atomic.Uint64, st *hammerStats) error {
	pick := func() uint64 {
		if len(*mine) == 0 || rng.IntN(8) == 0 {
			return nextID.Load() + uint64(rng.IntN(3)) // maybe another worker's, maybe unknown
		}
		return (*mine)[rng.IntN(len(*mine))]
	}
	allowed := func(err error, ok ...error) error {
		if err == nil {
			return nil
		}
		for _, e := range ok {
			if errors.Is(err, e) {
				return nil
			}
		}
		return err
	}
	switch op := rng.IntN(10); {
	case op < 4:
		var needs []Need
		if rng.IntN(3) == 0 {
			id := nextID.Add(1)
			*mine = append(*mine, id)
			needs = append(needs, Need{ID: id, NewLength: rng.IntN(3 * pageSizeOf(c)), Create: true})
		}
		for range rng.IntN(3) {
			id := pick()
			n, err := c.Lookup(id)
			if err != nil {
				continue
			}
			needs = append(needs, Need{ID: id, NewLength: n + rng.IntN(2*pageSizeOf(c))})
		}
		r, err := c.Reserve(needs)
		if errors.Is(err, ErrCacheFull) {
			st.full.Add(1)
		}
		if err != nil {
			// Lengths may have moved since Lookup, and others may hold the ids.
			return allowed(err, ErrCacheFull, ErrSequenceBusy, ErrFinishedSequence, ErrUnknownSequence, ErrDuplicateNeed, ErrInvalidNeed)
		}
		for _, n := range needs {
			if n.NewLength > 0 {
				if _, err := c.Slot(n.ID, n.NewLength-1); err != nil {
					return err // reserved positions must have slots before commit
				}
			}
		}
		if rng.IntN(4) == 0 {
			st.rollbacks.Add(1)
			return r.Rollback()
		}
		st.commits.Add(1)
		return r.Commit()
	case op < 6:
		err := c.Finish(pick())
		if err == nil {
			st.finishes.Add(1)
		}
		return allowed(err, ErrSequenceBusy, ErrFinishedSequence, ErrUnknownSequence)
	case op < 8:
		id := pick()
		n, err := c.Lookup(id)
		if err != nil {
			return allowed(err, ErrFinishedSequence, ErrUnknownSequence)
		}
		if n > 0 {
			_, err := c.Slot(id, rng.IntN(n))
			return allowed(err, ErrFinishedSequence) // finished by another worker meanwhile
		}
		return nil
	default:
		_, err := c.BlockTable(pick())
		return allowed(err, ErrFinishedSequence, ErrUnknownSequence)
	}
}

func pageSizeOf(c *Cache) int { return c.Config().PageSize }

func BenchmarkReserveCommit(b *testing.B) {
	const seqs, pageSize, maxLen = 64, 64, 4096
	c, err := New(Config{PageSize: pageSize, NumPages: seqs * maxLen / pageSize})
	if err != nil {
		b.Fatal(err)
	}
	needs := make([]Need, seqs)
	base := uint64(0)
	reset := func() {
		for i := range needs {
			if needs[i].ID != 0 {
				if err := c.Finish(needs[i].ID); err != nil {
					b.Fatal(err)
				}
			}
			needs[i] = Need{ID: base + uint64(i) + 1, NewLength: 0, Create: true}
		}
		base += seqs
	}
	reset()
	for b.Loop() {
		r, err := c.Reserve(needs)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Commit(); err != nil {
			b.Fatal(err)
		}
		if needs[0].NewLength == maxLen {
			reset()
			continue
		}
		for i := range needs {
			needs[i].Create = false
			needs[i].NewLength++ // one decode token per sequence
		}
	}
}

// TestTableState: a sequence's table state number stays while its pages
// stay, and changes with every change of them (pages added, dropped by a
// commit or a rollback, freed by the window), never returning to a number
// it had.
func TestTableState(t *testing.T) {
	c, err := New(Config{Format: FormatFP8UE8M0, PageSize: 4, NumPages: 64, Window: 8})
	require.NoError(t, err)
	seen := map[uint64]bool{}
	state := func(needs ...Need) (uint64, *Reservation) {
		r, err := c.Reserve(needs)
		require.NoError(t, err)
		st, err := r.TableState(0)
		require.NoError(t, err)
		return st, r
	}
	fresh := func(st uint64) {
		t.Helper()
		require.False(t, seen[st], "state %d came back", st)
		seen[st] = true
	}
	s0, r := state(Need{ID: 1, NewLength: 3, Create: true}) // one page
	fresh(s0)
	require.NoError(t, r.Commit())
	s1, r := state(Need{ID: 1, NewLength: 4}) // the same page
	require.Equal(t, s0, s1)
	require.NoError(t, r.Commit())
	s2, r := state(Need{ID: 1, NewLength: 6}) // a second page
	fresh(s2)
	require.NoError(t, r.Rollback()) // dropped again
	s3, r := state(Need{ID: 1, NewLength: 4})
	fresh(s3)
	require.NoError(t, r.Commit())
	s4, r := state(Need{ID: 1, NewLength: 12}) // two more pages
	fresh(s4)
	require.NoError(t, r.CommitLengths(map[uint64]int{1: 5})) // the last one dropped at commit
	s5, r := state(Need{ID: 1, NewLength: 5})
	fresh(s5)
	require.NoError(t, r.Commit())
	s6, r := state(Need{ID: 1, NewLength: 16}) // pages for 16 tokens; the window frees page 0 at commit
	fresh(s6)
	require.NoError(t, r.Commit())
	s7, r := state(Need{ID: 1, NewLength: 16})
	fresh(s7)
	tbl, err := r.AppendBlockTable(nil, 0)
	require.NoError(t, err)
	require.Equal(t, int32(-1), tbl[0], "the window freed the first page")
	require.NoError(t, r.Commit())
	// Another sequence never shares a number.
	s8, r := state(Need{ID: 2, NewLength: 1, Create: true})
	fresh(s8)
	require.NoError(t, r.Commit())
	_, err = r.TableState(0)
	require.ErrorIs(t, err, ErrReservationDone)
	_, err = r.AppendTableStates(nil)
	require.ErrorIs(t, err, ErrReservationDone)

	// AppendTableStates is TableState of every need, in needs order,
	// appended.
	r, err = c.Reserve([]Need{{ID: 2, NewLength: 5}, {ID: 3, NewLength: 2, Create: true}, {ID: 1, NewLength: 16}})
	require.NoError(t, err)
	got, err := r.AppendTableStates([]uint64{99})
	require.NoError(t, err)
	want := []uint64{99}
	for i := range 3 {
		st, err := r.TableState(i)
		require.NoError(t, err)
		want = append(want, st)
	}
	require.Equal(t, want, got)
	require.Equal(t, s7, got[3], "sequence 1 kept its pages")
	require.NoError(t, r.Rollback())
}
