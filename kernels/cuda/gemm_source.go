package cuda

import _ "embed"

//go:embed gemm_fp8.cu
var gemmSource string

// GEMMSource returns the CUDA source of the FP8 block-scaled GEMM kernels
// for small batches (weight streaming, split-K, the split-K reduction).
// Like every source of this folder it includes common.cuh: compile it with
// Headers.
func GEMMSource() string { return gemmSource }

//go:embed gemm_bf16.cu
var gemmBF16Source string

// BF16GEMMSource returns the CUDA source of the bf16 GEMM with float32
// output (the compressor's projections where cuBLASLt is absent or refuses
// a shape): kernel gemm_bf16_f32.
func BF16GEMMSource() string { return gemmBF16Source }

//go:embed gemm_bf16_mma.cu
var gemmBF16MMASource string

// BF16MMAGEMMSource returns the CUDA source of the tensor-core bf16 GEMM
// with float32 output for small batches (the compressor's projection at
// decode; sm_80+): kernels gemm_bf16_mma (weight streaming, split-K) and
// gemm_bf16_mma_reduce (the split-K reduction, in split order).
func BF16MMAGEMMSource() string { return gemmBF16MMASource }

//go:embed gemm_fp8_wgmma.cu
var gemmWGMMASource string

// WGMMAGEMMSource returns the CUDA source of the FP8 block-scaled GEMM for
// sm_90a (warpgroup MMA, operands by the tensor memory accelerator):
// the wide kernels gemm_fp8_wgmma_bn{8,16,32,64,128}, one a token tile,
// and the narrow ones gemm_fp8_wgmma_n1_bn{16,32,64,128} and
// gemm_fp8_wgmma_n1p_bn{16,32,64,128}; split-K partials are finished in
// the kernel (or by GEMMSource's gemm_fp8_reduce).
func WGMMAGEMMSource() string { return gemmWGMMASource }

//go:embed gemm_bf16_wgmma.cu
var gemmBF16WGMMASource string

// BF16WGMMAGEMMSource returns the CUDA source of the bf16 GEMM with
// float32 output for sm_90a (warpgroup MMA, operands by the tensor memory
// accelerator; sm90.cuh's helpers): kernels gemm_bf16_wgmma_bn{8,16,32,64,128}
// (abi.BF16WGMMATokenTiles), one a token tile; split-K partials go through
// BF16MMAGEMMSource's gemm_bf16_mma_reduce or are finished in the kernel.
func BF16WGMMAGEMMSource() string { return gemmBF16WGMMASource }
