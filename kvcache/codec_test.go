package kvcache

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dsv4mla/prologue/numerics"
	"github.com/stretchr/testify/require"
)

const poison = 0xA5

func poisonedPage(f Format, pageSize int) []byte {
	page := make([]byte, f.PageBytes(pageSize))
	for i := range page {
		page[i] = poison
	}
	return page
}

// requireBytes checks page against want (absolute offset -> byte); every
// other byte must still be the poison.
func requireBytes(t *testing.T, page []byte, want map[int]byte) {
	t.Helper()
	for i, b := range page {
		w, ok := want[i]
		if !ok {
			w = poison
		}
		if b != w {
			t.Fatalf("byte %d = %#02x, want %#02x", i, b, w)
		}
	}
}

// TestEncodeUE8M0Bytes pins the bytes of one fp8_ue8m0 token, computed by
// hand from docs/DESIGN.md section 4 step 5. P = 4, off = 2: values at 2*576 =
// 1152, scales at 4*576 + 2*8 = 2320.
func TestEncodeUE8M0Bytes(t *testing.T) {
	const valueAt, scaleAt = 1152, 2320
	var y [512]float32
	want := map[int]byte{}
	// All 448 nope bytes and 128 rope bytes are written; zeros unless set below.
	for i := range 576 {
		want[valueAt+i] = 0
	}
	set := func(i int, v float32, q byte) { y[i] = v; want[valueAt+i] = q }

	// Group 0: amax 448, t = 1 exactly, e = 127, inv = 1.
	set(0, 448, 0x7E)
	set(1, 0.5, 0x30)
	set(2, -1, 0xB8)
	want[scaleAt+0] = 127
	// Group 1: amax 1, t = fl(1/448) in (2^-9, 2^-8): e = 127-8 = 119, inv = 256.
	for i := 64; i < 128; i++ {
		set(i, 1, 0x78) // 256 = 2^8
	}
	set(65, -0.75, 0xF4) // -192 = -1.5 * 2^7
	want[scaleAt+1] = 119
	// Group 2: all zero: a = 1e-4, t ~ 2.2e-7 in (2^-23, 2^-22): e = 105.
	want[scaleAt+2] = 105
	// Group 3: amax 3, t ~ 0.0067 in (2^-8, 2^-7): e = 120, inv = 128.
	set(192, 3, 0x7C)               // 384 = 1.5 * 2^8
	set(193, 1.0/1024, 0x20)        // 0.125
	set(194, 1.0/16384, 0x04)       // 2^-7: e4m3 subnormal 4 * 2^-9
	set(195, 1.0625/128, 0x38)      // 1.0625: tie between 1 and 1.125, to even
	set(196, 1.1875/128, 0x3A)      // 1.1875: tie between 1.125 and 1.25, to even
	set(197, -1.0/(128*1024), 0x80) // -2^-10 rounds to -0
	want[scaleAt+3] = 120
	// Group 4: an Inf: t = Inf, e = 255 clamped to 254, inv = 2^-127.
	set(256, float32(math.Inf(1)), 0x7E)
	set(257, float32(math.Inf(-1)), 0xFE)
	set(258, 1<<20, 0x00) // 2^20 * 2^-127 underflows to 0 in e4m3
	want[scaleAt+4] = 254
	// Group 5: a NaN is ignored by amax (2): e = 120, inv = 128.
	set(320, float32(math.NaN()), 0x7F)
	set(321, 2, 0x78)
	want[scaleAt+5] = 120
	// Group 6: amax 2^20, t = 2^20/448 in (2^11, 2^12): e = 139, inv = 2^-12.
	set(384, 1<<20, 0x78)
	set(385, -4096, 0xB8)
	want[scaleAt+6] = 139
	// Rope: bf16 little-endian after the 448 nope bytes.
	y[448], want[valueAt+448], want[valueAt+449] = 1, 0x80, 0x3F
	y[449], want[valueAt+450], want[valueAt+451] = -2, 0x00, 0xC0
	y[450], want[valueAt+452], want[valueAt+453] = float32(math.NaN()), 0xFF, 0x7F // the canonical bf16 NaN 0x7FFF
	y[511], want[valueAt+574], want[valueAt+575] = 0.5, 0x00, 0x3F
	// Scale byte 7 (scaleAt+7) is padding: not in want, so it must stay poison.

	page := poisonedPage(FormatFP8UE8M0, 4)
	require.Len(t, page, 2880) // ceil(2336/576) = 5 rows
	encode(t, FormatFP8UE8M0, page, 4, 2, &y, 1)
	requireBytes(t, page, want)

	got := decode(t, FormatFP8UE8M0, page, 4, 2, 1)
	require.Equal(t, float32(448), got[0])
	require.Equal(t, float32(-0.75), got[65])
	require.Equal(t, float32(3), got[192])
	require.Equal(t, float32(1.0/128), got[195]) // the tie went to even
	require.Equal(t, float32(1.25/128), got[196])
	require.True(t, math.IsInf(float64(got[256]), 1), "Inf group: 448 * 2^127 overflows back to Inf, got %v", got[256])
	require.True(t, math.IsNaN(float64(got[320])))
	require.Equal(t, float32(-4096), got[385])
	require.Equal(t, float32(-2), got[449])
	require.True(t, math.IsNaN(float64(got[450])))
}

