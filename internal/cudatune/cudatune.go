package cudatune

import "math"

// DefaultDirectMaxRows is the largest launch with FP8 Q, in Q rows (tokens
// x heads), that takes the direct path by default: every decode batch, and
// context batches up to 8192 V4-Flash or 4096 V4-Pro tokens. Measured on
// the H200 (2026-12-01, time per layer in a many-layer CUDA graph,
// streaming against direct): V4-Flash b=256 MTP 3 30.8 against 27.9 us, 4096 context tokens
// 114.7 against 107.8 us; V4-Pro b=256 MTP 3 60.1 against 53.6 us, 4096
// tokens 220.2 against 210.5 us. At 16K tokens and more the streaming
// pipeline keeps the KV kernel ahead (V4-Flash 16K, cold: 16.5 against
// 17.2 us) and V4-Pro's Q (824 against 854 us).
const DefaultDirectMaxRows = 1 << 19

// DefaultDirectMaxRowsBF16 is DefaultDirectMaxRows for a launch whose Q
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
// bytes written, streams faster from 16K tokens: DefaultDirectMaxRows.)
const DefaultDirectMaxRowsBF16 = math.MaxInt32

// DefaultDirectMinRows is the smallest launch, in Q rows, that takes the
// direct path by default: every one. Since its warps ask L2 for their rows
// ahead of the programmatic-launch wait, the direct path beats the
// streaming pipeline at every decode size measured on the H200 (many-layer
// CUDA graph, time per layer, 2026-12-01: V4-Flash b=1 2.40 against 1.45
// us, b=16 MTP 3 4.10 against 2.98 us; V4-Pro b=1 2.77 against 1.61 us,
// b=8 MTP 3 3.66 against 3.14 us); without the prefetch the pipeline was
// faster below 6144 rows.
const DefaultDirectMinRows = 1

// DefaultDirectHalfBlockRows is the largest direct launch, in Q rows, that
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
const DefaultDirectHalfBlockRows = 8192

// DefaultBlocksPerSM caps a streaming grid at two blocks of 8 warps a
// multiprocessor: the KV and fused layer kernels take 110 registers a
// thread, so two is all that is resident at once (a cap of 4 left half the
// grid for a second wave), and the Q kernel, which fits four, streamed
// faster with two too. Cold single launches on the H200 (2026-12-01), 4
// against 2: KV at 16K tokens 18.98 against 16.70 us, at 64K 48.06 against
// 46.56 us; V4-Flash FP8 Q at 16K 427.2 against 410.5 us, at 64K 1653
// against 1602 us; V4-Pro FP8 Q at 16K 836 against 810 us.
const DefaultBlocksPerSM = 2

// DefaultQChunk is the streaming Q pipeline's chunk. The grid's warps take
// chunks of 8 consecutive rows in turn, so the rows in flight at once lie
// close together in memory, as a copy's do. Cold single launches, FP8 Q,
// % of the copy bandwidth at 16K / 64K context tokens (H200, 2026-12-01,
// A/B in one call, two rounds): V4-Flash 95.5-95.9 / 96.7 against
// 91.2-91.3 / 94.4-94.5 with a contiguous range a warp, V4-Pro 97.0 /
// 96.7-97.0 against 93.3-93.4 / 94.7-94.8. Chunks of 16 read 93.4-95.9, of
// 4 84.6-94.3 and of 2 79.4-85.6 (more token resolutions), of 64 about the
// contiguous ranges.
const DefaultQChunk = 8

// DefaultBF16MMAMaxRows is the largest projection GEMM (the KV
// compressor's bf16 GEMM), in X rows, that the tensor-core weight-streaming
// kernel runs by default; cuBLASLt runs larger ones. At decode the GEMM is
// the time to read its weights once, which cuBLASLt's large tiles leave
// most SMs idle for.
const DefaultBF16MMAMaxRows = 64

