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

// boundaryKnobs and splitKnobs put the thresholds of both Q formats at
// boundaryRows and splitRows.
func boundaryKnobs() cudatune.Knobs {
	return cudatune.Knobs{DirectMaxRows: boundaryRows, DirectMaxRowsBF16: boundaryRows, DirectMinRows: 1}
}

func splitKnobs() cudatune.Knobs {
	return cudatune.Knobs{DirectMaxRows: splitRows, DirectMaxRowsBF16: splitRows, DirectMinRows: 1}
}

func TestPathFor(t *testing.T) {
	gen := mla.Launch{Phase: metadata.Generation, Rows: 128, ValidRows: 128, NumSeqs: 32, SeqLen: 4}
	ctx64K := mla.Launch{Phase: metadata.Context, Rows: 65536, ValidRows: 65536, NumSeqs: 32}
	const fp8, bf16 = mla.QFP8, mla.QBF16
	cases := []struct {
		name  string
		knobs cudatune.Knobs
		l     mla.Launch
		heads int
		q     mla.QFormat
		want  abi.Path
	}{
		{"V4-Flash b=32 MTP 3, defaults", cudatune.Knobs{}, gen, 64, fp8, abi.Direct},
		{"V4-Pro b=32 MTP 3, defaults", cudatune.Knobs{}, gen, 128, fp8, abi.Direct},
		{"V4-Pro b=32 MTP 3, bf16 Q, defaults", cudatune.Knobs{}, gen, 128, bf16, abi.Direct},
		{"at the default threshold", cudatune.Knobs{}, mla.Launch{Rows: cudatune.SM90.Knobs.DirectMaxRows / 64}, 64, fp8, abi.Direct},
		{"a token past the default threshold", cudatune.Knobs{}, mla.Launch{Rows: cudatune.SM90.Knobs.DirectMaxRows/64 + 1}, 64, fp8, abi.Streaming},
		{"a token past the default threshold, bf16 Q", cudatune.Knobs{}, mla.Launch{Rows: cudatune.SM90.Knobs.DirectMaxRows/64 + 1}, 64, bf16, abi.Direct},
		{"V4-Pro 64K context tokens, FP8 Q", cudatune.Knobs{}, ctx64K, 128, fp8, abi.Streaming},
		{"V4-Pro 64K context tokens, bf16 Q", cudatune.Knobs{}, ctx64K, 128, bf16, abi.Direct},
		{"at the threshold", cudatune.Knobs{DirectMaxRows: 45, DirectMinRows: 1}, mla.Launch{Rows: 15}, 3, fp8, abi.Direct},
		{"past the threshold", cudatune.Knobs{DirectMaxRows: 45, DirectMinRows: 1}, mla.Launch{Rows: 23}, 2, fp8, abi.Streaming},
		{"past the bf16 threshold", cudatune.Knobs{DirectMaxRowsBF16: 45, DirectMinRows: 1}, mla.Launch{Rows: 23}, 2, bf16, abi.Streaming},
		{"FP8 threshold, bf16 Q", cudatune.Knobs{DirectMaxRows: 45, DirectMinRows: 1}, mla.Launch{Rows: 23}, 2, bf16, abi.Direct},
		{"off", cudatune.Knobs{DirectMaxRows: -1}, mla.Launch{Rows: 1}, 1, fp8, abi.Streaming},
		{"off for bf16 Q", cudatune.Knobs{DirectMaxRowsBF16: -1}, mla.Launch{Rows: 1}, 1, bf16, abi.Streaming},
		{"one token, defaults", cudatune.Knobs{}, mla.Launch{Rows: 1}, 64, fp8, abi.Direct},
		{"below a minimum", cudatune.Knobs{DirectMinRows: 128}, mla.Launch{Rows: 1}, 64, fp8, abi.Streaming},
		{"below a minimum, bf16 Q", cudatune.Knobs{DirectMinRows: 128}, mla.Launch{Rows: 1}, 64, bf16, abi.Streaming},
		{"at a minimum", cudatune.Knobs{DirectMinRows: 128}, mla.Launch{Rows: 2}, 64, fp8, abi.Direct},
		// A graph's launch is sized by its padded rows, not by the header's
		// counts (the host's copies are meaningless).
		{"from header: padded rows", cudatune.Knobs{DirectMaxRows: 100, DirectMinRows: 1}, mla.Launch{Rows: 51, FromHeader: true}, 2, fp8, abi.Streaming},
		{"from header: zero valid rows", cudatune.Knobs{DirectMaxRows: 100, DirectMinRows: 1}, mla.Launch{Rows: 50, FromHeader: true}, 2, fp8, abi.Direct},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, cuda.PathFor(c.knobs, c.l, c.heads, c.q))
		})
	}
}

// TestSuiteCrossesThePathBoundary: under the "boundary" variant the suite
// runs a launch exactly at the threshold (direct) and one a Q row past it
// (streaming), in either Q format; under "split" a batch's launches take
// both paths. A change to the scenarios that loses either fails here, not
// silently on the GPU.
func TestSuiteCrossesThePathBoundary(t *testing.T) {
	boundary, split := boundaryKnobs(), splitKnobs()
	var at, past, both []string
	for _, q := range mla.QFormats() {
		for _, s := range mlatest.Scenarios() {
			cs, err := mlatest.NewCase(s, mlatest.Configs()[0], 1)
			require.NoError(t, err, s.Name)
			paths := map[abi.Path]bool{}
			for _, l := range mla.Plan(cs.M) {
				switch l.Rows * s.Heads {
				case boundaryRows:
					require.Equal(t, abi.Direct, cuda.PathFor(boundary, l, s.Heads, q), s.Name)
					at = append(at, s.Name)
				case boundaryRows + 1:
					require.Equal(t, abi.Streaming, cuda.PathFor(boundary, l, s.Heads, q), s.Name)
					past = append(past, s.Name)
				}
				paths[cuda.PathFor(split, l, s.Heads, q)] = true
			}
			if len(paths) == 2 {
				both = append(both, s.Name)
			}
		}
	}
	require.NotEmpty(t, at, "no launch of exactly %d Q rows: move boundaryRows", boundaryRows)
	require.NotEmpty(t, past, "no launch of %d Q rows: move boundaryRows", boundaryRows+1)
	require.NotEmpty(t, both, "no batch with launches on both sides of %d Q rows: move splitRows", splitRows)
	t.Logf("at %d: %v; at %d: %v; split at %d: %v", boundaryRows, at, boundaryRows+1, past, splitRows, both)
}
