package kvcache

import (
	"encoding/binary"
	"fmt"

	"github.com/dsv4mla/prologue/numerics"
)

// EncodeToken stores one token's 512 values y (post-norm, post-RoPE; each
// already a bf16 value widened to float32: nope 0..447, rope 448..511) at
// in-page offset off of page, in format f. kvScale is used by
// fp8_pertensor only.
//
//   - fp8_ue8m0: per 64-value nope group, (e, inv) = UE8M0(max|y|) and
//     q = e4m3(fl(y*inv)); 448 e4m3 bytes, then 64 bf16 rope values
//     little-endian, at ValueOffset; the 7 exponent bytes at ScaleOffset.
//     Byte 7 of the scale slot is padding and is never written.
//   - bf16: 512 little-endian bf16 at ValueOffset.
//   - fp8_pertensor: 512 bytes e4m3(fl(y*kvScale)) at ValueOffset.
//
// No byte outside the token's own value row and scale bytes changes. It
// panics if f is invalid, page is shorter than f.PageBytes(pageSize), or off
// is outside [0, pageSize).
func EncodeToken(f Format, page []byte, pageSize, off int, y *[512]float32, kvScale float32) {
	checkPage(f, page, pageSize)
	vo := f.ValueOffset(pageSize, off)
	switch f {
	case FormatFP8UE8M0:
		vals := page[vo : vo+UE8M0ValueBytes]
		so := f.ScaleOffset(pageSize, off)
		scales := page[so : so+numerics.NumGroups]
		for g := range numerics.NumGroups {
			group := y[g*numerics.GroupSize : (g+1)*numerics.GroupSize]
			e, inv := numerics.UE8M0(numerics.GroupAbsMax(group))
			out := vals[g*numerics.GroupSize : (g+1)*numerics.GroupSize]
			for i, v := range group {
				out[i] = numerics.E4M3FromF32(float32(v * inv))
			}
			scales[g] = e
		}
		rope := vals[UE8M0RopeOffset:]
		for i, v := range y[numerics.NopeDim:] {
			binary.LittleEndian.PutUint16(rope[2*i:], numerics.BF16FromF32(v))
		}
	case FormatBF16:
		vals := page[vo : vo+1024]
		for i, v := range y {
			binary.LittleEndian.PutUint16(vals[2*i:], numerics.BF16FromF32(v))
		}
	case FormatFP8PerTensor:
		vals := page[vo : vo+512]
		for i, v := range y {
			vals[i] = numerics.E4M3FromF32(float32(v * kvScale))
		}
	}
}

// DecodeToken reads back the token at in-page offset off of page and
// dequantizes it:
//
//   - fp8_ue8m0: nope value i is e4m3(q_i) * 2^(e_g-127) for its group g;
//     rope values are the stored bf16, exactly.
//   - bf16: the stored values, exactly.
//   - fp8_pertensor: e4m3(q_i) / kvScale (IEEE float32 division), the
//     inverse of the encoder's multiplication by kvScale.
//
// It panics on the same bad arguments as EncodeToken.
func DecodeToken(f Format, page []byte, pageSize, off int, kvScale float32) [512]float32 {
	checkPage(f, page, pageSize)
	vo := f.ValueOffset(pageSize, off)
	var y [512]float32
	switch f {
	case FormatFP8UE8M0:
		vals := page[vo : vo+UE8M0ValueBytes]
		so := f.ScaleOffset(pageSize, off)
		for g := range numerics.NumGroups {
			scale := numerics.UE8M0Scale(page[so+g])
			for i := g * numerics.GroupSize; i < (g+1)*numerics.GroupSize; i++ {
				y[i] = float32(numerics.F32FromE4M3(vals[i]) * scale)
			}
		}
		for i := range numerics.RopeDim {
			b := binary.LittleEndian.Uint16(vals[UE8M0RopeOffset+2*i:])
			y[numerics.NopeDim+i] = numerics.F32FromBF16(b)
		}
	case FormatBF16:
		vals := page[vo : vo+1024]
		for i := range y {
			y[i] = numerics.F32FromBF16(binary.LittleEndian.Uint16(vals[2*i:]))
		}
	case FormatFP8PerTensor:
		vals := page[vo : vo+512]
		for i := range y {
			y[i] = float32(numerics.F32FromE4M3(vals[i]) / kvScale)
		}
	}
	return y
}

func checkPage(f Format, page []byte, pageSize int) {
	if !f.Valid() {
		panic(fmt.Sprintf("kvcache: invalid format %d", uint8(f)))
	}
	if want := f.PageBytes(pageSize); len(page) < want {
		panic(fmt.Sprintf("kvcache: page is %d bytes, format %v with page size %d needs %d",
			len(page), f, pageSize, want))
	}
}
