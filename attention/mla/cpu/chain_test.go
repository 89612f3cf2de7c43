package cpu_test

import (
	"testing"

	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

func TestActQuant(t *testing.T) { mlatest.TestActQuant(t, cpu.New(0)) }

func TestNormQuant(t *testing.T) { mlatest.TestNormQuant(t, cpu.New(0)) }

func TestQuantRefusals(t *testing.T) { mlatest.TestQuantRefusals(t, cpu.New(0)) }

// TestQuantOneWorker runs both kernels on one goroutine: the rows' tasks
// must not depend on how they are spread.
func TestQuantOneWorker(t *testing.T) {
	skipOneWorker(t)
	mlatest.TestActQuant(t, cpu.New(1))
	mlatest.TestNormQuant(t, cpu.New(1))
}

var _ mlatest.QuantBackend = (*cpu.Backend)(nil)
