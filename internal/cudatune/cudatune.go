package cudatune

import "fmt"

// Knobs are passed to cuda.NewTuned; zero fields take the defaults.
type Knobs struct {
	// Warps is the number of warps per block (0: 8); each KV warp streams
	// a contiguous range of rows, each Q warp chunks of QChunk rows.
	Warps int
	// KVDepth and QDepth are the rows each warp keeps in flight (0: 4).
	KVDepth, QDepth int
	// QChunk is the run of consecutive (token, head) rows a Q warp of the
	// streaming pipeline takes before the grid's other warps take theirs
	// (0: SM90.Knobs.QChunk).
	QChunk int
	// BlocksPerSM caps the grid at BlocksPerSM blocks per multiprocessor
	// (0: SM90.Knobs.BlocksPerSM); smaller batches get one warp per row.
	BlocksPerSM int
	// MaxBlocks, when set, caps the grid instead (tests use it to make a
	// few warps stream long ranges).
	MaxBlocks int
	// DirectMaxRows: a launch with FP8 Q of at most this many Q rows
	// (tokens x heads, padding included), and a KV kernel launched alone
	// whatever its layer's Q format, runs the direct path (one warp per
	// row, no shared memory; kernels/cuda/prologue.cu), a larger one the
	// streaming pipeline above. 0: SM90.Knobs.DirectMaxRows; negative: never
	// direct.
	DirectMaxRows int
	// DirectMaxRowsBF16 is DirectMaxRows for a launch with bf16 Q (0:
	// SM90.Knobs.DirectMaxRowsBF16; negative: never direct).
	DirectMaxRowsBF16 int
	// DirectMinRows: a launch of fewer Q rows streams (0:
	// SM90.Knobs.DirectMinRows; 1: every launch up to DirectMaxRows is direct).
	DirectMinRows int
	// DirectWarps is the direct path's warps per block (0: 4), at most:
	// see DirectHalfBlockRows.
	DirectWarps int
	// DirectHalfBlockRows: a direct launch of more Q rows than this runs
	// blocks of DirectWarps/2 warps (at least 1). 0:
	// SM90.Knobs.DirectHalfBlockRows; negative: never.
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
	// allows (0: SM90.Knobs.BF16MMAMaxRows; negative: never).
	BF16MMAMaxRows int
	// BF16MMADepth is the stages of W (64 k each) a lane of the
	// tensor-core kernel keeps in flight: 2 is gemm_bf16_mma, 4 and 8 its
	// ring kernels gemm_bf16_mma_d4 / _d8 (0: SM90.Knobs.BF16MMADepth).
	BF16MMADepth int
	// BF16MMABlocksPerSM is the grid the tensor-core kernel's split of K
	// aims for, in blocks a multiprocessor (0: the architecture's
	// BF16GEMMArch.SplitBlocksPerSM); never more than the kernel holds at
	// once.
	BF16MMABlocksPerSM int
	// BF16MMAReduce is how a split K of the tensor-core kernel is finished:
	// 1 by the gemm_bf16_mma_reduce launch after it, 2 by the kernel's last
	// block of each output block (the ring kernels gemm_bf16_mma_d2f,
	// _d4f, _d8f, _d4wf). 0:
	// SM90.Knobs.BF16MMAReduce.
	BF16MMAReduce int
	// BF16MMAWarpRows is the W rows a warp of the tensor-core kernel owns:
	// 16 (every kernel), or 32 (gemm_bf16_mma_d4w / _d4wf: BF16MMADepth 4,
	// two warps a block, each X fragment feeding twice the MMAs). 0:
	// SM90.Knobs.BF16MMAWarpRows.
	BF16MMAWarpRows int
	// BF16MMAMaxSplits caps the tensor-core kernel's split of K (0:
	// SM90.Knobs.BF16MMAMaxSplits; 0 there or negative: only the planner's
	// own limits). The reduction reads every split's partials:
	// weights_proj's one output block splits 112 ways at V4-Pro's hidden
	// size without a cap.
	BF16MMAMaxSplits int
	// BF16WGMMAMaxRows: a projection GEMM of at most this many rows runs
	// the sm_90a warpgroup-MMA kernel (kernels/cuda/gemm_bf16_wgmma.cu)
	// wherever its shape allows, before the tensor-core kernel's and
	// cuBLASLt's rules (0: the architecture description's BF16.WGMMA.Use
	// decides; negative: never).
	BF16WGMMAMaxRows int
	// BF16WGMMAFinish is how that kernel finishes a split K (0:
	// BF16.WGMMA.Finish): BF16WGMMAFinishReduce, BF16WGMMAFinishLast or
	// BF16WGMMAFinishCluster.
	BF16WGMMAFinish int
	// BF16WGMMAMaxSplits caps that kernel's split of K (0 or negative:
	// only the planner's own limits).
	BF16WGMMAMaxSplits int
	// BF16WGMMAMaxTile caps that kernel's token tile (0: the architecture's
	// largest): 128 rows in two chunks of 64 read W twice, from L2 where
	// the chunks' blocks run at once, for twice the units to split.
	BF16WGMMAMaxTile int
	// BF16WGMMAMaxStages caps that kernel's shared-memory ring (0: the
	// architecture's BF16.WGMMA.MaxStages, what fits): a shallower ring
	// leaves a multiprocessor's shared memory to the other stream's kernels.
	BF16WGMMAMaxStages int
	// BF16WGMMAL2Prefetch: positive, that kernel's producer asks for the
	// rest of its first unit's W into L2 at the start; negative, never; 0:
	// BF16.WGMMA.L2Prefetch.
	BF16WGMMAL2Prefetch int
	// IndexerKeys picks the kernels of the indexer compressor's step
	// (CompressStep with mla.EntryIndexer; 0: SM90.Knobs.IndexerKeys).
	IndexerKeys IndexerKeys
	// IndexerQuery picks the indexer query's kernel (IndexerQuery; 0:
	// SM90.Knobs.IndexerQuery).
	IndexerQuery IndexerQuery
	// TopKSelectNarrowMinRows: a top-k select launch of at least this many
	// rows, each of at most TopKSelectNarrowMaxKeys keys (the shape's block
	// table), runs the select in blocks of 256 threads (topk_select4n), so
	// that several short rows share a multiprocessor (0:
	// SM90.Knobs.TopKSelectNarrowMinRows; negative: never; TopKSelectNarrowAt).
	TopKSelectNarrowMinRows int
	// IndexerQueryWideMinRows: a query launch of at least this many token
	// rows runs indexer_query_wide whatever IndexerQuery names (0:
	// SM90.Knobs.IndexerQueryWideMinRows; negative: never; IndexerQueryAt).
	IndexerQueryWideMinRows int
	// IndexerQueryLaneMinRows: a query launch of at least this many token
	// rows runs indexer_query_lane whatever IndexerQuery and
	// IndexerQueryWideMinRows say (0: SM90.Knobs.IndexerQueryLaneMinRows;
	// negative: never; IndexerQueryAt).
	IndexerQueryLaneMinRows int
	// IndexerQueryTokMinRows: a query launch of at least this many token
	// rows runs indexer_query_tok whatever IndexerQuery says (before the
	// lane and wide rules; 0: SM90.Knobs.IndexerQueryTokMinRows; negative:
	// never; IndexerQueryAt).
	IndexerQueryTokMinRows int
	// IndexerStream says where a ratio-4 layer's indexer query path (its
	// wq_b GEMM and query step) runs (mla.AuxRunner; 0:
	// SM90.Knobs.IndexerStream).
	IndexerStream IndexerStream
	// CuBLASLtSplitK restricts the split-K reductions cuBLASLt's heuristic
	// may choose for the FP8 and bf16 GEMMs (0: SM90.Knobs.CuBLASLtSplitK).
	CuBLASLtSplitK CuBLASLtSplitK
	// CuBLASLtFP8Heuristic: the FP8 GEMMs on cuBLASLt run the heuristic's
	// N-th result for their shape (1: its first, the library's choice;
	// past the last it returns, the last; 0: SM90.Knobs.CuBLASLtFP8Heuristic,
	// 0 there too meaning the first): a measurement knob.
	CuBLASLtFP8Heuristic int
	// CuBLASLtBF16Heuristic: the same for the bf16 GEMMs on cuBLASLt (0:
	// SM90.Knobs.CuBLASLtBF16Heuristic).
	CuBLASLtBF16Heuristic int
	// IndexerQueryBlocksPerSM caps the grid of the indexer query's warp
	// kernels (all but indexer_query_lane) at this many blocks a
	// multiprocessor (0: SM90.Knobs.IndexerQueryBlocksPerSM; 0 there too:
	// the chain kernels' cap of 16; MaxBlocks overrides).
	IndexerQueryBlocksPerSM int
	// IndexerQueryTokBlocksPerSM is indexer_query_tok's grid, blocks a
	// multiprocessor (one wave; 0: SM90.Knobs.IndexerQueryTokBlocksPerSM;
	// MaxBlocks overrides).
	IndexerQueryTokBlocksPerSM int
	// WGMMAClusterSplits overrides how the wgmma FP8 GEMM finishes a split
	// K (0: the architecture description's FP8.WGMMA.ClusterSplits;
	// negative: the tile's last block from global partials; n > 0:
	// thread-block clusters of up to n <= 8 splits).
	WGMMAClusterSplits int
	// WGMMAMulticast overrides whether the wgmma GEMM's blocks share the
	// activation tile in clusters (0: FP8.WGMMA.Multicast; negative: never;
	// 2 or 4: clusters of that many).
	WGMMAMulticast int
	// WGMMAWeightMulticast overrides whether the wgmma GEMM's token-chunk
	// blocks share the weight tile in clusters (0:
	// FP8.WGMMA.WeightMulticast; negative: never; 2, 4 or 8: clusters of
	// up to that many).
	WGMMAWeightMulticast int
	// WGMMAMaxSMs > 0 caps the multiprocessors the wgmma GEMM is planned
	// for (0: FP8.WGMMA.MaxSMs).
	WGMMAMaxSMs int
	// WGMMAKernel makes every GEMM the wgmma kernel runs use that family
	// of its kernels (0: the one the architecture description's
	// FP8.WGMMA.Use rule names).
	WGMMAKernel WGMMAKernel
	// WGMMANarrow > 0 puts GEMMs of at most WGMMANarrowMaxN outputs (every
	// chain GEMM but wq_b) at up to WGMMANarrowMaxM rows on the wgmma kernel
	// of that family, before FP8.WGMMA.Use's rules (0: the rules alone).
	WGMMANarrow WGMMAKernel
	// WGMMANarrowStages caps the narrow families' ring (0:
	// FP8.WGMMA.NarrowMaxStages): fewer stages leave a multiprocessor's
	// shared memory to a kernel running beside the GEMM on another stream.
	WGMMANarrowStages int
	// WGMMANarrowChunks > 0 caps the token chunks the narrow families'
	// planner makes before it splits K (0: as many as fill half the
	// multiprocessors; FP8.WGMMA.NarrowMaxChunks).
	WGMMANarrowChunks int
	// WGMMAMaxSplits > 0 caps the wgmma GEMM's split of K (1: none), so
	// that a narrow GEMM can run on few multiprocessors beside another
	// stream's kernel, as cuBLASLt's does (12 blocks for V4-Flash's [wq_a;
	// wkv] at 128 rows: 0.09 waves, 2026-12-02-h200-j/gnarrow); 0:
	// FP8.WGMMA.MaxSplits.
	WGMMAMaxSplits int
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
	d := SM90.Knobs
	def(&k.Warps, d.Warps)
	def(&k.KVDepth, d.KVDepth)
	def(&k.QDepth, d.QDepth)
	def(&k.QChunk, d.QChunk)
	def(&k.BlocksPerSM, d.BlocksPerSM)
	def(&k.DirectWarps, d.DirectWarps)
	def(&k.DirectQRows, d.DirectQRows)
	def(&k.DirectMinBlocks, d.DirectMinBlocks)
	def(&k.DirectMinRows, d.DirectMinRows)
	threshold(&k.BF16MMAMaxRows, d.BF16MMAMaxRows)
	def(&k.BF16MMADepth, d.BF16MMADepth)
	def(&k.BF16MMAReduce, d.BF16MMAReduce)
	def(&k.BF16MMAWarpRows, d.BF16MMAWarpRows)
	threshold(&k.BF16MMAMaxSplits, d.BF16MMAMaxSplits)
	threshold(&k.DirectHalfBlockRows, d.DirectHalfBlockRows)
	threshold(&k.DirectMaxRows, d.DirectMaxRows)
	threshold(&k.DirectMaxRowsBF16, d.DirectMaxRowsBF16)
	threshold(&k.IndexerQueryWideMinRows, d.IndexerQueryWideMinRows)
	threshold(&k.TopKSelectNarrowMinRows, d.TopKSelectNarrowMinRows)
	threshold(&k.IndexerQueryLaneMinRows, d.IndexerQueryLaneMinRows)
	threshold(&k.IndexerQueryTokMinRows, d.IndexerQueryTokMinRows)
	if k.IndexerKeys == 0 {
		k.IndexerKeys = d.IndexerKeys
	}
	if k.IndexerQuery == 0 {
		k.IndexerQuery = d.IndexerQuery
	}
	if k.IndexerStream == 0 {
		k.IndexerStream = d.IndexerStream
	}
	if k.CuBLASLtSplitK == 0 {
		k.CuBLASLtSplitK = d.CuBLASLtSplitK
	}
	def(&k.CuBLASLtFP8Heuristic, d.CuBLASLtFP8Heuristic)
	def(&k.CuBLASLtBF16Heuristic, d.CuBLASLtBF16Heuristic)
	def(&k.IndexerQueryBlocksPerSM, d.IndexerQueryBlocksPerSM)
	def(&k.IndexerQueryTokBlocksPerSM, d.IndexerQueryTokBlocksPerSM)
	return k
}

