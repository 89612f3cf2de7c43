//go:build invariants

package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMutationsCheckInvariants: with -tags invariants a mutation on a
// corrupted cache panics instead of carrying on.
func TestMutationsCheckInvariants(t *testing.T) {
	c, err := New(Config{PageSize: 4, NumPages: 4})
	require.NoError(t, err)
	r, err := c.Reserve([]Need{{ID: 1, NewLength: 8, Create: true}})
	require.NoError(t, err)
	require.NoError(t, r.Commit())
	c.seqs[1].reserved = 9 // claims a token its two pages cannot hold
	require.PanicsWithError(t, "kvcache invariant: sequence 1 has 2 pages for 9 reserved tokens, want 3", func() {
		_, _ = c.Reserve([]Need{{ID: 2, NewLength: 1, Create: true}})
	})
}
