package cuda

import _ "embed"

//go:embed prologue.cu
var prologueSource string

// PrologueSource returns the CUDA source of the prologue kernels (KV and Q
// norm/RoPE/quantize/store, the fused layer grids and the conversion sweeps).
func PrologueSource() string { return prologueSource }
