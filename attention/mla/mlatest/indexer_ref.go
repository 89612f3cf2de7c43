package mlatest

import (
	"encoding/binary"
	"math"

	"github.com/dsv4mla/prologue/numerics"
)

// The reference of the indexer's prologue (DESIGN.md section 9), scalar and
// one row at a time. It shares nothing with numerics' Hadamard128 and MXFP4
// or package compressor: the transform is the recursive Sylvester
// construction, e2m1 is the nearest grid point in float64, the scale
// exponent comes from math.Frexp; only the scalar bf16 conversions and Exp32
// (in the pooling) come from numerics.

// refIndexerRope rotates the 32 pairs of dims [64, 128) of a 128-value row
// with the table's row pos (section 4.4's rounding).
func refIndexerRope(y []float32, table []byte, pos int) {
	for k := 0; k < 32; k++ {
		c := f32At(table, pos*64+2*k)
		s := f32At(table, pos*64+2*k+1)
		y0, y1 := y[64+2*k], y[64+2*k+1]
		a := float32(y0 * c)
		b := float32(y1 * s)
		e := float32(y0 * s)
		f := float32(y1 * c)
		y[64+2*k] = numerics.RoundBF16(float32(a - b))
		y[64+2*k+1] = numerics.RoundBF16(float32(e + f))
	}
}

// refWHT is the unnormalized Walsh-Hadamard transform in place, Sylvester's
// recursion H_2n = [[H_n, H_n], [H_n, -H_n]]: both halves transformed, then
// (a+b, a-b) across them, each sum one float32 rounding. (The rounding of
// every value follows the same operations as the butterfly stages
// h = 1, 2, ..., n/2 of the contract.)
func refWHT(v []float32) {
	n := len(v)
	if n == 1 {
		return
	}
	lo, hi := v[:n/2], v[n/2:]
	refWHT(lo)
	refWHT(hi)
	for j := range lo {
		a, b := lo[j], hi[j]
		lo[j] = float32(a + b)
		hi[j] = float32(a - b)
	}
}

// refHadamard returns bf16(fl(WHT(v) * fl32(128^-0.5))) of 128 bf16 values.
func refHadamard(v []float32) []float32 {
	out := append([]float32(nil), v[:128]...)
	refWHT(out)
	c := float32(1 / math.Sqrt(128))
	for i := range out {
		out[i] = numerics.RoundBF16(float32(out[i] * c))
	}
	return out
}

// refE2M1 is the nibble of x: the nearest of {0, .5, 1, 1.5, 2, 3, 4, 6},
// ties to the even code, saturating at 6, the sign in bit 3, NaN as +6.
func refE2M1(x float32) byte {
	if x != x {
		return 7
	}
	var sign byte
	if math.Signbit(float64(x)) {
		sign = 8
	}
	a := math.Min(math.Abs(float64(x)), 6)
	grid := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	best := 0
	for code := 1; code < 8; code++ {
		d, bd := math.Abs(a-grid[code]), math.Abs(a-grid[best])
		if d < bd || (d == bd && code%2 == 0) {
			best = code
		}
	}
	return sign | byte(best)
}

// refMXFP4 quantizes 128 values into 64 nibble bytes (low nibble = even
// element) and 4 scale bytes: per block of 32, a = max(max |v| without NaN,
// 6*2^-126), t = fl(a * fl32(1/6)), e = the biased exponent of t, plus one
// when t is not a power of two, at most 254; q = e2m1(v * 2^(127-e)).
func refMXFP4(v []float32, out []byte) {
	for b := 0; b < 4; b++ {
		blk := v[32*b : 32*b+32]
		var amax float64
		for _, x := range blk {
			if a := math.Abs(float64(x)); a > amax { // NaN never wins
				amax = a
			}
		}
		amax = math.Max(amax, 6*math.Ldexp(1, -126))
		t := float32(float32(amax) * float32(1.0/6))
		frac, exp := math.Frexp(float64(t)) // t = frac * 2^exp, frac in [0.5, 1)
		e := exp - 1 + 127
		if frac != 0.5 {
			e++
		}
		if math.IsInf(float64(t), 1) { // an Inf in the block: the clamp of section 4.5
			e = 254
		}
		e = min(e, 254)
		out[64+b] = byte(e)
		for i := 0; i < 32; i += 2 {
			lo := refE2M1(float32(float64(blk[i]) * math.Ldexp(1, 127-e)))
			hi := refE2M1(float32(float64(blk[i+1]) * math.Ldexp(1, 127-e)))
			out[(32*b+i)/2] = lo | hi<<4
		}
	}
}

// refIndexerEntry is one indexer cache entry from its 128 pooled float32
// values: refIndexerKey, then Hadamard and MXFP4.
func refIndexerEntry(pooled []float32, norm []byte, table []byte, pos int, eps float32) []byte {
	out := make([]byte, 68)
	refMXFP4(refHadamard(refIndexerKey(pooled, norm, table, pos, eps)), out)
	return out
}

