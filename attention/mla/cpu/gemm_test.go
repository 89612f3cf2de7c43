package cpu_test

import (
	"testing"

	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

// TestGEMM runs the GEMM conformance cases on the CPU backend with the
// Flash shapes' N scaled down (the host reference is the CPU backend's own
// arithmetic, so the cases check the plumbing: layouts, strides, the
// weight cache, refusals).
func TestGEMM(t *testing.T) {
	div := 8
	if testing.Short() {
		div = 64
	}
	mlatest.TestGEMMShapes(t, cpu.New(0), mlatest.ScaledGEMMs(mlatest.FlashGEMMs, div))
}
