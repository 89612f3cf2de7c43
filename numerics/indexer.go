package numerics

import (
	"fmt"
	"math"
)

// Dimensions of the lightning indexer's rows (DESIGN.md section 9).
const (
	// HadamardDim is the width of the indexer's Hadamard transform: one
	// 128-value head row (64 nope, then 64 rope).
	HadamardDim = 128

	// MXFP4Block is the number of values sharing one MXFP4 scale byte.
	MXFP4Block = 32

	// MXFP4RowBytes is the size of one quantized 128-value row: 64 bytes of
	// nibbles, then 4 scale bytes.
	MXFP4RowBytes = HadamardDim/2 + HadamardDim/MXFP4Block
)

// HadamardScale is c = fl32(128^-0.5), the normalization of Hadamard128.
var HadamardScale = float32(1 / math.Sqrt(HadamardDim))

// Hadamard128 writes the normalized Walsh-Hadamard transform (Sylvester
// order, H[i][j] = (-1)^popcount(i&j) / sqrt(128)) of the 128 bf16 values of
// src into dst, as bf16 bits: widen to float32; 7 butterfly stages h = 1, 2,
// 4, ..., 64, each turning the pair (j, j+h) for every j with j&h == 0 into
// (fl(a+b), fl(a-b)); then fl(v * c) with c = HadamardScale; then bf16
// (nearest even, the canonical NaN). dst and src may be the same slice.
func Hadamard128(dst, src []uint16) {
	if len(src) < HadamardDim || len(dst) < HadamardDim {
		panic(fmt.Sprintf("numerics: Hadamard128 of %d values into %d, want %d", len(src), len(dst), HadamardDim))
	}
	var v [HadamardDim]float32
	for i := range v {
		v[i] = F32FromBF16(src[i])
	}
	for h := 1; h < HadamardDim; h *= 2 {
		for j := 0; j < HadamardDim; j++ {
			if j&h != 0 {
				continue
			}
			a, b := v[j], v[j+h]
			v[j] = float32(a + b)
			v[j+h] = float32(a - b)
		}
	}
	c := HadamardScale
	for i := range v {
		dst[i] = BF16FromF32(float32(v[i] * c))
	}
}

// MXFP4Floor is 6 * 2^-126: the smallest amax an MXFP4 block is scaled for,
// so that an all-zero block still gets a normal scale (byte 1).
var MXFP4Floor = 6 * Pow2(-126)

// MXFP4InvSix is fl32(1/6), the constant the reference multiplies amax by.
var MXFP4InvSix = float32(1.0 / 6)

// MXFP4Exponent returns the scale byte e of an MXFP4 block whose absolute
// maximum (NaN already ignored) is amax: a = max(amax, 6*2^-126);
// t = fl(a * fl32(1/6)); e = biased exponent of t, plus one when t's mantissa
// is non-zero; e is clamped to 254 (only +Inf gets there). The block's values
// are multiplied by 2^(127-e) before e2m1 and dequantize as
// e2m1 * 2^(e-127).
func MXFP4Exponent(amax float32) uint8 {
	a := amax
	if !(a >= MXFP4Floor) { // also catches NaN, though callers pass none
		a = MXFP4Floor
	}
	return ceilExponent(float32(a * MXFP4InvSix))
}

// E2M1FromF32 returns the e2m1 nibble of x: round to nearest, ties to even,
// on the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating at 6 (±Inf too); bit
// 3 is the sign, so -0 and a negative value that rounds to zero give 0x8. A
// NaN gives +6 (0x7): e2m1 has no NaN, and both backends implement the
// conversion in software (sm_90 has no e2m1 instruction), so the project
// pins it here.
func E2M1FromF32(x float32) uint8 {
	u := math.Float32bits(x)
	if u&0x7FFFFFFF > 0x7F800000 {
		return 0x7
	}
	sign := uint8(u>>28) & 0x8
	a := math.Float32frombits(u & 0x7FFFFFFF)
	var m uint8
	switch {
	case a <= 0.25: // the tie 0.25 goes to the even 0
		m = 0
	case a < 0.75:
		m = 1
	case a <= 1.25: // ties 0.75 and 1.25 go to the even 1
		m = 2
	case a < 1.75:
		m = 3
	case a <= 2.5: // ties 1.75 and 2.5 go to the even 2
		m = 4
	case a < 3.5:
		m = 5
	case a <= 5: // ties 3.5 and 5 go to the even 4
		m = 6
	default:
		m = 7
	}
	return sign | m
}

// e2m1Grid holds the magnitudes of the eight e2m1 codes.
var e2m1Grid = [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// E2M1Value decodes the low four bits of nibble (bit 3 the sign; 0x8 is -0).
func E2M1Value(nibble uint8) float32 {
	v := e2m1Grid[nibble&7]
	if nibble&8 != 0 {
		return -v
	}
	return v
}

// QuantizeMXFP4 quantizes v (len(v) a positive multiple of MXFP4Block) block
// by block: e = MXFP4Exponent(max |v| over the block, NaN ignored), each
// q = E2M1FromF32(fl(v * 2^(127-e))). dst receives len(v)/2 nibble bytes
// (element 2k in the low nibble of byte k, 2k+1 in the high one), then
// len(v)/32 scale bytes: for a 128-value row, MXFP4RowBytes bytes.
func QuantizeMXFP4(dst []byte, v []float32) {
	n := len(v)
	if n == 0 || n%MXFP4Block != 0 {
		panic(fmt.Sprintf("numerics: QuantizeMXFP4 of %d values, want a positive multiple of %d", n, MXFP4Block))
	}
	if len(dst) < n/2+n/MXFP4Block {
		panic(fmt.Sprintf("numerics: QuantizeMXFP4 of %d values into %d bytes, want %d", n, len(dst), n/2+n/MXFP4Block))
	}
	scales := dst[n/2:]
	for b := 0; b < n/MXFP4Block; b++ {
		blk := v[b*MXFP4Block : (b+1)*MXFP4Block]
		e := MXFP4Exponent(GroupAbsMax(blk))
		inv := Pow2(127 - int(e))
		scales[b] = e
		for k := 0; k < MXFP4Block; k += 2 {
			lo := E2M1FromF32(float32(blk[k] * inv))
			hi := E2M1FromF32(float32(blk[k+1] * inv))
			dst[(b*MXFP4Block+k)/2] = lo | hi<<4
		}
	}
}

// DequantizeMXFP4 decodes len(dst) values (a positive multiple of
// MXFP4Block) from src in QuantizeMXFP4's layout: dst[i] = E2M1Value(nibble
// i) * 2^(e-127) with the scale byte e of i's block (exact in float32).
func DequantizeMXFP4(dst []float32, src []byte) {
	n := len(dst)
	if n == 0 || n%MXFP4Block != 0 {
		panic(fmt.Sprintf("numerics: DequantizeMXFP4 of %d values, want a positive multiple of %d", n, MXFP4Block))
	}
	if len(src) < n/2+n/MXFP4Block {
		panic(fmt.Sprintf("numerics: DequantizeMXFP4 of %d values from %d bytes, want %d", n, len(src), n/2+n/MXFP4Block))
	}
	scales := src[n/2:]
	for i := range dst {
		nib := src[i/2] >> (4 * uint(i&1)) & 0xF
		dst[i] = float32(E2M1Value(nib) * UE8M0Scale(scales[i/MXFP4Block]))
	}
}
