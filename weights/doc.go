// Package weights loads the attention weights of a DeepSeek-V4 checkpoint
// (docs/DESIGN.md sections 7 and 8) and writes synthetic checkpoints in the same
// layout. It is the start of the data path: weights -> GEMMs -> norms ->
// prologue kernels -> caches.
//
// A checkpoint is a directory: config.json, model.safetensors.index.json
// (tensor name -> shard file) and the safetensors shards. Load reads, per
// layer asked for, wq_a, wkv and wq_b (e4m3 with 128x128 block scales, F32
// or F8_E8M0, widened exactly to float32), q_norm and kv_norm (bf16 widened
// to float32) and, for compress ratios 4 and 128, the compressor's wkv and
// wgate (bf16, kept as bits), ape (float32) and norm weight, and for ratio 4
// the lightning indexer (Layer.Indexer, DESIGN.md section 9: wq_b e4m3 with
// block scales, weights_proj bf16 and its own 128-wide compressor; all
// heads on every rank, never cut to a HeadRange). It parses only
// the shard headers and reads only those tensors' bytes (ranged reads, no
// whole shard in memory); with a HeadRange only a tensor-parallel rank's
// rows of wq_b. Every dtype and shape is checked against the config before
// anything is allocated; a refused checkpoint returns no partial result,
// and a refused tensor is a *TensorError naming the tensor and its file.
// DeepSeek's, vLLM's and HuggingFace's spellings are accepted through one
// name map (names.go).
//
// WriteSynthetic writes a checkpoint with trained-looking magnitudes,
// deterministic from a seed (SyntheticLayer gives the same weights in
// memory); TinyConfig is a small valid config for tests; cmd/mkcheckpoint
// wraps the writer.
package weights
