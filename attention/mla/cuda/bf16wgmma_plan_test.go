package cuda

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// TestBF16WGMMAFinishIDs: cudatune's finish ids are abi.h's.
func TestBF16WGMMAFinishIDs(t *testing.T) {
	require.Equal(t, abi.BF16WGMMAFinishReduce, cudatune.BF16WGMMAFinishReduce)
	require.Equal(t, abi.BF16WGMMAFinishLast, cudatune.BF16WGMMAFinishLast)
	require.Equal(t, abi.BF16WGMMAFinishCluster, cudatune.BF16WGMMAFinishCluster)
	require.Equal(t, abi.BF16WGMMATokenTiles(), cudatune.SM90.BF16.WGMMA.TokenTiles, "the architecture's tiles are the kernels'")
}

// TestPlanBF16WGMMA: on the H200's resources, every plan covers K with
// its splits, keeps one wave of blocks (the persistent grid at most the
// multiprocessors, a cluster grid exactly the units' splits), fits the
// shared memory and the partials' workspace, and finishes a split K the
// way asked where it can (clusters only of at most 8 splits that the
// device runs at once).
func TestPlanBF16WGMMA(t *testing.T) {
	const sms, optin = 132, 227 << 10
	a := cudatune.SM90.BF16.WGMMA
	caps := []int{0, 0, 66, 44, 32, 22, 22, 16, 16} // as the driver might answer
	for _, finish := range []int{0, abi.BF16WGMMAFinishReduce, abi.BF16WGMMAFinishLast, abi.BF16WGMMAFinishCluster} {
		for _, withCaps := range []bool{false, true} {
			a.MaxClusters = nil
			if withCaps {
				a.MaxClusters = caps
			}
			for _, s := range []struct{ n, k int }{{2624, 4096}, {1024, 4096}, {2624, 7168}, {1024, 7168}, {64, 7168}, {16, 64}, {1040, 128}} {
				for _, m := range []int{1, 3, 8, 9, 31, 64, 128, 129, 512, 4096, 16384} {
					p, err := planBF16WGMMA(a, bf16WGMMAChoice{finish: finish}, m, s.n, s.k, sms, optin, bf16MMAPartBytes)
					require.NoError(t, err)
					kbn := s.k / abi.BF16WGMMAStageK
					units := p.tiles * p.chunks
					require.Equal(t, (s.n+127)/128, p.tiles)
					require.GreaterOrEqual(t, p.bn*p.chunks, m)
					require.True(t, p.bn >= m || p.bn == 128, "the smallest tile holding m")
					require.GreaterOrEqual(t, p.splits*p.kbPerSplit, kbn, "K covered")
					require.Less(t, (p.splits-1)*p.kbPerSplit, kbn, "no empty split")
					require.LessOrEqual(t, p.smem, optin)
					require.GreaterOrEqual(t, p.stages, 2)
					require.LessOrEqual(t, p.stages, a.MaxStages)
					if p.splits == 1 {
						require.Zero(t, p.finish)
						require.Equal(t, min(units, sms), p.grid)
						continue
					}
					require.LessOrEqual(t, units*p.splits, sms, "%v m %d: one wave", s, m)
					want := finish
					if want == 0 {
						want = a.Finish
					}
					switch p.finish {
					case abi.BF16WGMMAFinishCluster:
						require.Equal(t, abi.BF16WGMMAFinishCluster, want)
						require.True(t, withCaps)
						require.LessOrEqual(t, p.splits, 8)
						require.LessOrEqual(t, units, caps[p.splits])
						require.Equal(t, units*p.splits, p.grid)
					case abi.BF16WGMMAFinishLast:
						require.True(t, want == abi.BF16WGMMAFinishLast || want == abi.BF16WGMMAFinishCluster)
						require.LessOrEqual(t, 4*units, bf16WGMMACounterBytes)
					default:
						require.Equal(t, abi.BF16WGMMAFinishReduce, want)
					}
					if p.finish != abi.BF16WGMMAFinishCluster {
						require.LessOrEqual(t, 4*p.splits*m*s.n, bf16MMAPartBytes, "partials within the workspace")
						require.Equal(t, units*p.splits, p.grid)
					}
				}
			}
		}
	}
	// V4-Flash's fused projection at 128 rows: 21 tiles, 6 splits of 11 K
	// blocks, 126 blocks, a ring of 7 stages of 32 KiB.
	a.MaxClusters = nil
	p, err := planBF16WGMMA(a, bf16WGMMAChoice{finish: abi.BF16WGMMAFinishLast}, 128, 2624, 4096, sms, optin, bf16MMAPartBytes)
	require.NoError(t, err)
	require.Equal(t, bf16WGMMAPlan{bn: 128, tiles: 21, chunks: 1, splits: 6, kbPerSplit: 11, grid: 126, stages: 7,
		smem: bf16WGMMASmemBytes(128, 7), finish: abi.BF16WGMMAFinishLast}, p)
	// Capped at 4 splits: 16 K blocks each, 84 blocks.
	p, err = planBF16WGMMA(a, bf16WGMMAChoice{finish: abi.BF16WGMMAFinishLast, maxSplits: 4}, 128, 2624, 4096, sms, optin, bf16MMAPartBytes)
	require.NoError(t, err)
	require.Equal(t, [3]int{4, 16, 84}, [3]int{p.splits, p.kbPerSplit, p.grid})
	// Token tiles of at most 64: V4-Flash's ratio 128 at 128 rows in two
	// chunks, 16 units split 8 ways (clusters of 8, where 16 fit).
	a.MaxClusters = caps
	p, err = planBF16WGMMA(a, bf16WGMMAChoice{finish: abi.BF16WGMMAFinishCluster, maxTile: 64}, 128, 1024, 4096, sms, optin, bf16MMAPartBytes)
	require.NoError(t, err)
	require.Equal(t, [5]int{64, 2, 8, 128, abi.BF16WGMMAFinishCluster}, [5]int{p.bn, p.chunks, p.splits, p.grid, p.finish})
}

