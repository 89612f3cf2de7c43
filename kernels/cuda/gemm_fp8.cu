// FP8 block-scaled GEMM for small batches (DESIGN.md section 7):
// Y[m][n] = bf16( sum over 128-blocks kb of (x_scale[kb][m] * w_scale[n/128][kb])
//                 * sum_{k in kb} x[m][k] * w[n][k] ),  x, w e4m3.
// Compiled by NVRTC at first use (attention/mla/cuda/gemm.go); needs sm_89+
// for the e4m3 tensor-core MMA.
//
// Weight streaming: a block owns 128 rows of W (one row of weight scale
// blocks), a range of K blocks (split-K when N is narrow, so every SM has
// work) and MT tokens; each of its 8 warps owns 16 rows and reads every
// weight byte it needs once, with 16-byte loads issued two K blocks ahead.
// The tokens come through L1 (every warp of the block reads the same ones).
//
// The MMA is mma.sync m16n8k32 e4m3 with A = 16 weight rows, B = 8 tokens.
// Lane (g = lane/4, t = lane%4) supplies A row g (registers a0, a2), row
// g+8 (a1, a3) and B column (token) g (b0, b1), all at the same positions
// of K, so any assignment of real K offsets to a lane's MMA slots that is
// the same for A and B gives the same sum. Lane t takes bytes [16t, 16t+16)
// and [64+16t, 64+16t+16) of each 128-block: one 16-byte load per row and
// half, K step s of the block uses 8 of them (4 for a0/b0, 4 for a2/b1).
//
// Accumulation: each 128-block's MMA sum starts from zero, is scaled by
// x_scale * w_scale and added to a float32 running sum (the promotion that
// keeps tensor-core accumulation short, as the bound in package gemm
// assumes). Split-K partials go to a float32 workspace and a second kernel
// adds them in a fixed order (deterministic), then rounds to bf16 with the
// hardware conversion (nearest even, every NaN the canonical 0x7fff).

#include "common.cuh"

// The block shape (FP8_GEMM_WARPS, FP8_GEMM_ROW_TILE), the token tiles
// (FP8_GEMM_KERNELS) and the parameter struct (FP8GEMMParams,
// SplitKParams) come from abi.h.
static_assert(FP8_GEMM_ROW_TILE == 16 * FP8_GEMM_WARPS && FP8_GEMM_ROW_TILE == 128,
              "a warp owns 16 W rows, a block one row of 128x128 weight scale blocks");

// X is act_quant's or q_norm's output: a coherent load (common.cuh's ld_dep).
__device__ __forceinline__ uint4 ld_x(const u8* p) { return ld_dep_v4(p); }

