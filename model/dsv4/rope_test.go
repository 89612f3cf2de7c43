package dsv4

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestYaRNCorrectionRangeFlash checks DeepSeek's find_correction_range for
// V4-Flash's YaRN layers (base 160000, original 65536, betas 32 and 1):
// d(32) = 64*ln(65536/(64π)) / (2 ln 160000) ≈ 370.36/23.97 ≈ 15.45 → 15,
// d(1) = 64*ln(65536/(2π)) / (2 ln 160000) ≈ 592.15/23.97 ≈ 24.71 → 25.
func TestYaRNCorrectionRangeFlash(t *testing.T) {
	rs := Flash().RopeScaling
	base := Flash().CompressRopeTheta
	corrDim := func(rotations float64) float64 {
		return 64 * math.Log(float64(rs.OriginalMaxPositionEmbeddings)/(rotations*2*math.Pi)) / (2 * math.Log(base))
	}
	wantLow := math.Max(math.Floor(corrDim(rs.BetaFast)), 0)
	wantHigh := math.Min(math.Ceil(corrDim(rs.BetaSlow)), 63)

	low, high := YaRNCorrectionRange(rs.BetaFast, rs.BetaSlow, 64, base, rs.OriginalMaxPositionEmbeddings)
	assert.Equal(t, wantLow, low)
	assert.Equal(t, wantHigh, high)
	assert.Equal(t, 15.0, low, "hand-computed in the comment")
	assert.Equal(t, 25.0, high, "hand-computed in the comment")
}

func TestYaRNCorrectionRangeClamps(t *testing.T) {
	// A tiny original length puts d(beta_fast) below 0; a huge one puts
	// d(beta_slow) above dim-1.
	low, _ := YaRNCorrectionRange(32, 1, 64, 160000, 16)
	assert.Equal(t, 0.0, low)
	_, high := YaRNCorrectionRange(32, 1, 64, 10, math.MaxInt32)
	assert.Equal(t, 63.0, high)
}

func TestYaRNSmooth(t *testing.T) {
	tests := []struct{ low, high float64 }{
		{15, 25}, // V4-Flash
		{0, 63},
		{0, 1},
		{31, 31}, // zero width: DeepSeek widens high by 0.001
		{5, 5},
		{63, 63},
		{40, 63}, // ramp entirely past the 32 pairs
	}
	for _, tt := range tests {
		s := yarnSmooth(tt.low, tt.high)
		require.Len(t, s, 32)
		for k, v := range s {
			assert.False(t, math.IsNaN(v), "low %v high %v k %d", tt.low, tt.high, k)
			assert.True(t, v >= 0 && v <= 1, "low %v high %v: smooth[%d] = %v", tt.low, tt.high, k, v)
			if float64(k) <= tt.low {
				assert.Equal(t, 1.0, v, "low %v high %v: pairs up to low keep their frequency (k %d)", tt.low, tt.high, k)
			}
			if float64(k) >= tt.high && tt.high > tt.low {
				assert.Equal(t, 0.0, v, "low %v high %v: pairs from high are fully scaled (k %d)", tt.low, tt.high, k)
			}
			if k > 0 {
				assert.LessOrEqual(t, v, s[k-1], "low %v high %v: smooth must not increase (k %d)", tt.low, tt.high, k)
			}
		}
	}
	s := yarnSmooth(15, 25)
	assert.InDelta(t, 0.5, s[20], 0, "midway through the ramp")
}

func TestRopeFrequencies(t *testing.T) {
	c := Flash()
	plain, err := c.RopeFrequencies(RopePlain)
	require.NoError(t, err)
	yarn, err := c.RopeFrequencies(RopeYaRN)
	require.NoError(t, err)
	require.Len(t, plain, 32)
	require.Len(t, yarn, 32)
	for k := range 32 {
		assert.Equal(t, math.Pow(10000, -float64(2*k)/64), plain[k], "plain k %d", k)
		f := math.Pow(160000, -float64(2*k)/64)
		switch {
		case k <= 15:
			assert.Equal(t, f, yarn[k], "yarn k %d below the ramp keeps base^(-2k/64)", k)
		case k >= 25:
			assert.Equal(t, f/16, yarn[k], "yarn k %d past the ramp is divided by the factor", k)
		default:
			assert.True(t, yarn[k] < f && yarn[k] > f/16, "yarn k %d on the ramp lies between", k)
		}
		if k > 0 {
			assert.Less(t, plain[k], plain[k-1])
			assert.Less(t, yarn[k], yarn[k-1])
		}
	}
	_, err = c.RopeFrequencies(RopeKind(9))
	assert.ErrorContains(t, err, "unknown RoPE kind RopeKind(9)")
}

