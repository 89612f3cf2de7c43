package mlatest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/metadata"
)

// MixedEqualsParts checks, on any backend, that a mixed batch writes exactly
// the bytes its context launch and its generation launch write when each
// runs alone (seed 001's bug wrote un-normalized generation rows only in
// mixed batches).
func MixedEqualsParts(t *testing.T, b mla.Backend) {
	for _, s := range Scenarios() {
		if !hasBothPhases(s) {
			continue
		}
		for _, c := range Configs() {
			t.Run(s.Name+"/"+c.String(), func(t *testing.T) {
				seed := Seed(t)
				cs, err := NewCase(s, c, seed)
				require.NoError(t, err)
				whole := mla.Plan(cs.M)
				require.Len(t, whole, 2, "a mixed batch is one launch per phase")
				mixed, err := cs.Run(b, whole)
				require.NoError(t, err)
				require.NoError(t, cs.Compare(mixed, cs.Expected()))

				ctxOnly, err := cs.Run(b, whole[:1])
				require.NoError(t, err)
				genLaunch := whole[1]
				genLaunch.WriteScheduler = true
				genOnly, err := cs.Run(b, []mla.Launch{genLaunch})
				require.NoError(t, err)

				poison := cs.Poison()
				for i := range mixed.Pool {
					want := genOnly.Pool[i]
					if ctxOnly.Pool[i] != poison[i] {
						want = ctxOnly.Pool[i]
						require.Equal(t, poison[i], genOnly.Pool[i], "cache byte %d written by both phases", i)
					}
					if mixed.Pool[i] != want {
						t.Fatalf("cache byte %d: mixed %#02x, parts %#02x", i, mixed.Pool[i], want)
					}
				}
				split := whole[1].RowBegin * len(mixed.Q) / cs.M.PaddedTokens
				require.Equal(t, ctxOnly.Q[:split], mixed.Q[:split], "context rows of Q")
				require.Equal(t, genOnly.Q[split:], mixed.Q[split:], "generation rows of Q")
				require.Equal(t, mixed.Scheduler, ctxOnly.Scheduler)
				require.Equal(t, mixed.Scheduler, genOnly.Scheduler)
			})
		}
	}
}

func hasBothPhases(s Scenario) bool {
	var ctx, gen bool
	for _, r := range s.Reqs {
		ctx = ctx || r.Phase == metadata.Context
		gen = gen || r.Phase == metadata.Generation
	}
	return ctx && gen
}
