package cuda

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/kvcache"
)

// validCompressLayer is a ratio-4 layer with 10 new rows, 6 state rows and
// a pool of 3 pages of 5 entries (host-only buffers: validation reads
// their sizes).
func validCompressLayer() *CompressLayer {
	rows := func(n int) *Buffer { return &Buffer{n: n * 1024 * 4} }
	return &CompressLayer{
		Ratio: 4,
		NewK:  rows(10), NewG: rows(10), NewRows: 10,
		StateK: rows(6), StateG: rows(6), StateRows: 6,
		NormWeight: &Buffer{n: 2048}, Eps: 1e-6,
		Rope: &Buffer{n: 64 * 4 * 40}, RopePositions: 40,
		Pool: &Buffer{n: 3 * kvcache.FormatFP8UE8M0.PageBytes(5)}, PageSize: 5, NumPages: 3,
	}
}

func validCompressJobs() []CompressJob {
	return []CompressJob{
		{Index: 0, Candidates: []int32{0, 1, 2, 3}, Page: 0, Offset: 0},
		{Index: 1, Candidates: []int32{StateRow(0), StateRow(5), 0, 1, 2, 3, 4, 9}, Page: 2, Offset: 4},
		{Index: 9, Candidates: []int32{1, 1, 1, 1, 1, 1, 1, 1}, Page: 1, Offset: 0},
	}
}

// TestCompressRefusals: every bad field or job is refused before anything
// runs, with an error naming it.
func TestCompressRefusals(t *testing.T) {
	l := validCompressLayer()
	require.NoError(t, l.validate())
	n, err := l.validateJobs(validCompressJobs())
	require.NoError(t, err)
	require.Equal(t, 20, n)

	layerCases := []struct {
		name   string
		mutate func(l *CompressLayer)
		want   string
	}{
		{"ratio", func(l *CompressLayer) { l.Ratio = 16 }, "Ratio = 16"},
		{"new rows negative", func(l *CompressLayer) { l.NewRows = -1 }, "NewRows = -1"},
		{"new K short", func(l *CompressLayer) { l.NewK = &Buffer{n: 100} }, "NewK must hold NewRows = 10 rows"},
		{"new G missing", func(l *CompressLayer) { l.NewG = nil }, "NewG must hold"},
		{"state G short", func(l *CompressLayer) { l.StateRows = 7 }, "StateK must hold StateRows = 7"},
		{"norm", func(l *CompressLayer) { l.NormWeight = &Buffer{n: 2044} }, "NormWeight must hold 512"},
		{"eps zero", func(l *CompressLayer) { l.Eps = 0 }, "Eps = 0"},
		{"eps inf", func(l *CompressLayer) { l.Eps = float32(math.Inf(1)) }, "Eps = +Inf"},
		{"rope positions", func(l *CompressLayer) { l.RopePositions = 0 }, "RopePositions = 0"},
		{"rope short", func(l *CompressLayer) { l.RopePositions = 41 }, "Rope must hold RopePositions = 41"},
		{"page size", func(l *CompressLayer) { l.PageSize = 0 }, "PageSize = 0"},
		{"pages", func(l *CompressLayer) { l.NumPages = 0 }, "NumPages = 0"},
		{"pool short", func(l *CompressLayer) { l.NumPages = 4 }, "Pool must hold NumPages = 4"},
	}
	for _, tc := range layerCases {
		t.Run(tc.name, func(t *testing.T) {
			l := validCompressLayer()
			tc.mutate(l)
			require.ErrorContains(t, l.validate(), tc.want)
		})
	}
	// A space without rows needs no buffers.
	l = validCompressLayer()
	l.StateK, l.StateG, l.StateRows = nil, nil, 0
	require.NoError(t, l.validate())

	jobCases := []struct {
		name   string
		mutate func(j []CompressJob)
		want   string
	}{
		{"index negative", func(j []CompressJob) { j[0].Index = -1 }, "job 0: Index = -1"},
		{"index past rope", func(j []CompressJob) { j[2].Index = 10 }, "job 2: Index = 10 out of range"},
		{"entry 0 with 8", func(j []CompressJob) { j[0].Candidates = j[1].Candidates }, "job 0 (entry 0): 8 candidates, ratio 4 needs 4"},
		{"entry 1 with 4", func(j []CompressJob) { j[1].Candidates = j[1].Candidates[:4] }, "job 1 (entry 1): 4 candidates, ratio 4 needs 8"},
		{"new row", func(j []CompressJob) { j[1].Candidates[7] = 10 }, "candidate 7 is new row 10, but NewRows = 10"},
		{"state row", func(j []CompressJob) { j[1].Candidates[1] = StateRow(6) }, "candidate 1 is state row 6 (code -7), but StateRows = 6"},
		{"page", func(j []CompressJob) { j[2].Page = 3 }, "job 2 (entry 9): Page = 3"},
		{"offset", func(j []CompressJob) { j[2].Offset = 5 }, "job 2 (entry 9): Offset = 5"},
		{"duplicate", func(j []CompressJob) { j[2].Page, j[2].Offset = 2, 4 }, "jobs 1 and 2 both store at page 2 offset 4"},
	}
	for _, tc := range jobCases {
		t.Run(tc.name, func(t *testing.T) {
			jobs := validCompressJobs()
			tc.mutate(jobs)
			_, err := validCompressLayer().validateJobs(jobs)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestCompressCandidates(t *testing.T) {
	for _, tc := range []struct{ ratio, index, want int }{{4, 0, 4}, {4, 1, 8}, {4, 1000, 8}, {128, 0, 128}, {128, 7, 128}, {16, 1, 0}} {
		require.Equal(t, tc.want, CompressCandidates(tc.ratio, tc.index), "ratio %d index %d", tc.ratio, tc.index)
	}
	require.Equal(t, int32(-1), StateRow(0))
	require.Equal(t, 41, int(^StateRow(41)))
}
