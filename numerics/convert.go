package numerics

import "math"

// BF16NaN is the one bf16 NaN every backend writes.
const BF16NaN = 0x7FFF

// BF16FromF32 rounds f to bfloat16, nearest with ties to even; ±Inf stays
// ±Inf and finite values that round past the largest bf16 become ±Inf, as
// IEEE rounding says. Every NaN becomes the canonical 0x7FFF, as the GPU's
// cvt.rn.bf16.f32 does: the sign and payload of a NaN that arithmetic
// produced differ between x86 (0xFFC00000) and the GPU (0x7FFFFFFF), so only
// a canonical NaN keeps the backends byte-identical.
func BF16FromF32(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7FFFFFFF > 0x7F800000 {
		return BF16NaN
	}
	u += 0x7FFF + (u >> 16 & 1)
	return uint16(u >> 16)
}

// F32NaN is the float32 bits of the one float32 NaN every backend writes
// where an output is float32 (the FP8 indexer query's head weights): the
// GPU's arithmetic returns it for any NaN operand, while x86 keeps the
// operand's payload (a bf16 NaN widened is 0x7FFF0000).
const F32NaN = 0x7FFFFFFF

// CanonicalF32 is f, or the float32 with bits F32NaN when f is a NaN.
func CanonicalF32(f float32) float32 {
	if f != f {
		return math.Float32frombits(F32NaN)
	}
	return f
}

// F32FromBF16 widens a bf16 exactly.
func F32FromBF16(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// RoundBF16 returns f rounded to bf16 and widened back to float32.
func RoundBF16(f float32) float32 { return F32FromBF16(BF16FromF32(f)) }

// E4M3NaN is the byte a NaN input becomes.
const E4M3NaN = 0x7F

// E4M3FromF32 converts like the hardware cvt.rn.satfinite.e4m3x2.f32:
// round to nearest even; finite values beyond ±448 and ±Inf saturate to
// ±448 (0x7E / 0xFE); any NaN becomes 0x7F.
//
// It touches no memory, so the race detector has nothing to check in it:
// uninstrumented (and without checkptr's check of Float32bits) it no
// longer costs a detector call per quantized value under -race.
//
//go:norace
//go:nocheckptr
func E4M3FromF32(f float32) uint8 {
	u := math.Float32bits(f)
	sign := uint8(u >> 24 & 0x80)
	a := u & 0x7FFFFFFF
	if a > 0x7F800000 {
		return E4M3NaN
	}
	var mag uint32
	const minNormal = 0x3C800000 // 2^-6, the smallest normal e4m3
	if a >= minNormal {
		// Keep 3 mantissa bits and round the 20 dropped bits to even.
		keep := a >> 20
		rem := a & 0xFFFFF
		if rem > 0x80000 || (rem == 0x80000 && keep&1 == 1) {
			keep++
		}
		// Rebias the exponent from 127 to 7: subtract 120 from the 8-bit field.
		mag = keep - 120<<3
		if mag > 0x7E {
			mag = 0x7E
		}
	} else {
		// Subnormal e4m3: multiples of 2^-9. Scaling by 2^9 is exact.
		v := math.Float32frombits(a) * 512
		mag = uint32(math.RoundToEven(float64(v))) // 0..8; 8 is the smallest normal's encoding
	}
	return sign | uint8(mag)
}

// F32FromE4M3 decodes an e4m3 byte (0x7F and 0xFF are NaN).
func F32FromE4M3(b uint8) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	m := b & 0x7F
	if m == 0x7F {
		return float32(math.NaN())
	}
	exp := int(m >> 3)
	man := float32(m & 7)
	if exp == 0 {
		return sign * man * Pow2(-9)
	}
	return sign * (1 + man/8) * Pow2(exp-7)
}
