package kvcache

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// skipUnderInvariants skips a test of a million mutations in builds with
// -tags invariants, whose check after every mutation walks every page and
// every finished run: the heap tests measure memory, not the invariants.
func skipUnderInvariants(t *testing.T) {
	if invariantsEnabled {
		t.Skip("a million mutations under -tags invariants take minutes; run without the tag")
	}
}

func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// churn creates and finishes n sequences with ids from next(), keeping up
// to live of them alive and finishing a pseudo-random live one each step,
// as a server with that many streams in flight would.
func churn(t *testing.T, c *Cache, n, live int, next func() uint64, rng func() int) {
	t.Helper()
	var alive []uint64
	for range n {
		id := next()
		r, err := c.Reserve([]Need{{ID: id, NewLength: 3, Create: true}})
		require.NoError(t, err)
		require.NoError(t, r.Commit())
		alive = append(alive, id)
		if len(alive) > live {
			i := rng() % len(alive)
			require.NoError(t, c.Finish(alive[i]))
			alive[i] = alive[len(alive)-1]
			alive = alive[:len(alive)-1]
		}
	}
	for _, id := range alive {
		require.NoError(t, c.Finish(id))
	}
}

// TestFinishedIDsKeepTheHeapFlat: a server that runs forever finishes
// sequences forever; one million finished sequences (ids from a counter,
// finished out of order with 32 streams in flight) leave the heap where
// the first ten thousand left it, and every finished id is still refused.
func TestFinishedIDsKeepTheHeapFlat(t *testing.T) {
	skipUnderInvariants(t)
	c, err := New(Config{PageSize: 4, NumPages: 64})
	require.NoError(t, err)
	counter := uint64(0)
	next := func() uint64 { counter++; return counter }
	x := uint64(88172645463325252) // xorshift: cheap and deterministic
	rng := func() int { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return int(x >> 1) }

	churn(t, c, 10_000, 32, next, rng)
	before := heapAfterGC()
	churn(t, c, 1_000_000, 32, next, rng)
	after := heapAfterGC()
	runtime.KeepAlive(c)
	t.Logf("heap %d -> %d bytes after 1M more finished sequences; %d finished runs", before, after, len(c.finished.runs))
	require.Less(t, int64(after)-int64(before), int64(64<<10), "the heap grew with finished sequences")
	require.Len(t, c.finished.runs, 1, "a counter's finished ids are one run once none is live")
	for _, id := range []uint64{1, 5000, 500_000, counter} {
		_, err := c.Lookup(id)
		require.ErrorIs(t, err, ErrFinishedSequence, "id %d", id)
	}
	_, err = c.Lookup(counter + 1)
	require.ErrorIs(t, err, ErrUnknownSequence)
	require.NoError(t, c.CheckInvariants())
}

// TestFinishedRunsAreBounded: ids that never touch (every other id) make
// one run each; past MaxFinishedRuns the lowest are forgotten, so memory
// stays bounded, and the newest MaxFinishedRuns are still refused.
func TestFinishedRunsAreBounded(t *testing.T) {
	skipUnderInvariants(t)
	c, err := New(Config{PageSize: 4, NumPages: 8})
	require.NoError(t, err)
	id := uint64(0)
	next := func() uint64 { id += 2; return id }
	first := func() int { return 0 }
	churn(t, c, 2*MaxFinishedRuns, 0, next, first)
	before := heapAfterGC()
	churn(t, c, 8*MaxFinishedRuns, 0, next, first)
	after := heapAfterGC()
	runtime.KeepAlive(c)
	// The runs' slice is at most twice MaxFinishedRuns long, whatever
	// happened before: the heap may move within that, never past it.
	require.Less(t, int64(after)-int64(before), int64(2*MaxFinishedRuns*16), "the heap grew past the bound")
	require.Len(t, c.finished.runs, MaxFinishedRuns)

	newestForgotten := id - 2*MaxFinishedRuns // ids step by 2
	for _, tc := range []struct {
		id   uint64
		want error
	}{
		{id, ErrFinishedSequence},
		{newestForgotten + 2, ErrFinishedSequence},
		{newestForgotten, ErrUnknownSequence},
		{2, ErrUnknownSequence},
		{id - 1, ErrUnknownSequence}, // never used
	} {
		_, err := c.Lookup(tc.id)
		require.ErrorIs(t, err, tc.want, "id %d", tc.id)
	}
	// A forgotten id may be created again.
	r, err := c.Reserve([]Need{{ID: 2, NewLength: 1, Create: true}})
	require.NoError(t, err)
	require.NoError(t, r.Commit())
	require.NoError(t, c.CheckInvariants())
}

func TestFinishedSetMerges(t *testing.T) {
	for _, tc := range []struct {
		add  []uint64
		want string
	}{
		{[]uint64{5}, "[5]"},
		{[]uint64{5, 7}, "[5 7]"},
		{[]uint64{5, 7, 6}, "[5-7]"},
		{[]uint64{7, 5, 6, 6, 5}, "[5-7]"},
		{[]uint64{1, 3, 5, 2, 4}, "[1-5]"},
		{[]uint64{0, 18446744073709551615, 18446744073709551614, 1}, "[0-1 18446744073709551614-18446744073709551615]"},
		{[]uint64{10, 9, 11, 20, 8}, "[8-11 20]"},
	} {
		var f finishedSet
		for _, id := range tc.add {
			f.add(id)
		}
		require.Equal(t, tc.want, f.String(), "add %v", tc.add)
		for _, id := range tc.add {
			require.True(t, f.contains(id))
		}
		require.False(t, f.contains(12345))
	}
}
