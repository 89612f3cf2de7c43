// Command decode replays a batch trace through the MLA prologue engine the
// way an LLM server drives it: one iteration per trace line, every layer's
// prologue on synthetic activations, the KV cache carried from line to line.
//
//	go run ./cmd/decode                     # DeepSeek-V4's layer on the embedded chain trace
//	go run ./cmd/decode --trace my.jsonl --backend cpu --layers 4 --verify
//
// By default it runs V4-Flash's first four layers (ratios 0, 0, 4, 128)
// from hidden states on synthetic weights, with the window, the compressor
// and MTP steps with accept lists. It prints one line per iteration
// (tokens, launches per kind, wall time and, on CUDA, device time), a
// summary (accepted tokens and their rate, the pools, the longest
// sequence), and the summary again in Go benchmark
// format for benchstat; --json prints a JSON report instead. The trace
// format and the --dump tensors are described in the README.
package main
