// DSv4 chain kernels (DESIGN.md section 7 steps 1 and 3): act_quant of bf16
// rows into e4m3 with one UE8M0 scale per 128-value block, and q_norm (the
// RMSNorm over q_lora_rank values) fused with act_quant. Compiled by NVRTC
// at first use, like prologue.cu and with its rules: every float operation
// is an explicit _rn intrinsic (no fused multiply-add), and no -ftz (the
// inverse scale 2^-127 is a subnormal). The conversion helpers are
// common.cuh's, the same as prologue.cu's.
//
// Outputs: Data [rows][k] e4m3 row-major; Scale [k/128][scale_stride]
// float32, the scale of row r's block b at b*scale_stride + r (the M-major
// layout cuBLASLt's block-scaled FP8 mode reads), value 2^(e-127).

#include "common.cuh"

// Four values times inv, to four e4m3 bytes in memory order (v0 lowest).
__device__ __forceinline__ u32 quant4(float v0, float v1, float v2, float v3, float inv) {
    u32 lo = e4m3x2(__fmul_rn(v1, inv), __fmul_rn(v0, inv));
    u32 hi = e4m3x2(__fmul_rn(v3, inv), __fmul_rn(v2, inv));
    return lo | (hi << 16);
}

// act_quant: one half-warp quantizes one 128-value block. Lane l of the half
// loads values [8l, 8l+8) of the block (16 bytes), the 16 lanes reduce the
// maximum with shuffles, and each stores its 8 bytes; the half's first lane
// stores the scale. Each warp takes block pairs 2p, 2p+1 of the row-major
// block sequence (row = g / nb) in a grid-stride loop.
// x: the first row (XOffset applied); x_stride: bytes between rows.
extern "C" __global__ void __launch_bounds__(32 * CHAIN_WARPS) act_quant(const QuantParams p) {
    const u8* __restrict__ x = p.x;
    u8* __restrict__ out = p.out;
    float* __restrict__ scale = p.scale;
    const u64 x_stride = p.x_stride;
    const int rows = p.rows, k = p.k, scale_stride = p.scale_stride;
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int half = lane >> 4, hl = lane & 15;
    const int nb = k >> 7;
    const long long total = (long long)rows * nb;
    const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long pair = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); 2 * pair < total;
         pair += nwarps) {
        const long long g = 2 * pair + half;
        const bool live = g < total;  // the second half of the last pair may have no block
        int row = 0, b = 0;
        float v[8];
        float a = 0.f;
        if (live) {
            row = (int)(g / nb);
            b = (int)(g - (long long)row * nb);
            const uint4 w = ld_dep_v4(x + (size_t)row * x_stride + (size_t)b * 256 + hl * 16);
            const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[2 * i] = bf16_to_f32(ws[i] & 0xffffu);
                v[2 * i + 1] = bf16_to_f32(ws[i] >> 16);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) a = fmaxf(a, fabsf(v[i]));  // fmaxf drops NaN
        }
#pragma unroll
        for (int d = 8; d >= 1; d >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL, a, d));
        if (live) {
            const int e = ue8m0_exp(a);
            const float inv = pow2i(127 - e);
            uint2 o;
            o.x = quant4(v[0], v[1], v[2], v[3], inv);
            o.y = quant4(v[4], v[5], v[6], v[7], inv);
            *reinterpret_cast<uint2*>(out + (size_t)row * k + (size_t)b * 128 + hl * 8) = o;
            if (hl == 0) scale[(size_t)b * scale_stride + row] = pow2i(e - 127);
        }
    }
}

// Byte offset of value i of a row staged in shared memory: the row is kept
// as 32 segments of n = k/32 values (segment j is lane j's canonical
// partial, DESIGN.md section 4.1), each padded by 8 bytes so that the 32
// lanes reading their own segments hit different banks. i is a multiple
// of 4 and so is n: four values from i never straddle two segments.
__device__ __forceinline__ int seg_off(int i, int n, int seg_bytes) {
    const int j = i / n;
    return j * seg_bytes + 2 * (i - j * n);
}

