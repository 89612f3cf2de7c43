package kvcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

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
// No byte outside the token's own value row and scale bytes changes. Bad
// arguments (an invalid format, a page size that is not a power of two in
// [1, MaxPageSize], a page shorter than f.PageBytes(pageSize), off outside
// [0, pageSize), a nil y, a kvScale that is not finite and positive for
// fp8_pertensor) are an error that names them, and nothing is written.
func EncodeToken(f Format, page []byte, pageSize, off int, y *[512]float32, kvScale float32) error {
	if err := checkToken("EncodeToken", f, page, pageSize, off, kvScale); err != nil {
		return err
	}
	if y == nil {
		return errors.New("kvcache: EncodeToken: y is nil")
	}
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
	return nil
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
// The same bad arguments as EncodeToken's are an error.
func DecodeToken(f Format, page []byte, pageSize, off int, kvScale float32) ([512]float32, error) {
	var y [512]float32
	if err := checkToken("DecodeToken", f, page, pageSize, off, kvScale); err != nil {
		return y, err
	}
	vo := f.ValueOffset(pageSize, off)
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
	return y, nil
}

// checkToken reports the first bad argument of EncodeToken or DecodeToken.
func checkToken(fn string, f Format, page []byte, pageSize, off int, kvScale float32) error {
	if !f.Valid() {
		return fmt.Errorf("kvcache: %s: invalid format %d", fn, uint8(f))
	}
	if !isPowerOfTwo(pageSize) || pageSize > MaxPageSize {
		return fmt.Errorf("kvcache: %s: page size %d must be a power of two in [1, %d]", fn, pageSize, MaxPageSize)
	}
	if want := f.PageBytes(pageSize); len(page) < want {
		return fmt.Errorf("kvcache: %s: page is %d bytes, format %v with page size %d needs %d",
			fn, len(page), f, pageSize, want)
	}
	if off < 0 || off >= pageSize {
		return fmt.Errorf("kvcache: %s: in-page offset %d out of range [0, %d)", fn, off, pageSize)
	}
	if s := float64(kvScale); f == FormatFP8PerTensor && (!(s > 0) || math.IsInf(s, 0)) {
		return fmt.Errorf("kvcache: %s: kvScale %v must be finite and positive for format %v", fn, kvScale, f)
	}
	return nil
}
