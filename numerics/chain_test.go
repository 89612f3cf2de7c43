package numerics

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
)

// TestSumSquaresNOrder checks the canonical order at every width the chain
// uses against a transcription with an explicit lane array.
func TestSumSquaresNOrder(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 4))
	for _, w := range []int{32, 128, 512, 1024, 1536, 4096, 7168, 8192} {
		for n := 0; n < 20; n++ {
			x := make([]float32, w)
			for i := range x {
				x[i] = RoundBF16(float32(r.NormFloat64() * math.Ldexp(1, r.IntN(20)-10)))
			}
			per := w / 32
			lanes := make([]float32, 32)
			for j := range lanes {
				for i := per * j; i < per*(j+1); i++ {
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
			require.Equal(t, math.Float32bits(lanes[0]), math.Float32bits(SumSquaresN(x)), "W=%d", w)
			if w == HeadDim {
				require.Equal(t, math.Float32bits(SumSquaresN(x)), math.Float32bits(SumSquares(x)))
			}
		}
	}
	require.Panics(t, func() { SumSquaresN(make([]float32, 48)) })
	require.Panics(t, func() { SumSquaresN(nil) })
}

func TestRMSInvN(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	for i := 0; i < 10000; i++ {
		s := float32(r.ExpFloat64() * math.Ldexp(1, r.IntN(60)-30))
		require.Equal(t, math.Float32bits(RMSInv(s, DefaultEps)), math.Float32bits(RMSInvN(s, HeadDim, DefaultEps)))
		w := 128 * (1 + r.IntN(64))
		eps := float32(1e-5)
		want := float32(1 / float32(math.Sqrt(float64(float32(float32(s/float32(w))+eps)))))
		require.Equal(t, math.Float32bits(want), math.Float32bits(RMSInvN(s, w, eps)), "S=%g W=%d", s, w)
	}
	// An all-zero row: r = 1/sqrt(eps).
	require.Equal(t, float32(1/math.Sqrt(float64(float32(1e-5)))), RMSInvN(0, 1536, 1e-5))
}

// ceilLog2Over448 is ceil(log2(a/448)) in float64 arithmetic, and the same
// exponent found by exact comparison with the powers of two 448*2^k.
func ceilLog2Over448(a float64) (fromLog, fromCompare int) {
	fromLog = int(math.Ceil(math.Log2(a / 448)))
	k := -40
	for 448*math.Ldexp(1, k) < a {
		k++
	}
	return fromLog, k
}

// wantExponent is the act_quant exponent byte from the float64 formula:
// 127 + ceil(log2(max(a, 1e-4)/448)), at most 254.
func wantExponent(t *testing.T, a float32) int {
	if !(a >= UE8M0Floor) {
		a = UE8M0Floor
	}
	if math.IsInf(float64(a), 1) {
		return 254
	}
	fromLog, fromCompare := ceilLog2Over448(float64(a))
	require.Equal(t, fromCompare, fromLog, "a=%g: float64 log2 and exact comparison disagree", a)
	return min(127+fromLog, 254)
}

func checkBlockExponent(t *testing.T, a float32) {
	x := []float32{a / 3, -a, 0.5} // -a carries the maximum |x|
	if a < 1 {
		x[2] = a / 2
	}
	q := make([]uint8, len(x))
	scale := ActQuantBlock(x, q)
	e := wantExponent(t, a)
	if float64(scale) != math.Ldexp(1, e-127) {
		t.Fatalf("a=%g (%#08x): ActQuantBlock scale %g, float64 formula 2^%d", a, math.Float32bits(a), scale, e-127)
	}
}

// TestActQuantScaleExponent compares the block scale with a float64
// computation of 2^ceil(log2(a/448)) for every positive bf16, every float32
// within 8 ulps of each boundary 448*2^k and of the 1e-4 floor, and random
// float32 maxima.
func TestActQuantScaleExponent(t *testing.T) {
	if race.Enabled {
		t.Skip("-race: a scalar sweep starts no goroutine to watch; .ci/run's non-race step runs it")
	}
	for b := uint32(1); b <= 0x7F80; b++ {
		checkBlockExponent(t, F32FromBF16(uint16(b)))
	}
	for k := -40; k <= 119; k++ { // 448*2^119 = 1.75*2^127, the last edge below the largest float32
		edge := float32(448 * math.Ldexp(1, k))
		for d := -8; d <= 8; d++ {
			checkBlockExponent(t, math.Float32frombits(uint32(int32(math.Float32bits(edge))+int32(d))))
		}
	}
	for d := -8; d <= 8; d++ {
		checkBlockExponent(t, math.Float32frombits(uint32(int32(math.Float32bits(UE8M0Floor))+int32(d))))
	}
	checkBlockExponent(t, math.MaxFloat32)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 6))
	for i := 0; i < 500000; i++ {
		checkBlockExponent(t, math.Float32frombits(1+r.Uint32N(0x7F7FFFFF)))
	}
}