// wantCosSin is the exact-mode contract computed directly: f_k in float64,
// the angle in float64, cos and sin in float64, each rounded once to
// float32.
func wantCosSin(t *testing.T, c Config, kind RopeKind, pos, k int) (float32, float32) {
	t.Helper()
	base := c.RopeTheta
	f := 0.0
	if kind == RopeYaRN {
		base = c.CompressRopeTheta
	}
	f = math.Pow(base, -float64(2*k)/64)
	if kind == RopeYaRN {
		rs := c.RopeScaling
		low, high := YaRNCorrectionRange(rs.BetaFast, rs.BetaSlow, 64, base, rs.OriginalMaxPositionEmbeddings)
		if low == high {
			high += 0.001
		}
		smooth := 1 - math.Min(math.Max((float64(k)-low)/(high-low), 0), 1)
		f = float64(float64(f/rs.Factor)*(1-smooth)) + float64(f*smooth)
	}
	angle := float64(float64(pos) * f)
	return float32(math.Cos(angle)), float32(math.Sin(angle))
}

// wantCosSinReference is the reference-mode angle and (cos, sin) from the
// float32 frequencies: theta = fl(fl(pos) * f_k), cos and sin of it in
// float64, rounded to float32.
func wantCosSinReference(t *testing.T, c Config, kind RopeKind, pos, k int) (float32, float32) {
	t.Helper()
	f, err := c.RopeFrequencies32(kind)
	require.NoError(t, err)
	theta := float32(float32(pos) * f[k])
	return float32(math.Cos(float64(theta))), float32(math.Sin(float64(theta)))
}

func TestRopeTableValues(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	const positions = 70000 // past YaRN's original 65536
	for _, c := range []Config{Flash(), Pro()} {
		for _, tc := range []struct {
			kind RopeKind
			mode RopeMode
		}{{RopePlain, RopeExact}, {RopeYaRN, RopeExact}, {RopePlain, RopeReference}, {RopeYaRN, RopeReference}} {
			kind, mode := tc.kind, tc.mode
			want := wantCosSin
			if mode == RopeReference {
				want = wantCosSinReference
			}
			table, err := NewRopeTable(c, kind, mode, positions)
			require.NoError(t, err)
			assert.Equal(t, kind, table.Kind)
			assert.Equal(t, mode, table.Mode)
			assert.Equal(t, positions, table.Positions)
			require.Len(t, table.CosSin, positions*64)

			for k := range 32 {
				cos, sin := table.At(0, k)
				assert.Equal(t, float32(1), cos, "%v k %d pos 0", kind, k)
				assert.Equal(t, float32(0), sin, "%v k %d pos 0", kind, k)
			}
			// f_0 = 1 for both kinds and modes (YaRN keeps pair 0, and
			// positions are exact in float32), so pair 0 is cos(pos),
			// sin(pos).
			for _, pos := range []int{1, 2, 3, 100, 65535, 65536, positions - 1, rng.IntN(positions)} {
				cos, sin := table.At(pos, 0)
				assert.Equal(t, float32(math.Cos(float64(pos))), cos, "%v pos %d", kind, pos)
				assert.Equal(t, float32(math.Sin(float64(pos))), sin, "%v pos %d", kind, pos)
			}
			for range 2000 {
				pos, k := rng.IntN(positions), rng.IntN(32)
				wc, ws := want(t, c, kind, pos, k)
				gc, gs := table.At(pos, k)
				if gc != wc || gs != ws {
					t.Fatalf("%s %v %v pos %d k %d: got (%v, %v), want (%v, %v)", c.Name, kind, mode, pos, k, gc, gs, wc, ws)
				}
			}
		}
	}
}

func TestRopeTableLayout(t *testing.T) {
	table, err := NewRopeTable(Flash(), RopeYaRN, RopeReference, 300)
	require.NoError(t, err)
	raw := table.Bytes()
	require.Len(t, raw, 300*64*4)
	for pos := range 300 {
		row := table.Row(pos)
		require.Len(t, row, 64)
		assert.Equal(t, 64, cap(row), "Row must not expose the next position")
		for k := range 32 {
			c, s := table.At(pos, k)
			assert.Equal(t, c, row[2*k])
			assert.Equal(t, s, row[2*k+1])
			i := (pos*64 + 2*k) * 4
			assert.Equal(t, math.Float32bits(c), binary.LittleEndian.Uint32(raw[i:]))
			assert.Equal(t, math.Float32bits(s), binary.LittleEndian.Uint32(raw[i+4:]))
		}
	}
}

// TestRopeTableSplitInvariant builds tables split over several goroutines
// and over one, and expects the same values.
func TestRopeTableSplitInvariant(t *testing.T) {
	const positions = 3*parallelRows + 17
	c := Flash()
	for _, mode := range RopeModes() {
		fill, err := c.filler(RopeYaRN, mode)
		require.NoError(t, err)
		serial := make([]float32, positions*64)
		fill(serial, 0, positions)

		for _, procs := range []int{1, 2, 3, 8} {
			prev := runtime.GOMAXPROCS(procs)
			table, err := NewRopeTable(c, RopeYaRN, mode, positions)
			runtime.GOMAXPROCS(prev)
			require.NoError(t, err)
			assert.Equal(t, serial, table.CosSin, "%v GOMAXPROCS %d", mode, procs)
		}
	}
}

