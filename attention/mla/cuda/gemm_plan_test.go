package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlanOwnGEMM checks the own kernel's launch shapes without a GPU:
// the grid covers M and N, the splits cover K exactly with none empty,
// partials fit the workspace, and the V4 shapes get the grids the design
// intends.
func TestPlanOwnGEMM(t *testing.T) {
	for _, s := range []struct{ n, k int }{{1536, 4096}, {32768, 1024}, {2048, 7168}, {65536, 1536}, {128, 128}, {256, 384}, {384, 256}} {
		for _, m := range []int{1, 2, 3, 8, 16, 33, 64, 65, 127, 128, 129, 256, 300, 512, 1024, 4096} {
			for _, sms := range []int{1, 78, 132} {
				p := planOwnGEMM(m, s.n, s.k, sms, gemmPartBytes)
				kbn := s.k / 128
				require.Equal(t, (m+gemmBlockTokens-1)/gemmBlockTokens, p.chunks)
				require.Equal(t, (s.n+gemmBlockRows-1)/gemmBlockRows, p.rowBlocks)
				require.GreaterOrEqual(t, p.splits*p.kbPerSplit, kbn, "%+v", p)
				require.Less(t, (p.splits-1)*p.kbPerSplit, kbn, "an empty split: %+v", p)
				if p.splits > 1 {
					require.LessOrEqual(t, 4*p.splits*m*s.n, gemmPartBytes)
					require.LessOrEqual(t, 4*p.splits*m*s.n, s.n*s.k, "partials larger than the weight")
				}
			}
		}
	}
	// V4-Flash's fused A projection at one token: 6 row blocks split 16 ways
	// (96 blocks, one wave).
	require.Equal(t, ownGEMMPlan{chunks: 1, rowBlocks: 6, splits: 16, kbPerSplit: 2}, planOwnGEMM(1, 1536, 4096, 132, gemmPartBytes))
	// At 128 tokens the partials may not outgrow the weight: 8 splits.
	require.Equal(t, ownGEMMPlan{chunks: 2, rowBlocks: 6, splits: 8, kbPerSplit: 4}, planOwnGEMM(128, 1536, 4096, 132, gemmPartBytes))
	// wq_b: 128 row blocks fill the device without a split.
	require.Equal(t, ownGEMMPlan{chunks: 1, rowBlocks: 128, splits: 1, kbPerSplit: 8}, planOwnGEMM(1, 32768, 1024, 132, gemmPartBytes))
	require.Equal(t, ownGEMMPlan{chunks: 2, rowBlocks: 128, splits: 1, kbPerSplit: 8}, planOwnGEMM(128, 32768, 1024, 132, gemmPartBytes))
}

// TestGEMMStages: the H200 (227 KiB per block) gets the 4-deep weight ring,
// an Ada GPU (99 KiB) the 2-deep one, and too little shared memory none.
func TestGEMMStages(t *testing.T) {
	for _, c := range []struct{ max, stages int }{{232448, 4}, {101376, 2}, {49152, 0}} {
		s, bytes := gemmStages(c.max)
		require.Equal(t, c.stages, s, "max %d", c.max)
		if s > 0 {
			require.LessOrEqual(t, bytes, c.max)
		}
	}
}
