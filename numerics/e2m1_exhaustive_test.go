//go:build exhaustive

package numerics

import (
	"math"
	"runtime"
	"sync"
	"testing"
)

// TestE2M1Exhaustive compares E2M1FromF32 with the float64 nearest-grid
// reference on every one of the 2^32 float32 bit patterns:
// go test -tags exhaustive -run E2M1Exhaustive ./numerics
func TestE2M1Exhaustive(t *testing.T) {
	workers := uint64(runtime.GOMAXPROCS(0))
	per := (uint64(1)<<32 + workers - 1) / workers
	var mu sync.Mutex
	var wg sync.WaitGroup
	var bad uint64
	first := uint32(math.MaxUint32)
	for w := range workers {
		wg.Go(func() {
			for b := w * per; b < min((w+1)*per, 1<<32); b++ {
				x := math.Float32frombits(uint32(b))
				if E2M1FromF32(x) != e2m1Nearest(x) {
					mu.Lock()
					bad++
					first = min(first, uint32(b))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if bad != 0 {
		x := math.Float32frombits(first)
		t.Fatalf("%d differences, first at %g (%#08x): %#x, want %#x", bad, x, first, E2M1FromF32(x), e2m1Nearest(x))
	}
}
