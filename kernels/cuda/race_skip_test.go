package cuda_test

import (
	"testing"

	"github.com/dsv4mla/prologue/internal/race"
)

// skipCompileUnderRace skips a test that only runs NVRTC under the race
// detector: the compiler is native code the detector does not watch
// (these compiles took 16 of the package's 41 seconds under -race,
// 2026-12-02). .ci/run's step without -race compiles them. (attention/mla/cuda's
// tests have the same helper: a test helper does not cross packages.)
func skipCompileUnderRace(t *testing.T) {
	t.Helper()
	if race.Enabled {
		t.Skip("-race: NVRTC is native code the detector does not watch; .ci/run's step without -race compiles the source")
	}
}
