// Package cublaslt binds the part of NVIDIA's cuBLASLt that runs DeepSeek's
// FP8 block-scaled GEMM (DESIGN.md section 7, reference/cublaslt-fp8-
// blockscaled.md): e4m3 weights with one float32 scale per 128x128 block
// (BLK128x128_32F), e4m3 activations with one float32 scale per token and
// 128 values (VEC128_32F), bf16 output, float32 accumulation; and the KV
// compressor's projection (DESIGN.md section 8, MatmulBF16): bf16 weights
// and activations, float32 accumulation and output, no scales.
//
// The library is loaded at run time through purego (no cgo), found like
// NVRTC: PROLOGUE_CUBLASLT when set (and then nothing else), else
// libcublasLt.so.13 / .12 through the loader, the CUDA toolkit directories
// and the nvidia-cublas Python wheels. Every call runs on the driver
// Context's owner thread, with its context current. A Handle caches one
// plan (descriptors and the heuristic's algorithm) per kind and shape, and
// owns Workspaces workspaces of 32 MiB allocated once, so a Matmul or
// MatmulBF16 allocates nothing and can be captured into a CUDA graph; each
// names its stream's workspace, since matmuls running at once on one
// workspace corrupt each other's split-K state (and can hang).
package cublaslt
