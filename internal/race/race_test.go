package race_test

import (
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
