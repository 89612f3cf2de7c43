package mla_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
)

// TestMetadataLayoutBounds: sizes that would overflow, or pass the int32
// offsets of the device, are refused before anything is allocated; sizes
// within the bound are laid out exactly.
func TestMetadataLayoutBounds(t *testing.T) {
	for _, c := range []struct {
		name                string
		maxSeqs, pageStride int
		ok                  bool
	}{
		{"one sequence, one page", 1, 1, true},
		{"a server's capacity", 256, 16384, true},
		{"int32 offsets exceeded", 1 << 16, 1 << 16, false},
		{"product overflows int64", 1 << 40, 1 << 40, false},
		{"max int sequences", math.MaxInt, 1, false},
		{"max int stride", 1, math.MaxInt, false},
		{"zero", 0, 1, false},
		{"negative stride", 1, -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mb, err := mla.MetadataLayout(c.maxSeqs, c.pageStride)
			if !c.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.LessOrEqual(t, mb.Size, mla.MaxMetadataBytes)
			require.Equal(t, mb.OffBlockTables+((c.maxSeqs*c.pageStride*4+15)&^15), mb.OffScheduler)
			require.Equal(t, mb.OffScheduler+mla.SchedulerBytes, mb.Size)
		})
	}
	// The largest capacity of a 64Ki-wide table that fits stays under the bound.
	s := (mla.MaxMetadataBytes - 256) / 4 / (1<<16 + 7)
	mb, err := mla.MetadataLayout(s, 1<<16)
	require.NoError(t, err)
	require.LessOrEqual(t, mb.Size, mla.MaxMetadataBytes)
	_, err = mla.MetadataLayout(s+1, 1<<16)
	require.ErrorContains(t, err, "the buffer would pass 2147483647 bytes")
}
