// Package mla is the DSv4 MLA attention prologue: the backend interface its
// kernels implement, and the dispatcher that turns one iteration's metadata
// into launches.
//
// The data path is batch -> metadata -> dispatch -> kernels -> cache. A batch
// holds context sequences first, then generation sequences; Plan turns its
// metadata into at most two launches (one per phase) over disjoint token-row
// ranges of the same buffers, and RunLayer runs, for every launch, the KV work
// (norm, RoPE, quantize, store into the cache) and the Q work (norm, RoPE,
// quantize into the Q buffer). The two touch disjoint memory, so their order
// is free: the generic path (RunLaunches, the CPU backend) calls
// KVNormRopeStore then QNormRopeQuant, while a backend with a LayerRunner
// (CUDA) issues both as one fused grid per launch, KV and Q blocks side by
// side. The launches of a layer, and the layers of an iteration, run in
// issue order.
//
// Backends (package mla/cpu, package mla/cuda) differ only in where the
// buffers live and how the rows are scheduled; they produce the same bytes
// (docs/DESIGN.md section 4), which the shared conformance suite in package
// mla/mlatest checks. The RoPE table, the kv_a_layernorm weight and the
// rms_norm_eps (LayerArgs.Eps) come from the caller: a layer reads one table
// of its kind, shared by every layer of that kind.
//
// In a ratio-4 layer the indexer's prologue (docs/DESIGN.md section 9)
// produces what the selection reads: an IndexerQuerier (IndexerQueryArgs,
// one call per launch like the Q prologue) turns the indexer's wq_b GEMM
// output and the weights_proj GEMM output into the MXFP4 query
// [T][64][68 B] and the head weights [T][64] bf16, and a CompressStepper
// with CompressStepArgs.Entry = EntryIndexer writes the indexer's cache
// entries (section 8's ratio-4 pooling at width 128, RMSNorm, RoPE at 4i,
// Hadamard, MXFP4: 68 bytes each). A TopKSelector (TopKArgs, TopKPlan) scores every
// compressed entry a query token sees against the indexer's MXFP4 query
// and head weights and keeps the index_topk best as ascending int32 entry
// indices (docs/DESIGN.md section 9, "Selection").
package mla
