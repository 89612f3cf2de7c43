package kvcache

import (
	"fmt"
	"math/bits"
)

// Format is a KV cache storage format. The zero value is [FormatFP8UE8M0],
// the default, so a zero Config asks for the default format.
type Format uint8

const (
	// FormatFP8UE8M0 stores 448 e4m3 nope values with one UE8M0 exponent per
	// 64-value group, and the 64 rope values as bf16 (584 bytes per token).
	FormatFP8UE8M0 Format = iota
	// FormatBF16 stores all 512 values as bf16 (1024 bytes per token).
	FormatBF16
	// FormatFP8PerTensor stores all 512 values as e4m3 scaled by one
	// per-tensor kv_scale (512 bytes per token).
	FormatFP8PerTensor

	numFormats
)

// Sizes of the fp8_ue8m0 layout.
const (
	// UE8M0ValueBytes is the values-region stride of one token: 448 e4m3
	// bytes and 64 little-endian bf16 rope values.
	UE8M0ValueBytes = 448 + 64*2
	// UE8M0ScaleBytes is the scales-region stride of one token: 7 exponent
	// bytes and one padding byte that is never written.
	UE8M0ScaleBytes = 8
	// UE8M0RopeOffset is where the bf16 rope values start inside a token's
	// values region.
	UE8M0RopeOffset = 448
)

var formatNames = [numFormats]string{
	FormatFP8UE8M0:     "fp8_ue8m0",
	FormatBF16:         "bf16",
	FormatFP8PerTensor: "fp8_pertensor",
}

// Formats lists every valid format, in declaration order.
func Formats() []Format { return []Format{FormatFP8UE8M0, FormatBF16, FormatFP8PerTensor} }

// Valid reports whether f is one of the declared formats.
func (f Format) Valid() bool { return f < numFormats }

// String returns the format's name as ParseFormat accepts it; an invalid
// format prints as Format(n).
func (f Format) String() string {
	if !f.Valid() {
		return fmt.Sprintf("Format(%d)", uint8(f))
	}
	return formatNames[f]
}

// ParseFormat returns the format named s ("fp8_ue8m0", "bf16" or
// "fp8_pertensor"; exact, lower case).
func ParseFormat(s string) (Format, error) {
	for f, name := range formatNames {
		if s == name {
			return Format(f), nil
		}
	}
	return 0, fmt.Errorf("kvcache: unknown format %q (want fp8_ue8m0, bf16 or fp8_pertensor)", s)
}

// Set parses s into f, so that *Format is a flag.Value.
func (f *Format) Set(s string) error {
	p, err := ParseFormat(s)
	if err != nil {
		return err
	}
	*f = p
	return nil
}

// MarshalText implements encoding.TextMarshaler; an invalid format is an error.
func (f Format) MarshalText() ([]byte, error) {
	if !f.Valid() {
		return nil, fmt.Errorf("kvcache: cannot marshal invalid format %d", uint8(f))
	}
	return []byte(f.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (f *Format) UnmarshalText(b []byte) error { return f.Set(string(b)) }

// BytesPerToken returns the bytes one token occupies: 584, 1024 or 512.
func (f Format) BytesPerToken() int {
	switch f {
	case FormatFP8UE8M0:
		return UE8M0ValueBytes + UE8M0ScaleBytes
	case FormatBF16:
		return 512 * 2
	case FormatFP8PerTensor:
		return 512
	}
	panic(fmt.Sprintf("kvcache: invalid format %d", uint8(f)))
}

// PageBytes returns the bytes of one page of pageSize tokens. For
// fp8_ue8m0 the page is padded to a whole number of 576-byte value rows:
// ceil(584*P/576)*576 (37440 for P = 64). It panics if f is invalid or
// pageSize is below 1.
func (f Format) PageBytes(pageSize int) int {
	checkPageSize(pageSize)
	if f == FormatFP8UE8M0 {
		raw := f.BytesPerToken() * pageSize
		return (raw + UE8M0ValueBytes - 1) / UE8M0ValueBytes * UE8M0ValueBytes
	}
	return f.BytesPerToken() * pageSize
}

// ValueOffset returns the byte offset, inside its page, of the values of
// the token at in-page offset off: off*576, off*1024 or off*512.
func (f Format) ValueOffset(pageSize, off int) int {
	checkOffset(pageSize, off)
	switch f {
	case FormatFP8UE8M0:
		return off * UE8M0ValueBytes
	case FormatBF16, FormatFP8PerTensor:
		return off * f.BytesPerToken()
	}
	panic(fmt.Sprintf("kvcache: invalid format %d", uint8(f)))
}

// ScaleOffset returns the byte offset, inside its page, of the 8-byte scale
// slot of the token at in-page offset off: 576*P + off*8 for fp8_ue8m0. The
// other formats keep no per-token scales and get -1.
func (f Format) ScaleOffset(pageSize, off int) int {
	checkOffset(pageSize, off)
	if f == FormatFP8UE8M0 {
		return UE8M0ValueBytes*pageSize + off*UE8M0ScaleBytes
	}
	if !f.Valid() {
		panic(fmt.Sprintf("kvcache: invalid format %d", uint8(f)))
	}
	return -1
}

func isPowerOfTwo(n int) bool { return n > 0 && bits.OnesCount(uint(n)) == 1 }

// The layout helpers panic on a bad page size or offset: these are
// programming errors, and Config.Validate reports bad configurations first.
func checkPageSize(pageSize int) {
	if pageSize < 1 || pageSize > MaxPageSize {
		panic(fmt.Sprintf("kvcache: pageSize %d out of range [1, %d]", pageSize, MaxPageSize))
	}
}

func checkOffset(pageSize, off int) {
	checkPageSize(pageSize)
	if off < 0 || off >= pageSize {
		panic(fmt.Sprintf("kvcache: in-page offset %d out of range [0, %d)", off, pageSize))
	}
}
