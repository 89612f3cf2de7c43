package mla

import "context"

// The layer from hidden states (docs/DESIGN.md section 7): act_quant, the fused
// FP8 GEMM [wq_a; wkv], q_norm fused with its act_quant, the FP8 GEMM wq_b,
// then the prologue of this package. A backend that runs the chain
// implements ChainBackend beside Backend (an optional interface, found by
// type assertion).

// FP8Weight is a checkpoint weight matrix resident in a backend's memory:
// Data is [N][K] e4m3 row-major (as the checkpoint stores it), Scale is
// [ceil(N/128)][ceil(K/128)] float32 row-major (one scale per 128x128 block;
// the dequantized weight is e4m3 value x its block's scale).
type FP8Weight struct {
	N, K  int
	Data  Buffer
	Scale Buffer
}

// FP8Activations are rows quantized by ActQuant or NormQuant: Data is
// [Rows][K] e4m3 row-major, Scale is [K/128][ScaleStride] float32: for each
// 128-wide block of K the scales of all rows contiguous (the M-major layout
// cuBLASLt's VEC128_32F mode reads). ScaleStride >= Rows.
type FP8Activations struct {
	Rows, K     int
	Data        Buffer
	Scale       Buffer
	ScaleStride int
}

// ActQuantArgs quantize Rows rows of K bf16 values (row r at XOffset +
// r*XStride*2 bytes) into Out (docs/DESIGN.md section 7 step 1). K is a multiple
// of 128.
type ActQuantArgs struct {
	X       Buffer
	XOffset int // bytes, a multiple of 16
	XStride int // elements, a multiple of 8
	Out     FP8Activations
}

// NormQuantArgs normalize Rows rows of K bf16 values with Weight (K float32;
// RMSNorm of docs/DESIGN.md section 4 with W = K and the config's Eps), round to
// bf16 and quantize the result like ActQuant (section 7 step 3: q_norm).
type NormQuantArgs struct {
	X       Buffer
	XOffset int // bytes, a multiple of 16
	XStride int // elements, a multiple of 8
	Weight  Buffer
	Eps     float32
	Out     FP8Activations
}

// GEMMArgs compute Y = dequant(X) . dequant(W)^T in float32 and round it to
// bf16: Y row r (of X.Rows) at YOffset + r*YStride*2 bytes, N values.
type GEMMArgs struct {
	X       FP8Activations
	W       *FP8Weight
	Y       Buffer
	YOffset int // bytes, a multiple of 16
	YStride int // elements, >= W.N and a multiple of 8
}

// ChainBackend runs the steps of the chain before the prologue. ActQuant
// and NormQuant are bit-exact like the prologue; GEMM may differ between
// backends by the bound docs/DESIGN.md section 7 documents (the accumulation
// order is the library's).
type ChainBackend interface {
	ActQuant(ctx context.Context, a *ActQuantArgs) error
	NormQuant(ctx context.Context, a *NormQuantArgs) error
	GEMM(ctx context.Context, a *GEMMArgs) error
}