func TestEncodeBF16Bytes(t *testing.T) {
	// P = 2, off = 1: values at 1024.
	var y [512]float32
	want := map[int]byte{}
	for i := range 1024 {
		want[1024+i] = 0
	}
	y[0], want[1024], want[1025] = 1, 0x80, 0x3F
	y[447], want[1024+894], want[1024+895] = -1.5, 0xC0, 0xBF
	y[448], want[1024+896], want[1024+897] = 3, 0x40, 0x40
	y[511], want[1024+1022], want[1024+1023] = -2, 0x00, 0xC0
	page := poisonedPage(FormatBF16, 2)
	encode(t, FormatBF16, page, 2, 1, &y, 1)
	requireBytes(t, page, want)
	require.Equal(t, y, decode(t, FormatBF16, page, 2, 1, 1))
}

func TestEncodePerTensorBytes(t *testing.T) {
	// P = 2, off = 1: values at 512; kv_scale 2.
	var y [512]float32
	want := map[int]byte{}
	for i := range 512 {
		want[512+i] = 0
	}
	y[0], want[512] = 1, 0x40       // 2
	y[1], want[513] = 300, 0x7E     // 600 saturates to 448
	y[2], want[514] = -0.25, 0xB0   // -0.5
	y[448], want[512+448] = 4, 0x50 // rope is e4m3 too: 8 = 2^3
	y[511], want[512+511] = float32(math.NaN()), 0x7F
	page := poisonedPage(FormatFP8PerTensor, 2)
	encode(t, FormatFP8PerTensor, page, 2, 1, &y, 2)
	requireBytes(t, page, want)
	got := decode(t, FormatFP8PerTensor, page, 2, 1, 2)
	require.Equal(t, float32(1), got[0])
	require.Equal(t, float32(224), got[1])
	require.Equal(t, float32(-0.25), got[2])
	require.Equal(t, float32(4), got[448])
	require.True(t, math.IsNaN(float64(got[511])))
}

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
}

// randomToken draws bf16-exact values; each 64-value group gets its own
// magnitude range so that scales vary across the row, and some groups are
// all zero.
func randomToken(rng *rand.Rand, maxExp int) [512]float32 {
	var y [512]float32
	for g := range 8 {
		if rng.IntN(10) == 0 {
			continue // all-zero group
		}
		top := rng.IntN(maxExp+20) - 20
		for i := g * 64; i < (g+1)*64; i++ {
			v := float32(rng.Float64()) * numerics.Pow2(top-rng.IntN(12))
			if rng.IntN(2) == 0 {
				v = -v
			}
			y[i] = numerics.RoundBF16(v)
		}
	}
	return y
}

// requireFP8Close checks one e4m3 round trip against the e4m3 grid: 1/16
// relative in the normal range of the scaled value, half the subnormal step
// (2^-10 scaled) below it.
func requireFP8Close(t *testing.T, i int, want, got, scale float32) {
	t.Helper()
	diff := math.Abs(float64(got) - float64(want))
	scaled := math.Abs(float64(want)) / float64(scale)
	if scaled >= 1.0/64 {
		require.LessOrEqual(t, diff, math.Abs(float64(want))/16, "value %d: %v decoded as %v", i, want, got)
	} else {
		require.LessOrEqual(t, diff, float64(scale)/1024, "value %d: %v decoded as %v (subnormal)", i, want, got)
	}
}

