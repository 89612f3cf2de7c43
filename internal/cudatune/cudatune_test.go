package cudatune

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDefaults(t *testing.T) {
	require.Equal(t, Knobs{Warps: 8, KVDepth: 4, QDepth: 4, BlocksPerSM: 4}, Knobs{}.Defaults())
	set := Knobs{Warps: 3, KVDepth: 1, QDepth: 5, BlocksPerSM: 2, MaxBlocks: 1, SeparateLaunches: true, Verbose: true}
	require.Equal(t, set, set.Defaults(), "set fields stay")
	require.Equal(t, 8, Knobs{Warps: -1}.Defaults().Warps)
}
