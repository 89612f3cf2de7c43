package cudatune

import (
	"fmt"
	"math"
)

// Arch describes one GPU architecture for the CUDA backend's launch
// choices, in one place, as DeepGEMM keeps its per-architecture
// heuristics: the device's resources, the GEMM kernels' tile candidates,
// the choices measured per shape on it (each naming the measurement, a
// folder under bench/results where one holds it, that chose it) and the
// prologue kernels' launch-shape defaults. ForDevice takes the resources a
// device reports from the device and the rest from the table.
type Arch struct {
	Name         string
	Major, Minor int // compute capability
	// The resources, as on the device the choices were measured on; what
	// a device reports replaces them (ForDevice).
	Resources
	FP8  FP8GEMMArch
	BF16 BF16GEMMArch
	// CompressStoreBlocksPerSM caps compress_step's blocks that write the
	// ring rows (a grid-stride loop over the chunks) at this many a
	// multiprocessor.
	CompressStoreBlocksPerSM int
	// Knobs are the prologue kernels' launch shapes measured best on the
	// architecture, and the projection GEMM's row threshold: the defaults
	// the zero Knobs take (Knobs.Defaults).
	Knobs Knobs
}

// Resources are a device's, as the driver reports them (0: not reported).
type Resources struct {
	SMs                 int // multiprocessors
	SharedPerBlockOptin int // bytes of shared memory a block reaches by opting in
	SharedPerSM         int // bytes of shared memory a multiprocessor
	RegistersPerSM      int // 32-bit registers a multiprocessor
	L2Bytes             int
}

// FP8GEMMArch is the chain's FP8 GEMM on an architecture: the own
// weight-streaming kernel's tiles (attention/mla/cuda/gemm.go,
// kernels/cuda/gemm_fp8.cu) and the measured choice between it and
// cuBLASLt.
type FP8GEMMArch struct {
	// TokenTiles are the own kernel's token chunks, smallest first, one
	// kernel each (gemm_fp8_mt<T>: the backend fails to load without it); a
	// block owns RowTile rows of W (the kernels' 128, one row of weight
	// scale blocks).
	TokenTiles []int
	RowTile    int
	// SplitBlocksPerSM: narrow N splits K until the grid has about this
	// many blocks a multiprocessor (the smallest token tile's kernel holds
	// two a multiprocessor).
	SplitBlocksPerSM int
	// Own is the measured choice of the own kernel over cuBLASLt by shape:
	// the first rule whose MaxN is at least N decides.
	Own []OwnRule
	// WGMMA is the sm_90a warpgroup-MMA kernel's description.
	WGMMA WGMMAArch
}