// CuBLASLtSplitK names which split-K reductions cuBLASLt's heuristic may
// pick (its CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK).
type CuBLASLtSplitK int

const (
	// CuBLASLtSplitKAny: every reduction scheme (the library's default).
	CuBLASLtSplitKAny CuBLASLtSplitK = iota + 1
	// CuBLASLtSplitKWorkspace: a split K only through the workspace (in
	// the compute or the output type), not added up in place in the output.
	CuBLASLtSplitKWorkspace
	// CuBLASLtSplitKNone: no split of K.
	CuBLASLtSplitKNone
)

// ReductionMask is the cublasLtReductionScheme_t mask of s (INPLACE 1,
// COMPUTE_TYPE 2, OUTPUT_TYPE 4; 0 allows only the unsplit algorithms),
// and whether the preference is set at all (not for CuBLASLtSplitKAny).
func (s CuBLASLtSplitK) ReductionMask() (mask uint32, set bool) {
	switch s {
	case CuBLASLtSplitKWorkspace:
		return 2 | 4, true
	case CuBLASLtSplitKNone:
		return 0, true
	}
	return 0, false
}

func (s CuBLASLtSplitK) String() string {
	switch s {
	case CuBLASLtSplitKAny:
		return "any"
	case CuBLASLtSplitKWorkspace:
		return "workspace"
	case CuBLASLtSplitKNone:
		return "none"
	}
	return fmt.Sprintf("CuBLASLtSplitK(%d)", int(s))
}

