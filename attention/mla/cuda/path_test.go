package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/metadata"
)

// The direct-path thresholds of the conformance variants "boundary" and
// "split" (TestCUDAConformanceVariants).
const (
	// boundaryRows: the suite has a launch of exactly this many Q rows
	// (generation/mtp2: 5 sequences x 3 tokens x 3 heads) and one of a row
	// more (context/eps1e-6-explicit: 23 tokens x 2 heads).
	boundaryRows = 45
	// splitRows: mixed batches whose context launch streams and whose
	// generation launch goes direct (mixed: 159 and 84 Q rows).
	splitRows = 98
)

func TestPathFor(t *testing.T) {
	gen := mla.Launch{Phase: metadata.Generation, Rows: 128, ValidRows: 128, NumSeqs: 32, SeqLen: 4}
	cases := []struct {
		name  string
		knobs cudatune.Knobs
		l     mla.Launch
		heads int
		want  abi.Path
	}{
		{"V4-Flash b=32 MTP 3, defaults", cudatune.Knobs{}, gen, 64, abi.Direct},
		{"V4-Pro b=32 MTP 3, defaults", cudatune.Knobs{}, gen, 128, abi.Direct},
		{"at the default threshold", cudatune.Knobs{}, mla.Launch{Rows: cudatune.DefaultDirectMaxRows / 64}, 64, abi.Direct},
		{"a token past the default threshold", cudatune.Knobs{}, mla.Launch{Rows: cudatune.DefaultDirectMaxRows/64 + 1}, 64, abi.Streaming},
		{"at the threshold", cudatune.Knobs{DirectMaxRows: 45, DirectMinRows: 1}, mla.Launch{Rows: 15}, 3, abi.Direct},
		{"past the threshold", cudatune.Knobs{DirectMaxRows: 45, DirectMinRows: 1}, mla.Launch{Rows: 23}, 2, abi.Streaming},
		{"off", cudatune.Knobs{DirectMaxRows: -1}, mla.Launch{Rows: 1}, 1, abi.Streaming},
		{"one token, defaults", cudatune.Knobs{}, mla.Launch{Rows: 1}, 64, abi.Direct},
		{"below a minimum", cudatune.Knobs{DirectMinRows: 128}, mla.Launch{Rows: 1}, 64, abi.Streaming},
		{"at a minimum", cudatune.Knobs{DirectMinRows: 128}, mla.Launch{Rows: 2}, 64, abi.Direct},
		// A graph's launch is sized by its padded rows, not by the header's
		// counts (the host's copies are meaningless).
		{"from header: padded rows", cudatune.Knobs{DirectMaxRows: 100, DirectMinRows: 1}, mla.Launch{Rows: 51, FromHeader: true}, 2, abi.Streaming},
		{"from header: zero valid rows", cudatune.Knobs{DirectMaxRows: 100, DirectMinRows: 1}, mla.Launch{Rows: 50, FromHeader: true}, 2, abi.Direct},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, cuda.PathFor(c.knobs, c.l, c.heads))
		})
	}
}

// TestSuiteCrossesThePathBoundary: under the "boundary" variant the suite
// runs a launch exactly at the threshold (direct) and one a Q row past it
// (streaming); under "split" a batch's launches take both paths. A change
// to the scenarios that loses either fails here, not silently on the GPU.
func TestSuiteCrossesThePathBoundary(t *testing.T) {
	boundary := cudatune.Knobs{DirectMaxRows: boundaryRows, DirectMinRows: 1}
	split := cudatune.Knobs{DirectMaxRows: splitRows, DirectMinRows: 1}
	var at, past, both []string
	for _, s := range mlatest.Scenarios() {
		cs, err := mlatest.NewCase(s, mlatest.Configs()[0], 1)
		require.NoError(t, err, s.Name)
		paths := map[abi.Path]bool{}
		for _, l := range mla.Plan(cs.M) {
			switch l.Rows * s.Heads {
			case boundaryRows:
				require.Equal(t, abi.Direct, cuda.PathFor(boundary, l, s.Heads), s.Name)
				at = append(at, s.Name)
			case boundaryRows + 1:
				require.Equal(t, abi.Streaming, cuda.PathFor(boundary, l, s.Heads), s.Name)
				past = append(past, s.Name)
			}
			paths[cuda.PathFor(split, l, s.Heads)] = true
		}
		if len(paths) == 2 {
			both = append(both, s.Name)
		}
	}
	require.NotEmpty(t, at, "no launch of exactly %d Q rows: move boundaryRows", boundaryRows)
	require.NotEmpty(t, past, "no launch of %d Q rows: move boundaryRows", boundaryRows+1)
	require.NotEmpty(t, both, "no batch with launches on both sides of %d Q rows: move splitRows", splitRows)
	t.Logf("at %d: %v; at %d: %v; split at %d: %v", boundaryRows, at, boundaryRows+1, past, splitRows, both)
}
