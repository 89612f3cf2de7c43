package mlatest_test

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

// TestSeedFlagReplays: -mlatest.seed=N makes every case draw N, and a case
// built twice from one seed has the same inputs, so a logged seed replays
// the failure; without the flag each case draws a fresh seed.
func TestSeedFlagReplays(t *testing.T) {
	f := flag.Lookup("mlatest.seed")
	require.NotNil(t, f)
	old := f.Value.String()
	t.Cleanup(func() { require.NoError(t, f.Value.Set(old)) })

	require.NoError(t, f.Value.Set("0"))
	require.NotEqual(t, mlatest.Seed(t), mlatest.Seed(t), "fresh seeds")

	require.NoError(t, f.Value.Set("12345678901234567890"))
	seed := mlatest.Seed(t)
	require.Equal(t, uint64(12345678901234567890), seed)
	require.Equal(t, seed, mlatest.Seed(t))

	s, c := mlatest.Scenarios()[1], mlatest.Configs()[0]
	a, err := mlatest.NewCase(s, c, seed)
	require.NoError(t, err)
	b, err := mlatest.NewCase(s, c, seed)
	require.NoError(t, err)
	require.Equal(t, a.Poison(), b.Poison())
	require.Equal(t, a.Expected(), b.Expected())
	other, err := mlatest.NewCase(s, c, seed+1)
	require.NoError(t, err)
	require.NotEqual(t, a.Expected(), other.Expected())
}
