package numerics

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func randomRow(r *rand.Rand) []float32 {
	x := make([]float32, HeadDim)
	for i := range x {
		x[i] = RoundBF16(float32(r.NormFloat64() * 3))
	}
	return x
}

// TestSumSquaresOrder checks the canonical order against a direct
// transcription of the butterfly with an explicit lane array.
func TestSumSquaresOrder(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	for n := 0; n < 200; n++ {
		x := randomRow(r)
		lanes := make([]float32, 32)
		for j := 0; j < 32; j++ {
			for i := 16 * j; i < 16*j+16; i++ {
				sq := float32(x[i] * x[i])
				lanes[j] = float32(lanes[j] + sq)
			}
		}
		for _, d := range []int{16, 8, 4, 2, 1} {
			next := make([]float32, 32)
			for j := range lanes {
				next[j] = float32(lanes[j] + lanes[j^d])
			}
			lanes = next
		}
		for j := 1; j < 32; j++ {
			require.Equal(t, lanes[0], lanes[j])
		}
		require.Equal(t, math.Float32bits(lanes[0]), math.Float32bits(SumSquares(x)))
		// The order matters: a plain ascending sum usually differs in the
		// last bits, which is why the contract pins it. Check it is close.
		var plain float64
		for _, v := range x {
			plain += float64(v) * float64(v)
		}
		require.InEpsilon(t, plain, float64(SumSquares(x)), 1e-5)
	}
}

func TestRMSInv(t *testing.T) {
	require.Equal(t, float32(1/math.Sqrt(float64(float32(1+1e-6)))), RMSInv(512, DefaultEps))
	require.InEpsilon(t, 1e3, RMSInv(0, DefaultEps), 1e-6) // 1/sqrt(eps)
	require.Equal(t, float32(0), RMSInv(float32(math.Inf(1)), DefaultEps))
	require.True(t, math.IsNaN(float64(RMSInv(float32(math.NaN()), DefaultEps))))
	// The eps is the caller's: an all-zero row gives 1/sqrt(eps).
	for _, eps := range []float32{1e-5, 1e-6, 1e-12} {
		want := float32(1 / float32(math.Sqrt(float64(eps))))
		require.Equal(t, want, RMSInv(0, eps), "eps %g", eps)
	}
	require.NotEqual(t, RMSInv(512*1e-6, 1e-5), RMSInv(512*1e-6, 1e-6))
}

func TestRope(t *testing.T) {
	y0, y1 := Rope(1, 2, 0.5, 0.25)
	require.Equal(t, float32(0), y0) // 0.5 - 0.5
	require.Equal(t, float32(1.25), y1)
	y0, y1 = Rope(3, -7, 1, 0)
	require.Equal(t, float32(3), y0)
	require.Equal(t, float32(-7), y1)
	// Results are bf16 values.
	y0, _ = Rope(1.0078125, 1, float32(math.Cos(0.3)), float32(math.Sin(0.3)))
	require.Equal(t, y0, RoundBF16(y0))
}

func TestUE8M0(t *testing.T) {
	cases := []struct {
		amax float32
		e    uint8
		inv  float32
	}{
		{448, 127, 1},      // t = 1 exactly
		{449, 128, 0.5},    // t just over 1: ceil to 2
		{224, 126, 2},      // t = 0.5
		{0, 113, Pow2(14)}, // floored to 1e-4: t = 2.23e-7 -> 2^-22 ceil -> 2^-21? checked below
		{float32(math.Inf(1)), 254, Pow2(-127)},
	}
	for _, c := range cases[:3] {
		e, inv := UE8M0(c.amax)
		require.Equal(t, c.e, e, "amax %g", c.amax)
		require.Equal(t, c.inv, inv, "amax %g", c.amax)
	}
	// The floor: t = fl(1e-4/448) lies in [2^-23, 2^-22), so e = 127-22.
	e, inv := UE8M0(0)
	require.Equal(t, uint8(127-22), e)
	require.Equal(t, Pow2(22), inv)
	e2, _ := UE8M0(1e-9)
	require.Equal(t, e, e2)
	e, inv = UE8M0(float32(math.Inf(1)))
	require.Equal(t, uint8(254), e)
	require.Equal(t, uint32(0x00400000), math.Float32bits(inv), "2^-127 is a subnormal")
	e, _ = UE8M0(math.MaxFloat32)
	require.Equal(t, uint8(254-7), e) // 3.4e38/448 ~ 2^119.3 -> ceil 2^120 -> 247
	for e := 1; e < 255; e++ {
		require.Equal(t, float64(UE8M0Scale(uint8(e))), math.Pow(2, float64(e-127)))
	}
}

func TestGroupAbsMax(t *testing.T) {
	nan := float32(math.NaN())
	require.Equal(t, float32(5), GroupAbsMax([]float32{1, -5, nan, 2}))
	require.Equal(t, float32(0), GroupAbsMax([]float32{nan, nan}))
	require.Equal(t, float32(math.Inf(1)), GroupAbsMax([]float32{1, float32(math.Inf(-1))}))
}

func TestPow2(t *testing.T) {
	for k := -149; k <= 127; k++ {
		require.Equal(t, math.Pow(2, float64(k)), float64(Pow2(k)), "k=%d", k)
	}
}

func BenchmarkSumSquares(b *testing.B) {
	x := randomRow(rand.New(rand.NewPCG(1, 1)))
	b.SetBytes(HeadDim * 2)
	for b.Loop() {
		SumSquares(x)
	}
}

func BenchmarkE4M3FromF32(b *testing.B) {
	x := randomRow(rand.New(rand.NewPCG(1, 1)))
	b.SetBytes(HeadDim)
	for b.Loop() {
		for _, v := range x {
			E4M3FromF32(v)
		}
	}
}

func TestF32BytesRoundTrip(t *testing.T) {
	v := []float32{0, -0.5, 1.5, float32(math.Inf(-1)), math.Float32frombits(0x7fc00001), math.SmallestNonzeroFloat32}
	b := F32Bytes(v)
	if len(b) != 4*len(v) || b[4+3] != 0xbf || b[4+2] != 0x00 {
		t.Fatalf("F32Bytes(%v) = % x: want little-endian float32s", v, b)
	}
	got := F32sFromBytes(append(b, 0xff)) // a trailing partial value is ignored
	if len(got) != len(v) {
		t.Fatalf("F32sFromBytes gave %d values, want %d", len(got), len(v))
	}
	for i := range v {
		if math.Float32bits(got[i]) != math.Float32bits(v[i]) {
			t.Fatalf("value %d: got %#x, want %#x", i, math.Float32bits(got[i]), math.Float32bits(v[i]))
		}
	}
}
