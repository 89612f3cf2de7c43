package cuda

import _ "embed"

//go:embed chain.cu
var chainSource string

// ChainSource returns the CUDA source of the chain's bit-exact kernels
// (act_quant and q_norm fused with act_quant, DESIGN.md section 7); it
// includes common.cuh (compile it with Headers).
func ChainSource() string { return chainSource }
