package driver

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/fakecuda"
)

func underFakeDriver() bool { return fakecuda.Active() }

// TestGPUSuiteAgainstFakeDriver builds internal/fakecuda's fake
// libcuda.so.1 and reruns this test binary's TestGPU tests against it in a
// child process (the driver is loaded once per process). The fake enforces
// the driver rules the Go side must respect: calls only where the context is
// current, kernelParams and CUlaunchConfig as cuda.h lays them out, argument
// values copied at capture. So every binding, the owner-thread model and the
// launch layouts are exercised without a GPU.
func TestGPUSuiteAgainstFakeDriver(t *testing.T) {
	log := fakecuda.RunChild(t, "^TestGPU", envRequireGPU+"=1")
	passed := regexp.MustCompile(`(?m)^--- PASS: (TestGPU\w+)`).FindAllStringSubmatch(log, -1)
	skipped := regexp.MustCompile(`(?m)^--- SKIP: (TestGPU\w+)`).FindAllStringSubmatch(log, -1)
	var names []string
	for _, m := range passed {
		names = append(names, m[1])
	}
	t.Logf("against the fake driver, passed: %s", strings.Join(names, " "))
	require.Len(t, skipped, 1, "only the fake-driver test itself skips in the child:\n%s", log)
	require.GreaterOrEqual(t, len(passed), 15, "every TestGPU test ran:\n%s", log)
}

// TestFakeDriverSelectsTheLibrary: the fake package names the driver's
// environment variable by its value (it cannot import the driver).
func TestFakeDriverSelectsTheLibrary(t *testing.T) {
	require.Equal(t, EnvLibCUDA, "PROLOGUE_LIBCUDA")
}
