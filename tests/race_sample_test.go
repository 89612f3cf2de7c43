package tests

import "github.com/dsv4mla/prologue/internal/race"

// raceSample reports whether case i of a fault-injection table runs: every
// case without the race detector, half of them under it, a different half
// for each seed (each case is a whole replay with the CPU reference, and
// the detector adds nothing per case; .ci/run's step without -race runs
// them all).
func raceSample(i int, seed uint64) bool {
	return !race.Enabled || (uint64(i)+seed)%2 == 0
}
