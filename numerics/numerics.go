package numerics

import (
	"encoding/binary"
	"math"
)

// Dimensions of one DSv4 MLA row.
const (
	HeadDim   = 512 // values per latent or per-head Q row
	NopeDim   = 448 // leading values without position encoding
	RopeDim   = 64  // trailing values rotated by RoPE
	RopePairs = RopeDim / 2
	GroupSize = 64 // nope values sharing one UE8M0 exponent
	NumGroups = NopeDim / GroupSize

	// Partials and PartialLen describe the canonical reduction: 32 partial
	// sums (one per warp lane) of 16 consecutive squares each.
	Partials   = 32
	PartialLen = HeadDim / Partials
)

// DefaultEps is rms_norm_eps of both published DSv4 configs. The kernels
// take the config's value (mla.LayerArgs.Eps); this is only the default
// of the embedded configs and of tests.
const DefaultEps float32 = 1e-6

// E4M3Max is the largest finite e4m3 value.
const E4M3Max float32 = 448

// UE8M0Floor keeps an all-zero group from producing a zero scale.
const UE8M0Floor float32 = 1e-4

// SumSquares returns S for a 512-value row in the canonical order: lane j
// sums fl(x_i*x_i) for i in [16j, 16j+16) ascending, then a butterfly over
// d = 16, 8, 4, 2, 1 adds p_j and p_{j xor d} for all j at once, as a warp
// shuffle does. Every lane ends with the same value. SumSquaresN takes any
// width.
func SumSquares(x []float32) float32 { return SumSquaresN(x[:HeadDim]) }

// RMSInv returns r = fl(1 / fl(sqrt(fl(fl(S/512) + eps)))), eps being the
// config's rms_norm_eps as a float32.
func RMSInv(sumSq, eps float32) float32 { return RMSInvN(sumSq, HeadDim, eps) }

// Rope rotates one GPT-J pair (y0, y1) by (c, s) and returns both results
// rounded to bf16 and widened back:
// y0' = bf16(fl(fl(y0*c) - fl(y1*s))), y1' = bf16(fl(fl(y0*s) + fl(y1*c))).
func Rope(y0, y1, c, s float32) (float32, float32) {
	a := float32(y0 * c)
	b := float32(y1 * s)
	r0 := float32(a - b)
	d := float32(y0 * s)
	e := float32(y1 * c)
	r1 := float32(d + e)
	return RoundBF16(r0), RoundBF16(r1)
}

// GroupAbsMax returns max |y| over y, ignoring NaN (as fmaxf does). An
// all-NaN or empty group gives 0.
func GroupAbsMax(y []float32) float32 {
	var a float32
	for _, v := range y {
		av := float32(math.Abs(float64(v)))
		if av > a { // false for NaN
			a = av
		}
	}
	return a
}

// UE8M0 returns the stored exponent byte and the exact inverse scale for a
// group whose absolute maximum (NaN already ignored) is amax:
// a = max(amax, 1e-4); t = fl(a/448); e = biased exponent of t, plus one
// when t has a non-zero mantissa; e is clamped to 254; inv = 2^(127-e).
func UE8M0(amax float32) (exp uint8, inv float32) {
	a := amax
	if !(a >= UE8M0Floor) { // also catches NaN, though callers pass none
		a = UE8M0Floor
	}
	e := ceilExponent(float32(a / E4M3Max))
	return e, Pow2(127 - int(e))
}

// ceilExponent is section 4.5's scale exponent of a non-negative t: the
// biased exponent of t, plus one when its mantissa is non-zero (so 2^(e-127)
// is the least power of two >= t for normal t), clamped to 254. UE8M0 and
// MXFP4Exponent share it.
func ceilExponent(t float32) uint8 {
	bits := math.Float32bits(t)
	e := bits >> 23 & 0xFF
	if bits&0x7FFFFF != 0 {
		e++
	}
	return uint8(min(e, 254))
}

// UE8M0ExponentBits returns the exponent byte of UE8M0(amax) from the bits
// of a = max(amax, 1e-4) alone, without the division (the kernels' form):
// e = (bits(a) >> 23) - 8, plus one when a's mantissa field exceeds
// 0x600000 (1.m > 1.75); +Inf gives 254.
//
// Why it is UE8M0's exponent: 448 = 1.75 * 2^8 and a = 1.m * 2^A with
// A >= -14 (a >= 1e-4). If 1.m = 1.75, t = fl(a/448) = 2^(A-8) exactly. If
// 1.m > 1.75 (so >= 1.75 + 2^-23), a/448 lies in [2^(A-8) * (1 + 2^-23/1.75),
// 2^(A-8) * 8/7): above the midpoint 2^(A-8) * (1 + 2^-24) between 2^(A-8)
// and the next float, so t has exponent A-8 and a non-zero mantissa. If
// 1.m < 1.75, a/448 lies in [2^(A-9) * 8/7, 2^(A-8) * (1 - 2^-23/1.75)]:
// below the midpoint 2^(A-8) * (1 - 2^-25), so t has exponent A-9 and a
// non-zero mantissa. t is normal throughout (t >= 2^-23). The largest finite
// a gives 247, so the cap 254 binds only for +Inf (t = +Inf: exponent field
// 255, mantissa zero). TestUE8M0ExponentBits and, over every float32,
// TestUE8M0ExponentBitsExhaustive check it against UE8M0.
func UE8M0ExponentBits(amax float32) uint8 {
	a := amax
	if !(a >= UE8M0Floor) { // also catches NaN, as UE8M0
		a = UE8M0Floor
	}
	b := math.Float32bits(a)
	if b >= 0x7F800000 { // +Inf
		return 254
	}
	e := b>>23 - 8
	if b&0x7FFFFF > 0x600000 {
		e++
	}
	return uint8(e)
}

// UE8M0Scale returns 2^(e-127), the dequantization factor of exponent byte e.
func UE8M0Scale(e uint8) float32 { return Pow2(int(e) - 127) }

// Pow2 returns 2^k exactly for k in [-149, 127], including subnormals.
func Pow2(k int) float32 {
	switch {
	case k > 127:
		return float32(math.Inf(1))
	case k >= -126:
		return math.Float32frombits(uint32(k+127) << 23)
	case k >= -149:
		return math.Float32frombits(1 << uint(k+149))
	default:
		return 0
	}
}

// F32Bytes encodes v as little-endian float32s, the layout of every float32
// buffer the backends share (weights, scales, RoPE tables).
func F32Bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
	}
	return out
}

// F32sFromBytes decodes little-endian float32s (the inverse of F32Bytes;
// a trailing partial value is ignored).
func F32sFromBytes(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}