// TestProductEqualsQuotient checks the claim ActQuantBlock's doc makes:
// fl(x * 2^(127-e)) = fl(x / 2^(e-127)) for every bf16 x (subnormals, Inf,
// NaN included) and every exponent byte a block can get, 2^-127 (a
// subnormal inverse) at e = 254 included.
func TestProductEqualsQuotient(t *testing.T) {
	for e := 1; e <= 254; e++ {
		inv, s := Pow2(127-e), UE8M0Scale(uint8(e))
		for b := 0; b < 1<<16; b++ {
			x := F32FromBF16(uint16(b))
			p, d := float32(x*inv), float32(x/s)
			if math.Float32bits(p) != math.Float32bits(d) && !(p != p && d != d) {
				t.Fatalf("x=%g e=%d: x*inv=%g x/s=%g", x, e, p, d)
			}
		}
	}
	// And for every float32 a fused row can hold (not only bf16): random bits.
	r := rand.New(rand.NewPCG(1, 7))
	for i := 0; i < 1000000; i++ {
		x := math.Float32frombits(r.Uint32())
		e := 1 + r.IntN(254)
		p, d := float32(x*Pow2(127-e)), float32(x/UE8M0Scale(uint8(e)))
		if math.Float32bits(p) != math.Float32bits(d) && !(p != p && d != d) {
			t.Fatalf("x=%g e=%d: x*inv=%g x/s=%g", x, e, p, d)
		}
	}
}

func TestActQuantBlock(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		name  string
		x     []float32
		scale float32
		q     []uint8
	}{
		{"amax 448: scale 1", []float32{448, -1, 0.5, 0}, 1, []uint8{0x7E, 0xB8, 0x30, 0x00}},
		{"amax just over 448: scale 2", []float32{-450, 1}, 2, []uint8{0xF6, 0x30}},
		{"NaN ignored", []float32{nan, 224, 1}, 0.5, []uint8{0x7F, 0x7E, 0x40}},
		{"Inf: e=254, inverse 2^-127", []float32{inf, 1e30, -1}, Pow2(127), []uint8{0x7E, 0x00, 0x80}},
		{"zeros: the 1e-4 floor", []float32{0, float32(math.Copysign(0, -1))}, Pow2(-22), []uint8{0x00, 0x80}},
		{"all NaN: the floor", []float32{nan, nan}, Pow2(-22), []uint8{0x7F, 0x7F}},
		{"tiny: below the floor", []float32{1e-6, -3e-5}, Pow2(-22), []uint8{0x48, 0xF0}},
	}
	for _, c := range cases {
		q := make([]uint8, len(c.x))
		require.Equal(t, c.scale, ActQuantBlock(c.x, q), c.name)
		require.Equal(t, c.q, q, c.name)
		for i, v := range c.x {
			if v == v && c.scale < Pow2(20) && math.Abs(float64(v)) <= float64(448*c.scale) {
				// Within range the dequantized value is within half an e4m3 step.
				deq := F32FromE4M3(q[i]) * c.scale
				require.InDelta(t, v, deq, math.Abs(float64(v))/16+float64(c.scale)/1024, "%s: x[%d]", c.name, i)
			}
		}
	}
}
