package numerics

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
)

// slowE4M3 is an independent reference: it searches all 126 finite
// non-negative e4m3 values for the nearest one in float64, breaking ties
// toward the even code, then saturates and applies the sign.
func slowE4M3(f float32) uint8 {
	x := float64(f)
	if math.IsNaN(x) {
		return 0x7F
	}
	var sign uint8
	if math.Signbit(x) {
		sign = 0x80
		x = -x
	}
	if x > 448 {
		return sign | 0x7E
	}
	best := uint8(0)
	bestErr := math.Inf(1)
	for c := uint8(0); c <= 0x7E; c++ {
		v := slowDecode(c)
		d := math.Abs(v - x)
		if d < bestErr || (d == bestErr && c%2 == 0) {
			best, bestErr = c, d
		}
	}
	return sign | best
}

// slowDecode decodes a non-negative e4m3 code with float64 arithmetic.
func slowDecode(c uint8) float64 {
	e := int(c >> 3)
	m := float64(c & 7)
	if e == 0 {
		return m / 8 * math.Pow(2, -6)
	}
	return (1 + m/8) * math.Pow(2, float64(e-7))
}

func TestE4M3AllBF16Inputs(t *testing.T) {
	for b := 0; b < 1<<16; b++ {
		f := F32FromBF16(uint16(b))
		got, want := E4M3FromF32(f), slowE4M3(f)
		if got != want {
			t.Fatalf("bf16 %#04x (%g): E4M3FromF32 = %#02x, slow reference = %#02x", b, f, got, want)
		}
	}
}

func TestE4M3RandomFloat32(t *testing.T) {
	if race.Enabled {
		t.Skip("-race: a scalar sweep starts no goroutine to watch; .ci/run's non-race step runs it")
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < 200000; i++ {
		var f float32
		if i%2 == 0 {
			f = math.Float32frombits(r.Uint32())
		} else {
			f = float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(30)-20)))
		}
		require.Equal(t, slowE4M3(f), E4M3FromF32(f), "input %g (%#08x)", f, math.Float32bits(f))
	}
}

func TestE4M3Boundaries(t *testing.T) {
	cases := []struct {
		in   float32
		want uint8
	}{
		{0, 0x00},
		{float32(math.Copysign(0, -1)), 0x80},
		{448, 0x7E},
		{-448, 0xFE},
		{449, 0x7E},
		{464, 0x7E}, // tie between 448 and the non-finite 480: saturates
		{480, 0x7E},
		{1e30, 0x7E},
		{float32(math.Inf(1)), 0x7E},
		{float32(math.Inf(-1)), 0xFE},
		{float32(math.NaN()), 0x7F},
		{416, 0x7D},
		{432, 0x7E}, // tie between 416 (odd code 0x7D) and 448 (even 0x7E)
		{1, 0x38},
		{1.0625, 0x38},                  // tie between 1 and 1.125 goes to even (1)
		{1.1875, 0x3A},                  // tie between 1.125 and 1.25 goes to even (1.25)
		{0.015625, 0x08},                // 2^-6, smallest normal
		{0.001953125, 0x01},             // 2^-9, smallest subnormal
		{0.0009765625, 0x00},            // 2^-10: tie between 0 and 2^-9 goes to 0
		{0.0029296875, 0x02},            // 1.5*2^-9: tie goes to even (2)
		{0.0146484375, 0x08},            // 7.5*2^-9 rounds to 8*2^-9 = 2^-6
		{math.Float32frombits(1), 0x00}, // float32 subnormal
	}
	for _, c := range cases {
		require.Equalf(t, c.want, E4M3FromF32(c.in), "E4M3FromF32(%g)", c.in)
		require.Equalf(t, c.want, slowE4M3(c.in), "slowE4M3(%g)", c.in)
	}
}

func TestE4M3DecodeRoundTrip(t *testing.T) {
	for c := 0; c < 256; c++ {
		if c&0x7F == 0x7F {
			require.True(t, math.IsNaN(float64(F32FromE4M3(uint8(c)))))
			continue
		}
		v := F32FromE4M3(uint8(c))
		require.Equal(t, uint8(c), E4M3FromF32(v), "code %#02x value %g", c, v)
	}
}

// slowBF16 rounds with float64 arithmetic: the two bf16 neighbours of f and
// a tie to the even one.
func slowBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if math.IsNaN(float64(f)) {
		return 0x7FFF
	}
	lo := uint16(u >> 16)
	hi := lo + 1
	dl := math.Abs(float64(f) - float64(F32FromBF16(lo)))
	if math.IsInf(float64(f), 0) {
		return lo
	}
	hv := float64(F32FromBF16(hi))
	if math.IsInf(hv, 0) {
		// The next code up is Inf: compare against where 2^128 would sit.
		hv = math.Copysign(math.Pow(2, 128), float64(f))
	}
	dh := math.Abs(float64(f) - hv)
	if dh < dl || (dh == dl && hi%2 == 0) {
		return hi
	}
	return lo
}

func TestBF16FromF32(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	for i := 0; i < 500000; i++ {
		f := math.Float32frombits(r.Uint32())
		require.Equal(t, slowBF16(f), BF16FromF32(f), "input %#08x", math.Float32bits(f))
	}
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3F808000, 0x3F80}, // tie, even stays
		{0x3F818000, 0x3F82}, // tie, odd rounds up
		{0x3F808001, 0x3F81},
		{0x7F7FFFFF, 0x7F80}, // max float32 rounds to Inf
		{0x7F800000, 0x7F80},
		{0xFF800000, 0xFF80},
		{0x7FC00000, 0x7FFF}, // every NaN becomes the canonical NaN
		{0xFF800001, 0x7FFF},
		{0xFFC00000, 0x7FFF}, // x86's default NaN
		{0x00000001, 0x0000},
	}
	for _, c := range cases {
		require.Equalf(t, c.want, BF16FromF32(math.Float32frombits(c.in)), "input %#08x", c.in)
	}
	for b := 0; b < 1<<16; b++ {
		f := F32FromBF16(uint16(b))
		if math.IsNaN(float64(f)) {
			continue
		}
		require.Equal(t, uint16(b), BF16FromF32(f))
	}
}

// TestCanonicalF32: every float32 NaN, whatever its sign and payload,
// becomes F32NaN; every other value, -0 and the infinities included, is
// kept bit for bit.
func TestCanonicalF32(t *testing.T) {
	for _, bits := range []uint32{0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFF0000, 0xFFFFFFFF, 0x7FFFFFFF} {
		require.Equal(t, uint32(F32NaN), math.Float32bits(CanonicalF32(math.Float32frombits(bits))), "NaN %#x", bits)
	}
	for _, bits := range []uint32{0, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x3F800000, 0x7F7FFFFF} {
		require.Equal(t, bits, math.Float32bits(CanonicalF32(math.Float32frombits(bits))), "%#x", bits)
	}
}
