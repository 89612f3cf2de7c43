package numerics

import "math"

// The constants of Exp32, as float32 bit patterns so that the CUDA port
// (kernels/cuda/exp32.cuh) spells the very same values.
const (
	exp32Log2EBits = 0x3FB8AA3B // log2(e) rounded to float32
	exp32Ln2HiBits = 0x3F317200 // ln 2 truncated to 15 significant bits: k*ln2Hi is exact for |k| < 512
	exp32Ln2LoBits = 0x35BFBE8E // fl(ln 2 - ln2Hi)
	exp32ShiftBits = 0x4B400000 // 1.5 * 2^23: adding then subtracting it rounds to an integer, ties to even
	// Taylor coefficients 1/n! for n = 2..7, each rounded to float32.
	exp32C2Bits = 0x3F000000
	exp32C3Bits = 0x3E2AAAAB
	exp32C4Bits = 0x3D2AAAAB
	exp32C5Bits = 0x3C088889
	exp32C6Bits = 0x3AB60B61
	exp32C7Bits = 0x39500D01
	// Exp32OverflowBits is the largest float32 whose exponential is finite
	// (88.72283...); every larger input gives +Inf.
	exp32OverflowBits = 0x42B17217
)

// Exp32UnderflowBelow is the input below which Exp32 returns +0 without
// computing: exp(-104) is under half the smallest subnormal (2^-150).
const Exp32UnderflowBelow float32 = -104

// Exp32 is the project's canonical float32 exponential (DESIGN.md section
// 8): every backend computes it with the same operations in the same order,
// so the compressor's softmax is bit-identical everywhere. It is within 1
// ulp of the true value for every float32 input (an exhaustive test checks
// all 2^32); NaN returns its input, +Inf and every x above 88.7228317
// (the last input with a finite result) give +Inf, -Inf and every x below
// -104 give +0, and results in the subnormal range are rounded once.
//
// The steps, each float32 operation rounded on its own (no FMA):
//
//	t  = fl(x * log2e)
//	kf = fl(fl(t + 1.5*2^23) - 1.5*2^23)       // round t to an integer
//	r  = fl(fl(x - fl(kf*ln2Hi)) - fl(kf*ln2Lo)) // Cody-Waite; the first
//	                                              // subtraction is exact
//	p  = c7; p = fl(fl(p*r) + c_n) for n = 6, 5, 4, 3, 2
//	y  = fl(fl(fl(p * fl(r*r)) + r) + 1)         // exp(r), |r| <= 0.347
//	y  = fl(fl(y * 2^(k>>1)) * 2^(k-(k>>1)))      // two exact powers of two:
//	                                              // the first product is exact,
//	                                              // the second rounds once
//
// Like E4M3FromF32 it touches no memory: uninstrumented under -race.
//
//go:norace
//go:nocheckptr
func Exp32(x float32) float32 {
	if x != x { // NaN
		return x
	}
	if x > math.Float32frombits(exp32OverflowBits) {
		return float32(math.Inf(1))
	}
	if x < Exp32UnderflowBelow {
		return 0
	}
	shift := math.Float32frombits(exp32ShiftBits)
	t := float32(x * math.Float32frombits(exp32Log2EBits))
	j := float32(t + shift)
	kf := float32(j - shift)
	k := int32(kf) // in [-150, 128]
	hi := float32(kf * math.Float32frombits(exp32Ln2HiBits))
	rh := float32(x - hi)
	lo := float32(kf * math.Float32frombits(exp32Ln2LoBits))
	r := float32(rh - lo)

	p := math.Float32frombits(exp32C7Bits)
	p = float32(float32(p*r) + math.Float32frombits(exp32C6Bits))
	p = float32(float32(p*r) + math.Float32frombits(exp32C5Bits))
	p = float32(float32(p*r) + math.Float32frombits(exp32C4Bits))
	p = float32(float32(p*r) + math.Float32frombits(exp32C3Bits))
	p = float32(float32(p*r) + math.Float32frombits(exp32C2Bits))
	r2 := float32(r * r)
	q := float32(p * r2)
	s := float32(q + r)
	y := float32(s + 1)

	k1 := k >> 1 // floor(k/2), in [-75, 64]
	k2 := k - k1 // in [-75, 64]
	y = float32(y * exp32Pow2(k1))
	y = float32(y * exp32Pow2(k2))
	return y
}

// exp32Pow2 returns 2^k for k in [-126, 127] from its bits, as the CUDA
// port does with __int_as_float.
func exp32Pow2(k int32) float32 { return math.Float32frombits(uint32(k+127) << 23) }