// IndexerKeys names the kernels of the indexer compressor's step; all of
// them write the same bytes (kernels/cuda/compress.cu, indexer.cu).
type IndexerKeys int

const (
	// IndexerKeysSplit: compress_step at width 128 into a scratch buffer,
	// then indexer_step_finish (two launches).
	IndexerKeysSplit IndexerKeys = iota + 1
	// IndexerKeysFused: indexer_step, the pooling and the entry in one
	// kernel, one entry a block.
	IndexerKeysFused
)

// IndexerQuery names the indexer query's kernel; both write the same
// bytes (kernels/cuda/indexer.cu).
type IndexerQuery int

const (
	// IndexerQueryLate: indexer_query, the metadata read after the wait.
	IndexerQueryLate IndexerQuery = iota + 1
	// IndexerQueryEarly: indexer_query_early, the metadata and RoPE pairs
	// read before the wait, the head weight with the row.
	IndexerQueryEarly
	// IndexerQueryLean: indexer_query_lean, IndexerQueryEarly with fewer
	// instructions a row (the Hadamard's sign by an xor, e2m1 without
	// its compare chain).
	IndexerQueryLean
	// IndexerQueryWide: indexer_query_wide, eight rows a warp and four
	// lanes a row (most of the Hadamard inside a lane: about half the
	// instructions a row of IndexerQueryLean).
	IndexerQueryWide
	// IndexerQueryStream: indexer_query_stream, the wide kernel's rows and
	// lanes with its MXFP4 tail on bf16x2 pairs and the next unit's loads
	// in flight under the current one's arithmetic.
	IndexerQueryStream
	// IndexerQueryLane: indexer_query_lane, one lane a row (the whole
	// Hadamard in the lane), 32 rows of a token a warp through shared
	// memory, the stream kernel's MXFP4 tail.
	IndexerQueryLane
	// IndexerQueryTok: indexer_query_tok, the stream kernel over a
	// contiguous run of units a warp in one wave (IndexerQueryTokBlocksPerSM
	// blocks a multiprocessor), a token's position and RoPE pairs resolved
	// once, the next row loaded before its metadata.
	IndexerQueryTok
)

