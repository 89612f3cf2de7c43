package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/cudatune"

	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// TestPlanOwnGEMM checks the own kernel's launch shapes without a GPU:
// the splits cover K exactly with none empty, partials fit the workspace,
// and the V4 shapes get the grids the design intends.
func TestPlanOwnGEMM(t *testing.T) {
	for _, s := range []struct{ n, k int }{{1536, 4096}, {32768, 1024}, {2048, 7168}, {65536, 1536}, {128, 128}, {256, 384}} {
		for _, m := range []int{1, 2, 3, 8, 16, 33, 64, 65, 127, 128, 129, 256, 300, 512, 1024, 4096} {
			for _, sms := range []int{1, 78, 132} {
				p := planOwnGEMM(cudatune.SM90.FP8, m, s.n, s.k, sms, gemmPartBytes)
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
	require.Equal(t, ownGEMMPlan{mt: 64, chunks: 1, splits: 16, kbPerSplit: 2}, planOwnGEMM(cudatune.SM90.FP8, 1, 1536, 4096, 132, gemmPartBytes))
	// wq_b at 128 tokens: 256 row blocks fill the device without a split.
	require.Equal(t, ownGEMMPlan{mt: 128, chunks: 1, splits: 1, kbPerSplit: 8}, planOwnGEMM(cudatune.SM90.FP8, 128, 32768, 1024, 132, gemmPartBytes))
}

// TestRewriteFailureFacts pins the plan arithmetic that
// docs/gemm-rewrite-failure.md rests on. The f16 rewrite (508f76b) never
// splits K for the tiny model's GEMMs (K = 256, two K blocks: a split of
// two costs waves + 1 = 2, as much as none), so no split-K workspace took
// part in its failure, and each of those GEMMs ends with its own bf16
// epilogue; the current kernel splits them in two, so a reduction writes
// Y there. V4-Flash's fused A splits in both designs, its wq_b in neither.
func TestRewriteFailureFacts(t *testing.T) {
	for m := 1; m <= 256; m++ {
		for _, n := range []int{768, 1024, 2048} { // fused A; wq_b with 2 and 4 heads
			_, _, splits, _ := rewritePlan(m, n, 256, 132, gemmPartBytes)
			require.Equal(t, 1, splits, "m %d n %d", m, n)
		}
	}
	for _, n := range []int{768, 2048} {
		require.Equal(t, 2, planOwnGEMM(cudatune.SM90.FP8, 16, n, 256, 132, gemmPartBytes).splits, "n %d", n)
	}
	_, _, splits, _ := rewritePlan(16, 1536, 4096, 132, gemmPartBytes)
	require.Greater(t, splits, 1)
	require.Greater(t, planOwnGEMM(cudatune.SM90.FP8, 16, 1536, 4096, 132, gemmPartBytes).splits, 1)
	_, _, splits, _ = rewritePlan(16, 32768, 1024, 132, gemmPartBytes)
	require.Equal(t, 1, splits)
	require.Equal(t, 1, planOwnGEMM(cudatune.SM90.FP8, 8, 32768, 1024, 132, gemmPartBytes).splits)
}

// TestStreamSlot: launches on the side stream (inside Side) take the side
// stream's split-K workspaces, those on the third (inside Aux) the third's,
// everything else the main stream's, so GEMMs in flight at once on the
// streams never share partials.
func TestStreamSlot(t *testing.T) {
	main, side := &driver.Stream{}, &driver.Stream{}
	b := &Backend{stream: main, main: main}
	require.Equal(t, 0, b.streamSlot(), "no side stream")
	b.fork.stream = side
	require.Equal(t, 0, b.streamSlot())
	b.stream = side
	require.Equal(t, 1, b.streamSlot())
	b.stream = main
	require.Equal(t, 0, b.streamSlot())
	aux := &driver.Stream{}
	b.aux.stream = aux
	require.Equal(t, 0, b.streamSlot())
	b.stream = aux
	require.Equal(t, 2, b.streamSlot())
	b.stream = side
	require.Equal(t, 1, b.streamSlot())
}

// TestPlanWGMMA checks the wgmma kernel's launch shapes without a GPU: the
// token tile holds M (or the largest tiles cover it), the splits cover K
// with none empty, the persistent grid has a unit for every block, the
// ring fits the opt-in shared memory, partials fit the workspace; and the
// V4 shapes get the grids intended.
func TestPlanWGMMA(t *testing.T) {
	a := cudatune.SM90.FP8.WGMMA
	optin := cudatune.SM90.SharedPerBlockOptin
	for _, s := range []struct{ n, k int }{{1536, 4096}, {32768, 1024}, {2048, 7168}, {65536, 1536}, {128, 128}, {256, 384}} {
		for _, m := range []int{1, 2, 3, 8, 9, 16, 31, 32, 33, 64, 65, 127, 128, 129, 256, 300, 512, 4096} {
			for _, sms := range []int{1, 78, 132} {
				p, err := planWGMMA(a, m, s.n, s.k, sms, optin, gemmPartBytes)
				require.NoError(t, err)
				kbn := s.k / 128
				require.Contains(t, a.TokenTiles, p.bn)
				if m <= 128 {
					require.GreaterOrEqual(t, p.bn, m, "%+v", p)
					require.True(t, p.bn == 8 || p.bn/2 < m, "not the smallest tile for m %d: %+v", m, p)
				} else {
					require.Equal(t, 128, p.bn)
				}
				require.Equal(t, (m+p.bn-1)/p.bn, p.chunks)
				require.GreaterOrEqual(t, p.splits*p.kbPerSplit, kbn, "%+v", p)
				require.Less(t, (p.splits-1)*p.kbPerSplit, kbn, "an empty split: %+v", p)
				units := s.n / 128 * p.chunks * p.splits
				require.Equal(t, min(units, sms), p.grid, "%+v", p)
				require.GreaterOrEqual(t, p.stages, 2)
				require.LessOrEqual(t, p.stages, a.MaxStages)
				require.Equal(t, wgmmaSmemBytes(p.bn, p.stages), p.smem)
				require.LessOrEqual(t, p.smem, optin)
				if p.stages < a.MaxStages {
					require.Greater(t, wgmmaSmemBytes(p.bn, p.stages+1), optin, "a deeper ring fits: %+v", p)
				}
				if p.splits > 1 {
					require.LessOrEqual(t, 4*p.splits*m*s.n, gemmPartBytes)
					require.LessOrEqual(t, 4*p.splits*m*s.n, s.n*s.k, "partials larger than the weight")
					require.LessOrEqual(t, 2*s.n/128*p.chunks, sms, "split although the units fill half the device")
				}
			}
		}
	}
	for _, c := range []struct {
		name    string
		m, n, k int
		want    wgmmaPlan
	}{
		// V4-Flash [wq_a; wkv] at one token: 12 row tiles split 11 ways.
		{"flash A m1", 1, 1536, 4096, wgmmaPlan{bn: 8, chunks: 1, splits: 11, kbPerSplit: 3, grid: 132, stages: 8, smem: wgmmaSmemBytes(8, 8)}},
		// at 128 tokens the partials may not outgrow the weight: 8 splits.
		{"flash A m128", 128, 1536, 4096, wgmmaPlan{bn: 128, chunks: 1, splits: 8, kbPerSplit: 4, grid: 96, stages: 5, smem: wgmmaSmemBytes(128, 5)}},
		// wq_b: 256 row tiles, two rounds of the persistent grid, no split.
		{"flash wq_b m32", 32, 32768, 1024, wgmmaPlan{bn: 32, chunks: 1, splits: 1, kbPerSplit: 8, grid: 132, stages: 8, smem: wgmmaSmemBytes(32, 8)}},
		{"pro wq_b m129", 129, 65536, 1536, wgmmaPlan{bn: 128, chunks: 2, splits: 1, kbPerSplit: 12, grid: 132, stages: 5, smem: wgmmaSmemBytes(128, 5)}},
		{"pro A m64", 64, 2048, 7168, wgmmaPlan{bn: 64, chunks: 1, splits: 8, kbPerSplit: 7, grid: 128, stages: 8, smem: wgmmaSmemBytes(64, 8)}},
	} {
		p, err := planWGMMA(a, c.m, c.n, c.k, 132, optin, gemmPartBytes)
		require.NoError(t, err)
		require.Equal(t, c.want, p, c.name)
	}
	// Clusters: one wave of at most 8 splits a unit, a block a unit.
	ac := a
	ac.ClusterSplits = 8
	ac.MaxClusters = []int{0, 0, 66, 0, 30, 0, 0, 0, 15} // clusters of 2, 4 and 8 at once, as the H200 reports
	for _, c := range []struct {
		name    string
		m, n, k int
		want    wgmmaPlan
	}{
		{"flash A m1", 1, 1536, 4096, wgmmaPlan{bn: 8, chunks: 1, splits: 8, kbPerSplit: 4, grid: 96, stages: 8, smem: wgmmaSmemBytes(8, 8), cluster: true}},
		{"flash A m128", 128, 1536, 4096, wgmmaPlan{bn: 128, chunks: 1, splits: 8, kbPerSplit: 4, grid: 96, stages: 5, smem: wgmmaSmemBytes(128, 5), cluster: true}},
		// 16 clusters of 8 would take two waves: the last block's finish.
		{"pro A m64", 64, 2048, 7168, wgmmaPlan{bn: 64, chunks: 1, splits: 8, kbPerSplit: 7, grid: 128, stages: 8, smem: wgmmaSmemBytes(64, 8)}},
		// 64 tiles (an indexer wq_b): clusters of 2.
		{"n8192 m128", 128, 8192, 1024, wgmmaPlan{bn: 128, chunks: 1, splits: 2, kbPerSplit: 4, grid: 128, stages: 5, smem: wgmmaSmemBytes(128, 5), cluster: true}},
		// 256 row tiles fill the device: no split, no cluster.
		{"flash wq_b m32", 32, 32768, 1024, wgmmaPlan{bn: 32, chunks: 1, splits: 1, kbPerSplit: 8, grid: 132, stages: 8, smem: wgmmaSmemBytes(32, 8)}},
		// 100 tiles fill more than half the device: 2 splits would take
		// two rounds as well, no split.
		{"n12800 m1", 1, 12800, 1024, wgmmaPlan{bn: 8, chunks: 1, splits: 1, kbPerSplit: 8, grid: 100, stages: 8, smem: wgmmaSmemBytes(8, 8)}},
		{"n8576 m1", 1, 8576, 1024, wgmmaPlan{bn: 8, chunks: 1, splits: 1, kbPerSplit: 8, grid: 67, stages: 8, smem: wgmmaSmemBytes(8, 8)}},
		// 66 tiles: half the device, 66 clusters of 2 fill it.
		{"n8448 m1", 1, 8448, 1024, wgmmaPlan{bn: 8, chunks: 1, splits: 2, kbPerSplit: 4, grid: 132, stages: 8, smem: wgmmaSmemBytes(8, 8), cluster: true}},
		{"n8320 m1", 1, 8320, 1024, wgmmaPlan{bn: 8, chunks: 1, splits: 2, kbPerSplit: 4, grid: 130, stages: 8, smem: wgmmaSmemBytes(8, 8), cluster: true}},
	} {
		p, err := planWGMMA(ac, c.m, c.n, c.k, 132, optin, gemmPartBytes)
		require.NoError(t, err)
		require.Equal(t, c.want, p, "cluster "+c.name)
		require.LessOrEqual(t, p.grid, 132, "one wave")
		require.GreaterOrEqual(t, p.stages*(wgmmaRowTile*128+p.bn*128), p.bn*(wgmmaRowTile+4)*4, "the partial tile fits the ring")
	}
	ac.MaxClusters[8] = 16
	p, err := planWGMMA(ac, 64, 2048, 7168, 132, optin, gemmPartBytes)
	require.NoError(t, err)
	require.Equal(t, wgmmaPlan{bn: 64, chunks: 1, splits: 8, kbPerSplit: 7, grid: 128, stages: 8, smem: wgmmaSmemBytes(64, 8), cluster: true}, p, "16 clusters fit at once")
	// Shared activation tiles: one chunk, no split, whole clusters that fit.
	am := ac
	for _, c := range []struct {
		name    string
		mc      int
		m, n, k int
		want    wgmmaPlan
	}{
		{"flash wq_b m128 mc2", 2, 128, 32768, 1024, wgmmaPlan{bn: 128, chunks: 1, splits: 1, kbPerSplit: 8, grid: 132, stages: 5, smem: wgmmaSmemBytes(128, 5), multicast: 2}},
		// 30 clusters of 4 at once: 120 blocks.
		{"flash wq_b m128 mc4", 4, 128, 32768, 1024, wgmmaPlan{bn: 128, chunks: 1, splits: 1, kbPerSplit: 8, grid: 120, stages: 5, smem: wgmmaSmemBytes(128, 5), multicast: 4}},
		{"flash wq_b m16 mc2", 2, 16, 32768, 1024, wgmmaPlan{bn: 16, chunks: 1, splits: 1, kbPerSplit: 8, grid: 132, stages: 8, smem: wgmmaSmemBytes(16, 8), multicast: 2}},
		// Slices of fewer than 8 rows would break the swizzle: no sharing.
		{"flash wq_b m16 mc4", 4, 16, 32768, 1024, wgmmaPlan{bn: 16, chunks: 1, splits: 1, kbPerSplit: 8, grid: 132, stages: 8, smem: wgmmaSmemBytes(16, 8)}},
		{"flash wq_b m8 mc2", 2, 8, 32768, 1024, wgmmaPlan{bn: 8, chunks: 1, splits: 1, kbPerSplit: 8, grid: 132, stages: 8, smem: wgmmaSmemBytes(8, 8)}},
		// Two chunks, or a split: no sharing.
		{"pro wq_b m129 mc2", 2, 129, 65536, 1536, wgmmaPlan{bn: 128, chunks: 2, splits: 1, kbPerSplit: 12, grid: 132, stages: 5, smem: wgmmaSmemBytes(128, 5)}},
		{"flash A m128 mc2", 2, 128, 1536, 4096, wgmmaPlan{bn: 128, chunks: 1, splits: 8, kbPerSplit: 4, grid: 96, stages: 5, smem: wgmmaSmemBytes(128, 5), cluster: true}},
		// 67 tiles: not whole clusters of 2.
		{"n8576 m32 mc2", 2, 32, 8576, 1024, wgmmaPlan{bn: 32, chunks: 1, splits: 1, kbPerSplit: 8, grid: 67, stages: 8, smem: wgmmaSmemBytes(32, 8)}},
	} {
		am.Multicast = c.mc
		p, err := planWGMMA(am, c.m, c.n, c.k, 132, optin, gemmPartBytes)
		require.NoError(t, err)
		require.Equal(t, c.want, p, c.name)
		if p.multicast > 1 {
			require.Zero(t, p.grid%p.multicast, "whole clusters")
			require.Zero(t, (c.n/128)%p.multicast, "every cluster's blocks have the same units")
		}
	}
	// The layout: 128 W rows and 128 token rows of 128 bytes a stage, two
	// barriers; two 128 x 72 bf16 tiles; the alignment slack.
	require.Equal(t, 5*(32768+528+16)+2*128*144+1024, wgmmaSmemBytes(128, 5))
	require.Equal(t, 48, wgmmaScaleBytes(wgmmaRowTile, 8))
	_, err = planWGMMA(a, 1, 128, 128, 132, 30<<10, gemmPartBytes)
	require.ErrorIs(t, err, ErrWGMMAUnavailable, "30 KiB hold one stage")
	_, err = planWGMMA(cudatune.WGMMAArch{}, 1, 128, 128, 132, optin, gemmPartBytes)
	require.ErrorIs(t, err, ErrWGMMAUnavailable, "no tiles")
}

// TestPlanWGMMANarrow: the narrow families halve the token tile until
// the 64-row units fill half the H200 and then run the full K (the
// shapes of issue 25: DeepGEMM's 96 and 128 blocks at 128 rows), split K
// only where even the smallest tile leaves the device half empty, and
// fill shared memory with up to 16 stages.
func TestPlanWGMMANarrow(t *testing.T) {
	a := cudatune.SM90.FP8.WGMMA
	a.MaxClusters = []int{0, 0, 66, 0, 30, 0, 0, 0, 15}
	a.NarrowMaxChunks = 0 // uncapped first (SM90's cap of 2 below)
	optin := cudatune.SM90.SharedPerBlockOptin
	for _, c := range []struct {
		name    string
		kern    cudatune.WGMMAKernel
		m, n, k int
		want    wgmmaPlan
	}{
		{"flash A m128", cudatune.WGMMANarrow, 128, 1536, 4096, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 32, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16)}},
		{"flash A m128 pipe", cudatune.WGMMANarrowPipe, 128, 1536, 4096, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 32, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16)}},
		{"pro A m128", cudatune.WGMMANarrow, 128, 2048, 7168, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 56, grid: 128, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16)}},
		{"flash A m129", cudatune.WGMMANarrow, 129, 1536, 4096, wgmmaPlan{bn: 64, chunks: 3, splits: 1, kbPerSplit: 32, grid: 72, stages: 13, smem: wgmmaSmemBytesRows(64, 64, 13)}},
		{"flash idx wq_b m128", cudatune.WGMMANarrow, 128, 8192, 1024, wgmmaPlan{bn: 128, chunks: 1, splits: 1, kbPerSplit: 8, grid: 128, stages: 8, smem: wgmmaSmemBytesRows(64, 128, 8)}},
		{"flash idx wq_b m128 pipe", cudatune.WGMMANarrowPipe, 128, 8192, 1024, wgmmaPlan{bn: 128, chunks: 1, splits: 1, kbPerSplit: 8, grid: 128, stages: 8, smem: wgmmaSmemBytesRows(64, 128, 8)}},
		// 24 units of the smallest tile: 6 splits (clusters of 5 would be
		// the one wave, unknown to the driver's answer here: the last block).
		{"flash A m8", cudatune.WGMMANarrow, 8, 1536, 4096, wgmmaPlan{bn: 16, chunks: 1, splits: 6, kbPerSplit: 6, grid: 132, stages: 16, smem: wgmmaSmemBytesRows(64, 16, 16)}},
	} {
		p, err := planWGMMAKernel(a, c.kern, c.m, c.n, c.k, 132, optin, gemmPartBytes)
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, p, c.name)
		require.LessOrEqual(t, p.smem, optin, c.name)
	}
	// Capped at one and two chunks (SM90's cap): K split in clusters (5 and 2 splits).
	require.Equal(t, 2, cudatune.SM90.FP8.WGMMA.NarrowMaxChunks)
	a.MaxClusters = []int{0, 0, 66, 44, 30, 26, 22, 18, 15}
	for _, c := range []struct {
		chunks int
		want   wgmmaPlan
	}{
		{1, wgmmaPlan{bn: 128, chunks: 1, splits: 5, kbPerSplit: 7, grid: 120, stages: 8, smem: wgmmaSmemBytesRows(64, 128, 8), cluster: true}},
		{2, wgmmaPlan{bn: 64, chunks: 2, splits: 2, kbPerSplit: 16, grid: 96, stages: 13, smem: wgmmaSmemBytesRows(64, 64, 13), cluster: true}},
	} {
		ac := a
		ac.NarrowMaxChunks = c.chunks
		p, err := planWGMMAKernel(ac, cudatune.WGMMANarrowPipe, 128, 1536, 4096, 132, optin, gemmPartBytes)
		require.NoError(t, err)
		require.Equal(t, c.want, p, "flash A m128, at most %d chunks", c.chunks)
	}
	// No split: 24 blocks of the full K.
	an := a
	an.NarrowMaxChunks, an.MaxSplits = 1, 1
	p, err := planWGMMAKernel(an, cudatune.WGMMANarrowPipe, 128, 1536, 4096, 132, optin, gemmPartBytes)
	require.NoError(t, err)
	require.Equal(t, wgmmaPlan{bn: 128, chunks: 1, splits: 1, kbPerSplit: 32, grid: 24, stages: 8, smem: wgmmaSmemBytesRows(64, 128, 8)}, p, "flash A m128 unsplit")
	// Shared weights: the chunks of a tile in clusters (the largest power
	// of two up to WeightMulticast dividing them), no cluster split finish,
	// whole clusters in one round; with Multicast too, clusters of every
	// chunk of Multicast tiles (no split, at most 8 blocks).
	a.MaxClusters = []int{0, 0, 66, 44, 30, 26, 22, 18, 15}
	for _, c := range []struct {
		name              string
		wc, mc, chunks, m int
		n, k              int
		want              wgmmaPlan
	}{
		{"flash A m128 wc4", 4, 0, 4, 128, 1536, 4096, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 32, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16), wcast: 4}},
		{"flash A m128 wc8 (4 chunks)", 8, 0, 4, 128, 1536, 4096, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 32, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16), wcast: 4}},
		// 32 clusters of 4 do not fit at once (30): 120 blocks, a second round for 8 of them.
		{"pro A m128 wc4", 4, 0, 4, 128, 2048, 7168, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 56, grid: 120, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16), wcast: 4}},
		// Two chunks, split twice by the last block (not in clusters).
		{"flash A m128 wc2 c2", 2, 0, 2, 128, 1536, 4096, wgmmaPlan{bn: 64, chunks: 2, splits: 2, kbPerSplit: 16, grid: 96, stages: 13, smem: wgmmaSmemBytesRows(64, 64, 13), wcast: 2}},
		{"flash A m32 wc4 (2 chunks)", 4, 0, 4, 32, 1536, 4096, wgmmaPlan{bn: 16, chunks: 2, splits: 2, kbPerSplit: 16, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 16, 16), wcast: 2}},
		// One chunk: nothing to share.
		{"flash A m8 wc4", 4, 0, 4, 8, 1536, 4096, wgmmaPlan{bn: 16, chunks: 1, splits: 5, kbPerSplit: 7, grid: 120, stages: 16, smem: wgmmaSmemBytesRows(64, 16, 16), cluster: true}},
		// Both: 12 clusters of 4 chunks x 2 tiles.
		{"flash A m128 wc4 mc2", 4, 2, 4, 128, 1536, 4096, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 32, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16), wcast: 4, multicast: 2}},
		// 4 x 4 is past 8 blocks: 4 x 2.
		{"flash A m128 wc4 mc4", 4, 4, 4, 128, 1536, 4096, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 32, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16), wcast: 4, multicast: 2}},
		// 16 clusters of 8, 15 at once: 120 blocks.
		{"pro A m128 wc4 mc2", 4, 2, 4, 128, 2048, 7168, wgmmaPlan{bn: 32, chunks: 4, splits: 1, kbPerSplit: 56, grid: 120, stages: 16, smem: wgmmaSmemBytesRows(64, 32, 16), wcast: 4, multicast: 2}},
		// Split K: the weights shared alone.
		{"flash A m32 wc2 mc2", 4, 2, 4, 32, 1536, 4096, wgmmaPlan{bn: 16, chunks: 2, splits: 2, kbPerSplit: 16, grid: 96, stages: 16, smem: wgmmaSmemBytesRows(64, 16, 16), wcast: 2}},
	} {
		aw := a
		aw.WeightMulticast, aw.Multicast, aw.NarrowMaxChunks = c.wc, c.mc, c.chunks
		p, err := planWGMMAKernel(aw, cudatune.WGMMANarrowPipe, c.m, c.n, c.k, 132, optin, gemmPartBytes)
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, p, c.name)
		if p.wcast > 1 {
			require.Zero(t, p.grid%(p.wcast*max(1, p.multicast)), "whole clusters")
			require.Zero(t, p.chunks%p.wcast, "every cluster's blocks have one tile")
		}
	}
	// Planned for at most 66 multiprocessors: 48 blocks of 64 tokens.
	aw := a
	aw.WeightMulticast, aw.NarrowMaxChunks, aw.MaxSMs = 4, 4, 66
	p, err = planWGMMAKernel(aw, cudatune.WGMMANarrowPipe, 128, 1536, 4096, 132, optin, gemmPartBytes)
	require.NoError(t, err)
	require.Equal(t, wgmmaPlan{bn: 64, chunks: 2, splits: 1, kbPerSplit: 32, grid: 48, stages: 13, smem: wgmmaSmemBytesRows(64, 64, 13), wcast: 2}, p, "flash A m128 on 66 SMs")
	// The wide pipelined family: up to 64 tokens, two chunks at 128 rows.
	p, err = planWGMMAKernel(a, cudatune.WGMMAWidePipe, 128, 32768, 1024, 132, optin, gemmPartBytes)
	require.NoError(t, err)
	require.Equal(t, wgmmaPlan{bn: 64, chunks: 2, splits: 1, kbPerSplit: 8, grid: 132, stages: 8, smem: wgmmaSmemBytes(64, 8)}, p, "flash wq_b m128")
	// One consumer warpgroup's tile, one W scale row of the 128-row block.
	require.Equal(t, 16*(64*128+32*128+144+16)+32*144+1024, wgmmaSmemBytesRows(64, 32, 16))
	_, err = planWGMMAKernel(a, cudatune.WGMMAKernel(9), 1, 128, 128, 132, optin, gemmPartBytes)
	require.ErrorIs(t, err, ErrWGMMAUnavailable)
}