__device__ __forceinline__ void mma_e4m3(float d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One warp's weight fragment of a 128-block: rows g and g+8, halves 0 and 1.
struct WFrag {
    uint4 lo0, lo1, hi0, hi1;
};

__device__ __forceinline__ WFrag load_w(const u8* row_g, const u8* row_g8, int kb, int t) {
    const int off = kb * 128 + t * 16;
    WFrag f;
    f.lo0 = ld_stream(row_g + off);
    f.lo1 = ld_stream(row_g + off + 64);
    f.hi0 = ld_stream(row_g8 + off);
    f.hi1 = ld_stream(row_g8 + off + 64);
    return f;
}

// The 128-block's dot products of the warp's 16 rows with 8 tokens: four
// MMAs from a zero accumulator.
__device__ __forceinline__ void block_mma(float d[4], const WFrag& w, uint4 xa, uint4 xb) {
    d[0] = d[1] = d[2] = d[3] = 0.f;
    mma_e4m3(d, w.lo0.x, w.hi0.x, w.lo0.y, w.hi0.y, xa.x, xa.y);
    mma_e4m3(d, w.lo0.z, w.hi0.z, w.lo0.w, w.hi0.w, xa.z, xa.w);
    mma_e4m3(d, w.lo1.x, w.hi1.x, w.lo1.y, w.hi1.y, xb.x, xb.y);
    mma_e4m3(d, w.lo1.z, w.hi1.z, w.lo1.w, w.hi1.w, xb.z, xb.w);
}

// Grid: x = token chunk of MT (fastest, so the chunks that share a weight
// tile run together and the second reads it from L2), y = 128-row block of
// W, z = split of K. Y is written as bf16 when splits == 1, else as float32
// partials part[z][m][n].
template <int MT>
__device__ __forceinline__ void gemm_fp8_body(const FP8GEMMParams& p) {
    const u8* __restrict__ w = p.w;
    const float* __restrict__ ws = p.ws;
    const u8* __restrict__ x = p.x;
    const float* __restrict__ xs = p.xs;
    u8* __restrict__ y = p.y;
    float* __restrict__ part = p.part;
    const int m = p.m, n = p.n, k = p.k, xs_stride = p.xs_stride, y_stride = p.y_stride,
              kb_per_split = p.kb_per_split;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * MT;
    const int nb = blockIdx.y;
    const int kbn = k >> 7;
    const int kb0 = blockIdx.z * kb_per_split;
    const int kb1 = min(kbn, kb0 + kb_per_split);
    const int tiles = min(MT / 8, (m - m0 + 7) >> 3);  // token tiles holding a real token

    const u8* row_g = w + (size_t)(nb * 128 + warp * 16 + g) * k;
    const u8* row_g8 = row_g + (size_t)8 * k;

    // The weights do not depend on the kernel before: start streaming them
    // before waiting for it.
    WFrag cur = load_w(row_g, row_g8, kb0, t);
    WFrag nxt = cur;
    if (kb0 + 1 < kb1) nxt = load_w(row_g, row_g8, kb0 + 1, t);
    pdl_wait();

    float acc[MT / 8][4];
#pragma unroll
    for (int j = 0; j < MT / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    for (int kb = kb0; kb < kb1; kb++) {
        WFrag after = nxt;
        if (kb + 2 < kb1) after = load_w(row_g, row_g8, kb + 2, t);
        const float wsc = __ldg(ws + (size_t)nb * kbn + kb);
        const float* xs_kb = xs + (size_t)kb * xs_stride;
#pragma unroll
        for (int j = 0; j < MT / 8; j++) {
            if (j < tiles) {
                const int mb = m0 + j * 8;
                const int mx = mb + g;  // this lane's B token
                uint4 xa = make_uint4(0, 0, 0, 0), xb = xa;
                if (mx < m) {
                    const u8* xr = x + (size_t)mx * k + kb * 128 + t * 16;
                    xa = ld_x(xr);
                    xb = ld_x(xr + 64);
                }
                float d[4];
                block_mma(d, cur, xa, xb);
                const int mc = mb + 2 * t;  // this lane's D tokens: mc, mc + 1
                const float s0 = mc < m ? __fmul_rn(ld_dep_f32(xs_kb + mc), wsc) : 0.f;
                const float s1 = mc + 1 < m ? __fmul_rn(ld_dep_f32(xs_kb + mc + 1), wsc) : 0.f;
                acc[j][0] = __fmaf_rn(d[0], s0, acc[j][0]);
                acc[j][1] = __fmaf_rn(d[1], s1, acc[j][1]);
                acc[j][2] = __fmaf_rn(d[2], s0, acc[j][2]);
                acc[j][3] = __fmaf_rn(d[3], s1, acc[j][3]);
            }
        }
        cur = nxt;
        nxt = after;
    }
    pdl_trigger();

    const int nr = nb * 128 + warp * 16 + g;  // D rows: nr (d0, d1) and nr + 8 (d2, d3)
    if (part != nullptr) {
        float* pz = part + (size_t)blockIdx.z * m * n;
#pragma unroll
        for (int j = 0; j < MT / 8; j++) {
            const int mc = m0 + j * 8 + 2 * t;
            if (mc < m) {
                pz[(size_t)mc * n + nr] = acc[j][0];
                pz[(size_t)mc * n + nr + 8] = acc[j][2];
            }
            if (mc + 1 < m) {
                pz[(size_t)(mc + 1) * n + nr] = acc[j][1];
                pz[(size_t)(mc + 1) * n + nr + 8] = acc[j][3];
            }
        }
        return;
    }

    // bf16 through shared memory, so that each token's 256 bytes go out in
    // 16-byte stores.
    __shared__ __align__(16) u16 tile[MT][128 + 8];
    const int c = warp * 16 + g;
#pragma unroll
    for (int j = 0; j < MT / 8; j++) {
        const int r = j * 8 + 2 * t;
        const u32 v0 = bf16x2_rn(acc[j][0], acc[j][1]);  // (r, c), (r + 1, c)
        const u32 v1 = bf16x2_rn(acc[j][2], acc[j][3]);  // (r, c + 8), (r + 1, c + 8)
        tile[r][c] = (u16)(v0 & 0xffff);
        tile[r + 1][c] = (u16)(v0 >> 16);
        tile[r][c + 8] = (u16)(v1 & 0xffff);
        tile[r + 1][c + 8] = (u16)(v1 >> 16);
    }
    __syncthreads();
    const int rows = min(MT, m - m0);
    for (int i = threadIdx.x; i < rows * 16; i += FP8_GEMM_WARPS * 32) {
        const int r = i >> 4, chunk = i & 15;
        u8* dst = y + ((size_t)(m0 + r) * y_stride + nb * 128) * 2 + chunk * 16;
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&tile[r][chunk * 8]);
    }
}

#define GEMM_KERNEL(NAME, MT, MINBLOCKS)                                                                        \
    extern "C" __global__ void __launch_bounds__(FP8_GEMM_WARPS * 32, MINBLOCKS) NAME(const FP8GEMMParams p) { \
        gemm_fp8_body<MT>(p);                                                                                  \
    }

FP8_GEMM_KERNELS(GEMM_KERNEL)

// Split-K finish: Y[r][c..c+3] = bf16(part[0][r][c..] + part[1][r][c..] + ...),
// the splits added in order (common.cuh's splitk_reduce). One thread per 4 outputs.
extern "C" __global__ void gemm_fp8_reduce(const SplitKParams p) {
    splitk_reduce<u16>(p);
}
