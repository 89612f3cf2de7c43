package numerics

import (
	"fmt"
	"math"
)

// ActQuantBlockSize is the number of values sharing one scale in act_quant
// (DESIGN.md section 7 steps 1 and 3): the activations' 128-wide blocks.
const ActQuantBlockSize = 128

// SumSquaresN returns S for a row of any width W = len(x), a positive
// multiple of 32, in the canonical order of DESIGN.md section 4.1: partial j
// sums fl(x_i*x_i) for i in [jW/32, (j+1)W/32) ascending, then the xor
// butterfly over d = 16, 8, 4, 2, 1. SumSquares is the W = 512 case.
func SumSquaresN(x []float32) float32 {
	w := len(x)
	if w == 0 || w%Partials != 0 {
		panic(fmt.Sprintf("numerics: SumSquaresN of %d values, want a positive multiple of %d", w, Partials))
	}
	n := w / Partials
	var p [Partials]float32
	for j := range p {
		var s float32
		for _, v := range x[j*n : (j+1)*n] {
			sq := float32(v * v)
			s = float32(s + sq)
		}
		p[j] = s
	}
	for d := Partials / 2; d >= 1; d /= 2 {
		var next [Partials]float32
		for j := range p {
			next[j] = float32(p[j] + p[j^d])
		}
		p = next
	}
	return p[0]
}

// RMSInvN returns r = fl(1 / fl(sqrt(fl(fl(S/W) + eps)))) for a row of width
// w (exact in float32: w <= 2^24) and the config's eps.
func RMSInvN(sumSq float32, w int, eps float32) float32 {
	mean := float32(sumSq / float32(w))
	v := float32(mean + eps)
	root := float32(math.Sqrt(float64(v))) // the IEEE float32 sqrt: float64 has room for an exact double rounding
	return float32(1 / root)
}

// ActQuantBlock quantizes one block of values (128 in the chain) with a
// UE8M0 scale: the scale byte e comes from UE8M0 (max |x| with NaN ignored,
// floored at 1e-4, t = fl(a/448) ceiled to a power of two, e <= 254), each
// q[i] = e4m3(fl(x[i] * 2^(127-e))) and the returned dequantization scale is
// 2^(e-127) as float32. DESIGN.md writes the quotient x / 2^(e-127): both
// factors are exact powers of two (2^-127, a subnormal, included), so the
// product and the quotient are the same correctly rounded real number.
func ActQuantBlock(x []float32, q []uint8) float32 {
	q = q[:len(x)]
	e, inv := UE8M0(GroupAbsMax(x))
	for i, v := range x {
		q[i] = E4M3FromF32(float32(v * inv))
	}
	return UE8M0Scale(e)
}
