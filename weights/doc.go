// Package weights loads the attention weights of a DeepSeek-V4 checkpoint
// (docs/DESIGN.md section 7) and writes synthetic checkpoints in the same layout.
// It is the start of the data path: weights -> GEMMs -> norms -> prologue
// kernels -> caches.
package weights
