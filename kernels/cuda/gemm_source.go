package cuda

import _ "embed"

//go:embed gemm_fp8.cu
var gemmSource string

// GEMMSource returns the CUDA source of the FP8 block-scaled GEMM kernels
// for small batches (weight streaming, split-K, the split-K reduction).
func GEMMSource() string { return gemmSource }
