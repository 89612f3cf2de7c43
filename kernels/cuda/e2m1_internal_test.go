package cuda

import (
	"math"
	"os"
	"testing"

	"github.com/dsv4mla/prologue/numerics"
)

// e2m1Int is indexer.cu's e2m1_int on the host, line by line (float32
// additions round once each, as __fadd_rn does).
func e2m1Int(x float32) uint8 {
	u := math.Float32bits(x)
	b := u & 0x7fffffff
	a := math.Float32frombits(b)
	lo := math.Float32bits((a+a)+float32(12582912)) - 0x4B400000
	hi := min(((b+0x1FFFFF+((b>>22)&1))>>22)-252, 7)
	m := hi
	if b < 0x3f800000 {
		m = lo
	}
	if b > 0x7f800000 {
		return 7
	}
	return uint8((u>>28)&8 | m)
}

// TestE2M1IntMatchesReference: the lean query's e2m1 without compares
// equals numerics.E2M1FromF32 on every float32 whose low 12 bits are zero
// (the query's values have at most 8 significant bits), on every input
// within 4096 ulps of each rounding threshold and its neighbours, and on
// the specials; PROLOGUE_EXHAUSTIVE=1 checks all 2^32 (about 20 s).
func TestE2M1IntMatchesReference(t *testing.T) {
	check := func(u uint32) {
		x := math.Float32frombits(u)
		if got, want := e2m1Int(x), numerics.E2M1FromF32(x); got != want {
			t.Fatalf("e2m1_int(%08x = %g) = %d, numerics.E2M1FromF32 %d", u, x, got, want)
		}
	}
	if os.Getenv("PROLOGUE_EXHAUSTIVE") == "1" {
		for u := uint64(0); u < 1<<32; u++ {
			check(uint32(u))
		}
		return
	}
	for u := uint64(0); u < 1<<32; u += 1 << 12 {
		check(uint32(u))
	}
	for _, v := range []float32{0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, float32(math.Inf(1))} {
		c := math.Float32bits(v)
		for d := uint32(0); d < 4096; d++ {
			for _, s := range []uint32{0, 0x80000000} {
				check((c + d) | s)
				check((c - d) | s)
			}
		}
	}
	for _, u := range []uint32{0x7f800001, 0x7fc00000, 0x7fffffff, 0xff800001, 0xffc00000, 0xffffffff, 0x00000001, 0x807fffff} {
		check(u)
	}
}

// e2m1Scaled is indexer.cu's e2m1_scaled on the host, line by line (the
// fma as one rounding of the exact 2a + 1.5*2^23: a < 1 there, so 2a is
// exact and the float32 add rounds once).
func e2m1Scaled(v, inv float32) uint8 {
	b := math.Float32bits(v*inv) & 0x7fffffff
	a := math.Float32frombits(b)
	lo := math.Float32bits(float32(2*a)+float32(12582912)) - 0x4B400000
	hi := min((b+0x1FFFFF-252<<22+((b>>22)&1))>>22, 7) // mod 2^32, as the u32 constant
	m := hi
	if b < 0x3f800000 {
		m = lo
	}
	return uint8((math.Float32bits(v)>>28)&8 | m)
}

// TestE2M1ScaledMatchesReference: the wide query's e2m1 of a scaled value
// equals numerics.E2M1FromF32 of the product on every value the kernel
// gives it: every bf16 (each NaN as round2 leaves it, the canonical
// positive one) times every MXFP4 block scale 2^(127-e), e in [1, 254]
// (the floor 6*2^-126 keeps e >= 1); every other exponent under -short.
func TestE2M1ScaledMatchesReference(t *testing.T) {
	step := 1
	if testing.Short() {
		step = 2
	}
	for e := 1; e <= 254; e += step {
		k := 127 - e
		var inv float32
		if k >= -126 {
			inv = math.Float32frombits(uint32(k+127) << 23)
		} else {
			inv = math.Float32frombits(1 << (k + 149))
		}
		for h := range uint32(1 << 16) {
			u := h << 16
			if u&0x7fffffff > 0x7f800000 {
				u = 0x7fff0000 // numerics.BF16FromF32's NaN
			}
			v := math.Float32frombits(u)
			if got, want := e2m1Scaled(v, inv), numerics.E2M1FromF32(v*inv); got != want {
				t.Fatalf("e2m1_scaled(%08x = %g, 2^%d) = %d, numerics.E2M1FromF32 %d", u, v, k, got, want)
			}
		}
	}
}