func TestNewRopeTableErrors(t *testing.T) {
	bad := Flash()
	bad.RopeTheta = 0
	huge := Flash()
	huge.MaxPositionEmbeddings = 1 << 30
	tests := []struct {
		name      string
		cfg       Config
		kind      RopeKind
		mode      RopeMode
		positions int
		want      string
	}{
		{"zero positions", Flash(), RopePlain, RopeReference, 0, "dsv4: RoPE table positions 0 out of range [1, 1048576]"},
		{"negative positions", Flash(), RopeYaRN, RopeExact, -5, "dsv4: RoPE table positions -5 out of range [1, 1048576]"},
		{"past max positions", Flash(), RopePlain, RopeReference, 1048577, "dsv4: RoPE table positions 1048577 out of range [1, 1048576] (max_position_embeddings)"},
		{"past float32 positions", huge, RopePlain, RopeReference, 1<<24 + 1, "dsv4: RoPE table positions 16777217 out of range [1, 16777216] (2^24: positions must be exact in float32)"},
		{"unset kind", Flash(), RopeKind(0), RopeReference, 16, "dsv4: unknown RoPE kind RopeKind(0)"},
		{"unknown kind", Flash(), RopeKind(3), RopeReference, 16, "dsv4: unknown RoPE kind RopeKind(3)"},
		{"unknown mode", Flash(), RopePlain, RopeMode(2), 16, "dsv4: unknown RoPE mode RopeMode(2)"},
		{"invalid config", bad, RopePlain, RopeReference, 16, `"rope_theta" = 0: must be finite and greater than 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table, err := NewRopeTable(tt.cfg, tt.kind, tt.mode, tt.positions)
			assert.Nil(t, table)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestRopeTableBounds(t *testing.T) {
	table, err := NewRopeTable(Flash(), RopePlain, RopeReference, 10)
	require.NoError(t, err)
	require.NoError(t, table.CheckPosition(0))
	require.NoError(t, table.CheckPosition(9))
	assert.EqualError(t, table.CheckPosition(10), "dsv4: position 10 outside the plain RoPE table of 10 positions")
	assert.EqualError(t, table.CheckPosition(-1), "dsv4: position -1 outside the plain RoPE table of 10 positions")

	assert.PanicsWithValue(t, "dsv4: RopeTable.At(10, 0) outside [0, 10) x [0, 32)", func() { table.At(10, 0) })
	assert.PanicsWithValue(t, "dsv4: RopeTable.At(0, 32) outside [0, 10) x [0, 32)", func() { table.At(0, 32) })
	assert.PanicsWithValue(t, "dsv4: RopeTable.At(0, -1) outside [0, 10) x [0, 32)", func() { table.At(0, -1) })
	assert.PanicsWithValue(t, "dsv4: RopeTable.Row(-1) outside [0, 10)", func() { table.Row(-1) })
}

func TestRopeTables(t *testing.T) {
	set, err := Flash().RopeTables(RopeReference, 128)
	require.NoError(t, err)
	require.NotNil(t, set.Plain)
	require.NotNil(t, set.YaRN)
	assert.Equal(t, RopePlain, set.Plain.Kind)
	assert.Equal(t, RopeYaRN, set.YaRN.Kind)

	for layer := range Flash().NumAttentionLayers() {
		kind, err := Flash().LayerRope(layer)
		require.NoError(t, err)
		table, err := set.ForLayer(layer)
		require.NoError(t, err)
		assert.Equal(t, kind, table.Kind, "layer %d", layer)
		assert.Equal(t, 128, table.Positions)
	}
	_, err = set.ForLayer(44)
	assert.ErrorContains(t, err, "dsv4: layer 44 out of range [0, 44)")

	// A set keeps its own ratios: editing the config afterwards changes
	// nothing.
	c := Flash()
	set, err = c.RopeTables(RopeExact, 8)
	require.NoError(t, err)
	c.CompressRatios[0] = 4
	table, err := set.ForLayer(0)
	require.NoError(t, err)
	assert.Equal(t, RopePlain, table.Kind)

	// Only the kinds some layer uses are built.
	uncompressed := Flash()
	for i := range uncompressed.CompressRatios {
		uncompressed.CompressRatios[i] = 0
	}
	set, err = uncompressed.RopeTables(RopeReference, 8)
	require.NoError(t, err)
	assert.Nil(t, set.YaRN)
	_, err = set.Table(RopeYaRN)
	assert.EqualError(t, err, "dsv4: no layer uses yarn RoPE, so its table was not built")
	_, err = set.Table(RopeKind(0))
	assert.EqualError(t, err, "dsv4: unknown RoPE kind RopeKind(0)")

	_, err = Flash().RopeTables(RopeReference, 0)
	assert.ErrorContains(t, err, "positions 0 out of range")
}

func BenchmarkNewRopeTable65536(b *testing.B) {
	for _, kind := range []RopeKind{RopePlain, RopeYaRN} {
		b.Run(kind.String(), func(b *testing.B) {
			b.SetBytes(65536 * 64 * 4)
			for b.Loop() {
				if _, err := NewRopeTable(Flash(), kind, RopeReference, 65536); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