// WGMMAArch is the FP8 GEMM of kernels/cuda/gemm_fp8_wgmma.cu (warpgroup
// MMA, operands by the tensor memory accelerator) on an architecture: its
// token tiles (wgmma's N side, one kernel each: gemm_fp8_wgmma_bn<T>;
// none: the kernel does not exist there), the deepest shared-memory ring
// it may use, and the shapes it is the measured choice for.
type WGMMAArch struct {
	TokenTiles []int
	MaxStages  int
	// NarrowTiles and NarrowPipeTiles are the token tiles of the
	// WGMMANarrow and WGMMANarrowPipe kernels (one a tile:
	// gemm_fp8_wgmma_n1_bn<T>, gemm_fp8_wgmma_n1p_bn<T>), smallest first;
	// NarrowMaxStages their deepest ring (a 64-row stage is half a wide
	// one's: twice as many K blocks in flight in the same shared memory).
	NarrowTiles, NarrowPipeTiles []int
	NarrowMaxStages              int
	// NarrowMaxChunks > 0: the narrow planner halves the token tile only
	// while the chunks stay at most this many (0: no cap).
	NarrowMaxChunks int
	// MaxSplits > 0 caps every family's split of K (0: no cap).
	MaxSplits int
	// WidePipeTiles are WGMMAWidePipe's token tiles.
	WidePipeTiles []int
	// ClusterSplits > 0: a split K is finished through distributed shared
	// memory, the splits of a unit one thread-block cluster of at most
	// ClusterSplits blocks (8: the portable cluster size); 0: by the
	// tile's last block from float32 partials in global memory.
	ClusterSplits int
	// MaxClusters[s] is how many clusters of s blocks the device runs at
	// once (the backend asks the driver, cuOccupancyMaxActiveClusters, when
	// it loads the kernel; missing or 0: unknown, no clusters of s). A
	// split GEMM with more units than that is finished by the tile's last
	// block instead: a second wave of clusters costs more than the global
	// partials (2026-12-02, V4-Pro's [wq_a; wkv], 16 clusters of 8: 14.7 us
	// at one row against 10.1).
	MaxClusters []int
	// Multicast > 1: GEMMs of one token chunk and no split run in clusters
	// of Multicast blocks that share the activation tile, each bringing
	// 1/Multicast of it to every block by TMA multicast (at 128 rows the
	// tile is as many bytes as a block's weights, and every block read it
	// from L2); token tiles of at least MulticastMinTile rows. 0: off.
	Multicast, MulticastMinTile int
	// WeightMulticast > 1: GEMMs of several token chunks run in clusters
	// of up to WeightMulticast blocks, the chunks of one weight tile and K
	// range, each bringing 1/WeightMulticast of the tile to every block by
	// TMA multicast (the narrow kernel at V4-Flash's [wq_a; wkv], 128
	// rows, reads each weight tile once a chunk from L2 otherwise); the
	// largest power of two dividing the chunks, no cluster split finish.
	// 0: off.
	WeightMulticast int
	// MaxSMs > 0: the planner plans every wgmma GEMM for at most that many
	// multiprocessors (its persistent grid no larger), leaving the rest to
	// a kernel on another stream (the compressor's projection GEMM beside
	// the chain's [wq_a; wkv]); 0: all.
	MaxSMs int
	// Use: the first rule whose MaxN is at least N names N's rules (it and
	// the rules right after it with the same MaxN); the first of them
	// whose MaxM is at least M decides, the kernel family its Kernel (0:
	// WGMMAWide); none (no rule for N or M, and no rules, the default
	// until the device has measured it): the other implementations'
	// choice.
	Use []OwnRule
}

// Chosen reports whether the wgmma kernel is the measured choice for an
// M x N GEMM.
func (a WGMMAArch) Chosen(m, n int) bool { return a.KernelFor(m, n) != 0 }

// KernelFor is the wgmma kernel family chosen for an M x N GEMM, 0 where
// the wgmma kernel is not the choice.
func (a WGMMAArch) KernelFor(m, n int) WGMMAKernel {
	if len(a.TokenTiles) == 0 {
		return 0
	}
	for i, r := range a.Use {
		if n > r.MaxN {
			continue
		}
		for _, c := range a.Use[i:] {
			if c.MaxN != r.MaxN {
				break
			}
			if m <= c.MaxM {
				if c.Kernel == 0 {
					return WGMMAWide
				}
				return c.Kernel
			}
		}
		return 0
	}
	return 0
}

// OwnRule: GEMMs of at most MaxN outputs run the own kernel up to MaxM
// rows, cuBLASLt above (FP8GEMMArch.Own); or the wgmma kernel of family
// Kernel (WGMMAArch.Use).
type OwnRule struct {
	MaxN, MaxM int
	Kernel     WGMMAKernel // WGMMAArch.Use only (0: WGMMAWide)
	Source     string      // the measurement that chose it
}

// OwnKernel reports whether the own kernel is the measured choice over
// cuBLASLt for an M x N GEMM; without a rule for N, it is.
func (a FP8GEMMArch) OwnKernel(m, n int) bool {
	for _, r := range a.Own {
		if n <= r.MaxN {
			return m <= r.MaxM
		}
	}
	return true
}