// Knobs are passed to cuda.NewTuned; zero fields take the defaults.
type Knobs struct {
	// Warps is the number of warps per block (0: 8); each KV warp streams
	// a contiguous range of rows, each Q warp chunks of QChunk rows.
	Warps int
	// KVDepth and QDepth are the rows each warp keeps in flight (0: 4).
	KVDepth, QDepth int
	// QChunk is the run of consecutive (token, head) rows a Q warp of the
	// streaming pipeline takes before the grid's other warps take theirs
	// (0: DefaultQChunk).
	QChunk int
	// BlocksPerSM caps the grid at BlocksPerSM blocks per multiprocessor
	// (0: DefaultBlocksPerSM); smaller batches get one warp per row.
	BlocksPerSM int
	// MaxBlocks, when set, caps the grid instead (tests use it to make a
	// few warps stream long ranges).
	MaxBlocks int
	// DirectMaxRows: a launch with FP8 Q of at most this many Q rows
	// (tokens x heads, padding included), and a KV kernel launched alone
	// whatever its layer's Q format, runs the direct path (one warp per
	// row, no shared memory; kernels/cuda/prologue.cu), a larger one the
	// streaming pipeline above. 0: DefaultDirectMaxRows; negative: never
	// direct.
	DirectMaxRows int
	// DirectMaxRowsBF16 is DirectMaxRows for a launch with bf16 Q (0:
	// DefaultDirectMaxRowsBF16; negative: never direct).
	DirectMaxRowsBF16 int
	// DirectMinRows: a launch of fewer Q rows streams (0:
	// DefaultDirectMinRows; 1: every launch up to DirectMaxRows is direct).
	DirectMinRows int
	// DirectWarps is the direct path's warps per block (0: 4), at most:
	// see DirectHalfBlockRows.
	DirectWarps int
	// DirectHalfBlockRows: a direct launch of more Q rows than this runs
	// blocks of DirectWarps/2 warps (at least 1). 0:
	// DefaultDirectHalfBlockRows; negative: never.
	DirectHalfBlockRows int
	// DirectQRows is the (token, head) rows each Q warp of the direct path
	// owns (0: 2), the next one's loads issued before a row's arithmetic:
	// fewer warps, so that more of a decode batch's grid is resident at once.
	DirectQRows int
	// DirectMinBlocks is the direct path's __launch_bounds__ minimum of
	// blocks a multiprocessor (0: 1, the registers left to the compiler);
	// a larger value caps the registers a thread to raise occupancy.
	DirectMinBlocks int
	// BF16MMAMaxRows: a projection GEMM of at most this many rows runs the
	// tensor-core kernel (kernels/cuda/gemm_bf16_mma.cu) where its shape
	// allows (0: DefaultBF16MMAMaxRows; negative: never).
	BF16MMAMaxRows int
	// SeparateLaunches makes RunLayer issue the KV and Q kernels as two
	// launches instead of one fused layer launch.
	SeparateLaunches bool
	// Verbose keeps ptxas's resource report (registers, spills) in
	// CompileLog, compiling without the cache.
	Verbose bool
}

// Defaults returns k with every zero shape field set to its default (a
// negative DirectMaxRows, DirectMaxRowsBF16, DirectHalfBlockRows or
// BF16MMAMaxRows becomes -1: never).
func (k Knobs) Defaults() Knobs {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	// A row threshold: 0 takes the default, a negative one turns its rule off.
	threshold := func(v *int, d int) {
		switch {
		case *v == 0:
			*v = d
		case *v < 0:
			*v = -1
		}
	}
	def(&k.Warps, 8)
	def(&k.KVDepth, 4)
	def(&k.QDepth, 4)
	def(&k.QChunk, DefaultQChunk)
	def(&k.BlocksPerSM, DefaultBlocksPerSM)
	def(&k.DirectWarps, 4)
	def(&k.DirectQRows, 2)
	def(&k.DirectMinBlocks, 1)
	def(&k.DirectMinRows, DefaultDirectMinRows)
	threshold(&k.BF16MMAMaxRows, DefaultBF16MMAMaxRows)
	threshold(&k.DirectHalfBlockRows, DefaultDirectHalfBlockRows)
	threshold(&k.DirectMaxRows, DefaultDirectMaxRows)
	threshold(&k.DirectMaxRowsBF16, DefaultDirectMaxRowsBF16)
	return k
}

// DirectBlockWarps is the warps a block of a direct launch of qRows Q rows
// (tokens x heads) under k (with its defaults applied).
func (k Knobs) DirectBlockWarps(qRows int) int {
	if k.DirectHalfBlockRows >= 0 && qRows > k.DirectHalfBlockRows {
		return max(1, k.DirectWarps/2)
	}
	return k.DirectWarps
}

// Direct reports whether a launch of qRows Q rows (tokens x heads), its Q
// output bf16 or FP8, takes the direct path under k (with its defaults
// applied).
func (k Knobs) Direct(qRows int, bf16Q bool) bool {
	limit := k.DirectMaxRows
	if bf16Q {
		limit = k.DirectMaxRowsBF16
	}
	return limit >= 0 && qRows <= limit && qRows >= k.DirectMinRows
}