// IndexerQueryAt is the query kernel of a launch of rows token rows under k
// (with its defaults applied): IndexerQueryTok from IndexerQueryTokMinRows
// rows on, else IndexerQueryLane from IndexerQueryLaneMinRows rows on,
// else IndexerQueryWide from IndexerQueryWideMinRows rows on, IndexerQuery
// below.
func (k Knobs) IndexerQueryAt(rows int) IndexerQuery {
	if k.IndexerQueryTokMinRows > 0 && rows >= k.IndexerQueryTokMinRows {
		return IndexerQueryTok
	}
	if k.IndexerQueryLaneMinRows > 0 && rows >= k.IndexerQueryLaneMinRows {
		return IndexerQueryLane
	}
	if k.IndexerQueryWideMinRows > 0 && rows >= k.IndexerQueryWideMinRows {
		return IndexerQueryWide
	}
	return k.IndexerQuery
}

// TopKSelectNarrowMaxKeys bounds the rows TopKSelectNarrowMinRows sends to
// the 256-thread select: a prefill's rows (a 16K prompt's see at most 4,096
// entries, a block table of 65 pages of 64: 4,160 keys, 16 KiB of shared
// memory a block, six blocks a multiprocessor; measured there), up to a
// 32K prompt's (32 KiB, not measured), where a decode row of 64K context
// (16K keys) would hold 64 KiB.
const TopKSelectNarrowMaxKeys = 8192