// norm_quant: one warp per row (grid-stride over rows). The weight does not
// depend on the kernel before, so the block stages it in shared memory
// before the programmatic-launch wait, under the kernel before; after it,
// the warp issues all of its row's coalesced 16-byte loads (up to 8 a lane
// at a time) before copying them into its shared-memory slot. With one-warp
// blocks for a decode batch, V4-Flash's chain at b=32 MTP 3 went from 38.86
// to 36.60 us a layer in the graph (alone, caches flushed, the kernel stays
// at 8.2 us: 2026-12-02-h200-h/lead calls 2 and 3). Lane j sums the squares of its
// segment in ascending order and the xor butterfly completes S; then for
// each 128-block lane l normalizes values [4l, 4l+4), rounds them to bf16,
// the warp reduces the block maximum, and lane l stores its 4 e4m3 bytes
// (lane 0 the scale). The bf16 y never leaves registers. Shared memory:
// (blockDim.x/32) * (2k + 256) + 4k bytes (normQuantShared on the host).
extern "C" __global__ void __launch_bounds__(32 * CHAIN_WARPS) norm_quant(const QuantParams p) {
    extern __shared__ __align__(16) u8 smem[];
    const u8* __restrict__ x = p.x;
    const float* __restrict__ weight = p.weight;
    u8* __restrict__ out = p.out;
    float* __restrict__ scale = p.scale;
    const u64 x_stride = p.x_stride;
    const float eps = p.eps;
    const int rows = p.rows, k = p.k, scale_stride = p.scale_stride;
    const int lane = threadIdx.x & 31;
    const int n = k >> 5;
    const int seg_bytes = 2 * n + 8;
    const int wpb = blockDim.x >> 5;
    u8* const row_s = smem + (threadIdx.x >> 5) * (32 * seg_bytes);
    // After every warp's slot (a multiple of 16 bytes: 64n + 256).
    float* const w_s = reinterpret_cast<float*>(smem + wpb * (32 * seg_bytes));
    for (int i = threadIdx.x; i < (k >> 2); i += blockDim.x)
        reinterpret_cast<float4*>(w_s)[i] = __ldg(reinterpret_cast<const float4*>(weight) + i);
    __syncthreads();
    pdl_wait();
    pdl_trigger();
    const int nb = k >> 7;
    const int chunks = k >> 3;  // chunk c: values [8c, 8c+8), 16 bytes
    const float kf = (float)k;  // exact: k <= 2^24
    for (int row = blockIdx.x * wpb + (threadIdx.x >> 5); row < rows; row += gridDim.x * wpb) {
        const u8* src = x + (size_t)row * x_stride;
        __syncwarp();  // every lane is done reading the previous row
        for (int c0 = 0; c0 < chunks; c0 += 8 * 32) {
            uint4 w[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int c = c0 + 32 * i + lane;
                if (c < chunks) w[i] = ld_dep_v4(src + 16 * c);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int c = c0 + 32 * i + lane;
                if (c < chunks) {
                    *reinterpret_cast<uint2*>(row_s + seg_off(8 * c, n, seg_bytes)) = make_uint2(w[i].x, w[i].y);
                    *reinterpret_cast<uint2*>(row_s + seg_off(8 * c + 4, n, seg_bytes)) = make_uint2(w[i].z, w[i].w);
                }
            }
        }
        __syncwarp();
        float s = 0.f;
        const u8* mine = row_s + lane * seg_bytes;
        for (int q = 0; q < n; q += 4) {
            const uint2 w = *reinterpret_cast<const uint2*>(mine + 2 * q);
            const float v0 = bf16_to_f32(w.x & 0xffffu), v1 = bf16_to_f32(w.x >> 16);
            const float v2 = bf16_to_f32(w.y & 0xffffu), v3 = bf16_to_f32(w.y >> 16);
            s = __fadd_rn(s, __fmul_rn(v0, v0));
            s = __fadd_rn(s, __fmul_rn(v1, v1));
            s = __fadd_rn(s, __fmul_rn(v2, v2));
            s = __fadd_rn(s, __fmul_rn(v3, v3));
        }
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL, s, d));
        const float r = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(s, kf), eps)));
        for (int b = 0; b < nb; b++) {
            const int i = 128 * b + 4 * lane;
            const uint2 w = *reinterpret_cast<const uint2*>(row_s + seg_off(i, n, seg_bytes));
            const float4 wt = *reinterpret_cast<const float4*>(w_s + i);
            float y0 = __fmul_rn(__fmul_rn(bf16_to_f32(w.x & 0xffffu), r), wt.x);
            float y1 = __fmul_rn(__fmul_rn(bf16_to_f32(w.x >> 16), r), wt.y);
            float y2 = __fmul_rn(__fmul_rn(bf16_to_f32(w.y & 0xffffu), r), wt.z);
            float y3 = __fmul_rn(__fmul_rn(bf16_to_f32(w.y >> 16), r), wt.w);
            round2(y0, y1);
            round2(y2, y3);
            float a = fmaxf(fmaxf(fabsf(y0), fabsf(y1)), fmaxf(fabsf(y2), fabsf(y3)));
#pragma unroll
            for (int d = 16; d >= 1; d >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL, a, d));
            const int e = ue8m0_exp(a);
            *reinterpret_cast<u32*>(out + (size_t)row * k + i) = quant4(y0, y1, y2, y3, pow2i(127 - e));
            if (lane == 0) scale[(size_t)b * scale_stride + row] = pow2i(e - 127);
        }
    }
}
