package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/numerics"
)

// bf16Round is one bf16 rounding of x (to nearest even, subnormals kept,
// overflow to Inf): what sm_80's bf16x2 fma, min and max return for an
// exact result x. x is exact in float64 wherever the callers use it (a
// product of two bf16 plus a small constant).
func bf16Round(x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	_, exp := math.Frexp(math.Abs(x)) // |x| = f * 2^exp, f in [0.5, 1)
	q := math.Ldexp(1, max(exp-8, -133))
	r := math.RoundToEven(x/q) * q
	if math.Abs(r) > 0x1.fep127 {
		return math.Copysign(math.Inf(1), x)
	}
	return r
}

func bf16Val(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }

func bf16Bits(x float64) uint16 {
	if math.IsNaN(x) {
		return 0x7fff
	}
	return uint16(math.Float32bits(float32(x)) >> 16) // x is a bf16 value: exact
}

// bf16 min and max as min.bf16x2 and max.bf16x2: a NaN operand dropped.
func bf16Min(a, b float64) float64 {
	switch {
	case math.IsNaN(a):
		return b
	case math.IsNaN(b):
		return a
	}
	return math.Min(a, b)
}

// e2m1PairMag is indexer.cu's e2m1x2_mag on one half, line by line.
func e2m1PairMag(m, s1, s2, s4 uint16) uint16 {
	mv := bf16Val(m)
	lo := bf16Min(bf16Round(mv*bf16Val(s1)+192), bf16Round(mv*bf16Val(s2)+194))
	return bf16Bits(bf16Min(lo, bf16Min(bf16Round(mv*bf16Val(s4)+196), 199)))
}

// TestE2M1PairMatchesReference: the stream query's bf16x2 e2m1 gives
// numerics.E2M1FromF32 of the scaled value on every value the kernel
// gives it: every bf16 (each NaN as round2 leaves it, the canonical
// positive one) under every MXFP4 block scale 2^(127-e), e in [1, 254];
// every other exponent under -short; under the race detector (plain
// arithmetic, no goroutine for it to watch: 14 s of the package's 20)
// every eighth from a random first one (.ci/run's step without -race
// checks them all).
func TestE2M1PairMatchesReference(t *testing.T) {
	first, step := 1, 1
	if testing.Short() {
		step = 2
	}
	if race.Enabled {
		first, step = 1+rand.IntN(8), 8
		t.Logf("-race: exponents %d, %d, ...", first, first+step)
	}
	for e := first; e <= 254; e += step {
		var s [3]uint16 // 2^(128-e), 2^(127-e), 2^(126-e)
		for i := range s {
			s[i] = uint16(math.Float32bits(float32(math.Ldexp(1, 128-i-e))) >> 16)
			if bf16Val(s[i]) != math.Ldexp(1, 128-i-e) {
				t.Fatalf("e %d: 2^%d is not an exact bf16", e, 128-i-e)
			}
		}
		for h := range uint32(1 << 16) {
			u := h << 16
			if u&0x7fffffff > 0x7f800000 {
				u = 0x7fff0000
			}
			v := math.Float32frombits(u)
			y := e2m1PairMag(uint16(u>>16)&0x7fff, s[0], s[1], s[2])
			if y < 0x4340 || y > 0x4347 {
				t.Fatalf("e2m1x2_mag(%04x, 2^%d) = %04x, not 0x4340 + an index", u>>16, 127-e, y)
			}
			got := uint8(y-0x4340) | uint8(u>>28)&8
			want := numerics.E2M1FromF32(v * math.Float32frombits(math.Float32bits(float32(math.Ldexp(1, 127-e)))))
			if got != want {
				t.Fatalf("e2m1x2_mag(%08x = %g, 2^%d): nibble %d, numerics.E2M1FromF32 %d", u, v, 127-e, got, want)
			}
		}
	}
}

// mxfp4Word is indexer.cu's mxfp4_word, line by line.
func mxfp4Word(p, y [4]uint32) uint32 {
	const s = 0x80008000
	w := p[0] & s
	w = w>>4 | p[1]&s
	w = w>>4 | p[2]&s
	w = w>>4 | p[3]&s
	c := ((y[3]*16+y[2])*16+y[1])*16 + y[0]
	bias := uint32(0x43404340)
	return c - bias*0x1111 + w // mod 2^32, as the u32 product
}

// TestMXFP4WordPacks: mxfp4_word puts value i's index and sign in nibble
// i (value j in the low half of pair j, value j + 4 in its high half), on
// random pairs and indices (seed printed).
func TestMXFP4WordPacks(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for range 100000 {
		var p, y [4]uint32
		var want uint32
		for j := range 4 {
			p[j] = r.Uint32()
			lo, hi := r.Uint32N(8), r.Uint32N(8)
			y[j] = 0x43404340 + lo + hi<<16
			want |= (lo | (p[j]>>15&1)<<3) << (4 * j)
			want |= (hi | (p[j]>>31)<<3) << (4 * (j + 4))
		}
		if got := mxfp4Word(p, y); got != want {
			t.Fatalf("mxfp4_word(%08x, %08x) = %08x, want %08x", p, y, got, want)
		}
	}
}
