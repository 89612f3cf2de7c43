package cpu_test

import (
	"testing"

	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/internal/race"
)

// TestGEMM runs the GEMM conformance cases on the CPU backend with the
// Flash shapes' N scaled down (the host reference is the CPU backend's own
// arithmetic, so the cases check the plumbing: layouts, strides, the
// weight cache, refusals). In short mode and under the race detector N is
// scaled down further: the detector sees the same goroutines at any N, and
// .ci/run's non-race step runs the larger shapes.
func TestGEMM(t *testing.T) {
	div := 8
	if testing.Short() || race.Enabled {
		div = 64
	}
	mlatest.TestGEMMShapes(t, cpu.New(0), mlatest.ScaledGEMMs(mlatest.FlashGEMMs, div))
}
