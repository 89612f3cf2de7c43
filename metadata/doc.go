// Package metadata computes the per-iteration, layer-invariant part of the
// DSv4 MLA prologue (docs/DESIGN.md section 5): query and KV lengths, cached
// offsets, the cumulative-length arrays, block tables, the token-row to
// (sequence, position, slot) mapping and the FMHA scheduler scalars.
//
// The pass runs in two steps so that a rejected batch never touches the KV
// cache (docs/DESIGN.md section 6, refusal is atomic):
//
//  1. NewPlan validates the batch description against the lengths the cache
//     already holds (through a LengthLookup) and the parameters, and
//     computes every length. It changes nothing.
//  2. The caller makes the cache hold Plan.Needs() (creating sequences and
//     allocating pages), then Plan.Build copies each sequence's page list
//     into the block tables and returns the Metadata.
//
// Batches are ordered context-first: context (prefill) rows occupy
// [0, CtxTokens) with ragged query lengths, generation (decode) rows occupy
// [CtxTokens, Tokens) with one uniform query length GenSeqLen = 1 + MTP, and
// rows in [Tokens, PaddedTokens) are CUDA-graph padding that every kernel
// skips.
//
// The package imports no other project package but kvcache, for the errors
// and the page-size bound every package shares (kvcache.ErrUnknownSequence,
// kvcache.ErrPositionOutOfRange, kvcache.MaxPageSize); it holds no cache.
package metadata
