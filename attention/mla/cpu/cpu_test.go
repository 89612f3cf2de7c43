package cpu_test

import (
	"testing"

	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/internal/race"
)

// skipOneWorker skips a one-goroutine rerun of the suite in short mode and
// under the race detector: one worker starts no goroutine for the detector
// to watch, and the parallel run covers the same scenarios (.ci/run's
// non-race step runs it).
func skipOneWorker(t *testing.T) {
	t.Helper()
	if testing.Short() || race.Enabled {
		t.Skip("short mode or -race: the parallel run covers the same scenarios")
	}
}

func TestConformance(t *testing.T) {
	mlatest.Test(t, cpu.New(0))
}

func TestConformanceOneWorker(t *testing.T) {
	skipOneWorker(t)
	mlatest.Test(t, cpu.New(1))
}

// TestCompressStep runs the compressor step's conformance suite (it skips
// until the backend implements mla.CompressStepper).
func TestCompressStep(t *testing.T) {
	mlatest.TestCompressStep(t, cpu.New(0))
}

func TestCompressStepOneWorker(t *testing.T) {
	skipOneWorker(t)
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
