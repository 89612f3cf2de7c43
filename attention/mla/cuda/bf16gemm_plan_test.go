package cuda

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
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
				p := planBF16MMA(cudatune.SM90.BF16.SplitBlocksPerSM, 4, 0, m, s.n, s.k, sms, bf16MMAPartBytes)
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
		planBF16MMA(cudatune.SM90.BF16.SplitBlocksPerSM, 4, 0, 64, 2048, 4096, 132, bf16MMAPartBytes))
	// At 8 rows: the same grid, each split's X staged at once.
	require.Equal(t, bf16MMAPlan{tiles: 32, chunks: 1, splits: 8, kSplit: 512, kChunk: 512, shared: 2 * 8 * 544},
		planBF16MMA(cudatune.SM90.BF16.SplitBlocksPerSM, 4, 0, 8, 2048, 4096, 132, bf16MMAPartBytes))
	// Ratio 128's 1024 outputs at V4-Pro's 7168: 16 blocks split 16 ways
	// (7 stages each, the last split 7 too: 112 stages).
	require.Equal(t, bf16MMAPlan{tiles: 16, chunks: 1, splits: 16, kSplit: 448, kChunk: 448, shared: 2 * 32 * 480},
		planBF16MMA(cudatune.SM90.BF16.SplitBlocksPerSM, 4, 0, 32, 1024, 7168, 132, bf16MMAPartBytes))
}

// bf16MMABlockModel replays one block's loops of gemm_bf16_mma.cu (the
// two-stage kernel for depth 2, the ring kernels otherwise) for a plan on
// the host: the stages its MMAs read, in order, and the W loads it
// issues; it fails the test where a loop would read W or X outside the
// block's split or chunk, run past the shared memory it was given, or
// never end.
func bf16MMABlockModel(t *testing.T, p bf16MMAPlan, depth, m, k, split, chunk int) (mmas, loads []int) {
	t.Helper()
	m0 := chunk * bf16MMATokens
	rows := min(bf16MMATokens, m-m0)
	require.Positive(t, rows, "a chunk without tokens")
	tiles := (rows + 7) / 8
	k0 := split * p.kSplit
	k1 := min(k, k0+p.kSplit)
	require.Less(t, k0, k1, "an empty split: %+v", p)
	pitch := p.kChunk + bf16MMAPad
	stageX := func(c0, c1 int) {
		require.LessOrEqual(t, c1-c0, p.kChunk)
		require.Zero(t, (c1-c0)%8)
		// The last 16-byte piece a staging writes, in bytes.
		require.LessOrEqual(t, 2*((tiles*8-1)*pitch+(c1-c0)), p.shared, "X staging past the shared memory: %+v", p)
	}
	load := func(s int) {
		require.GreaterOrEqual(t, s, k0)
		require.LessOrEqual(t, s+bf16MMAStage, k1, "a W load past the split: %+v", p)
		loads = append(loads, s)
	}
	mma := func(s, c0 int) {
		require.LessOrEqual(t, s-c0+bf16MMAStage, p.kChunk, "an MMA past the staged X: %+v", p)
		mmas = append(mmas, s)
	}
	steps := 0
	if depth == 2 {
		load(k0)
		if k0+bf16MMAStage < k1 {
			load(k0 + bf16MMAStage)
		}
		for c0 := k0; c0 < k1; c0 += p.kChunk {
			c1 := min(k1, c0+p.kChunk)
			stageX(c0, c1)
			for s := c0; s < c1; s += bf16MMAStage {
				if s+2*bf16MMAStage < k1 {
					load(s + 2*bf16MMAStage)
				}
				mma(s, c0)
				steps++
				require.Less(t, steps, 1<<20, "the stage loop does not end")
			}
		}
		return mmas, loads
	}
	ns := (k1 - k0) / bf16MMAStage
	for d := range min(depth, ns) {
		load(k0 + d*bf16MMAStage)
	}
	c0, c1 := k0, min(k1, k0+p.kChunk)
	stageX(c0, c1)
	for base := 0; base < ns; base += depth {
		for d := range depth {
			i := base + d
			if i >= ns {
				continue
			}
			s := k0 + i*bf16MMAStage
			if s == c1 {
				c0, c1 = s, min(k1, s+p.kChunk)
				stageX(c0, c1)
			}
			mma(s, c0)
			if i+depth < ns {
				load(s + depth*bf16MMAStage)
			}
			steps++
			require.Less(t, steps, 1<<20, "the stage loop does not end")
		}
	}
	return mmas, loads
}

