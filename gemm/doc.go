// Package gemm is the host reference of the chain's FP8 block-scaled GEMMs
// (DESIGN.md section 7): Y = dequant(X) . dequant(W)^T with float32
// accumulation, rounded to bf16, where X holds e4m3 activation rows with one
// float32 scale per row and 128 values of K, and W an e4m3 checkpoint weight
// with one float32 scale per 128x128 block.
//
// A GEMM's accumulation order is its implementation's (a BLAS, cuBLASLt's
// tensor cores, a split-K kernel), so backends may differ in the last bits.
// The package states by how much (see Bound) and checks it (CheckBound):
//
//	|y_a - y_b| <= Bound(K) * sum_k |x_k||w_k| + ulp_bf16(max(|y_a|, |y_b|))
//
// per output element, with x and w the dequantized operands.
//
// The compressor's projections (DESIGN.md section 8) are a bf16 GEMM with
// float32 output: ReferenceBF16 (ascending k, the CPU backend's order),
// and its bound, without the ulp term (BoundBF16, CompareF32,
// CheckBoundF32):
//
//	|y_a - y_b| <= BoundBF16(K) * sum_k |x_k||w_k|
//
// NaN: an e4m3 NaN byte (0x7F, 0xFF) or a NaN scale makes every output it
// reaches NaN, written as the canonical bf16 NaN 0x7FFF. e4m3 has no
// infinity; an infinite scale gives ±Inf or NaN (Inf x 0) as IEEE float32
// arithmetic says, and float32 overflow of the accumulation gives ±Inf.
package gemm
