package mlatest_test

import (
	"testing"

	"github.com/dsv4mla/prologue/internal/race"
)

// skipUnderRace skips a test of the suite itself (deliberately wrong
// backends it must fail, the host reference it must agree with) under the
// race detector: what it asserts is a property of the suite's cases and
// reference, the same with or without the detector, which watches the CPU
// backend's goroutines in attention/mla/cpu's runs of the suite already.
// .ci/run's non-race step runs it.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if race.Enabled {
		t.Skip("-race: a property of the suite's cases; .ci/run's non-race step runs it")
	}
}
