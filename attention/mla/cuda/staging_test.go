package cuda_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
)

// TestCUDAAsyncWrite: staging memory starts zeroed; copies from it land in
// stream order with the backend's other work (a queued fill before them,
// later copies to the same bytes after them, a Read after them sees them),
// without a wait in between; a staging slice may be rewritten once
// WaitWrites returns for it; sources and slices outside staging memory are
// refused, as is everything after Close.
func TestCUDAAsyncWrite(t *testing.T) {
	b := backend(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	const n = 4099 // odd: the copies need no alignment
	dst, err := b.Alloc(n + 64)
	require.NoError(t, err)
	defer b.Free(dst)
	s1, err := b.AllocStaging(n)
	require.NoError(t, err)
	s2, err := b.AllocStaging(n)
	require.NoError(t, err)
	require.Equal(t, make([]byte, n), s1, "staging memory starts zeroed")
	got := make([]byte, n)
	for round := range 20 {
		require.NoError(t, b.WaitWrites(s1), "round %d", round)
		require.NoError(t, b.WaitWrites(s2[5:9]), "round %d: any range of the slice", round)
		for i := range s1 {
			s1[i], s2[i] = byte(rng.Uint32()), byte(rng.Uint32())
		}
		off := 1 + rng.IntN(63)
		lo, hi := rng.IntN(n/2), n/2+rng.IntN(n/2)
		// Poison first (queued), then s1 whole, then s2's middle over it:
		// the device must apply them in this order.
		require.NoError(t, b.Fill(dst, 0, n+64, 0xA5))
		require.NoError(t, b.WriteAsync(dst, off, s1))
		require.NoError(t, b.WriteAsync(dst, off+lo, s2[lo:hi]))
		want := append(append(append([]byte(nil), s1[:lo]...), s2[lo:hi]...), s1[hi:]...)
		require.NoError(t, b.Read(got, dst, off))
		require.Equal(t, want, got, "round %d: off %d, s2 over [%d,%d)", round, off, lo, hi)
		before := make([]byte, off)
		require.NoError(t, b.Read(before, dst, 0))
		for i, v := range before {
			require.Equal(t, byte(0xA5), v, "round %d: byte %d before the copy", round, i)
		}
	}

	goMem := make([]byte, 16)
	require.ErrorContains(t, b.WriteAsync(dst, 0, goMem), "not inside staging memory")
	require.ErrorContains(t, b.WaitWrites(goMem), "not inside staging memory")
	require.ErrorContains(t, b.WriteAsync(dst, 65, s1), "outside a buffer")

	own, err := cuda.New(cuda.Options{})
	require.NoError(t, err)
	s, err := own.AllocStaging(64)
	require.NoError(t, err)
	obuf, err := own.Alloc(64)
	require.NoError(t, err)
	require.NoError(t, own.WriteAsync(obuf, 0, s))
	require.ErrorContains(t, b.WriteAsync(dst, 0, s), "not inside staging memory", "another backend's staging memory")
	require.NoError(t, own.Synchronize(context.Background()))
	require.NoError(t, own.Close())
	require.Error(t, own.WaitWrites(s), "after Close")
	_, err = own.AllocStaging(64)
	require.Error(t, err, "after Close")
}
