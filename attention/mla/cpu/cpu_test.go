package cpu_test

import (
	"testing"

	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

func TestConformance(t *testing.T) {
	mlatest.Test(t, cpu.New(0))
}

func TestConformanceOneWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: the parallel run covers the same scenarios")
	}
	mlatest.Test(t, cpu.New(1))
}

// TestCompressStep runs the compressor step's conformance suite (it skips
// until the backend implements mla.CompressStepper).
func TestCompressStep(t *testing.T) {
	mlatest.TestCompressStep(t, cpu.New(0))
}

func TestCompressStepOneWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: the parallel run covers the same scenarios")
	}
	mlatest.TestCompressStep(t, cpu.New(1))
}

// TestIndexerQuery runs the indexer query's conformance suite.
func TestIndexerQuery(t *testing.T) {
	mlatest.TestIndexerQuery(t, cpu.New(0))
}

// TestIndexerRotation is "rotate both or neither" on the CPU backend.
func TestIndexerRotation(t *testing.T) {
	mlatest.TestIndexerRotation(t, cpu.New(0))
}
