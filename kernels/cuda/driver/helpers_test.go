package driver

import (
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// EnvRequireGPU turns the skips of GPU and NVRTC tests into failures, for
// runs on a machine that is supposed to have both.
const envRequireGPU = "PROLOGUE_REQUIRE_GPU"

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(envRequireGPU) == "1" {
		t.Fatalf(format+" ("+envRequireGPU+"=1)", args...)
	}
	t.Skipf(format, args...)
}

// openTestContext opens device 0 or skips the test saying why.
func openTestContext(t testing.TB) *Context {
	t.Helper()
	if err := Available(); err != nil {
		skipOrFail(t, "no CUDA device: %v", err)
	}
	c, err := Open(0)
	if err != nil {
		t.Fatalf("Open(0): %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func requireNVRTC(t testing.TB) {
	t.Helper()
	if err := NVRTCAvailable(); err != nil {
		skipOrFail(t, "no NVRTC: %v", err)
	}
}

// newRand returns a generator with a fresh seed, logged so a failure can be
// replayed.
func newRand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
