package dsv4

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ropePins are table entries of V4-Flash (plain: rope_theta 10000; YaRN:
// compress_rope_theta 160000, factor 16, original 65536, betas 32 and 1) at
// positions up to 1M, as float32 bit patterns. They were computed
// independently of this package, by this Python script (CPython floats are
// float64, math.pow and math.cos are the C library's; struct's 'f' rounds a
// float64 to float32, so f32(a op b) of float32 values a, b is the float32
// operation):
//
//	import math, struct
//	def f32(x): return struct.unpack('<f', struct.pack('<f', x))[0]
//	def bits(x): return struct.unpack('<I', struct.pack('<f', x))[0]
//	def rng(base):  # DeepSeek find_correction_range(32, 1, 64, base, 65536)
//	    d = lambda rot: 64 * math.log(65536 / (rot * 2 * math.pi)) / (2 * math.log(base))
//	    return max(math.floor(d(32)), 0), min(math.ceil(d(1)), 63)
//	def freq(k, yarn, ref):
//	    base = 160000.0 if yarn else 10000.0
//	    low, high = rng(base)
//	    if ref:
//	        f = f32(1 / f32(math.pow(f32(base), f32(f32(2 * k) / 64))))
//	        if yarn:
//	            ramp = min(max(f32(f32(k - low) / f32(high - low)), 0.0), 1.0)
//	            s = f32(1 - ramp)
//	            f = f32(f32(f32(f / 16) * f32(1 - s)) + f32(f * s))
//	    else:
//	        f = math.pow(base, -(2 * k) / 64)
//	        if yarn:
//	            s = 1 - min(max((k - low) / (high - low), 0.0), 1.0)
//	            f = (f / 16) * (1 - s) + f * s
//	    return f
//	for ref in (True, False):
//	    for yarn in (False, True):
//	        for p in (0, 1, 65535, 327680, 1048575):
//	            for k in (1, 24, 31):
//	                f = freq(k, yarn, ref)
//	                a = f32(f32(p) * f) if ref else p * f
//	                print(..., bits(math.cos(a)), bits(math.sin(a)))
var ropePins = []struct {
	mode     RopeMode
	kind     RopeKind
	pos, k   int
	cos, sin uint32
}{
	{RopeReference, RopePlain, 0, 1, 0x3f800000, 0x00000000},
	{RopeReference, RopePlain, 0, 24, 0x3f800000, 0x00000000},
	{RopeReference, RopePlain, 0, 31, 0x3f800000, 0x00000000},
	{RopeReference, RopePlain, 1, 1, 0x3f3b54b0, 0x3f2e7ace},
	{RopeReference, RopePlain, 1, 24, 0x3f7ffff8, 0x3a83126e},
	{RopeReference, RopePlain, 1, 31, 0x3f800000, 0x390bd472},
	{RopeReference, RopePlain, 65535, 1, 0xbf6d7f5d, 0xbebf1c9f},
	{RopeReference, RopePlain, 65535, 24, 0xbf67c939, 0x3ed95beb},
	{RopeReference, RopePlain, 65535, 31, 0xbf4629b9, 0x3f221282},
	{RopeReference, RopePlain, 327680, 1, 0xbf4faff2, 0x3f15ac46},
	{RopeReference, RopePlain, 327680, 24, 0x3f13fef1, 0x3f50e2bb},
	{RopeReference, RopePlain, 327680, 31, 0x3f75a3c9, 0xbe902e88},
	{RopeReference, RopePlain, 1048575, 1, 0x3dbb744f, 0xbf7eece6},
	{RopeReference, RopePlain, 1048575, 24, 0x3f40fd3a, 0xbf283328},
	{RopeReference, RopePlain, 1048575, 31, 0xbcec5703, 0x3f7fe4b8},
	{RopeReference, RopeYaRN, 0, 1, 0x3f800000, 0x00000000},
	{RopeReference, RopeYaRN, 0, 24, 0x3f800000, 0x00000000},
	{RopeReference, RopeYaRN, 0, 31, 0x3f800000, 0x00000000},
	{RopeReference, RopeYaRN, 1, 1, 0x3f45d205, 0x3f227d83},
	{RopeReference, RopeYaRN, 1, 24, 0x3f800000, 0x37a3d70c},
	{RopeReference, RopeYaRN, 1, 31, 0x3f800000, 0x35187c4d},
	{RopeReference, RopeYaRN, 65535, 1, 0xbf523027, 0x3f1223e6},
	{RopeReference, RopeYaRN, 65535, 24, 0x3e92cec4, 0x3f75402a},
	{RopeReference, RopeYaRN, 65535, 31, 0x3f7fd298, 0x3d1872b1},
	{RopeReference, RopeYaRN, 327680, 1, 0xbf6c96dc, 0xbec390e1},
	{RopeReference, RopeYaRN, 327680, 24, 0x3f7e415c, 0x3deeb1e5},
	{RopeReference, RopeYaRN, 327680, 31, 0x3f7b93ee, 0x3e3d8216},
	{RopeReference, RopeYaRN, 1048575, 1, 0x3f547c5d, 0x3f0ec760},
	{RopeReference, RopeYaRN, 1048575, 24, 0xbd741bab, 0x3f7f8b83},
	{RopeReference, RopeYaRN, 1048575, 31, 0x3f53e9cc, 0x3f0fa08f},
	{RopeExact, RopePlain, 0, 1, 0x3f800000, 0x00000000},
	{RopeExact, RopePlain, 0, 24, 0x3f800000, 0x00000000},
	{RopeExact, RopePlain, 0, 31, 0x3f800000, 0x00000000},
	{RopeExact, RopePlain, 1, 1, 0x3f3b54b0, 0x3f2e7ace},
	{RopeExact, RopePlain, 1, 24, 0x3f7ffff8, 0x3a83126d},
	{RopeExact, RopePlain, 1, 31, 0x3f800000, 0x390bd471},
	{RopeExact, RopePlain, 65535, 1, 0xbf6d709e, 0xbebf65db},
	{RopeExact, RopePlain, 65535, 24, 0xbf67c91f, 0x3ed95c5a},
	{RopeExact, RopePlain, 65535, 31, 0xbf4629b6, 0x3f221286},
	{RopeExact, RopePlain, 327680, 1, 0xbf50a3aa, 0x3f1457cd},
	{RopeExact, RopePlain, 327680, 24, 0x3f14002f, 0x3f50e1da},
	{RopeExact, RopePlain, 327680, 31, 0x3f75a3c7, 0xbe902e97},
	{RopeExact, RopePlain, 1048575, 1, 0x3dcbddeb, 0xbf7eba7e},
	{RopeExact, RopePlain, 1048575, 24, 0x3f40fa12, 0xbf2836c7},
	{RopeExact, RopePlain, 1048575, 31, 0xbcec4f77, 0x3f7fe4ba},
	{RopeExact, RopeYaRN, 0, 1, 0x3f800000, 0x00000000},
	{RopeExact, RopeYaRN, 0, 24, 0x3f800000, 0x00000000},
	{RopeExact, RopeYaRN, 0, 31, 0x3f800000, 0x00000000},
	{RopeExact, RopeYaRN, 1, 1, 0x3f45d206, 0x3f227d83},
	{RopeExact, RopeYaRN, 1, 24, 0x3f800000, 0x37a3d70a},
	{RopeExact, RopeYaRN, 1, 31, 0x3f800000, 0x35187c4c},
	{RopeExact, RopeYaRN, 65535, 1, 0xbf51f1c8, 0x3f127d71},
	{RopeExact, RopeYaRN, 65535, 24, 0x3e92ceca, 0x3f754029},
	{RopeExact, RopeYaRN, 65535, 31, 0x3f7fd298, 0x3d1872b0},
	{RopeExact, RopeYaRN, 327680, 1, 0xbf6c902b, 0xbec3b13f},
	{RopeExact, RopeYaRN, 327680, 24, 0x3f7e415e, 0x3deeb159},
	{RopeExact, RopeYaRN, 327680, 31, 0x3f7b93ee, 0x3e3d8216},
	{RopeExact, RopeYaRN, 1048575, 1, 0x3f57e473, 0x3f0992d4},
	{RopeExact, RopeYaRN, 1048575, 24, 0xbd7417ad, 0x3f7f8b87},
	{RopeExact, RopeYaRN, 1048575, 31, 0x3f53e9cc, 0x3f0fa08f},
}

// TestRopeTablePinned checks the pinned entries of both modes and kinds,
// computing the rows of far positions alone (a full 1M-position table takes
// 256 MiB); TestRopeTableSplitInvariant ties the row filler to NewRopeTable.
func TestRopeTablePinned(t *testing.T) {
	c := Flash()
	for _, p := range ropePins {
		fill, err := c.filler(p.kind, p.mode)
		require.NoError(t, err)
		row := make([]float32, rowFloats)
		fill(row, p.pos, p.pos+1)
		assert.Equal(t, p.cos, math.Float32bits(row[2*p.k]), "%v %v pos %d k %d: cos %v", p.mode, p.kind, p.pos, p.k, row[2*p.k])
		assert.Equal(t, p.sin, math.Float32bits(row[2*p.k+1]), "%v %v pos %d k %d: sin %v", p.mode, p.kind, p.pos, p.k, row[2*p.k+1])
	}
	table, err := NewRopeTable(c, RopeYaRN, RopeReference, 65536)
	require.NoError(t, err)
	for _, p := range ropePins {
		if p.mode == RopeReference && p.kind == RopeYaRN && p.pos < table.Positions {
			cos, sin := table.At(p.pos, p.k)
			assert.Equal(t, p.cos, math.Float32bits(cos), "table pos %d k %d", p.pos, p.k)
			assert.Equal(t, p.sin, math.Float32bits(sin), "table pos %d k %d", p.pos, p.k)
		}
	}
}

// TestRopeModesDiffer: the float32 angle of the reference mode moves cos
// and sin at position 327680 by up to about 0.015 against exact math
// (docs/DESIGN.md section 2), and not at all at small positions where the
// angles round alike.
func TestRopeModesDiffer(t *testing.T) {
	c := Flash()
	for _, kind := range []RopeKind{RopePlain, RopeYaRN} {
		ref, err := c.filler(kind, RopeReference)
		require.NoError(t, err)
		exact, err := c.filler(kind, RopeExact)
		require.NoError(t, err)
		maxDiff := func(pos int) float64 {
			a, b := make([]float32, rowFloats), make([]float32, rowFloats)
			ref(a, pos, pos+1)
			exact(b, pos, pos+1)
			d := 0.0
			for i := range a {
				d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
			}
			return d
		}
		d := maxDiff(327680)
		t.Logf("%v: max |reference - exact| at 327680 = %.4g", kind, d)
		assert.Greater(t, d, 1e-3, "%v", kind)
		assert.Less(t, d, 0.03, "%v", kind)
		assert.Less(t, maxDiff(1), 1e-6, "%v", kind)
	}
}

// TestReferencePowMargin: the float32 powers of the reference frequencies
// are computed in float64 and rounded once; that is the correctly rounded
// float32 power only if the float64 value is not within its own error of a
// float32 rounding boundary. For both published bases every power is more
// than 2^-40 (relative) away from one, far beyond math.Pow's error.
func TestReferencePowMargin(t *testing.T) {
	for _, base := range []float64{10000, 160000} {
		b32 := float64(float32(base))
		for k := range ropePairs {
			e := float64(float32(float32(2*k) / ropeDim))
			v := math.Pow(b32, e)
			r := float32(v)
			lo, hi := math.Nextafter32(r, float32(math.Inf(-1))), math.Nextafter32(r, float32(math.Inf(1)))
			mLo, mHi := (float64(lo)+float64(r))/2, (float64(r)+float64(hi))/2
			margin := math.Min(v-mLo, mHi-v) / v
			require.Greater(t, margin, 0x1p-40, "base %v k %d: %v is %g (relative) from a float32 rounding boundary", base, k, v, margin)
		}
	}
}

// TestReferenceFrequencies: pair 0 is 1 in every mode and kind; below the
// YaRN ramp the reference keeps 1/base^(2k/64), past it divides by 16
// exactly; and the float32 frequencies are within float32 rounding of the
// float64 ones.
func TestReferenceFrequencies(t *testing.T) {
	c := Flash()
	for _, kind := range []RopeKind{RopePlain, RopeYaRN} {
		f32, err := c.RopeFrequencies32(kind)
		require.NoError(t, err)
		f64, err := c.RopeFrequencies(kind)
		require.NoError(t, err)
		require.Len(t, f32, 32)
		assert.Equal(t, float32(1), f32[0])
		for k := range 32 {
			assert.InEpsilon(t, f64[k], float64(f32[k]), 3e-7, "%v k %d", kind, k)
		}
	}
	yarn, err := c.RopeFrequencies32(RopeYaRN)
	require.NoError(t, err)
	plain160k := c
	plain160k.RopeTheta = c.CompressRopeTheta
	unscaled, err := plain160k.RopeFrequencies32(RopePlain)
	require.NoError(t, err)
	for k := range 32 {
		switch {
		case k <= 15:
			assert.Equal(t, unscaled[k], yarn[k], "k %d", k)
		case k >= 25:
			assert.Equal(t, unscaled[k]/16, yarn[k], "k %d", k)
		}
	}
	_, err = c.RopeFrequencies32(RopeKind(7))
	assert.EqualError(t, err, "dsv4: unknown RoPE kind RopeKind(7)")
}

func TestRopeModeNames(t *testing.T) {
	for _, m := range RopeModes() {
		got, err := ParseRopeMode(m.String())
		require.NoError(t, err)
		assert.Equal(t, m, got)
		text, err := m.MarshalText()
		require.NoError(t, err)
		var back RopeMode
		require.NoError(t, back.UnmarshalText(text))
		assert.Equal(t, m, back)
	}
	assert.Equal(t, RopeReference, RopeMode(0), "the zero value is the default")
	assert.Equal(t, "RopeMode(9)", RopeMode(9).String())
	_, err := ParseRopeMode("Exact")
	assert.EqualError(t, err, `dsv4: unknown RoPE mode "Exact" (want reference or exact)`)
	_, err = RopeMode(9).MarshalText()
	assert.EqualError(t, err, "dsv4: cannot marshal invalid RoPE mode 9")
}
