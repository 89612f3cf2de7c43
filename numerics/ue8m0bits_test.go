package numerics

import (
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
)

// ue8m0BitsMismatches compares UE8M0ExponentBits with UE8M0's exponent over
// the float32 bit patterns [lo, hi) on all cores: the number of differences
// and the lowest differing pattern.
func ue8m0BitsMismatches(lo, hi uint64) (count uint64, first uint32) {
	workers := uint64(runtime.GOMAXPROCS(0))
	per := (hi - lo + workers - 1) / workers
	var mu sync.Mutex
	var wg sync.WaitGroup
	first = math.MaxUint32
	for w := range workers {
		wg.Go(func() {
			var n uint64
			f := uint32(math.MaxUint32)
			for b := lo + w*per; b < min(lo+(w+1)*per, hi); b++ {
				a := math.Float32frombits(uint32(b))
				if want, _ := UE8M0(a); UE8M0ExponentBits(a) != want {
					if n == 0 {
						f = uint32(b)
					}
					n++
				}
			}
			mu.Lock()
			count += n
			first = min(first, f)
			mu.Unlock()
		})
	}
	wg.Wait()
	return count, first
}

func requireUE8M0BitsMatch(t *testing.T, name string, lo, hi uint64) {
	t.Helper()
	n, first := ue8m0BitsMismatches(lo, hi)
	if n != 0 {
		a := math.Float32frombits(first)
		want, _ := UE8M0(a)
		t.Fatalf("%s: %d differences, first at %g (%#08x): bits form %d, division %d",
			name, n, a, first, UE8M0ExponentBits(a), want)
	}
}

// TestUE8M0ExponentBits compares the division-free exponent with UE8M0 on
// every float32 in [1e-4, 2), within 1000 ulps of every power of two and of
// every 1.75 * 2^k (which holds each 448 * 2^E, where t = fl(a/448) is a
// power of two), and on the edges: below the floor, NaN, the largest
// finite float32, +Inf. TestUE8M0ExponentBitsExhaustive (build tag
// exhaustive or invariants) covers every float32.
func TestUE8M0ExponentBits(t *testing.T) {
	if race.Enabled {
		t.Skip("-race: a scalar sweep starts no goroutine to watch; .ci/run's non-race step runs it")
	}
	floor := uint64(math.Float32bits(UE8M0Floor))
	requireUE8M0BitsMatch(t, "[1e-4, 2)", floor, uint64(math.Float32bits(2)))
	const ulps = 1000
	for exp := uint64(1); exp <= 254; exp++ {
		pow2 := exp << 23
		requireUE8M0BitsMatch(t, "around 2^k", pow2-ulps, pow2+ulps+1)
		boundary := pow2 | 0x600000 // 1.75 * 2^(exp-127)
		requireUE8M0BitsMatch(t, "around 1.75*2^k", boundary-ulps, boundary+ulps+1)
	}
	requireUE8M0BitsMatch(t, "around 1e-4", floor-ulps, floor+ulps+1)
	requireUE8M0BitsMatch(t, "largest floats and +Inf", 0x7F800000-ulps, 0x7F800001)
	requireUE8M0BitsMatch(t, "NaNs", 0x7F800001, 0x7F800001+ulps)
	requireUE8M0BitsMatch(t, "zero and subnormals", 0, ulps)
	requireUE8M0BitsMatch(t, "negatives", 0x80000000, 0x80000000+ulps)

	for k := -22; k <= 119; k++ { // 448 * 2^-23 is below the floor
		// 448 * 2^k is exact (448 * 2^119 = 1.75 * 2^127 is finite): t is a
		// power of two there, and the next float up ceils one further.
		edge := float32(448 * math.Ldexp(1, k))
		require.Equal(t, uint32(0x600000), math.Float32bits(edge)&0x7FFFFF, "448*2^%d", k)
		require.Equal(t, uint8(127+k), UE8M0ExponentBits(edge), "448*2^%d", k)
		require.Equal(t, uint8(128+k), UE8M0ExponentBits(math.Nextafter32(edge, float32(math.Inf(1)))), "above 448*2^%d", k)
	}

	inf := float32(math.Inf(1))
	cases := []struct {
		name string
		amax float32
		e    uint8
	}{
		{"448: t = 1", 448, 127},
		{"449: t just over 1", 449, 128},
		{"224: t = 0.5", 224, 126},
		{"the floor 1e-4: t in [2^-23, 2^-22)", UE8M0Floor, 105},
		{"below the floor", 1e-9, 105},
		{"zero", 0, 105},
		{"NaN", float32(math.NaN()), 105},
		{"the largest finite float32: the cap never binds", math.MaxFloat32, 247},
		{"+Inf: t = +Inf, exponent 255 capped", inf, 254},
	}
	for _, c := range cases {
		want, _ := UE8M0(c.amax)
		require.Equal(t, c.e, want, "%s: UE8M0", c.name)
		require.Equal(t, c.e, UE8M0ExponentBits(c.amax), "%s: UE8M0ExponentBits", c.name)
	}
}

func BenchmarkUE8M0ExponentBits(b *testing.B) {
	var sink uint8
	for i := 0; i < b.N; i++ {
		sink += UE8M0ExponentBits(math.Float32frombits(0x38D1B717 + uint32(i)&0xFFFFFF))
	}
	_ = sink
}
