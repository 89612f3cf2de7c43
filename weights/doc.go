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
// Every value is checked for what it holds too: a NaN or infinity in a
// float32 or bf16 tensor, an e4m3 NaN byte or a block scale that is not
// finite and positive is refused naming the first bad element
// (ErrNonFinite, ErrBadScale; CheckFinite applies the same rule to weights
// set by other means). Files are checked to be regular before they are
// opened, so a FIFO never blocks a load (ErrNotRegular); symbolic links are
// followed wherever they point (a HuggingFace hub snapshot links into
// ../../blobs/). config.json is the checkpoint's truth: a config given to
// Load, or a command's --model (CheckConfig), must agree with it field by
// field. DeepSeek's spelling, the only published on-disk one, and vLLM's and
// HuggingFace's in-memory spellings are accepted through one name map
// (names.go).
//
// WriteSynthetic writes a checkpoint with trained-looking magnitudes,
// deterministic from a seed (SyntheticLayer gives the same weights in
// memory); TinyConfig is a small valid config for tests; cmd/mkcheckpoint
// wraps the writer.
package weights
