package cuda_test

import (
	"testing"

	"github.com/dsv4mla/prologue/internal/cudatune"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

var _ mlatest.QuantBackend = (*cuda.Backend)(nil)

func TestCUDAActQuant(t *testing.T) { mlatest.TestActQuant(t, backend(t)) }

func TestCUDANormQuant(t *testing.T) { mlatest.TestNormQuant(t, backend(t)) }

func TestCUDAQuantRefusals(t *testing.T) { mlatest.TestQuantRefusals(t, backend(t)) }

// TestCUDAQuantVariants runs both kernels with a one-block grid (every warp
// loops over many rows and blocks, its shared-memory slot reused) and
// without programmatic dependent launch.
func TestCUDAQuantVariants(t *testing.T) {
	backend(t)
	variants := map[string]struct {
		opts  cuda.Options
		knobs cudatune.Knobs
	}{
		"one-block": {knobs: cudatune.Knobs{MaxBlocks: 1}},
		"no-pdl":    {opts: cuda.Options{NoPDL: true}},
	}
	for name, v := range variants {
		b, err := cuda.NewTuned(v.opts, v.knobs)
		require.NoError(t, err)
		t.Run(name+"/act_quant", func(t *testing.T) { mlatest.TestActQuant(t, b) })
		t.Run(name+"/norm_quant", func(t *testing.T) { mlatest.TestNormQuant(t, b) })
		require.NoError(t, b.Close())
	}
}
