package kvcache

import (
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
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
// sequences forever; one million finished sequences (a fifth under -race;
// ids from a counter, finished out of order with 32 streams in flight)
// leave the heap where the first ten thousand left it, and every finished
// id is still refused.
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
	more := 1_000_000
	if race.Enabled {
		// A fifth under the detector (12 s of its run): 200,000 finishes
		// that each kept even one byte would still pass 64 KiB threefold.
		more = 200_000
	}
	churn(t, c, more, 32, next, rng)
	after := heapAfterGC()
	runtime.KeepAlive(c)
	t.Logf("heap %d -> %d bytes after %d more finished sequences; %d finished runs", before, after, more, len(c.finished.runs))
	require.Less(t, int64(after)-int64(before), int64(64<<10), "the heap grew with finished sequences")
	require.Len(t, c.finished.runs, 1, "a counter's finished ids are one run once none is live")
	for _, id := range []uint64{1, 5000, uint64(more / 2), counter} {
		_, err := c.Lookup(id)
		require.ErrorIs(t, err, ErrFinishedSequence, "id %d", id)
	}
	_, err = c.Lookup(counter + 1)
	require.ErrorIs(t, err, ErrUnknownSequence)
	require.NoError(t, c.CheckInvariants())
}

// TestFinishedRunsAreBounded: ids that never touch (every other id) make
// one run each; past MaxFinishedRuns the cache merges runs across their
// smallest gaps, so memory stays bounded, and still no finished id comes
// back: the first one, id 0, is refused after 65,537 and after 4*65,536
// finishes, as is every id in between.
func TestFinishedRunsAreBounded(t *testing.T) {
	skipUnderInvariants(t)
	c, err := New(Config{PageSize: 4, NumPages: 8})
	require.NoError(t, err)
	id := uint64(0)
	next := func() uint64 { v := id; id += 2; return v }
	first := func() int { return 0 }
	churn(t, c, MaxFinishedRuns+1, 0, next, first)
	_, err = c.Reserve([]Need{{ID: 0, NewLength: 1, Create: true}})
	require.ErrorIs(t, err, ErrFinishedSequence, "id 0 after %d finishes", MaxFinishedRuns+1)
	churn(t, c, MaxFinishedRuns-1, 0, next, first)
	before := heapAfterGC()
	churn(t, c, 2*MaxFinishedRuns, 0, next, first) // four compactions
	after := heapAfterGC()
	runtime.KeepAlive(c)
	// The runs' slice is at most twice MaxFinishedRuns long, whatever
	// happened before: the heap may move within that, never past it.
	require.Less(t, int64(after)-int64(before), int64(2*MaxFinishedRuns*16), "the heap grew past the bound")
	require.LessOrEqual(t, len(c.finished.runs), MaxFinishedRuns)
	require.NoError(t, c.CheckInvariants())

	for v := uint64(0); v < id; v += 2 {
		if _, err := c.Lookup(v); !errors.Is(err, ErrFinishedSequence) {
			t.Fatalf("finished id %d came back: %v", v, err)
		}
	}
	// Ids past every finished one are new; the never-used ones between the
	// newest runs, which no compaction merged yet, too.
	for _, v := range []uint64{id, id + 1, id - 1} {
		_, err := c.Lookup(v)
		require.ErrorIs(t, err, ErrUnknownSequence, "id %d", v)
	}
	_, err = c.Reserve([]Need{{ID: 0, NewLength: 1, Create: true}})
	require.ErrorIs(t, err, ErrFinishedSequence)
}

// TestFinishedCompactionKeepsLiveIDs: a compaction never merges across a
// live sequence, whose id stays live (and finishes normally), and the gaps
// that live ids pin let the run count pass MaxFinishedRuns by no more than
// one run per such gap.
func TestFinishedCompactionKeepsLiveIDs(t *testing.T) {
	skipUnderInvariants(t)
	c, err := New(Config{PageSize: 4, NumPages: 4096})
	require.NoError(t, err)
	// Live odd ids inside the gaps of the finished even ids.
	var live []uint64
	for k := range uint64(1000) {
		live = append(live, 1+2*(k*3*MaxFinishedRuns/2/1000)) // odd, spread over the finished range
	}
	for _, v := range live {
		r, err := c.Reserve([]Need{{ID: v, NewLength: 1, Create: true}})
		require.NoError(t, err)
		require.NoError(t, r.Commit())
	}
	for v := uint64(0); v < 3*MaxFinishedRuns; v += 2 { // one compaction
		r, err := c.Reserve([]Need{{ID: v, NewLength: 1, Create: true}})
		require.NoError(t, err)
		require.NoError(t, r.Commit())
		require.NoError(t, c.Finish(v))
	}
	require.NoError(t, c.CheckInvariants())
	require.LessOrEqual(t, len(c.finished.runs), MaxFinishedRuns+len(live))
	require.Less(t, len(c.finished.runs), 3*MaxFinishedRuns/2, "a compaction merged runs")
	for _, v := range live {
		n, err := c.Lookup(v)
		require.NoError(t, err, "live id %d", v)
		require.Equal(t, 1, n)
		require.NoError(t, c.Finish(v))
		_, err = c.Lookup(v)
		require.ErrorIs(t, err, ErrFinishedSequence)
	}
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
			f.add(id, func() []uint64 { return nil })
		}
		require.Equal(t, tc.want, f.String(), "add %v", tc.add)
		for _, id := range tc.add {
			require.True(t, f.contains(id))
		}
		require.False(t, f.contains(12345))
	}
}
