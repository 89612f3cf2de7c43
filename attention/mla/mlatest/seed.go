package mlatest

import (
	"flag"
	"math/rand/v2"
	"testing"
)

var seedFlag = flag.Uint64("mlatest.seed", 0, "replay the conformance suite's cases with this seed (0: a fresh seed per case)")

// Seed returns the seed of one case's random inputs: -mlatest.seed's value
// when it is set (to replay a logged failure, narrowed with -run to the
// case), else a fresh one. Either way it logs the seed with the flag that
// replays it.
func Seed(t testing.TB) uint64 {
	t.Helper()
	s := *seedFlag
	if s == 0 {
		s = rand.Uint64()
	}
	t.Logf("seed %d (replay with -mlatest.seed=%d)", s, s)
	return s
}
