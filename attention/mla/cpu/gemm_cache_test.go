package cpu

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

// TestWeightCache: a weight is dequantized once; pointing it at other
// buffers computes it again; a collected weight leaves the cache.
func TestWeightCache(t *testing.T) {
	b := New(1)
	r := rand.New(rand.NewPCG(1, 2))
	w, err := mlatest.UploadFP8Weight(b, mlatest.RandomFP8Weight(r, 128, 256))
	require.NoError(t, err)
	first, err := dequantized(w)
	require.NoError(t, err)
	again, err := dequantized(w)
	require.NoError(t, err)
	require.Same(t, first, again, "dequantized twice")

	other, err := mlatest.UploadFP8Weight(b, mlatest.RandomFP8Weight(r, 128, 256))
	require.NoError(t, err)
	w.Data = other.Data
	changed, err := dequantized(w)
	require.NoError(t, err)
	require.NotSame(t, first, changed)
	require.NotEqual(t, first.Values(), changed.Values())

	weightCache.Lock()
	before := len(weightCache.m)
	weightCache.Unlock()
	func() {
		tmp := &mla.FP8Weight{N: other.N, K: other.K, Data: other.Data, Scale: other.Scale}
		_, err := dequantized(tmp)
		require.NoError(t, err)
	}()
	require.Eventually(t, func() bool {
		runtime.GC()
		weightCache.Lock()
		defer weightCache.Unlock()
		return len(weightCache.m) == before
	}, 5*time.Second, 10*time.Millisecond, "a collected weight stays cached")
	runtime.KeepAlive(w)
}
