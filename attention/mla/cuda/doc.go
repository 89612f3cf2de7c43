// Package cuda is the CUDA backend of the MLA prologue: the kernels in
// kernels/cuda/prologue.cu and the chain's kernels (act_quant and norm_quant
// in kernels/cuda/chain.cu, the FP8 GEMM in kernels/cuda/gemm_fp8.cu, with
// cuBLASLt for large batches and on sm_90a the wgmma kernel of
// kernels/cuda/gemm_fp8_wgmma.cu where chosen), embedded, compiled by NVRTC
// for the device at first use (with kernels/cuda.Headers: common.cuh and
// the generated abi.h as in-memory includes) and cached on disk, and the Go
// side that launches them. It implements mla.Backend and
// mla.ChainBackend and passes the same conformance suites as the CPU
// backend, byte for byte (the GEMM within the bound of docs/DESIGN.md
// section 7).
//
// The launch parameters are packed with the table of kernels/cuda/abi, the
// one source of every kernel's parameter struct (Params, TopKParams, the
// GEMMs', the chain's and the compressor's: gemm_params.go packs those),
// the ids, layout constants and tiles and the kernel names both sides use.
//
// RunLayer issues each launch (one per phase) as one fused grid: its first
// blocks do the KV work, the rest the Q work, side by side (they touch
// disjoint memory). Each launch takes one of two paths (abi.Path), chosen by
// its size in Q rows (tokens x heads) and its Q format
// (cudatune.Knobs.DirectMaxRows, DirectMaxRowsBF16): small batches, and
// bf16 Q at every size, the direct path (one warp per row, no shared
// memory); large batches with FP8 Q the streaming pipeline (a capped grid
// whose warps stream row ranges through a cp.async ring); both share the
// per-row arithmetic, so they write the same bytes. A KV kernel launched
// alone (KVNormRopeStore, ForkKV) follows the FP8 Q rule whatever the Q
// format: only a fused grid needs one path for both parts. All driver work
// goes through one driver.Context, whose goroutine is locked to its OS
// thread; launches go out on one stream in issue order, so the launches of
// a layer and the layers of an iteration run in that order. With
// programmatic dependent launch (the default) a grid starts while the
// previous one drains: before its griddepcontrol.wait it reads only what
// no grid in flight writes (the metadata the host uploaded, the RoPE table,
// the weight) and asks L2 for its rows, and it reads the rows an earlier
// kernel produces, and writes anything, only after the wait.
//
// The KV compressor (DESIGN.md section 8) runs in its own module,
// kernels/cuda/compress.cu on prologue.cu's helpers and the canonical exp32
// (kernels/cuda/exp32.cuh), loaded at first use (LoadCompressor).
// CompressStep (mla.CompressStepper) is the engine's: one launch per
// compressed layer reads the iteration's plan from device memory, pools
// each entry (one block, one thread per channel) from the projection rows
// (KGStride apart: a ratio-4 layer's two steps read their columns of the
// engine's one projection GEMM) and the sequence's ring slot, and writes
// the rows the sequence keeps, so a CUDA graph replays it for any batch. BF16GEMM (mla.BF16GEMMBackend:
// bf16 operands, float32 output) writes the projections with the sm_90a
// warpgroup-MMA kernel of kernels/cuda/gemm_bf16_wgmma.cu where
// cudatune's BF16WGMMAMaxRows or BF16.WGMMA.Use choose it (TMA into a
// shared-memory ring, a split K finished in split order; bf16wgmma.go), the
// tensor-core weight-streaming kernel of kernels/cuda/gemm_bf16_mma.cu up
// to cudatune's BF16MMAMaxRows rows (none on the H200, where cuBLASLt was
// measured faster), cuBLASLt above (the tensor-core kernel where cuBLASLt
// is absent or refuses), or
// kernels/cuda/gemm_bf16.cu for the shapes neither runs, within
// gemm.BoundBF16 of the CPU backend
// (cudatune.Knobs.BF16MMADepth picks the tensor-core kernel: the stages of
// W a lane keeps in flight); Side puts both on the second stream under the
// layer's GEMMs, each stream with its own split-K workspaces, cuBLASLt's
// included.
// CompressEntries and LaunchCompress pool explicit candidate lists (the
// kernel tests' entry point).
//
// The indexer's prologue (DESIGN.md section 9) lives in the compressor's
// module (kernels/cuda/indexer.cu). The query (IndexerQuery) runs
// indexer_query_stream by default (cudatune's SM90 IndexerQuery), described
// below with the others. The lean kernel:
// one warp per four (token, head) rows of a
// token with the Q prologue's Params for positions, its metadata and RoPE
// pairs read before the PDL wait; RoPE, the canonical Hadamard by xor
// shuffles, then MXFP4 (e2m1 by integer rounding) and the bf16 head
// weight, or in mla.IndexerQueryFP8 e4m3 with one UE8M0 scale a row folded
// into a float32 head weight. The key step (CompressStep with
// mla.EntryIndexer) runs indexer_step by default: the pooling and the
// entry in one launch, one entry a block, its plan words read before the
// wait. cudatune.Knobs selects the earlier kernels, the same bytes and
// slower on the H200 at every measured shape: IndexerKeysSplit
// (compress_step at width 128, then indexer_step_finish),
// IndexerQueryLate (indexer_query) and IndexerQueryEarly
// (indexer_query_early). IndexerQueryWide (or IndexerQueryWideMinRows,
// from a number of token rows on) selects indexer_query_wide: eight rows a
// warp, four lanes a row, so that five of the Hadamard's seven stages stay
// inside a lane and a MXFP4 block maximum needs one shuffle (about 40%
// fewer instructions a row), the same bytes. IndexerQueryStream (the
// default) selects indexer_query_stream: the wide kernel's lanes with its MXFP4 tail on
// bf16x2 pairs (e2m1 as the minimum of three fmas into 192, a pair at a
// time) and the next unit's loads in flight. IndexerQueryLane (or
// IndexerQueryLaneMinRows) selects indexer_query_lane: one lane a row, 32
// rows of a token a warp, the rows in through shared memory by cp.async
// (two buffers a warp) and the outputs out through it in 16-byte pieces,
// the whole Hadamard and each block maximum inside the lane, the stream
// kernel's tail; one wave of blocks, each warp looping over units.
// IndexerQueryTok (or IndexerQueryTokMinRows, the H200's rule from 4096
// rows) selects indexer_query_tok: the stream kernel's lanes and
// arithmetic over a contiguous run of units a warp in one wave
// (IndexerQueryTokBlocksPerSM), a token's position and RoPE pairs resolved
// once for its eight units, the next row loaded before its metadata.
//
// The backend has a third stream beside the side stream (mla.AuxRunner:
// Aux, MarkSide, AwaitSide; JoinKV joins it), with its own GEMM workspaces
// like the other two; with cudatune.IndexerStreamAux (AuxQuery, the
// H200's default) the engine runs a ratio-4 layer's indexer query path
// there, its wq_b GEMM and query step under the main stream's wq_b GEMM
// and Q prologue.
//
// cuBLASLt runs an FP8 GEMM only where its weight-scale rows (K/128
// float32) are whole 16-byte units (cublasLtScaleRowsOK): at K = 256 its
// block-scaled kernel wrote wrong columns on the H200, so those shapes (the
// tiny test model's) run the own kernels. CuBLASLtAlgorithm reports the
// algorithm its heuristic chose for a shape, under
// cudatune.Knobs.CuBLASLtSplitK.
//
// The indexer's top-k selection (DESIGN.md section 9, mla.TopKSelector)
// runs kernels/cuda/topk.cu, loaded at first use (LoadTopK): topk_score
// scores a row's visible entries a thread each (block dot products of
// doubled e2m1 values as exact int32 by dp4a, scaled and summed in the
// contract's float32 order) into the scratch space as order-preserving
// keys; topk_score_mma4x (the one IndexerTopK launches) computes the same
// keys on the int8 tensor cores, four rows of a sequence a block (decode's
// 1+MTP tokens). topk_select5e (the default select) radix-selects each row's
// threshold key in up to three passes where its keys fit shared memory
// (ending at the first pass whose bin's keys are all taken; a sampled
// candidate sweep where they do not) and writes the indices ascending;
// topk_select4n, four passes in blocks of 256 threads, takes a launch of
// many short rows (cudatune.Knobs.TopKSelectNarrowAt). All read the plan
// from device memory, so a CUDA graph replays them for any batch of the
// shape.
//
// Options hold what a user chooses (device, logger, PDL); the launch-shape
// knobs the tests and cmd/bench vary live in internal/cudatune (NewTuned),
// and so does the one description of the device's architecture every
// launch choice reads (cudatune.Arch: the multiprocessors and shared memory
// the device reports, the GEMM kernels' tiles, the GEMM choices measured
// per shape with the result folders that chose them, the knobs' defaults).
package cuda