// TestBF16WGMMAParamsPacking: BF16WGMMAParams from a plan and the GEMM's
// arguments, each finish (the partials and counters only where the finish
// reads them: bf16WGMMA passes zero otherwise).
func TestBF16WGMMAParamsPacking(t *testing.T) {
	a := &mla.BF16GEMMArgs{Rows: 29, N: 2624, K: 7168, XStride: 7176, YStride: 2628}
	for _, c := range []struct {
		p              bf16WGMMAPlan
		part, counters uint64
	}{
		{bf16WGMMAPlan{bn: 32, tiles: 21, chunks: 1, splits: 1, kbPerSplit: 112, grid: 21, stages: 8, smem: 164992}, 0, 0},
		{bf16WGMMAPlan{bn: 32, tiles: 21, chunks: 1, splits: 6, kbPerSplit: 19, grid: 126, stages: 8, smem: 164992, finish: abi.BF16WGMMAFinishReduce, l2Prefetch: true}, 0xa0000, 0},
		{bf16WGMMAPlan{bn: 128, tiles: 21, chunks: 2, splits: 3, kbPerSplit: 38, grid: 126, stages: 7, smem: 230512, finish: abi.BF16WGMMAFinishLast}, 0xa0000, 0xb0000},
		{bf16WGMMAPlan{bn: 16, tiles: 8, chunks: 1, splits: 8, kbPerSplit: 14, grid: 64, stages: 8, smem: 148608, finish: abi.BF16WGMMAFinishCluster}, 0, 0},
	} {
		params, err := bf16WGMMAParams(0x90000, driver.DevicePtr(c.part), driver.DevicePtr(c.counters), a, c.p)
		require.NoError(t, err)
		pf := uint64(0)
		if c.p.l2Prefetch {
			pf = 1
		}
		requireFields(t, abi.BF16WGMMAParams, params, map[abi.FieldID]uint64{
			abi.BF16WGMMAY: 0x90000, abi.BF16WGMMAPart: c.part, abi.BF16WGMMACounters: c.counters,
			abi.BF16WGMMAM: 29, abi.BF16WGMMAN: 2624, abi.BF16WGMMAK: 7168, abi.BF16WGMMAYStride: 2628,
			abi.BF16WGMMAKBPerSplit: uint64(c.p.kbPerSplit), abi.BF16WGMMASplits: uint64(c.p.splits), abi.BF16WGMMAChunks: uint64(c.p.chunks),
			abi.BF16WGMMAStages: uint64(c.p.stages), abi.BF16WGMMASmemBytes: uint64(c.p.smem), abi.BF16WGMMAFinish: uint64(c.p.finish),
			abi.BF16WGMMAL2Prefetch: pf,
		}, fmt.Sprintf("gemm_bf16_wgmma %+v", c.p))
	}
}

// TestBF16WGMMAKernelsCompiled: gemm_bf16_wgmma.cu, compiled as the
// backend compiles it (compute_90 where NVRTC has no sm_90a), defines a
// kernel for every tile of abi.BF16WGMMATokenTiles (expanded from abi.h's
// BF16_WGMMA_KERNELS), each taking two tensor maps and its struct.
func TestBF16WGMMAKernelsCompiled(t *testing.T) {
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("NVRTC not found: %v", err)
	}
	opts := bf16WGMMAProgram.options("sm_90", cudatune.Knobs{}.Defaults())
	if major, _, _, _ := driver.NVRTCVersion(); major < 12 {
		opts.Arch = "sm_90"
	}
	ptx, err := driver.CompilePTX(bf16WGMMAProgram.src(), bf16WGMMAProgram.file, opts)
	require.NoError(t, err)
	for _, bn := range abi.BF16WGMMATokenTiles() {
		name := abi.BF16WGMMAKernel(bn)
		require.Contains(t, ptx, fmt.Sprintf(".entry %s(\n\t.param .align 64 .b8 %s_param_0[128],\n\t.param .align 64 .b8 %s_param_1[128],\n\t.param .align 8 .b8 %s_param_2[%d]\n)",
			name, name, name, name, abi.BF16WGMMAParams.Size()))
	}
}
