// bf16 GEMM with float32 output, for the KV compressor's projections
// (DESIGN.md section 8, mla.BF16GEMMArgs) where cuBLASLt is absent or
// refuses a shape: Y[m][n] = sum_k x[m][k] * w[n][k], float32 products and
// a float32 accumulation, Y not rounded. Compiled by NVRTC at first use
// (attention/mla/cuda/bf16gemm.go). Simple rather than fast: it only covers
// what cuBLASLt does not.
//
// One warp per (row m, 8 outputs n0..n0+7): lane l reads the 16 bytes at
// k = 8l + 256i of the X row and of each of the 8 W rows (coalesced: a step
// of the warp reads 512 contiguous bytes of each row), keeps 8 float32
// partial sums, and the warp adds its lanes' sums with a butterfly (float32
// addition commutes, so every lane ends with the same bits). The order of
// the additions is not the CPU's ascending one: package gemm's BoundBF16
// covers it.
//
// Alignment (mla.BF16GEMMArgs.Validate): X rows start at 16-byte multiples
// (XOffset % 16, XStride % 8), W rows too (K % 8), Y rows at 16-byte
// multiples (YOffset % 16, YStride % 4) and n0 % 8 == 0: every load is a
// 16-byte vector, every store two.

#include "common.cuh"

// BF16_GEMM_WARPS and BF16GEMMParams come from abi.h.

// The two bf16 of a little-endian 32-bit word, widened exactly.
__device__ __forceinline__ float bf16_lo(u32 v) { return bf16_to_f32(v); }
__device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// acc + x[0]*w[0] + ... + x[7]*w[7], in that order, each operation rounded
// on its own (no contraction).
__device__ __forceinline__ float dot8(float acc, const float x[8], uint4 w) {
    acc = __fadd_rn(acc, __fmul_rn(x[0], bf16_lo(w.x)));
    acc = __fadd_rn(acc, __fmul_rn(x[1], bf16_hi(w.x)));
    acc = __fadd_rn(acc, __fmul_rn(x[2], bf16_lo(w.y)));
    acc = __fadd_rn(acc, __fmul_rn(x[3], bf16_hi(w.y)));
    acc = __fadd_rn(acc, __fmul_rn(x[4], bf16_lo(w.z)));
    acc = __fadd_rn(acc, __fmul_rn(x[5], bf16_hi(w.z)));
    acc = __fadd_rn(acc, __fmul_rn(x[6], bf16_lo(w.w)));
    acc = __fadd_rn(acc, __fmul_rn(x[7], bf16_hi(w.w)));
    return acc;
}

// w: [n][k] bf16; x: row r at x + r * x_stride; y: row r at y + r * y_stride.
// Grid: ceil(m * n / 8 / BF16_GEMM_WARPS) blocks of BF16_GEMM_WARPS warps.
extern "C" __global__ void __launch_bounds__(BF16_GEMM_WARPS * 32) gemm_bf16_f32(const BF16GEMMParams p) {
    const u16* __restrict__ w = p.w;
    const u16* __restrict__ x = p.x;
    float* __restrict__ y = p.y;
    const int m = p.m, n = p.n, k = p.k, x_stride = p.x_stride, y_stride = p.y_stride;
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const long long groups = n >> 3;
    const long long job = (long long)blockIdx.x * BF16_GEMM_WARPS + (threadIdx.x >> 5);
    if (job < (long long)m * groups) {  // the same for the whole warp
        const int row = (int)(job / groups);
        const int n0 = (int)(job - (long long)row * groups) * 8;
        const u16* xr = x + (size_t)row * x_stride;
        const u16* wr = w + (size_t)n0 * k;
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = 0.0f;
        for (int kk = lane * 8; kk < k; kk += 256) {
            const uint4 xv = ld_dep_v4(xr + kk);
            const float xf[8] = {bf16_lo(xv.x), bf16_hi(xv.x), bf16_lo(xv.y), bf16_hi(xv.y),
                                 bf16_lo(xv.z), bf16_hi(xv.z), bf16_lo(xv.w), bf16_hi(xv.w)};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wr + (size_t)j * k + kk));
                acc[j] = dot8(acc[j], xf, wv);
            }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) acc[j] = __fadd_rn(acc[j], __shfl_xor_sync(0xffffffffu, acc[j], off));
        }
        if (lane == 0) {
            float4* dst = reinterpret_cast<float4*>(y + (size_t)row * y_stride + n0);
            dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
        }
    }
    pdl_trigger();
}