// BF16GEMMArch is the projection GEMM's tensor-core kernel on an
// architecture (attention/mla/cuda/bf16gemm.go); the rows it takes are
// Knobs.BF16MMAMaxRows.
type BF16GEMMArch struct {
	// SplitBlocksPerSM is the grid the split of K aims for: with four
	// blocks resident a multiprocessor, two a multiprocessor keep every
	// SM streaming without a second wave.
	SplitBlocksPerSM int
	// WGMMA is the sm_90a warpgroup-MMA kernel's description.
	WGMMA BF16WGMMAArch
}

// The ways the sm_90a bf16 GEMM finishes a split K (kernels/cuda/abi's
// BF16WGMMAFinish*, abi.h's BF16_WGMMA_FINISH_*; a CPU test keeps them
// equal).
const (
	BF16WGMMAFinishReduce  = 1 // float32 partials, then the split-K reduction launch
	BF16WGMMAFinishLast    = 2 // float32 partials, added by each unit's last block
	BF16WGMMAFinishCluster = 3 // thread-block clusters of the splits, through distributed shared memory
)

// BF16WGMMAArch is the projection GEMM of kernels/cuda/gemm_bf16_wgmma.cu
// (warpgroup MMA on bf16, operands by the tensor memory accelerator) on an
// architecture: its token tiles (wgmma's N side, one kernel each:
// gemm_bf16_wgmma_bn<T>; none: the kernel does not exist there), the
// deepest shared-memory ring it may use, how it finishes a split K, and
// the shapes it is the measured choice for.
type BF16WGMMAArch struct {
	TokenTiles []int
	MaxStages  int
	// Finish is BF16WGMMAFinishReduce, Last or Cluster (the last where one
	// wave of the clusters fits the device, MaxClusters, and a unit splits
	// at most 8 ways; else the unit's last block).
	Finish int
	// L2Prefetch: the producer asks for the rest of its first unit's W
	// into L2 at the start (bulk tensor prefetches).
	L2Prefetch bool
	// MaxClusters[s] is how many clusters of s blocks of the kernel the
	// device runs at once (asked of the driver when the kernel loads;
	// missing or 0: none).
	MaxClusters []int
	// Use: the first rule whose MaxN is at least N decides, the kernel
	// running up to MaxM rows; no rule for N (and no rules, the default
	// until the device has measured it): the other implementations' choice.
	Use []OwnRule
}

// Chosen reports whether the wgmma kernel is the measured choice for an
// M x N projection GEMM.
func (a BF16WGMMAArch) Chosen(m, n int) bool {
	if len(a.TokenTiles) == 0 {
		return false
	}
	for _, r := range a.Use {
		if n <= r.MaxN {
			return m <= r.MaxM
		}
	}
	return false
}

// gemmTimes is where the FP8 GEMM's choices were measured.
const gemmTimes = "bench/results/2026-11-30-h200-b/diagnostic/gemm-times-old-kernel.txt (TestGEMMTimes, graph-timed, L2 flushed)"

// wgmmaTimes is the measurement behind the wgmma kernel's rules: its scales
// through shared memory and the cluster split finish beside the own kernel
// and cuBLASLt, one H200 call.
const wgmmaTimes = "bench/results/2026-12-02-h200-f/gemm-times.txt (TestGEMMTimes, graph-timed, L2 flushed)"

// wgmmaIndexerTimes: the indexer's wq_b and V4-Pro's [wq_a; wkv] with the
// cluster capacity the driver reports (15 clusters of 8 at once).
const wgmmaIndexerTimes = "bench/results/2026-12-02-h200-f/gemm-times-indexer.txt (TestGEMMTimes, graph-timed, L2 flushed)"

// wgmmaLayer: the layer a server runs, with the compressor's projection
// GEMM on the side stream (41 of V4-Flash's 44 layers), default rules
// against no wgmma kernel, one H200 call.
const wgmmaLayer = "bench/results/2026-12-02-h200-h/lead/call3-layer-{default,nowgmma}.json (cmd/bench --chain-only, 8 layers a graph, L2 flushed)"