// TopKSelectNarrowAt reports whether a select launch of rows rows, each of
// at most keys keys, runs the 256-thread select under k (with its
// defaults applied).
func (k Knobs) TopKSelectNarrowAt(rows, keys int) bool {
	return k.TopKSelectNarrowMinRows > 0 && rows >= k.TopKSelectNarrowMinRows && keys <= TopKSelectNarrowMaxKeys
}

// IndexerStream names where the indexer's query path runs in a layer's
// chain; both write the same bytes.
type IndexerStream int

const (
	// IndexerStreamMain: the wq_b GEMM on the main stream after the Q
	// prologue, the query step after the join.
	IndexerStreamMain IndexerStream = iota + 1
	// IndexerStreamAux: both on the third stream, forked after q_norm
	// (the GEMM's input), the query step after the side stream's
	// projection GEMM (its head weights' input), joined at the layer's end.
	IndexerStreamAux
)

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

// WGMMAKernel names a family of the sm_90a wgmma FP8 GEMM's kernels
// (kernels/cuda/gemm_fp8_wgmma.cu).
type WGMMAKernel int

const (
	// WGMMAWide: gemm_fp8_wgmma_bn<T>, two consumer warpgroups, 128 W rows
	// a work unit, the token tile the smallest holding M.
	WGMMAWide WGMMAKernel = iota + 1
	// WGMMANarrow: gemm_fp8_wgmma_n1_bn<T>, one consumer warpgroup, 64 W
	// rows a unit; the token tile halved (down to the smallest of
	// FP8.WGMMA.NarrowTiles) until the units fill half the multiprocessors,
	// before K is split.
	WGMMANarrow
	// WGMMANarrowPipe: WGMMANarrow's with two MMA sums in turn, a K block's
	// promotion under the next one's MMAs (gemm_fp8_wgmma_n1p_bn<T>).
	WGMMANarrowPipe
	// WGMMAWidePipe: WGMMAWide's with two MMA sums in turn
	// (gemm_fp8_wgmma_p_bn<T>, FP8.WGMMA.WidePipeTiles).
	WGMMAWidePipe
)

// WGMMANarrowMaxN and WGMMANarrowMaxM bound the GEMMs Knobs.WGMMANarrow
// moves: V4-Flash's and V4-Pro's [wq_a; wkv] (1536, 2048 outputs) and
// the indexer's wq_b (8192), at up to b = 32 with MTP 3.
const (
	WGMMANarrowMaxN = 8192
	WGMMANarrowMaxM = 128
)

func (k WGMMAKernel) String() string {
	switch k {
	case 0:
		return "default"
	case WGMMAWide:
		return "wide"
	case WGMMANarrow:
		return "narrow"
	case WGMMANarrowPipe:
		return "narrow-pipe"
	case WGMMAWidePipe:
		return "wide-pipe"
	}
	return fmt.Sprintf("WGMMAKernel(%d)", int(k))
}
