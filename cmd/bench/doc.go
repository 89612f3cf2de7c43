// Command bench measures the CUDA prologue kernels on the device, and draws
// the plots of its report.
//
//	bench [flags]            the measurements (needs a GPU); writes JSON
//	bench host [flags]       only the engine's host cost, on any backend (cpu works anywhere)
//	bench report [flags]     plots (PNG and SVG) from the JSON, anywhere
//	bench topk --log PATH... the indexer top-k against the context, from BenchmarkCUDATopK logs
//
// The measurements: every kernel as a cold single launch (L2 flushed,
// median of many) over generation and context shapes, for V4-Flash and
// V4-Pro dims and each cache and Q format, against a device-to-device copy
// measured in the same run; every shape the way a server sees it, a CUDA
// graph of all layers of an iteration with distinct inputs (time per
// layer), each prologue kernel alone in such a graph, and beside them the
// dependent-chain floor (a kernel that only copies the layer's Q rows, in the
// same graph, with and without asking L2 for them ahead of the wait); a
// whole decode iteration launched eagerly from Go (the device
// time and the host time to issue it) and as a graph;
// and the engine's own host cost per iteration (Begin, End). The JSON feeds
// bench/report.py, which joins it with the PyTorch peers (bench/peers.py).
// The chain: the whole layer from hidden states (act_quant, the two FP8
// GEMMs, q_norm, the prologue with the KV side on a second stream), every
// layer with its own weights in one CUDA graph, against the weight-streaming
// floor and the PyTorch chain peer (bench/chain_peer.py).
// With --indexer (or --indexer-only), issue 23's measurement: a ratio-4
// layer from hidden states (the chain with its ratio-4 compressor forked)
// without the lightning indexer, with its prologue as the engine issues it
// (one bf16 GEMM of the compressor's, the indexer compressor's and
// weights_proj's projections and both compressor steps on the side stream,
// its wq_b GEMM after the Q prologue, its query step after the join; under
// cudatune.IndexerStreamAux both on the third stream) and
// with its top-k selection too, every layer with its own weights in one
// CUDA graph, the L2 flushed before each replay, and one layer alone so;
// beside them the variants: the indexer's query path on the main stream
// (b1), on the third stream forked after q_norm (b3), only its wq_b GEMM
// there (b3g), on the side stream behind the compressor (b'); the
// three bf16 projections as three GEMMs, the engine before its one GEMM;
// the prologue without its key step, whose difference is what the key
// step on the side stream costs the layer (b-k) (--indexer-no-topk
// leaves the selection's modes out),
// the indexer's work alone, the added
// weights' streaming floor and the share (b-a)/a against the 15% goal, and
// at 128 tokens the query step alone in both query formats beside vLLM's
// quoted fused kernel. --indexer-contexts adds decode shapes at a long
// context, where the selection scores every row.
// With --check-dir it also writes small cases as safetensors for
// bench/check_peers.py, after checking them byte for byte against the CPU
// backend.
package main
