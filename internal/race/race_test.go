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

// TestReadIsSeen: a goroutine writing one element of a slice while another
// reports its Read of the whole slice is a data race the detector reports
// (a child process runs the race: the report fails the test that has it).
func TestReadIsSeen(t *testing.T) {
	if !race.Enabled {
		t.Skip("the race detector is off")
	}
	if os.Getenv("RACE_READ_CHILD") == "1" {
		s := make([]uint16, 64)
		done := make(chan struct{})
		go func() { s[37] = 1; close(done) }()
		race.Read(s)
		<-done
		race.Read([]float32{})
		race.Read[int](nil)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReadIsSeen$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RACE_READ_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "WARNING: DATA RACE")
	require.Contains(t, string(out), "racereadrange")
}