func TestRoundTripUE8M0(t *testing.T) {
	rng := newRand(t)
	const pageSize = 64
	page := make([]byte, FormatFP8UE8M0.PageBytes(pageSize))
	for range 400 {
		off := rng.IntN(pageSize)
		y := randomToken(rng, 60)
		encode(t, FormatFP8UE8M0, page, pageSize, off, &y, 1)
		got := decode(t, FormatFP8UE8M0, page, pageSize, off, 1)
		so := FormatFP8UE8M0.ScaleOffset(pageSize, off)
		for g := range 7 {
			e := page[so+g]
			scale := numerics.UE8M0Scale(e)
			// The scale is the power of two at or just above max(amax, 1e-4)/448.
			amax := float64(numerics.GroupAbsMax(y[g*64 : (g+1)*64]))
			target := math.Max(amax, 1e-4) / 448
			require.GreaterOrEqual(t, float64(scale)*(1+1e-6), target, "group %d scale %v too small for amax %v", g, scale, amax)
			require.Less(t, float64(scale)/2, target, "group %d scale %v not the smallest power of two for amax %v", g, scale, amax)
			for i := g * 64; i < (g+1)*64; i++ {
				requireFP8Close(t, i, y[i], got[i], scale)
			}
		}
		require.Equal(t, y[448:], got[448:], "rope values are stored as exact bf16")
	}
}

func TestRoundTripBF16(t *testing.T) {
	rng := newRand(t)
	page := make([]byte, FormatBF16.PageBytes(16))
	for range 200 {
		off := rng.IntN(16)
		y := randomToken(rng, 100)
		encode(t, FormatBF16, page, 16, off, &y, 1)
		require.Equal(t, y, decode(t, FormatBF16, page, 16, off, 1))
	}
}

func TestRoundTripPerTensor(t *testing.T) {
	rng := newRand(t)
	page := make([]byte, FormatFP8PerTensor.PageBytes(8))
	for _, kvScale := range []float32{1, 0.5, 2, 1.0 / 3, 37.25} {
		for range 100 {
			off := rng.IntN(8)
			y := randomToken(rng, 7)
			// Keep |y*kvScale| within the e4m3 range: 256 * 37.25 would not be.
			for i := range y {
				if math.Abs(float64(y[i]*kvScale)) > 448 {
					y[i] = numerics.RoundBF16(y[i] / 64)
				}
			}
			encode(t, FormatFP8PerTensor, page, 8, off, &y, kvScale)
			got := decode(t, FormatFP8PerTensor, page, 8, off, kvScale)
			for i := range y {
				requireFP8Close(t, i, y[i], got[i], 1/kvScale)
			}
		}
	}
}

// TestEncodeTouchesOnlyItsToken fills every other token of a poisoned page
// and checks that encoding one token changes only its own value row and its
// 7 scale bytes: the scale padding byte and the page's tail padding stay
// poison, and the neighbours decode as before.
func TestEncodeTouchesOnlyItsToken(t *testing.T) {
	rng := newRand(t)
	for _, f := range Formats() {
		for _, pageSize := range []int{1, 2, 4, 64} {
			page := poisonedPage(f, pageSize)
			tokens := make([][512]float32, pageSize)
			for off := range pageSize {
				tokens[off] = randomToken(rng, 8)
			}
			for _, off := range rng.Perm(pageSize) {
				before := append([]byte(nil), page...)
				encode(t, f, page, pageSize, off, &tokens[off], 1)
				own := map[int]bool{}
				vo := f.ValueOffset(pageSize, off)
				n := f.BytesPerToken()
				if f == FormatFP8UE8M0 {
					n = UE8M0ValueBytes
					so := f.ScaleOffset(pageSize, off)
					for b := so; b < so+7; b++ {
						own[b] = true
					}
					require.Equal(t, byte(poison), page[so+7], "%v P=%d off=%d: scale padding byte written", f, pageSize, off)
				}
				for b := vo; b < vo+n; b++ {
					own[b] = true
				}
				for b := range page {
					if !own[b] && page[b] != before[b] {
						t.Fatalf("%v P=%d off=%d: byte %d outside the token changed %#02x -> %#02x", f, pageSize, off, b, before[b], page[b])
					}
				}
			}
			for off := range pageSize {
				got := decode(t, f, page, pageSize, off, 1)
				want := decode(t, f, encodeAlone(t, f, pageSize, off, &tokens[off]), pageSize, off, 1)
				for i := range got {
					if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
						t.Fatalf("%v P=%d off=%d value %d: %v after neighbours were written, %v alone", f, pageSize, off, i, got[i], want[i])
					}
				}
			}
		}
	}
}

