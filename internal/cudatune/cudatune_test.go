package cudatune

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDefaults(t *testing.T) {
	require.Equal(t, Knobs{Warps: 8, KVDepth: 4, QDepth: 4, QChunk: DefaultQChunk, BlocksPerSM: DefaultBlocksPerSM,
		DirectMaxRows: DefaultDirectMaxRows, DirectMinRows: DefaultDirectMinRows, DirectWarps: 4, DirectHalfBlockRows: DefaultDirectHalfBlockRows, DirectQRows: 2, DirectMinBlocks: 1,
		BF16MMAMaxRows: DefaultBF16MMAMaxRows}, Knobs{}.Defaults())
	set := Knobs{Warps: 3, KVDepth: 1, QDepth: 5, QChunk: 3, BlocksPerSM: 2, MaxBlocks: 1, DirectMaxRows: 7, DirectMinRows: 2, DirectWarps: 2, DirectHalfBlockRows: 5,
		DirectQRows: 3, DirectMinBlocks: 6, BF16MMAMaxRows: 9, SeparateLaunches: true, Verbose: true}
	require.Equal(t, set, set.Defaults(), "set fields stay")
	require.Equal(t, 8, Knobs{Warps: -1}.Defaults().Warps)
	require.Equal(t, -1, Knobs{DirectMaxRows: -5}.Defaults().DirectMaxRows, "negative: never direct")
	require.Equal(t, -1, Knobs{BF16MMAMaxRows: -3}.Defaults().BF16MMAMaxRows, "negative: never the tensor-core kernel")
}

func TestDirect(t *testing.T) {
	cases := []struct {
		name    string
		maxRows int
		minRows int
		rows    int
		want    bool
	}{
		{"default, V4-Flash b=32 MTP 3", 0, 0, 32 * 4 * 64, true},
		{"default, at the threshold", 0, 0, DefaultDirectMaxRows, true},
		{"default, one past", 0, 0, DefaultDirectMaxRows + 1, false},
		{"default, at the minimum", 0, 0, DefaultDirectMinRows, true},
		{"default, one below the minimum", 0, 0, DefaultDirectMinRows - 1, false},
		{"at the threshold", 98, 1, 98, true},
		{"one past the threshold", 98, 1, 99, false},
		{"one row", 1, 1, 1, true},
		{"off", -1, 1, 1, false},
		{"off, no rows", -1, 1, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, Knobs{DirectMaxRows: c.maxRows, DirectMinRows: c.minRows}.Defaults().Direct(c.rows))
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
