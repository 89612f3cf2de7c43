package numerics

import (
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
)

// exp32Want is the true exponential rounded to float32: float64 exp is
// within 1 float64 ulp, so its float32 rounding is at most one float32 ulp
// from the correctly rounded result (and usually equal to it).
func exp32Want(x float32) float32 { return float32(math.Exp(float64(x))) }

// ulpDistance counts the float32 values between a and b (both non-negative
// or both NaN): bit patterns of non-negative floats are ordered, and +Inf
// sits one step above the largest finite value. Two NaNs are 0 apart.
func ulpDistance(a, b float32) int64 {
	if a != a || b != b {
		if a != a && b != b {
			return 0
		}
		return math.MaxInt64
	}
	ua, ub := int64(math.Float32bits(a)), int64(math.Float32bits(b))
	if ua > ub {
		return ua - ub
	}
	return ub - ua
}

// exp32MaxUlp returns the largest distance between Exp32 and exp32Want over
// the bit patterns lo, lo+step, ... below hi (as uint64 so that the whole
// range fits), and the worst input, scanning in parallel.
func exp32MaxUlp(lo, hi, step uint64) (worst int64, worstBits uint32) {
	workers := runtime.GOMAXPROCS(0)
	n := (hi - lo + step - 1) / step
	per := (n + uint64(workers) - 1) / uint64(workers)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range uint64(workers) {
		wg.Go(func() {
			var mx int64
			var mb uint32
			for i := w * per; i < min((w+1)*per, n); i++ {
				b := uint32(lo + i*step)
				x := math.Float32frombits(b)
				if d := ulpDistance(Exp32(x), exp32Want(x)); d > mx {
					mx, mb = d, b
				}
			}
			mu.Lock()
			if mx > worst {
				worst, worstBits = mx, mb
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return worst, worstBits
}

// TestExp32Sampled checks every 1021st float32 bit pattern, and every
// pattern (or every few) of the ranges where the scaling is delicate: the
// overflow edge, the subnormal results, tiny |x|, and the [-1, 0] inputs a
// softmax sees most. The exhaustive test (build tag exhaustive) covers all.
func TestExp32Sampled(t *testing.T) {
	if race.Enabled {
		t.Skip("-race: a scalar sweep starts no goroutine to watch; .ci/run's non-race step runs it")
	}
	ranges := []struct {
		name         string
		lo, hi, step uint64
	}{
		{"every 1021st pattern", 0, 1 << 32, 1021},
		{"overflow edge [88, 89]", uint64(math.Float32bits(88)), uint64(math.Float32bits(89)), 1},
		{"subnormal results [-104, -87]", uint64(math.Float32bits(-87)), uint64(math.Float32bits(-104)), 1},
		{"tiny |x| below 2^-20", 0, uint64(math.Float32bits(0x1p-20)), 401},
		{"tiny negative x", 0x80000000, 0x80000000 + uint64(math.Float32bits(0x1p-20)), 401},
		{"softmax range [-1, 0]", 0x80000000, uint64(math.Float32bits(-1)), 509},
	}
	if testing.Short() {
		for i := range ranges {
			ranges[i].step = ranges[i].step*7 + 1
		}
	}
	for _, r := range ranges {
		worst, bits := exp32MaxUlp(r.lo, r.hi, r.step)
		require.LessOrEqualf(t, worst, int64(1), "%s: Exp32(%g = %#08x) = %g, want %g",
			r.name, math.Float32frombits(bits), bits, Exp32(math.Float32frombits(bits)), exp32Want(math.Float32frombits(bits)))
	}
}

func TestExp32Special(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		in   uint32
		want uint32
	}{
		{0x00000000, 0x3F800000},                        // exp(0) = 1 exactly
		{0x80000000, 0x3F800000},                        // exp(-0) = 1
		{0x3F800000, math.Float32bits(float32(math.E))}, // e, correctly rounded
		{0x7F800000, 0x7F800000},                        // +Inf
		{0xFF800000, 0x00000000},                        // -Inf -> +0
		{exp32OverflowBits, 0x7F7FFF84},                 // the last finite result
		{exp32OverflowBits + 1, 0x7F800000},             // the first overflow
		{0xC2CFF1B4, 0x00000001},                        // -103.9720764: rounds up to the smallest subnormal
		{0xC2CFF1B5, 0x00000000},                        // -103.972084: rounds down to 0
		{0xC2AEAC4F, 0x00800026},                        // -87.33654: the last normal result
		{0xC2AEAC50, 0x007FFFE6},                        // -87.336548: the first subnormal result
		{0xC2D00000, 0x00000000},                        // -104, the cut-off
		{0xC2D00001, 0x00000000},                        // below the cut-off
		{0x7F7FFFFF, 0x7F800000},                        // max float
		{0xFF7FFFFF, 0x00000000},                        // -max float
	}
	for _, c := range cases {
		got := Exp32(math.Float32frombits(c.in))
		require.Equalf(t, c.want, math.Float32bits(got), "Exp32(%g = %#08x) = %g", math.Float32frombits(c.in), c.in, got)
	}
	for _, nan := range []uint32{0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF} {
		got := Exp32(math.Float32frombits(nan))
		require.Equalf(t, nan, math.Float32bits(got), "NaN %#08x keeps its bits", nan)
	}
	require.Equal(t, inf, Exp32(100))
}

// TestExp32Constants checks the split of ln 2 and the coefficients.
func TestExp32Constants(t *testing.T) {
	hi, lo := math.Float32frombits(exp32Ln2HiBits), math.Float32frombits(exp32Ln2LoBits)
	require.InDelta(t, math.Ln2, float64(hi)+float64(lo), 1e-13)
	// k*ln2Hi must be exact for every k the reduction produces.
	for k := -151; k <= 129; k++ {
		p := float64(k) * float64(hi)
		require.Equal(t, p, float64(float32(p)), "k = %d", k)
	}
	require.Equal(t, float32(math.Log2E), math.Float32frombits(exp32Log2EBits))
	fact := 1.0
	for n, bits := range []uint32{exp32C2Bits, exp32C3Bits, exp32C4Bits, exp32C5Bits, exp32C6Bits, exp32C7Bits} {
		fact *= float64(n + 2)
		require.Equal(t, float32(1/fact), math.Float32frombits(bits), "1/%d!", n+2)
	}
}

// TestExp32Golden pins the exact bits of a few results, so that a port
// (the CUDA one) that drifts by a rounding is caught even where it stays
// within the accuracy bound.
func TestExp32Golden(t *testing.T) {
	cases := []struct{ in, want uint32 }{
		{0xBF000000, 0x3F1B4598}, // -0.5
		{0xC0A00000, 0x3BDCC9FF}, // -5
		{0xC2C80000, 0x0000001B}, // -100: subnormal
		{0x3F317218, 0x40000000}, // fl(ln 2): 2
		{0xBDCCCCCD, 0x3F67A36D}, // -0.1
		{0x42200000, 0x5C51106A}, // 40
	}
	for _, c := range cases {
		got := math.Float32bits(Exp32(math.Float32frombits(c.in)))
		require.Equalf(t, c.want, got, "Exp32(%g)", math.Float32frombits(c.in))
	}
}

func BenchmarkExp32(b *testing.B) {
	x := make([]float32, 1024)
	for i := range x {
		x[i] = float32(-i) / 64
	}
	b.SetBytes(int64(4 * len(x)))
	var sink float32
	for b.Loop() {
		for _, v := range x {
			sink += Exp32(v)
		}
	}
	_ = sink
}
