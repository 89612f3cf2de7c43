package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/cudatune"
)

// TestPlanBF16MMA checks the tensor-core bf16 GEMM's launch shapes without
// a GPU: the splits cover K exactly in whole stages with none empty, the
// partials fit the workspace and stay within half the weight, the X chunk
// is whole stages within its split and fits the shared memory cap, and the
// V4 decode shapes get the grids the design intends.
func TestPlanBF16MMA(t *testing.T) {
	for _, s := range []struct{ n, k int }{{512, 1024}, {1024, 4096}, {2048, 4096}, {2048, 7168}, {16, 64}, {48, 192}, {65536, 64}} {
		for _, m := range []int{1, 2, 3, 7, 8, 9, 15, 16, 17, 32, 33, 63, 64, 65, 128, 1000, 4096} {
			for _, sms := range []int{1, 78, 132} {
				p := planBF16MMA(cudatune.SM90.BF16, m, s.n, s.k, sms, bf16MMAPartBytes)
				require.Equal(t, (s.n+63)/64, p.tiles)
				require.Equal(t, (m+63)/64, p.chunks)
				require.Zero(t, p.kSplit%bf16MMAStage, "%+v", p)
				require.GreaterOrEqual(t, p.splits*p.kSplit, s.k, "%+v", p)
				require.Less(t, (p.splits-1)*p.kSplit, s.k, "an empty split: %+v", p)
				if p.splits > 1 {
					require.LessOrEqual(t, 4*p.splits*m*s.n, bf16MMAPartBytes, "%+v", p)
					require.LessOrEqual(t, 4*p.splits*m*s.n, s.n*s.k, "partials larger than half the weight: %+v", p)
				}
				require.Positive(t, p.kChunk)
				require.Zero(t, p.kChunk%bf16MMAStage, "%+v", p)
				require.LessOrEqual(t, p.kChunk, p.kSplit)
				tokens := (min(m, 64) + 7) / 8 * 8
				require.Equal(t, 2*tokens*(p.kChunk+bf16MMAPad), p.shared)
				require.LessOrEqual(t, p.shared, bf16MMASharedBytes)
			}
		}
	}
	// V4-Flash ratio 4's [wkv; wgate] at 64 rows: 32 output blocks split 8
	// ways (256 blocks), each split's X staged in two halves.
	require.Equal(t, bf16MMAPlan{tiles: 32, chunks: 1, splits: 8, kSplit: 512, kChunk: 256, shared: 2 * 64 * 288},
		planBF16MMA(cudatune.SM90.BF16, 64, 2048, 4096, 132, bf16MMAPartBytes))
	// At 8 rows: the same grid, each split's X staged at once.
	require.Equal(t, bf16MMAPlan{tiles: 32, chunks: 1, splits: 8, kSplit: 512, kChunk: 512, shared: 2 * 8 * 544},
		planBF16MMA(cudatune.SM90.BF16, 8, 2048, 4096, 132, bf16MMAPartBytes))
	// Ratio 128's 1024 outputs at V4-Pro's 7168: 16 blocks split 16 ways
	// (7 stages each, the last split 7 too: 112 stages).
	require.Equal(t, bf16MMAPlan{tiles: 16, chunks: 1, splits: 16, kSplit: 448, kChunk: 448, shared: 2 * 32 * 480},
		planBF16MMA(cudatune.SM90.BF16, 32, 1024, 7168, 132, bf16MMAPartBytes))
}
