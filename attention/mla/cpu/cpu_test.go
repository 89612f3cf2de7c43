package cpu_test

import (
	"testing"

	"github.com/stretchr/testify/require"

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

// TestFill: Fill sets exactly the n bytes at off, zero (cleared) or not
// (doubling copies), for lengths around the powers of two those copies
// cross, and leaves the rest as it was.
func TestFill(t *testing.T) {
	b := cpu.New(0)
	for _, v := range []byte{0xA5, 0} {
		for _, c := range []struct{ off, n int }{{0, 0}, {0, 1}, {3, 2}, {1, 3}, {5, 63}, {0, 64}, {7, 65}, {2, 1000}} {
			buf, err := b.Alloc(c.off + c.n + 9)
			require.NoError(t, err)
			mem := cpu.Bytes(buf)
			for i := range mem {
				mem[i] = byte(i*7 + 1)
			}
			require.NoError(t, b.Fill(buf, c.off, c.n, v))
			for i, got := range mem {
				want := byte(i*7 + 1)
				if i >= c.off && i < c.off+c.n {
					want = v
				}
				require.Equal(t, want, got, "value %#02x off %d n %d: byte %d", v, c.off, c.n, i)
			}
		}
	}
	buf, err := b.Alloc(8)
	require.NoError(t, err)
	require.Error(t, b.Fill(buf, 4, 5, 1), "past the end")
}
