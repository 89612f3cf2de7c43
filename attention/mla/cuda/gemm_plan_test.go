package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlanOwnGEMM checks the own kernel's launch shapes without a GPU:
// the splits cover K exactly with none empty, partials fit the workspace,
// and the V4 shapes get the grids the design intends.
func TestPlanOwnGEMM(t *testing.T) {
	for _, s := range []struct{ n, k int }{{1536, 4096}, {32768, 1024}, {2048, 7168}, {65536, 1536}, {128, 128}, {256, 384}} {
		for _, m := range []int{1, 2, 3, 8, 16, 33, 64, 65, 127, 128, 129, 256, 300, 512, 1024, 4096} {
			for _, sms := range []int{1, 78, 132} {
				p := planOwnGEMM(m, s.n, s.k, sms, gemmPartBytes)
				kbn := s.k / 128
				require.Contains(t, []int{64, 128}, p.mt)
				require.Equal(t, (m+p.mt-1)/p.mt, p.chunks)
				require.GreaterOrEqual(t, p.splits*p.kbPerSplit, kbn, "%+v", p)
				require.Less(t, (p.splits-1)*p.kbPerSplit, kbn, "an empty split: %+v", p)
				if p.splits > 1 {
					require.Equal(t, 64, p.mt)
					require.LessOrEqual(t, 4*p.splits*m*s.n, gemmPartBytes)
					require.LessOrEqual(t, 4*p.splits*m*s.n, s.n*s.k, "partials larger than the weight")
				}
			}
		}
	}
	// V4-Flash's fused A projection at one token: 12 row blocks split 16 ways.
	require.Equal(t, ownGEMMPlan{mt: 64, chunks: 1, splits: 16, kbPerSplit: 2}, planOwnGEMM(1, 1536, 4096, 132, gemmPartBytes))
	// wq_b at 128 tokens: 256 row blocks fill the device without a split.
	require.Equal(t, ownGEMMPlan{mt: 128, chunks: 1, splits: 1, kbPerSplit: 8}, planOwnGEMM(128, 32768, 1024, 132, gemmPartBytes))
}

func TestOwnGEMMDefault(t *testing.T) {
	for _, c := range []struct {
		m, n int
		own  bool
	}{
		{1, 32768, true}, {8, 32768, true}, {9, 32768, false}, {128, 32768, false},
		{32, 1536, true}, {33, 1536, false}, {32, 2048, true}, {128, 2048, false},
	} {
		if got := ownGEMMDefault(c.m, c.n); got != c.own {
			t.Errorf("ownGEMMDefault(%d, %d) = %v, want %v", c.m, c.n, got, c.own)
		}
	}
}