func encodeAlone(t testing.TB, f Format, pageSize, off int, y *[512]float32) []byte {
	page := make([]byte, f.PageBytes(pageSize))
	encode(t, f, page, pageSize, off, y, 1)
	return page
}

func encode(t testing.TB, f Format, page []byte, pageSize, off int, y *[512]float32, kvScale float32) {
	t.Helper()
	require.NoError(t, EncodeToken(f, page, pageSize, off, y, kvScale))
}

func decode(t testing.TB, f Format, page []byte, pageSize, off int, kvScale float32) [512]float32 {
	t.Helper()
	y, err := DecodeToken(f, page, pageSize, off, kvScale)
	require.NoError(t, err)
	return y
}

// TestCodecRefusesBadArguments: every bad argument is an error naming it,
// and a refused EncodeToken writes nothing.
func TestCodecRefusesBadArguments(t *testing.T) {
	rng := newRand(t)
	y := randomToken(rng, 4)
	page := make([]byte, FormatFP8UE8M0.PageBytes(64))
	for _, c := range []struct {
		name     string
		f        Format
		page     []byte
		pageSize int
		off      int
		y        *[512]float32
		kvScale  float32
		want     string
	}{
		{"invalid format", Format(3), page, 64, 0, &y, 1, "invalid format 3"},
		{"short page", FormatFP8UE8M0, page[:len(page)-1], 64, 0, &y, 1, "page is 37439 bytes, format fp8_ue8m0 with page size 64 needs 37440"},
		{"offset past the page", FormatFP8UE8M0, page, 64, 64, &y, 1, "in-page offset 64 out of range [0, 64)"},
		{"negative offset", FormatBF16, page, 16, -1, &y, 1, "in-page offset -1 out of range [0, 16)"},
		{"page size not a power of two", FormatFP8UE8M0, page, 48, 0, &y, 1, "page size 48 must be a power of two in [1, 1048576]"},
		{"page size zero", FormatFP8UE8M0, page, 0, 0, &y, 1, "page size 0 must be a power of two"},
		{"page size too big", FormatFP8UE8M0, page, 2 * MaxPageSize, 0, &y, 1, "page size 2097152 must be a power of two"},
		{"zero kv scale", FormatFP8PerTensor, page, 64, 0, &y, 0, "kvScale 0 must be finite and positive for format fp8_pertensor"},
		{"infinite kv scale", FormatFP8PerTensor, page, 64, 0, &y, float32(math.Inf(1)), "kvScale +Inf must be finite"},
		{"NaN kv scale", FormatFP8PerTensor, page, 64, 0, &y, float32(math.NaN()), "kvScale NaN must be finite"},
		{"nil token", FormatFP8UE8M0, page, 64, 0, nil, 1, "y is nil"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i := range page {
				page[i] = 0xA5
			}
			err := EncodeToken(c.f, c.page, c.pageSize, c.off, c.y, c.kvScale)
			require.ErrorContains(t, err, "kvcache: EncodeToken: "+c.want)
			for i, b := range page {
				if b != 0xA5 {
					t.Fatalf("refused EncodeToken wrote byte %d", i)
				}
			}
			if c.y == nil {
				return
			}
			_, err = DecodeToken(c.f, c.page, c.pageSize, c.off, c.kvScale)
			require.ErrorContains(t, err, "kvcache: DecodeToken: "+c.want)
		})
	}
}

func BenchmarkEncodeToken(b *testing.B) {
	rng := newRand(b)
	const pageSize = 64
	for _, f := range Formats() {
		b.Run(f.String(), func(b *testing.B) {
			page := make([]byte, f.PageBytes(pageSize))
			y := randomToken(rng, 10)
			b.SetBytes(int64(f.BytesPerToken()))
			off := 0
			for b.Loop() {
				encode(b, f, page, pageSize, off, &y, 1)
				off = (off + 1) & (pageSize - 1)
			}
		})
	}
}

func BenchmarkDecodeToken(b *testing.B) {
	rng := newRand(b)
	const pageSize = 64
	page := make([]byte, FormatFP8UE8M0.PageBytes(pageSize))
	y := randomToken(rng, 10)
	encode(b, FormatFP8UE8M0, page, pageSize, 5, &y, 1)
	for b.Loop() {
		_ = decode(b, FormatFP8UE8M0, page, pageSize, 5, 1)
	}
}
