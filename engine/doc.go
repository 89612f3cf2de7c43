// Package engine is what a Go LLM server embeds to run the DeepSeek-V4 MLA
// attention prologue: it owns the backend (CPU or an accelerator), the paged
// KV cache (page bookkeeping plus one pool per layer), the RoPE tables, the
// kv_a_layernorm weights and the fixed-address buffers a CUDA graph can
// replay, and runs one iteration at a time:
//
//	e, err := engine.New(ctx, engine.Config{Model: dsv4.Flash(), Checkpoint: dir})
//	it, err := e.Begin(ctx, batch)   // validate, reserve pages, metadata once
//	for layer := range e.Layers() {
//		it.SetHidden(layer, rows)    // or write HiddenInput on the device
//		it.RunLayer(ctx, layer)
//	}
//	err = it.End(ctx)                // wait, commit the new tokens
//
// The zero Config with Model set is DeepSeek-V4's real layer: every
// default below is on, and what other MLA models or tests need is asked
// for by name. The engine starts from the hidden states (DESIGN.md section
// 7): it holds each layer's attention weights (Config.Checkpoint, or
// generated ones when Config.SyntheticWeights asks; there are no silent
// random weights, ErrNoWeights), and RunLayer runs act_quant, the fused
// [wq_a; wkv] GEMM, q_norm, the wq_b GEMM and the prologue, the KV side on
// a second stream where the backend has one (mla.KVForker).
// Config.Input = InputProjected takes the projections' outputs instead
// (it.SetInputs, or Engine.Inputs on the device) and runs the prologue
// alone. Config.HeadBegin and HeadEnd shard the Q heads for tensor
// parallelism. Generation-only iterations replay CUDA graphs where the
// backend captures them (Config.Eager launches everything eagerly).
// Config.MemoryLimit defaults to what the machine has: the backend's free
// memory (the device's on CUDA, the host's available memory on cpu).
//
// DeepSeek-V4's cache model (DESIGN.md section 8) is the default;
// Config.FullCache keeps every token (DeepSeek-V3's MLA, no window) and
// Config.Compressor.Off leaves the compressor out:
//
//   - The sliding window (Cache.Window 0 = kvcache.DSv4Window = 128) frees, when an
//     iteration ends, every page whose positions all lie below
//     committed_len - 128; block tables, slots and metadata stay by
//     absolute position (freed entries are -1). Set RopePositions to the
//     longest sequence served: the pool no longer bounds it.
//   - Iteration.Accept reports, after an MTP verify step, how many of each
//     sequence's 1+MTP tokens were accepted; End commits cached + n and
//     rolls everything past it back (pages, window, compressed entries,
//     compressor state), as if the rejected drafts never ran.
//   - The KV compressor (Config.Compressor) runs in the ratio-4 and
//     ratio-128 layers: a compressed pool per layer (584-byte entries, 64 a page,
//     one block table per ratio by entry index), reserved with the SWA
//     pages all or nothing, and the compressor states on the backend: a
//     ring of state slots per compressed layer, one slot per live sequence
//     (at most Compressor.MaxSequences) and one more for every chunk a
//     batch can carry (a chunk longer than 1+MaxDrafts tokens after
//     earlier ones writes a fresh slot, so an aborted chunk leaves the old
//     state whole): only new sequences are ever refused for a slot. Its projections are the caller's on the projected path
//     (Iteration.SetCompressorInputs) or the engine's projection GEMM of
//     the hidden rows. Begin writes each ratio's plan (the sequences'
//     rows, positions and slots, the entries to emit and where) once; each
//     compressed layer then issues the projection GEMM and one step launch
//     (mla.CompressStepper) inside the layer, on the side stream under the
//     layer's GEMMs where the backend has one, and inside the layer's CUDA
//     graph on the graph path.
//     With the model's index_n_heads > 0 (Config.IndexerEnabled) each
//     ratio-4 layer also holds the lightning indexer's key cache (68-byte
//     entries on the ratio-4 block table) and its compressor's states, at
//     the same slots (DESIGN.md section 9). On the hidden-state path the
//     layer computes them too (indexer.go): its bf16 projections of the
//     hidden rows (the indexer compressor's [wkv; wgate] and weights_proj)
//     are rows of the layer's one projection GEMM with the compressor's
//     [wkv; wgate] (2*1024 + 2*256 + 64 outputs a row; each step reads its
//     columns), the indexer compressor's step runs beside the main
//     compressor's, the indexer's wq_b GEMM after the Q prologue; after
//     the join its query step, into the query and head-weight buffers of
//     Engine.IndexerQuery, and last the top-k selection (topk.go) into the layer's
//     [MaxTokens][index_topk] int32 indices (Engine.IndexerTopK, the
//     hand-off's indices), from the plan Begin writes. With
//     Compressor.IndexerQueryFormat fp8 the query is written in the FP8
//     layout a server's own FP8 selection reads, and no selection runs.
//     The bookkeeping of every pool is the cache model's
//     (kvcache.Model, rows from Config.CacheLayout): the engine reserves,
//     commits with the accepted lengths, rolls back and finishes it as
//     one; this package only computes what the rows hold.
//     Engine.Pools and Config.SequenceMemory give a scheduler the figures;
//     Engine.Debug().CheckInvariants checks that nothing leaks.
//
// The hand-off to attention: Engine.Handoff describes every buffer the
// engine writes for the server's attention kernel (the Q buffer, each
// layer's SWA and compressed pools, the block tables, the per-iteration
// lengths and prefix sums, the scheduler scalars), named after the
// attention kernels' arguments (q, k_cache, extra_k_cache, block_table,
// cache_seqlens, cu_seqlens_q, ...), with its layout, its lifetime and the
// stream order a consumer follows; the Handoff type's documentation is
// the reference. The host copies and checks that replay, verification and
// tests use (ReadPool, ReadQ, CompressorState, CheckInvariants, RunStage,
// ...) are on the debug views, Engine.Debug and Iteration.Debug.
//
// A refused batch (an unknown or finished sequence, a full pool, a prompt
// past the RoPE table, a batch beyond the capacity) changes nothing: no page,
// no block table, no pool byte. An iteration that fails after Begin (Abort,
// a failed or missing layer, a failed wait) rolls back its bookkeeping the
// same way: pages, block tables, lengths and created sequences are as
// before Begin. Its pool bytes are not copied back, which would cost a
// device round trip per layer on every iteration: in each layer that ran,
// the slots of the iteration's own tokens (value row and scale bytes) may
// hold the aborted values. Those slots hold no committed token (they lie at
// or past each sequence's committed length, or in pages the rollback
// freed), so every committed token's bytes and every other pool byte are
// unchanged, and the next iteration to reach those positions overwrites
// each slot whole.
//
// The same holds for the compressed pools: an aborted iteration may leave
// entries at indices at or past each sequence's committed entry count (in
// its own or freed pages), which the next iteration to reach them
// overwrites; the compressor states are restored exactly.
//
// Finish may be called from any goroutine; a sequence of the running
// iteration is finished when that iteration ends, even when the iteration
// rolls back, including the creation of that sequence (its id is retired).
//
// Every size that drives an allocation is bounded and New refuses, before
// allocating anything, a Config whose buffers (Config.Footprint) would pass
// Config.MemoryLimit; errors about fields are *ConfigError. An unknown
// sequence and a position out of range are kvcache.ErrUnknownSequence and
// kvcache.ErrPositionOutOfRange whichever package refused.
//
// Backends: "cpu" is built in; accelerator backends register themselves
// (RegisterBackend) from an init function, and "auto" takes the first one
// that is available on the machine, else cpu.
package engine
