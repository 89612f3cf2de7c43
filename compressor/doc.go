// Package compressor is DSv4's KV compressor on the CPU (DESIGN.md section
// 8): it pools the projections (K, G) of each window of r tokens (r = 4
// with overlap, or 128) into one 584-byte fp8_ue8m0 entry per window, the
// bit-exact reference every backend must match.
//
// The math, in the fixed order every backend follows:
//
//   - Candidates of entry i, per channel c in [0, 512): ratio 128, the
//     window's 128 tokens (logit G[t][c], value K[t][c]); ratio 4, the
//     previous window's four tokens with the "A" half (G[t][c], K[t][c]),
//     absent for i = 0, then the current window's four with the "B" half
//     (G[t][512+c], K[t][512+c]). Ascending positions throughout.
//   - [PoolChannel]: m = max ascending, e_j = Exp32(fl(G_j - m)),
//     s = sum e_j ascending, E = sum fl(fl(e_j / s) * K_j) ascending.
//   - The KV prologue on bf16(E) at position i*r: RMSNorm with the layer's
//     norm.weight, RoPE with the layer's (YaRN) table, UE8M0 quantization
//     of the 448 nope values ([Layer.FinishEntry]).
//
// [State] keeps, per sequence and layer, the (K, G) of the positions a
// later entry still reads (the last coff*r, plus the drafts of the current
// step), keyed by position: chunks that start or end mid-window, prompts
// shorter than r, interleaved prefill and decode and rejected MTP drafts
// ([State.Accept]) need no special case, and every entry is the same
// whichever way the tokens were grouped. The projections themselves come
// from [Projection.Project], a float32 GEMM of the bf16 weights.
//
// The lightning indexer's compressor (DESIGN.md section 9) pools the same
// way at width [IndexerDim] ([PoolEntryDim]); [FinishIndexer] turns the
// 128 pooled values into a 68-byte MXFP4 entry (RMSNorm at W = 128, RoPE
// of the rope half at 4i, Hadamard).
package compressor
