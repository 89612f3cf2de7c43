package cudatune

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDefaults(t *testing.T) {
	require.Equal(t, Knobs{Warps: 8, KVDepth: 4, QDepth: 4, QChunk: DefaultQChunk, BlocksPerSM: DefaultBlocksPerSM,
		DirectMaxRows: DefaultDirectMaxRows, DirectMaxRowsBF16: DefaultDirectMaxRowsBF16, DirectMinRows: DefaultDirectMinRows, DirectWarps: 4, DirectHalfBlockRows: DefaultDirectHalfBlockRows, DirectQRows: 2, DirectMinBlocks: 1,
		BF16MMAMaxRows: DefaultBF16MMAMaxRows}, Knobs{}.Defaults())
	set := Knobs{Warps: 3, KVDepth: 1, QDepth: 5, QChunk: 3, BlocksPerSM: 2, MaxBlocks: 1, DirectMaxRows: 7, DirectMaxRowsBF16: 8, DirectMinRows: 2, DirectWarps: 2, DirectHalfBlockRows: 5,
		DirectQRows: 3, DirectMinBlocks: 6, BF16MMAMaxRows: 9, SeparateLaunches: true, Verbose: true}
	require.Equal(t, set, set.Defaults(), "set fields stay")
	require.Equal(t, 8, Knobs{Warps: -1}.Defaults().Warps)
	require.Equal(t, -1, Knobs{DirectMaxRows: -5}.Defaults().DirectMaxRows, "negative: never direct")
	require.Equal(t, -1, Knobs{DirectMaxRowsBF16: -5}.Defaults().DirectMaxRowsBF16, "negative: never direct")
	require.Equal(t, -1, Knobs{BF16MMAMaxRows: -3}.Defaults().BF16MMAMaxRows, "negative: never the tensor-core kernel")
}

func TestDirect(t *testing.T) {
	cases := []struct {
		name           string
		maxRows, bf16  int // DirectMaxRows, DirectMaxRowsBF16
		minRows        int
		rows           int
		wantFP8, wantB bool // FP8 Q, bf16 Q
	}{
		{"default, V4-Flash b=32 MTP 3", 0, 0, 0, 32 * 4 * 64, true, true},
		{"default, at the threshold", 0, 0, 0, DefaultDirectMaxRows, true, true},
		{"default, one past: FP8 Q streams", 0, 0, 0, DefaultDirectMaxRows + 1, false, true},
		{"default, V4-Pro 64K context tokens", 0, 0, 0, 65536 * 128, false, true},
		{"default, at the minimum", 0, 0, 0, DefaultDirectMinRows, true, true},
		{"default, one below the minimum", 0, 0, 0, DefaultDirectMinRows - 1, false, false},
		{"at the threshold", 98, 98, 1, 98, true, true},
		{"one past the threshold", 98, 98, 1, 99, false, false},
		{"thresholds apart", 98, 50, 1, 60, true, false},
		{"one row", 1, 1, 1, 1, true, true},
		{"off", -1, -1, 1, 1, false, false},
		{"FP8 off", -1, 0, 1, 1, false, true},
		{"bf16 off", 0, -1, 1, 1, true, false},
		{"off, no rows", -1, -1, 1, 0, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := Knobs{DirectMaxRows: c.maxRows, DirectMaxRowsBF16: c.bf16, DirectMinRows: c.minRows}.Defaults()
			require.Equal(t, c.wantFP8, k.Direct(c.rows, false), "FP8 Q")
			require.Equal(t, c.wantB, k.Direct(c.rows, true), "bf16 Q")
		})
	}
}

func TestDirectBlockWarps(t *testing.T) {
	cases := []struct {
		name          string
		warps, half   int
		rows, wantOut int
	}{
		{"default, V4-Flash b=32 MTP 3 (one wave)", 0, 0, 32 * 4 * 64, 4},
		{"default, V4-Pro b=32 MTP 3 (two waves)", 0, 0, 32 * 4 * 128, 2},
		{"default, at the threshold", 0, 0, DefaultDirectHalfBlockRows, 4},
		{"default, one past", 0, 0, DefaultDirectHalfBlockRows + 1, 2},
		{"odd warps round down", 3, 10, 11, 1},
		{"one warp stays one", 1, 10, 11, 1},
		{"never", 4, -1, 1 << 30, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := Knobs{DirectWarps: c.warps, DirectHalfBlockRows: c.half}.Defaults()
			require.Equal(t, c.wantOut, k.DirectBlockWarps(c.rows))
		})
	}
}
