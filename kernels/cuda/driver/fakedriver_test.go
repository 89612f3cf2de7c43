package driver

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

//go:embed testdata/fakecuda.c
var fakeDriverSource string

// envFakeDriver marks a test process whose libcuda is the fake.
const envFakeDriver = "PROLOGUE_FAKE_DRIVER"

func underFakeDriver() bool { return os.Getenv(envFakeDriver) == "1" }

// TestGPUSuiteAgainstFakeDriver builds testdata/fakecuda.c into a fake
// libcuda.so.1 and reruns this test binary's TestGPU tests against it in a
// child process (the driver is loaded once per process). The fake enforces
// the driver rules the Go side must respect: calls only where the context is
// current, kernelParams and CUlaunchConfig as cuda.h lays them out, argument
// values copied at capture. So every binding, the owner-thread model and the
// launch layouts are exercised without a GPU.
func TestGPUSuiteAgainstFakeDriver(t *testing.T) {
	if underFakeDriver() {
		t.Skip("this process already runs against the fake driver")
	}
	if testing.Short() {
		t.Skip("builds a C library and runs a child test process")
	}
	cc := ""
	for _, name := range []string{"cc", "gcc", "clang"} {
		if p, err := exec.LookPath(name); err == nil {
			cc = p
			break
		}
	}
	if cc == "" {
		t.Skip("no C compiler (cc, gcc, clang) on PATH to build the fake libcuda")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fakecuda.c")
	require.NoError(t, os.WriteFile(src, []byte(fakeDriverSource), 0o644))
	lib := filepath.Join(dir, "libcuda.so.1")
	out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", lib, src).CombinedOutput()
	require.NoError(t, err, "building the fake libcuda:\n%s", out)

	child := exec.Command(os.Args[0], "-test.run", "^TestGPU", "-test.v", "-test.count=1")
	child.Env = append(os.Environ(), EnvLibCUDA+"="+lib, envFakeDriver+"=1", envRequireGPU+"=1")
	out, err = child.CombinedOutput()
	log := string(out)
	require.NoError(t, err, "GPU tests against the fake driver failed:\n%s", log)

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