// refIndexerKey is an indexer key before the rotation: bf16 of the pooled
// values, RMSNorm with the weight (32 partial sums of 4 squares, the xor
// butterfly), RoPE at pos.
func refIndexerKey(pooled []float32, norm []byte, table []byte, pos int, eps float32) []float32 {
	x := make([]float32, 128)
	for i := range x {
		x[i] = numerics.RoundBF16(pooled[i])
	}
	lanes := make([]float32, 32)
	for j := range lanes {
		for i := 4 * j; i < 4*j+4; i++ {
			lanes[j] = float32(lanes[j] + float32(x[i]*x[i]))
		}
	}
	for _, d := range []int{16, 8, 4, 2, 1} {
		next := make([]float32, 32)
		for j := range lanes {
			next[j] = float32(lanes[j] + lanes[j^d])
		}
		lanes = next
	}
	mean := float32(lanes[0] / 128)
	r := float32(1 / float32(math.Sqrt(float64(float32(mean+eps)))))
	y := make([]float32, 128)
	for i := range y {
		y[i] = numerics.RoundBF16(float32(float32(x[i]*r) * f32At(norm, i)))
	}
	refIndexerRope(y, table, pos)
	return y
}

// refIndexerQueryRow is one (token, head) query row from its 128 bf16
// input values: RoPE at pos, Hadamard, MXFP4 (no norm: the reference feeds
// the GEMM's output straight in).
func refIndexerQueryRow(in []byte, table []byte, pos int, rotate bool) []byte {
	y := make([]float32, 128)
	for i := range y {
		y[i] = bf16At(in, i)
	}
	refIndexerRope(y, table, pos)
	if rotate {
		y = refHadamard(y)
	}
	out := make([]byte, 68)
	refMXFP4(y, out)
	return out
}

// refIndexerWeight is bf16(fl(bf16(w) * fl32(2^-6.5))) as bf16 bits.
func refIndexerWeight(w float32) []byte {
	c := float32(math.Pow(2, -6.5))
	out := make([]byte, 2)
	binary.LittleEndian.PutUint16(out, numerics.BF16FromF32(float32(numerics.RoundBF16(w)*c)))
	return out
}

// refIndexerQueryFP8 is one (token, head) row in the FP8 layout (DESIGN.md
// section 9): RoPE at pos and Hadamard as refIndexerQueryRow, then one
// power-of-two scale over the 128 values: a = max |y| (NaN ignored) floored
// at 1e-4, t = fl(a / 448), e = t's biased exponent plus one for a non-zero
// mantissa, at most 254; the 128 bytes e4m3(fl(y_i * 2^(127-e))), and the
// head weight fl(fl(bf16(w) * fl32(2^-6.5)) * 2^(e-127)) as float32 bits,
// a NaN as 0x7FFFFFFF.
func refIndexerQueryFP8(in []byte, table []byte, pos int, w float32) (q, wf []byte) {
	y := make([]float32, 128)
	for i := range y {
		y[i] = bf16At(in, i)
	}
	refIndexerRope(y, table, pos)
	y = refHadamard(y)
	var amax float32
	for _, v := range y {
		if a := float32(math.Abs(float64(v))); a > amax { // false for NaN
			amax = a
		}
	}
	amax = max(amax, 1e-4)
	tb := math.Float32bits(float32(amax / 448))
	e := int(tb >> 23 & 0xFF)
	if tb&0x7FFFFF != 0 {
		e++
	}
	e = min(e, 254)
	inv := float32(math.Ldexp(1, 127-e))
	q = make([]byte, 128)
	for i, v := range y {
		q[i] = numerics.E4M3FromF32(float32(v * inv))
	}
	c := float32(math.Pow(2, -6.5))
	ws := float32(numerics.RoundBF16(w) * c)
	wv := ws * float32(math.Ldexp(1, e-127))
	wb := math.Float32bits(wv)
	if math.IsNaN(float64(wv)) {
		wb = 0x7FFFFFFF // section 9: a NaN head weight is the float32 NaN 0x7FFFFFFF
	}
	wf = binary.LittleEndian.AppendUint32(nil, wb)
	return q, wf
}

// refDequantMXFP4 decodes a 68-byte row to 128 float64 values.
func refDequantMXFP4(row []byte) []float64 {
	grid := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	out := make([]float64, 128)
	for i := range out {
		nib := row[i/2] >> (4 * (i % 2)) & 0xF
		v := grid[nib&7] * math.Ldexp(1, int(row[64+i/32])-127)
		if nib&8 != 0 {
			v = -v
		}
		out[i] = v
	}
	return out
}