// TestPlanBF16MMAKernels checks every tensor-core kernel's plans (each
// kernel's residency, split targets of 1 to 4 blocks a multiprocessor)
// over the engine's projection shapes, weights_proj's narrow N = 64 at
// V4-Pro's K = 7168 among them (one output block, 112 stages: the shape
// of cmd/bench's hung three-projection graph), and edge shapes: the grid's
// dimensions are within the driver's limits and never zero, the grid
// holds no more blocks than the kernel keeps resident (no second wave),
// the partials fit the workspace, the reduction's grid covers every
// output, and each block's loops (bf16MMABlockModel) read every stage of
// its split exactly once, in order, each stage's W loaded exactly once
// and within the split, X within the chunk and the shared memory.
func TestPlanBF16MMAKernels(t *testing.T) {
	shapes := []struct{ n, k int }{
		{64, 7168}, {64, 4096}, {2624, 4096}, {2624, 7168}, {1024, 4096}, {1024, 7168}, {2048, 7168}, {512, 7168},
		{16, 64}, {48, 192}, {80, 4096}, {64, 64}, {64, 448},
	}
	// Under the race detector (the planner is plain arithmetic, the same
	// under it) the row counts around each tile edge only, and two of the
	// four residencies (one without a split cap, one with).
	rows, smsList, perSMs := []int{1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129, 4096}, []int{1, 132}, []int{1, 2, 3, 4}
	if race.Enabled {
		rows, smsList, perSMs = []int{1, 9, 33, 128, 129, 4096}, []int{132}, []int{1, 4}
	}
	for _, kn := range bf16MMAKernels {
		for _, perSM := range perSMs {
			maxSplits := []int{0, 16, 0, 5}[perSM-1]
			for _, s := range shapes {
				for _, m := range rows {
					for _, sms := range smsList {
						p := planBF16MMA(perSM, kn.resident, maxSplits, m, s.n, s.k, sms, bf16MMAPartBytes)
						name := fmt.Sprintf("%s perSM=%d maxSplits=%d m=%d n=%d k=%d sms=%d: %+v", kn.name, perSM, maxSplits, m, s.n, s.k, sms, p)
						if maxSplits > 0 {
							require.LessOrEqual(t, p.splits, maxSplits, name)
						}
						for _, d := range []int{p.tiles, p.splits, p.chunks} {
							require.Positive(t, d, name)
						}
						require.LessOrEqual(t, p.splits, 65535, name)
						require.LessOrEqual(t, p.chunks, 65535, name)
						if p.splits > 1 {
							require.LessOrEqual(t, p.tiles*p.splits*p.chunks, kn.resident*sms, "a second wave: %s", name)
							require.LessOrEqual(t, 4*p.splits*m*s.n, bf16MMAPartBytes, name)
							require.LessOrEqual(t, p.tiles*p.chunks, bf16MMACounters, "more output blocks than counters: %s", name)
							grid := splitKGrid(m, s.n)
							require.GreaterOrEqual(t, int(grid[0])*abi.SplitKThreads, m*s.n/4, name)
							require.Positive(t, grid[0], name)
						}
						require.LessOrEqual(t, p.shared, bf16MMASharedBytes, name)
						if p.chunks > 2 && p.splits*p.tiles > 4 {
							continue // the blocks of many-chunk plans repeat the first chunks' loops
						}
						for split := range p.splits {
							for chunk := range p.chunks {
								mmas, loads := bf16MMABlockModel(t, p, kn.depth, m, s.k, split, chunk)
								var want []int
								for st := split * p.kSplit; st < min(s.k, (split+1)*p.kSplit); st += bf16MMAStage {
									want = append(want, st)
								}
								require.Equal(t, want, mmas, "the MMAs' stages: %s", name)
								require.Equal(t, want, loads, "the W loads: %s", name)
							}
						}
					}
				}
			}
		}
	}
	// weights_proj at V4-Pro decode, the default kernel: one output block
	// split 56 ways at 32 rows (2 stages each), 14 ways at 128 rows (two
	// chunks of tokens, 8 stages a split, X in two pieces).
	require.Equal(t, bf16MMAPlan{tiles: 1, chunks: 1, splits: 56, kSplit: 128, kChunk: 128, shared: 2 * 32 * 160},
		planBF16MMA(cudatune.SM90.BF16.SplitBlocksPerSM, 4, 0, 32, 64, 7168, 132, bf16MMAPartBytes))
	require.Equal(t, bf16MMAPlan{tiles: 1, chunks: 2, splits: 14, kSplit: 512, kChunk: 256, shared: 2 * 64 * 288},
		planBF16MMA(cudatune.SM90.BF16.SplitBlocksPerSM, 4, 0, 128, 64, 7168, 132, bf16MMAPartBytes))
	// With at most 16 splits, weights_proj at 1 row: 16 splits of 7 stages.
	require.Equal(t, bf16MMAPlan{tiles: 1, chunks: 1, splits: 16, kSplit: 448, kChunk: 448, shared: 2 * 8 * 480},
		planBF16MMA(cudatune.SM90.BF16.SplitBlocksPerSM, 4, 16, 1, 64, 7168, 132, bf16MMAPartBytes))
	// The ring kernel of depth 8 (2 blocks resident) on the fused ratio-4
	// projection (41 output blocks) at V4-Flash decode: 6 splits, 246
	// blocks, not 7 (287, past the 264 resident).
	require.Equal(t, bf16MMAPlan{tiles: 41, chunks: 1, splits: 6, kSplit: 704, kChunk: 704, shared: 2 * 32 * 736},
		planBF16MMA(2, 2, 0, 32, 2624, 4096, 132, bf16MMAPartBytes))
}
