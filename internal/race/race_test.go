package race_test

import (
	"os"
	"os/exec"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
)

// TestEnabledMatchesTheBuild: Enabled is true exactly when the binary was
// built with -race, as its build settings record.
func TestEnabledMatchesTheBuild(t *testing.T) {
	info, ok := debug.ReadBuildInfo()
	require.True(t, ok)
	built := false
	for _, s := range info.Settings {
		if s.Key == "-race" {
			built = s.Value == "true"
		}
	}
	require.Equal(t, built, race.Enabled)
}

// TestRangesAreSeen: a goroutine writing one element of a slice while
// another reports its Read, or its Write, of the whole slice is a data race
// the detector reports (a child process runs each race: the report fails
// the test that has it).
func TestRangesAreSeen(t *testing.T) {
	if !race.Enabled {
		t.Skip("the race detector is off")
	}
	if mode := os.Getenv("RACE_RANGE_CHILD"); mode != "" {
		s := make([]uint16, 64)
		done := make(chan struct{})
		go func() { s[37] = 1; close(done) }()
		if mode == "read" {
			race.Read(s)
		} else {
			race.Write(s)
		}
		<-done
		race.Read([]float32{})
		race.Write[int](nil)
		return
	}
	for _, mode := range []string{"read", "write"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRangesAreSeen$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RACE_RANGE_CHILD="+mode)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%s: %s", mode, out)
		require.Contains(t, string(out), "WARNING: DATA RACE", mode)
		require.Contains(t, string(out), "race"+mode+"range", mode)
	}
}