// SM90 is the H200 (sm_90, 132 multiprocessors), the architecture every
// choice of the backend was measured on.
var SM90 = Arch{
	Name: "sm_90 (H200)", Major: 9, Minor: 0,
	Resources: Resources{SMs: 132, SharedPerBlockOptin: 227 << 10, SharedPerSM: 228 << 10, RegistersPerSM: 64 << 10, L2Bytes: 50 << 20},
	FP8: FP8GEMMArch{
		TokenTiles: []int{64, 128}, RowTile: 128, SplitBlocksPerSM: 2,
		Own: []OwnRule{
			// The narrow fused [wq_a; wkv]: V4-Flash at 32 rows 12.7 us
			// against cuBLASLt's 14.1, at 128 rows 29.4 against 14.3.
			{MaxN: 4096, MaxM: 32, Source: gemmTimes},
			// wq_b: V4-Flash at 8 rows 15.8 us against 16.8, V4-Pro 38.5
			// against 46.5; cuBLASLt above (and it refuses M = 1, 2: the own
			// kernel runs those whatever the rule).
			{MaxN: math.MaxInt, MaxM: 8, Source: gemmTimes},
		},
		// Chosen where it was the fastest of the three in one call
		// (wgmmaTimes; cold us, wgmma / own / cuBLASLt).
		WGMMA: WGMMAArch{TokenTiles: []int{8, 16, 32, 64, 128}, MaxStages: 8, ClusterSplits: 8,
			// The narrow kernels' stages: 16, as DeepGEMM's at these shapes
			// (2026-12-02-h200-i/deepgemm: 64 x 32 tiles, 16 stages).
			NarrowTiles: []int{16, 32, 64, 128}, NarrowPipeTiles: []int{16, 32, 64, 128}, NarrowMaxStages: 16,
			// At most two token chunks before K is split (in clusters): the
			// narrow-pipe kernel at 128 rows, cold us, 2 chunks / 4 chunks
			// (the cap off): V4-Flash [wq_a; wkv] 11.28 / 12.22, V4-Pro
			// 15.09 / 17.68 (cuBLASLt 14.50, 16.57), indexer wq_b 10.19 /
			// 10.12 and 11.92 / 11.46; one chunk split 4 ways 10.82 at
			// V4-Flash but 34.12 at V4-Pro, whose 32 clusters of 4 take a
			// second wave (bench/results/2026-12-02-h200-j/gnarrow/call2).
			NarrowMaxChunks: 2,
			WidePipeTiles:   []int{16, 32, 64},
			Use: []OwnRule{
				// V4-Flash [wq_a; wkv], 12 clusters of 8 splits: 1 row 6.7 /
				// 8.4 / -, 8 rows 6.8 / 8.4 / 14.1, 32 rows 8.0 / 12.4 / 14.1,
				// 128 rows 11.6 / 29.2 / 14.4 (wgmmaTimes). But at 128 rows
				// (b=32 MTP 3) the layer with its compressor is slower with it:
				// ratio-4 58.84 against 53.26 us, ratio-128 51.07 against 46.10,
				// though the chain alone is 36.60 against 42.87 (wgmmaLayer): a
				// grid of clusters of 8 waits for SMs the side stream's GEMM
				// holds. So cuBLASLt from 33 rows; 32 rows and below keep the
				// 6 us margin of the GEMM alone (not measured in the layer).
				{MaxN: 1536, MaxM: 32, Source: wgmmaTimes + "; " + wgmmaLayer},
				// V4-Pro [wq_a; wkv], 16 units (the last block's finish): 1 row
				// 10.1 / 11.8 / -, 8 rows 10.3 / 12.2 / 15.6, 32 rows 13.8 / 20.5 /
				// 15.6; 128 rows cuBLASLt (17.0 against 24.0).
				{MaxN: 2048, MaxM: 32, Source: wgmmaTimes},
				// The indexer's wq_b (64 heads x 128), 64 units in clusters of 2:
				// V4-Flash 1 row 7.3 / 8.2 (own) / -, 8 rows 7.4 / - / 7.1; V4-Pro
				// 8.3 / 10.2 / -, 8.6 / - / 8.5: faster than the own kernel, which
				// the own rules pick up to 8 rows; cuBLASLt above (32 rows 7.1
				// against 8.2, V4-Pro 8.6 against 9.6).
				{MaxN: 8192, MaxM: 8, Source: wgmmaIndexerTimes},
				// wq_b: V4-Flash 1 row 13.4 / 16.6 / -, 8 rows 13.4 / 17.7 / 17.5,
				// 32 rows 14.0 / 34.0 / 16.5; V4-Pro 33.2 / 40.9 / -, 33.2 / 45.0 /
				// 39.7, 34.3 / 85.6 / 41.2; at 128 rows cuBLASLt (15.9 against
				// 17.9, 39.0 against 40.3).
				{MaxN: math.MaxInt, MaxM: 32, Source: wgmmaTimes},
			}},
	},
	BF16: BF16GEMMArch{SplitBlocksPerSM: 2,
		// Finish: the reduction launch, the fastest of the three (or within
		// 0.4 us of it) at every shape and batch measured, cold us, reduce /
		// last block / clusters where they fit: V4-Flash's fused projection
		// at 1 / 32 / 128 rows 10.98 / 12.43 / 15.46 against the last
		// block's 11.71 / 14.87 / 25.60, ratio 128 at 128 rows 11.49 against
		// 31.52 and clusters of 8 11.82, V4-Pro's fused at 128 rows 21.27
		// against 31.29 (bench/results/2026-12-02-h200-j/bfwg/call1,
		// TestBF16GEMMTimes). L2Prefetch off: slower or even at every shape
		// of the 15:10 call (call2), V4-Pro's fused projection at 1 / 128 rows
		// 20.09 / 25.61 us against 16.39 / 21.25 without it. The choice for
		// no shape (Use): cuBLASLt as fast or faster from 32 rows in both
		// calls, within about 1 us either way below (V4-Flash's fused at 1
		// row 11.57 against 10.38 in call2, 10.98 against 11.48 in call1),
		// and the layer with its compressor no faster with it at b = 1, 2 or
		// 32, MTP 3 (call2, bench --chain-only: V4-Flash ratio 4 39.14 /
		// 38.58 / 56.90 us a layer against cuBLASLt's 38.74 / 39.16 / 52.82,
		// V4-Pro 62.41 / 62.83 / 90.73 against 61.70 / 62.51 / 90.00).
		WGMMA: BF16WGMMAArch{TokenTiles: []int{8, 16, 32, 64, 128}, MaxStages: 8, Finish: BF16WGMMAFinishReduce}},
	// 264 blocks on the H200 since the kernel came (d614e60); not measured
	// against other caps.
	CompressStoreBlocksPerSM: 2,
	Knobs: Knobs{
		// The streaming pipeline: 8 warps a block, 4 rows in flight a warp.
		Warps: 8, KVDepth: 4, QDepth: 4,
		// QChunk: the streaming Q pipeline's chunk. The grid's warps take
		// chunks of 8 consecutive rows in turn, so the rows in flight at once lie
		// close together in memory, as a copy's do. Cold single launches, FP8 Q,
		// % of the copy bandwidth at 16K / 64K context tokens (H200, 2026-12-01,
		// A/B in one call, two rounds): V4-Flash 95.5-95.9 / 96.7 against
		// 91.2-91.3 / 94.4-94.5 with a contiguous range a warp, V4-Pro 97.0 /
		// 96.7-97.0 against 93.3-93.4 / 94.7-94.8. Chunks of 16 read 93.4-95.9, of
		// 4 84.6-94.3 and of 2 79.4-85.6 (more token resolutions), of 64 about the
		// contiguous ranges.
		QChunk: 8,
		// BlocksPerSM caps a streaming grid at two blocks of 8 warps a
		// multiprocessor: the KV and fused layer kernels take 110 registers a
		// thread, so two is all that is resident at once (a cap of 4 left half the
		// grid for a second wave), and the Q kernel, which fits four, streamed
		// faster with two too. Cold single launches on the H200 (2026-12-01), 4
		// against 2: KV at 16K tokens 18.98 against 16.70 us, at 64K 48.06 against
		// 46.56 us; V4-Flash FP8 Q at 16K 427.2 against 410.5 us, at 64K 1653
		// against 1602 us; V4-Pro FP8 Q at 16K 836 against 810 us.
		BlocksPerSM: 2,
		// DirectMaxRows: the largest launch with FP8 Q, in Q rows (tokens
		// x heads), that takes the direct path by default: every decode batch, and
		// context batches up to 8192 V4-Flash or 4096 V4-Pro tokens. Measured on
		// the H200 (2026-12-01, time per layer in a many-layer CUDA graph,
		// streaming against direct): V4-Flash b=256 MTP 3 30.8 against 27.9 us, 4096 context tokens
		// 114.7 against 107.8 us; V4-Pro b=256 MTP 3 60.1 against 53.6 us, 4096
		// tokens 220.2 against 210.5 us. At 16K tokens and more the streaming
		// pipeline keeps the KV kernel ahead (V4-Flash 16K, cold: 16.5 against
		// 17.2 us) and V4-Pro's Q (824 against 854 us).
		DirectMaxRows: 1 << 19,
		// DirectMaxRowsBF16: DirectMaxRows for a launch whose Q
		// output is bf16: every launch, however large, takes the direct path. A
		// bf16 Q row writes as many bytes as it reads, like a copy, and the
		// direct grid (one pass, every warp its own two rows, no rings) moves
		// that mix faster than the streaming pipeline. Cold single launches on the
		// H200 (2026-12-01, % of the 1 GiB cuMemcpyDtoD rate, two rounds in one
		// call), direct against streaming: V4-Flash at 16K / 64K context tokens
		// 98.4 / 99.2-99.5 against 92.1-92.7 / 94.4; V4-Pro 98.8-99.0 / 99.2-99.5
		// against 93.6-93.8 / 93.7-94.2. Time per layer in an 8-layer graph:
		// V4-Flash 16K 519.8 against 557.2 us, 64K 2070 against 2198 us; V4-Pro
		// 1027 against 1096 us, 4095 against 4373 us. (FP8 Q, a third of its
		// bytes written, streams faster from 16K tokens: DirectMaxRows.)
		DirectMaxRowsBF16: math.MaxInt32,
		// DirectMinRows: the smallest launch, in Q rows, that takes the
		// direct path by default: every one. Since its warps ask L2 for their rows
		// ahead of the programmatic-launch wait, the direct path beats the
		// streaming pipeline at every decode size measured on the H200 (many-layer
		// CUDA graph, time per layer, 2026-12-01: V4-Flash b=1 2.40 against 1.45
		// us, b=16 MTP 3 4.10 against 2.98 us; V4-Pro b=1 2.77 against 1.61 us,
		// b=8 MTP 3 3.66 against 3.14 us); without the prefetch the pipeline was
		// faster below 6144 rows.
		DirectMinRows: 1,
		// The direct path's block: 4 warps, 2 (token, head) rows a Q warp,
		// the registers left to the compiler.
		DirectWarps: 4, DirectQRows: 2, DirectMinBlocks: 1,
		// DirectHalfBlockRows: the largest direct launch, in Q rows, that
		// runs blocks of DirectWarps warps; a larger one runs blocks of half as
		// many. Above it a decode grid takes more than one wave of resident warps
		// on the H200 (36 warps a multiprocessor at the direct kernels' 56
		// registers, 132 multiprocessors, 2 Q rows a warp: about 9500 rows), and
		// smaller blocks let the second wave and the next layer's blocks in as
		// soon as each pair of warps is done. Measured on the H200 (2026-12-01,
		// decode iteration through the graph, b=32 MTP 3, three runs each, blocks
		// of 4 against 2 warps): V4-Pro (16384 rows) 460.2-461.1 against
		// 451.2-452.2 us; V4-Flash (8192 rows, one wave) 184.6-186.3 against
		// 188.6-189.2 us.
		DirectHalfBlockRows: 8192,
		// BF16MMAMaxRows: the largest projection GEMM (the KV
		// compressor's bf16 GEMM), in X rows, that the tensor-core weight-streaming
		// kernel runs by default; cuBLASLt runs larger ones (and the kernel
		// what cuBLASLt refuses). None: cuBLASLt was faster at every decode
		// shape measured, 1 to 128 rows of the fused ratio-4 projection
		// (2624 outputs) and ratio 128's (1024) at hidden 4096 and 7168, cold
		// in a graph: e.g. V4-Flash's fused at 1 / 8 / 32 / 64 rows 12.4 /
		// 12.4 / 13.4 / 11.3 us against the kernel's 12.9 / 13.7 / 16.1 /
		// 22.4, V4-Pro's ratio 128 10.4 / 10.2 / 10.6 / 11.1 against 11.3 /
		// 12.2 / 14.6 / 17.8, and than every variant of the kernel
		// (bench/results/2026-12-02-h200-bf16, TestBF16GEMMTimes, the kernel of
		// 4ecf717). It was 64 from 43d2295 (2026-11-30), whose measurement no
		// folder keeps.
		BF16MMAMaxRows: -1,
		// BF16MMADepth: gemm_bf16_mma, two stages of W in flight a lane, the
		// kernel every measurement so far ran; the ring kernels (4, 8) are not
		// yet measured on the device.
		BF16MMADepth: 2,
		// BF16MMAReduce, BF16MMAWarpRows: the separate reduction launch,
		// 16 W rows a warp, as measured so far.
		BF16MMAReduce: 1, BF16MMAWarpRows: 16,
		// The indexer's key step: indexer_step (in one launch), bit-exact
		// with the CPU in every indexer and compressor-step test and the
		// fastest at every shape measured, as indexer_query_lean was among
		// the query kernels then (H200, 2026-12-02, bench/results/2026-12-02-h200-g/idxkeys: 20
		// calls in a graph, best of 20, us a call). Keys, split against
		// fused: 7.65 / 5.25 at b=32 MTP 3, 7.00 / 4.61 at b=1 MTP 3,
		// 33.50 / 11.66 at 4K prefill. Query, late / early / lean: 5.52 /
		// 5.09 / 3.69, 4.28 / 3.80 / 2.34, 97.92 / 102.6 / 78.78. V4-Flash's
		// ratio-4 layer through the graph: +23.3% -> +19.8% at b=32 MTP 3,
		// +35.8% -> +30.8% at 4K.
		// The query: indexer_query_stream at every size (H200, 2026-12-02;
		// bit-exact through TestCUDAIndexerKernels/query=stream at 14:15,
		// bench/results/2026-12-02-h200-j/lead/call1.log.gz; the query
		// alone at 13:35, bench/results/2026-12-02-h200-i/idxq/call2, 20
		// calls a graph, best replay, us, stream / lean / wide: 2.15 / 2.35
		// / 2.79 at 4 rows, 2.52 / 3.78 / 3.21 at 128, 6.28 / 11.25 / 8.22
		// at 512, 39.78 / 78.72 / 59.41 at 4096, 141.44 / 303.44 / 211.04
		// at 16384). Before it: lean below 128 rows, wide from 128 on
		// (IndexerQueryWideMinRows; the measurements below).
		IndexerKeys: IndexerKeysFused, IndexerQuery: IndexerQueryStream,
		// The indexer's query path on the third stream (its wq_b GEMM and
		// query step under the main stream's wq_b GEMM and Q prologue),
		// faster than on the main stream at every shape below. (Its one
		// failure, the tiny model's graphs, was cuBLASLt's at K = 256,
		// on any stream: cublasLtScaleRowsOK in attention/mla/cuda.) H200,
		// 2026-12-02 12:19, bench/results/2026-12-02-h200-i/lead: V4-Flash
		// b=32 MTP 3 54.41 us without the indexer, 66.04 with its query
		// path on the main stream (+21.4%), 61.07 on the third (+12.2%);
		// V4-Pro 90.65, 110.06 (+21.4%), 97.83 (+7.9%).
		// indexer_query_wide from 128 token rows on (H200, 2026-12-02
		// 07:35, bench/results/2026-12-02-h200-h/idx: cmd/bench's indexer
		// layer, 8 layers a graph, L2 flushed, us a layer, query path on
		// the main stream / on the third stream; the query kernel alone,
		// 20 calls a graph, best replay). V4-Flash b=32 MTP 3 71.51 / 66.78
		// (+23.2% / +15.1% over the layer without the indexer), 4K 896.3
		// / 896.8 (lean) and 874.3 / 840.9 (wide), 16K 3700 / 3528 (lean)
		// and 3618 / 3495 (wide); V4-Pro b=32 MTP 3 109.77 / 98.33, 4K
		// 1918 / 1775 (lean) and 1908 / 1737 (wide). The query alone,
		// lean / wide: 3.75 / 3.15 at 128 rows, 78.4 / 58.7 at 4096, 2.40
		// / 2.75 at 4 (b=1 MTP 3: the lean kernel's 16 warps against the
		// wide one's 4).
		IndexerStream: IndexerStreamAux, IndexerQueryWideMinRows: -1,
		CuBLASLtSplitK: CuBLASLtSplitKAny,
		// The 256-thread select (topk_select4n) from 1024 rows of up to
		// TopKSelectNarrowMaxKeys keys: at prefill 16K (16,384 rows) the
		// select alone 295.9-298.8 us against 755.2-755.3 in 1024-thread
		// blocks (the layer 2521.7-2522.6 against 3005.7-3010.8), one
		// block a row either way; at decode b=32 MTP 3 (128 rows, one block
		// a multiprocessor) it is slower, 9.4-9.5 us against 7.6-7.7 at
		// 8K (bench/results/2026-12-02-h200-i/topkp/call1). Through this
		// rule, against topk_select4: a 1024-row chunk at 3K 16.3-17.0
		// against 40.7-40.8 us, prefill 4K (4096 rows) 28.8-29.0 against
		// 92.0-93.2 (bench/results/2026-12-02-h200-i/topkp/call2).
		TopKSelectNarrowMinRows: 1024,
		// indexer_query_lane: never (bit-exact, 14:15 call above; slower
		// than indexer_query_stream at every size of the 13:35 call but 2K
		// rows on 1584 blocks, 19.99 against 22.93 us).
		IndexerQueryLaneMinRows:    -1,
		IndexerQueryTokBlocksPerSM: 2,
		// indexer_query_tok from 4096 token rows, the same bytes: 34.22 /
		// 129.42 us against indexer_query_stream's 39.65 / 141.72 alone at
		// 4K / 16K rows (bench/results/2026-12-02-h200-k/iqp/call1/query.txt);
		// V4-Flash's ratio-4 layer 863.6-863.9 against 871.4-878.9 us at 4K,
		// 3568.8-3572.2 against 3607.1-3629.9 at 16K (iqp/call2/ab-*.json).
		// Smaller batches not measured.
		IndexerQueryTokMinRows: 4096,
	},
}

// ForDevice is the description for a device of compute capability
// major.minor whose driver reports r: each resource it reports replaces
// the table's. Only sm_90 is measured: any other architecture gets its
// choices, named as borrowed.
func ForDevice(major, minor int, r Resources) Arch {
	a := SM90
	if major != a.Major || minor != a.Minor {
		a.Name = fmt.Sprintf("sm_%d%d (the choices measured on %s)", major, minor, SM90.Name)
		a.Major, a.Minor = major, minor
		// sm_90a code (wgmma) runs on compute capability 9.0 alone.
		a.FP8.WGMMA = WGMMAArch{}
		a.BF16.WGMMA = BF16WGMMAArch{}
	}
	for _, f := range []struct {
		dst *int
		v   int
	}{
		{&a.SMs, r.SMs}, {&a.SharedPerBlockOptin, r.SharedPerBlockOptin}, {&a.SharedPerSM, r.SharedPerSM},
		{&a.RegistersPerSM, r.RegistersPerSM}, {&a.L2Bytes, r.L2Bytes},
	} {
		if f.v > 0 {
			*f.dst = f.v
		}
	}
	return a
}
