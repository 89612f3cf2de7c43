package mlatest

import (
	"flag"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/dsv4mla/prologue/internal/race"
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

// raceThird is which third of a long suite's cases runs under the race
// detector in this process: -mlatest.seed's value mod 3 when it is set (a
// replay sees the same cases), else a fresh choice.
var raceThird = sync.OnceValue(func() int {
	if *seedFlag != 0 {
		return int(*seedFlag % 3)
	}
	return rand.IntN(3)
})

// skipUnderRace skips case i of a long suite under the race detector unless
// it is in this process's third. The detector adds nothing per case (the
// backends' hot loops report whole ranges), and the CPU backend's indexer
// query and compressor step suites took 48 of its package's 83 CPU seconds
// under it (2026-12-02); .ci/run's step without -race runs every case.
func skipUnderRace(t *testing.T, i int) {
	t.Helper()
	if race.Enabled && (i+raceThird())%3 != 0 {
		t.Skipf("-race: a third of this suite's cases run (those with index %% 3 == %d); .ci/run's step without -race runs them all", (3-raceThird())%3)
	}
}
