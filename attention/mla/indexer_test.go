package mla_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
)

// sized is a Buffer of n bytes (Validate reads lengths only).
type sized int

func (s sized) Len() int { return int(s) }

// TestIndexerQueryFormat: each format's names, row and weight sizes, and
// Validate sizing QOut and WOut by the format (one byte short is refused
// naming the buffer) and refusing an unknown format.
func TestIndexerQueryFormat(t *testing.T) {
	const rows = 3
	for _, tt := range []struct {
		f          mla.IndexerQueryFormat
		name       string
		row, wbyte int
	}{
		{mla.IndexerQueryMXFP4, "mxfp4", 68, 2},
		{mla.IndexerQueryFP8, "fp8", 128, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.name, tt.f.String())
			p, err := mla.ParseIndexerQueryFormat(tt.name)
			require.NoError(t, err)
			require.Equal(t, tt.f, p)
			require.Equal(t, tt.row, tt.f.RowBytes())
			require.Equal(t, tt.wbyte, tt.f.WeightBytes())
			qout, wout := rows*64*tt.row, rows*64*tt.wbyte
			a := func(q, w int) *mla.IndexerQueryArgs {
				return &mla.IndexerQueryArgs{Format: tt.f, Q: sized(rows * 8192 * 2), QStride: 8192, W: sized(rows * 64 * 4), WStride: 64,
					QOut: sized(q), WOut: sized(w), Rope: sized(10 * 64 * 4), RopePositions: 10, Meta: &mla.MetadataBuffers{}}
			}
			require.NoError(t, a(qout, wout).Validate(rows))
			require.ErrorIs(t, a(qout-1, wout).Validate(rows), mla.ErrIndexerArgs)
			require.ErrorContains(t, a(qout-1, wout).Validate(rows), "QOut")
			require.ErrorContains(t, a(qout, wout-1).Validate(rows), "WOut")
		})
	}
	_, err := mla.ParseIndexerQueryFormat("fp4")
	require.ErrorIs(t, err, mla.ErrIndexerArgs)
	bad := &mla.IndexerQueryArgs{Format: 7, QStride: 8192, WStride: 64, RopePositions: 1, Meta: &mla.MetadataBuffers{}}
	require.ErrorContains(t, bad.Validate(0), "Format")
	require.Equal(t, "IndexerQueryFormat(7)", mla.IndexerQueryFormat(7).String())
}
