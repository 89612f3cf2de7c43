package kvcache

import (
	"encoding/json"
	"flag"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFormatNames(t *testing.T) {
	tests := []struct {
		name string
		want Format
	}{
		{"fp8_ue8m0", FormatFP8UE8M0},
		{"bf16", FormatBF16},
		{"fp8_pertensor", FormatFP8PerTensor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseFormat(tt.name)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.name, got.String())
			require.True(t, got.Valid())
		})
	}
	require.Equal(t, FormatFP8UE8M0, Format(0), "the zero Format is the default fp8_ue8m0")
	require.Equal(t, "Format(9)", Format(9).String())
	require.False(t, Format(3).Valid())
}

func TestParseFormatRejects(t *testing.T) {
	for _, s := range []string{"", "FP8_UE8M0", "fp8", "bf16 ", "fp16", "Format(1)"} {
		_, err := ParseFormat(s)
		require.Error(t, err, "%q", s)
		require.Contains(t, err.Error(), "unknown format")
		require.Contains(t, err.Error(), "fp8_ue8m0, bf16 or fp8_pertensor")
	}
}

func TestFormatFlagAndText(t *testing.T) {
	var f Format
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Var(&f, "kv-format", "cache format")
	require.NoError(t, fs.Parse([]string{"-kv-format", "fp8_pertensor"}))
	require.Equal(t, FormatFP8PerTensor, f)

	var v struct{ F Format }
	require.NoError(t, json.Unmarshal([]byte(`{"F":"bf16"}`), &v))
	require.Equal(t, FormatBF16, v.F)
	out, err := json.Marshal(v)
	require.NoError(t, err)
	require.JSONEq(t, `{"F":"bf16"}`, string(out))
	require.Error(t, json.Unmarshal([]byte(`{"F":"int8"}`), &v))
	_, err = Format(7).MarshalText()
	require.Error(t, err)
}

func TestFormatSizes(t *testing.T) {
	// Hand-computed from docs/DESIGN.md section 3.
	tests := []struct {
		f        Format
		pageSize int
		perToken int
		page     int
	}{
		{FormatFP8UE8M0, 64, 584, 37440}, // ceil(37376/576) = 65 rows
		{FormatFP8UE8M0, 1, 584, 1152},   // 584 > 576: two rows
		{FormatFP8UE8M0, 2, 584, 1728},   // ceil(1168/576) = 3
		{FormatFP8UE8M0, 8, 584, 5184},   // ceil(4672/576) = 9
		{FormatFP8UE8M0, 128, 584, 74880},
		{FormatBF16, 64, 1024, 65536},
		{FormatBF16, 1, 1024, 1024},
		{FormatFP8PerTensor, 64, 512, 32768},
		{FormatFP8PerTensor, 16, 512, 8192},
	}
	for _, tt := range tests {
		require.Equal(t, tt.perToken, tt.f.BytesPerToken(), "%v", tt.f)
		require.Equal(t, tt.page, tt.f.PageBytes(tt.pageSize), "%v P=%d", tt.f, tt.pageSize)
	}
}

func TestFormatOffsets(t *testing.T) {
	tests := []struct {
		f             Format
		pageSize, off int
		value, scale  int
	}{
		{FormatFP8UE8M0, 64, 0, 0, 36864},
		{FormatFP8UE8M0, 64, 1, 576, 36872},
		{FormatFP8UE8M0, 64, 63, 36288, 37368},
		{FormatFP8UE8M0, 1, 0, 0, 576},
		{FormatBF16, 64, 3, 3072, -1},
		{FormatFP8PerTensor, 64, 63, 32256, -1},
	}
	for _, tt := range tests {
		require.Equal(t, tt.value, tt.f.ValueOffset(tt.pageSize, tt.off), "%v P=%d off=%d", tt.f, tt.pageSize, tt.off)
		require.Equal(t, tt.scale, tt.f.ScaleOffset(tt.pageSize, tt.off), "%v P=%d off=%d", tt.f, tt.pageSize, tt.off)
	}
}

// TestPageLayoutDisjoint checks, for every format and many page sizes, that
// the byte ranges of all tokens of a page are disjoint and inside the page.
func TestPageLayoutDisjoint(t *testing.T) {
	for _, f := range Formats() {
		for pageSize := 1; pageSize <= 256; pageSize *= 2 {
			owner := make([]int, f.PageBytes(pageSize))
			mark := func(lo, n, off int) {
				if lo < 0 || lo+n > len(owner) {
					t.Fatalf("%v P=%d off=%d: bytes [%d, %d) not inside the %d-byte page", f, pageSize, off, lo, lo+n, len(owner))
				}
				for b := lo; b < lo+n; b++ {
					if owner[b] != 0 {
						t.Fatalf("%v P=%d: byte %d shared by tokens %d and %d", f, pageSize, b, owner[b]-1, off)
					}
					owner[b] = off + 1
				}
			}
			for off := range pageSize {
				if f == FormatFP8UE8M0 {
					mark(f.ValueOffset(pageSize, off), UE8M0ValueBytes, off)
					mark(f.ScaleOffset(pageSize, off), UE8M0ScaleBytes, off)
				} else {
					mark(f.ValueOffset(pageSize, off), f.BytesPerToken(), off)
				}
			}
		}
	}
}

func TestFormatHelpersPanic(t *testing.T) {
	require.PanicsWithValue(t, "kvcache: in-page offset 64 out of range [0, 64)", func() { FormatBF16.ValueOffset(64, 64) })
	require.PanicsWithValue(t, "kvcache: in-page offset -1 out of range [0, 64)", func() { FormatFP8UE8M0.ScaleOffset(64, -1) })
	require.PanicsWithValue(t, "kvcache: pageSize 0 out of range [1, 1048576]", func() { FormatBF16.PageBytes(0) })
	require.PanicsWithValue(t, "kvcache: invalid format 5", func() { Format(5).BytesPerToken() })
	require.Panics(t, func() { Format(5).ScaleOffset(64, 0) })
}

func FuzzParseFormat(f *testing.F) {
	for _, s := range []string{"fp8_ue8m0", "bf16", "fp8_pertensor", "", "BF16", "fp8_ue8m0\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseFormat(s)
		if err != nil {
			if !strings.Contains(err.Error(), "unknown format") {
				t.Fatalf("ParseFormat(%q) error %q does not say unknown format", s, err)
			}
			return
		}
		if !got.Valid() || got.String() != s {
			t.Fatalf("ParseFormat(%q) = %v, which prints as %q", s, uint8(got), got.String())
		}
	})
}
