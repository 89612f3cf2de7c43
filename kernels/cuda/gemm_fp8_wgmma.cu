// FP8 block-scaled GEMM for sm_90a with warpgroup MMA and the tensor memory
// accelerator (DESIGN.md section 7; the same math as gemm_fp8.cu):
// Y[m][n] = bf16( sum over SB-blocks kb of (x_scale[kb][m] * w_scale[n/SB][kb])
//                 * sum_{k in kb} x[m][k] * w[n][k] ),  x, w e4m3.
// SB, the scale block, is a template parameter (128 for DeepSeek-V4,
// 32 for V4.1's 32x32 blocks); K must be a multiple of 128.
// Compiled by NVRTC for sm_90a only (wgmma and the bulk tensor copy).
//
// Weight streaming with Y^T tiles: W's rows are the MMA's M side (64 rows a
// consumer warpgroup; WGS = 2 warpgroups, 128 rows a block, one row of
// 128x128 weight scale blocks, in the wide kernels, WGS = 1 in the narrow
// ones, which give narrow N twice as many units) and up to BN tokens its N side (wgmma m64nBNk32; FP8 wgmma takes both
// operands K-major from shared memory, which W [n][k] and X [m][k] are).
// A work unit is (64 WGS-row tile of W, BN-token chunk, K range of a split),
// numbered split fastest, then chunk, then tile; the grid is persistent (at
// most one block an SM), each block walking the units blockIdx.x, +
// gridDim.x, ...; the ring runs on across units, so the next unit's
// weights arrive while a unit's epilogue runs.
//
// Block: WGS consumer warpgroups, then one producer warpgroup whose first
// thread issues every bulk tensor copy (128-byte swizzle; a stage is one
// 128-wide K block: 64 WGS W rows and BN token rows of 128 bytes) into a ring
// of `stages` stages with full (transaction-counted) and empty (one arrival
// a consumer warp) mbarriers. The producer's second warp, the scale loader,
// brings each stage's scales (BN x scales and the tile's W scales of the K
// block) into shared memory beside it with 4-byte cp.async whose
// completion arrives on the same full barrier (one arrival a lane): the
// consumers read scales from shared memory, never from global memory in
// the K loop (the latency of a global load a K block, 52% of the stalls of
// the first version under Nsight Compute, 2026-12-02). Programmatic
// dependent launch: the weights do not depend on the kernel before, so the
// producer issues the first stages' W copies before griddepcontrol.wait
// and their X copies after it; the loader waits before its first copy.
//
// Accumulation: each scale block's MMA sum starts from zero (scale-d 0 on
// its first wgmma), is scaled by fl(x_scale * w_scale) and added to a
// float32 running sum with one fma (the promotion DESIGN.md's bound
// assumes); with PIPE two MMA sums take turns, a scale block's promotion
// running while the next one's MMAs do (the same operations in the same
// order). Out: bf16 Y with row stride y_stride when splits == 1 (through
// shared memory, 16-byte stores). A split K is added in split order
// (deterministic) one of three ways: float32 partials part[z][m][n] that
// gemm_fp8.cu's gemm_fp8_reduce adds; the same partials added by the
// tile's last block (split_finish); or, launched as clusters of the splits
// (cluster != 0, a block a unit), partial tiles in shared memory added
// across the cluster (cluster_finish).
//
// Accumulator fragment of wgmma m64nN (f32): warp w of the warpgroup holds
// rows 16w..16w+15; lane (g = lane/4, t = lane%4) holds, for each 8-column
// chunk j, d[4j] = (16w+g, 8j+2t), d[4j+1] = (16w+g, 8j+2t+1),
// d[4j+2] = (16w+g+8, 8j+2t), d[4j+3] = (16w+g+8, 8j+2t+1).

#include "common.cuh"
#include "sm90.cuh"

namespace wgm {

using namespace sm90;

// The block's shape for WGS consumer warpgroups (2: the wide kernels, 128
// W rows a unit; 1: the narrow ones, 64 rows, for narrow N at up to a few
// hundred tokens, where 128-row units leave most multiprocessors idle or
// split K into short chains).
template <int WGS>
struct Cfg {
    static_assert(WGS == 1 || WGS == 2, "consumer warpgroups");
    static constexpr int kConsumerWGs = WGS;
    static constexpr int kThreads = 128 * (WGS + 1);
    static constexpr int kRowTile = 64 * WGS;           // W rows a unit
    static constexpr int kWStage = kRowTile * 128;      // bytes of W a stage
    static constexpr int kLoaderWarp = WGS * 4 + 1;     // the scale loader: the producer warpgroup's second warp
    static constexpr int kPartPitch = kRowTile + 4;     // floats a token row of a cluster's partial tile (conflict-free writes)
};
constexpr int kEpiPitch = 64 + 8;  // u16 a token row of a warpgroup's bf16 tile

#ifdef WGMMA_L2_HINTS
#define TMA_W(dst, map, c0, c1, bar) tma_load_2d_hint(dst, map, c0, c1, bar, pol_w)
#define TMA_X(dst, map, c0, c1, bar) tma_load_2d_hint(dst, map, c0, c1, bar, pol_x)
#else
#define TMA_W(dst, map, c0, c1, bar) tma_load_2d(dst, map, c0, c1, bar)
#define TMA_X(dst, map, c0, c1, bar) tma_load_2d(dst, map, c0, c1, bar)
#endif

// wgmma.mma_async m64nNk32 e4m3 x e4m3 -> f32: D (N/2 registers a thread)
// = A . B^T (+ D when scale_d != 0), A and B from descriptors.
template <int N>
struct Wgmma;

template <> struct Wgmma<8> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {"
            "%0, %1, %2, %3"
            "}, %4, %5, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

template <> struct Wgmma<16> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
            "%0, %1, %2, %3, %4, %5, %6, %7"
            "}, %8, %9, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

template <> struct Wgmma<32> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
            "}, %16, %17, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

template <> struct Wgmma<64> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, %32, %33, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

template <> struct Wgmma<128> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, %64, %65, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

// Shared memory of a block: `stages` stages of (W tile, X tile), then the
// consumer warpgroups' bf16 tiles, then each stage's scales, then the
// barriers, after up to 1024 bytes of alignment; the host's allocation
// (gemm_wgmma.go's wgmmaSmemBytes) comes as smem_bytes and the kernel
// checks it. A stage's scales: x_scale[kb SUBS + sub][m0 + i] at
// [sub BN + i], then the tile's W scales w_scale[tile kRowTile / SB + r][kb
// SUBS + sub] at [SUBS BN + r SUBS + sub] (SUBS = 128 / SB scale blocks a
// K block; WROWS = kRowTile / SB W scale rows a tile, at least one: a
// 64-row tile is half a 128-row scale block), padded to 16 bytes.
template <int BN, int SB, int WGS>
struct Layout {
    typedef Cfg<WGS> C;
    static constexpr int kXStage = BN * 128;
    static constexpr int kStage = C::kWStage + kXStage;
    static constexpr int kEpi = WGS * BN * kEpiPitch * 2;
    static constexpr int kSubs = 128 / SB;
    static constexpr int kWRows = C::kRowTile >= SB ? C::kRowTile / SB : 1;
    static constexpr int kScales = kSubs * BN + kWRows * kSubs;   // floats a stage
    static constexpr int kScaleStage = (kScales * 4 + 15) & ~15;  // bytes a stage
};

// A work unit's coordinates, split fastest, then token chunk, then W
// tile (the numbering the header describes); with the weights shared
// (wcast > 1) token chunk fastest, then split, then tile, so that the
// wcast blocks of a cluster hold the chunks of one tile and K range. The
// one decoding the loader, the producer, the consumers and the cluster
// finish share.
struct Unit {
    int z, c, tile;
};
__device__ __forceinline__ Unit unit_at(int u, int splits, int chunks, int wcast) {
    if (wcast > 1) {
        const int rest = u / chunks;
        return Unit{rest % splits, u % chunks, rest / splits};
    }
    const int rest = u / splits;
    return Unit{u % splits, rest % chunks, rest / chunks};
}

// The split-K finish inside the kernel (counters != nullptr): each
// block, its partials written, counts its unit's split in; the block that
// brings the count to `splits` adds the tile's partials in split order,
// exactly as gemm_fp8_reduce does (the same bits whichever block is last),
// stores bf16 Y and resets the count for the next GEMM. An integer atomic
// decides who finishes; no float is added atomically.
template <int WGS>
__device__ __forceinline__ void split_finish(const float* part, u8* y, int* count, int m, int n, int y_stride,
                                             int splits, int tile, int m0, int bn) {
    typedef Cfg<WGS> C;
    __shared__ int last;
    __threadfence();  // this block's partials, before its count
    named_sync(3, 128 * WGS);
    const int ctid = threadIdx.x;  // consumers are threads 0 .. 128 WGS - 1
    if (ctid == 0) last = atomicAdd(count, 1) == splits - 1;
    named_sync(3, 128 * WGS);
    if (!last) return;
    __threadfence();  // the other blocks' partials, after their counts
    const int rows = min(bn, m - m0);
    for (int i = ctid; i < rows * (C::kRowTile / 4); i += 128 * WGS) {
        const int tok = m0 + i / (C::kRowTile / 4), col = tile * C::kRowTile + (i % (C::kRowTile / 4)) * 4;
        float4 acc = __ldcg(reinterpret_cast<const float4*>(part + (size_t)tok * n + col));
        for (int z = 1; z < splits; z++) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(part + ((size_t)z * m + tok) * n + col));
            acc = add4_rn(acc, v);
        }
        splitk_store4(reinterpret_cast<u16*>(y) + (size_t)tok * y_stride + col, acc);
    }
    if (ctid == 0) *count = 0;
}


// The producer thread: every bulk tensor copy of the block's units. With
// mc > 1 the mc blocks of a cluster share X: each brings the rank-th of
// mc slices of the tile (tx's box BN / mc rows) into every block's stage;
// with wc > 1 the wc blocks (the token chunks of one W tile) share W the
// same way (tw's box kRowTile / wc rows, a multiple of the 8 rows of a
// 1024-byte swizzle atom, so a slice lands as the whole box would). Both:
// a cluster of wc x mc blocks, rank = wc x (W tile) + (token chunk), the
// wc ranks of a tile sharing its W, the mc ranks of a chunk its X.
template <int BN, int WGS>
__device__ __forceinline__ void produce(const TensorMap* tw, const TensorMap* tx, u32 base, u32 bars, int units, int kbn,
                                        int kb_per_split, int splits, int chunks, int stages, int mc, int wc) {
    typedef Layout<BN, 128, WGS> L;  // kStage does not depend on SB
    typedef Cfg<WGS> C;
    {
        tma_prefetch_map(tw);
        tma_prefetch_map(tx);
#ifdef WGMMA_L2_HINTS
        const u64 pol_w = policy_evict_first(), pol_x = policy_evict_last();
#endif
        const int wn = max(1, wc), xn = max(1, mc);
        const int rank = wn * xn > 1 ? (int)cluster_rank() : 0, wr = rank % wn, xr = rank / wn;
        const int slice = BN / xn, off = xr * slice;
        u16 mask = 0;  // the ranks of this chunk: wr, wr + wn, ...
        for (int i = 0; i < xn; i++) mask |= (u16)(1u << (i * wn + wr));
        const int wslice = C::kRowTile / wn, woff = wr * wslice;
        const u16 wmask = (u16)(((1u << wn) - 1) << (xr * wn));  // the ranks of this tile
        auto load_w = [&](u32 dst, int kb, int tile, u32 bar) {
            if (wc > 1)
                tma_load_2d_multicast(dst + woff * 128, tw, kb * 128, tile * C::kRowTile + woff, bar, wmask);
            else
                TMA_W(dst, tw, kb * 128, tile * C::kRowTile, bar);
        };
        auto load_x = [&](u32 dst, int kb, int c, u32 bar) {
            if (mc > 1)
                tma_load_2d_multicast(dst + off * 128, tx, kb * 128, c * BN + off, bar, mask);
            else
                TMA_X(dst, tx, kb * 128, c * BN, bar);
        };
        int s = 0;
        u32 ph = 0;
        bool first = true;
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const auto [z, c, tile] = unit_at(u, splits, chunks, wc);
            const int kb0 = z * kb_per_split, kb1 = min(kbn, kb0 + kb_per_split);
            // The first unit's first stages: W now, X after the wait.
            const int pre = first ? min(stages, kb1 - kb0) : 0;
            for (int kb = kb0; kb < kb1; kb++) {
                const u32 full = bars + 8 * s, empty = bars + 8 * (stages + s);
                mbar_wait(empty, ph ^ 1);
                mbar_expect_tx(full, L::kStage);
                const u32 st = base + s * L::kStage;
                load_w(st, kb, tile, full);
                if (kb - kb0 >= pre) load_x(st + C::kWStage, kb, c, full);
                if (pre > 0 && kb - kb0 == pre - 1) {
                    pdl_wait();
                    for (int i = 0; i < pre; i++) load_x(base + i * L::kStage + C::kWStage, kb0 + i, c, bars + 8 * i);
                }
                if (++s == stages) s = 0, ph ^= 1;
            }
            first = false;
        }
        pdl_trigger();
    }
}

// One scale block's MMAs (the q-th of the unit, sub-block sub of its
// stage) into d, committed as one group; at a stage's first sub-block the
// consumer first waits for the stage. (si, phi) is the issuing side's ring
// position, advanced past the stage at its last sub-block.
template <int BN, int SB, int WGS>
__device__ __forceinline__ void mma_block(float* d, int sub, u32 base, u32 bars, int wg, int stages, int& si, u32& phi) {
    typedef Layout<BN, SB, WGS> L;
    constexpr int R = BN / 2;
    if (sub == 0) mbar_wait(bars + 8 * si, phi);
    const u32 st = base + si * L::kStage;
    const u64 da = smem_desc(st + wg * 64 * 128);
    const u64 db = smem_desc(st + Cfg<WGS>::kWStage);
    fence_regs<R>(d);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < SB / 32; kk++) {
        const int off = (sub * SB + kk * 32) >> 4;
        Wgmma<BN>::mma(d, da + off, db + off, kk);
    }
    wgmma_commit();
    if (sub == L::kSubs - 1 && ++si == stages) si = 0, phi ^= 1;
}

// The warp's W scale (scale row wrow of the tile) of sub-block sub of
// stage sf.
template <int BN, int SB, int WGS>
__device__ __forceinline__ float w_scale(const float* scales, int sf, int wrow, int sub) {
    typedef Layout<BN, SB, WGS> L;
    return scales[sf * (L::kScaleStage / 4) + L::kSubs * BN + wrow * L::kSubs + sub];
}

// The promotion of a finished scale block's MMA sum d into acc with its
// scales from stage sf's shared memory (wsc: w_scale's, read by the
// caller while the MMAs run); at the stage's last sub-block the warp
// releases the stage to the producer (every block's, with shared X) and
// sf moves on.
template <int BN, int SB, int WGS>
__device__ __forceinline__ void promote(float* acc, float* d, int sub, float wsc, const float* scales, u32 bars, int t,
                                        int lane, int stages, int mc, int& sf) {
    typedef Layout<BN, SB, WGS> L;
    constexpr int SUBS = L::kSubs;
    fence_regs<BN / 2>(d);
    const float* const sc = scales + sf * (L::kScaleStage / 4);
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        // Past m the loader wrote zeros (and X's rows are zero).
        const float s0 = __fmul_rn(sc[sub * BN + 8 * j + 2 * t], wsc);
        const float s1 = __fmul_rn(sc[sub * BN + 8 * j + 2 * t + 1], wsc);
        acc[4 * j] = __fmaf_rn(d[4 * j], s0, acc[4 * j]);
        acc[4 * j + 1] = __fmaf_rn(d[4 * j + 1], s1, acc[4 * j + 1]);
        acc[4 * j + 2] = __fmaf_rn(d[4 * j + 2], s0, acc[4 * j + 2]);
        acc[4 * j + 3] = __fmaf_rn(d[4 * j + 3], s1, acc[4 * j + 3]);
    }
    if (sub == SUBS - 1) {
        // The stage's tiles and scales read: the ring may refill it (with
        // X or W shared, every block of the cluster hears of it, whether
        // its producer writes into this block or not).
        const u32 empty = bars + 8 * (stages + sf);
        __syncwarp();
        if (mc > 1) {
            if (lane < mc) mbar_arrive_cluster(mapa(empty, lane));  // lane r tells block r
        } else if (lane == 0) {
            mbar_arrive(empty);
        }
        if (++sf == stages) sf = 0;
    }
}

__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

// The consumer warpgroups: MMA, promotion, and the unit's output (bf16 Y,
// float32 partials, or, in a cluster, the partial tile in shared memory).
// mc: the blocks that share the ring's stages (X or W shared), each told
// of a stage's release; wcast: the unit numbering (unit_at).
// PIPE: two MMA sums in turn, so that scale block q's promotion runs
// while block q + 1's MMAs are in flight (wgmma.wait_group 1); the sums
// and their promotions are the same operations in the same order either
// way, so the output bits are the same.
template <int BN, int SB, int WGS, bool PIPE>
__device__ __forceinline__ void consume(const float* __restrict__ ws, const float* xs, u8* __restrict__ y,
                                        float* __restrict__ part, int* counters, u8* gbase, u32 base, u32 epi, u32 scl,
                                        u32 bars, int m, int n, int kbn, int y_stride, int kb_per_split, int splits,
                                        int chunks, int stages, int units, int cluster, int mc, int wcast) {
    typedef Layout<BN, SB, WGS> L;
    typedef Cfg<WGS> C;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#ifdef WGMMA_SETMAXNREG
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
#endif
    pdl_wait();  // before any store (the kernel before may still read Y's memory)
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, t = lane & 3;
    const int tid = threadIdx.x & 127;
    constexpr int R = BN / 2;  // accumulator registers a thread
    constexpr int SUBS = L::kSubs;
    const float* const scales = reinterpret_cast<const float*>(gbase + (scl - base));
    const int wrow = (wg * 64 + wl * 16) / SB;  // this warp's W scale row in the tile (16 rows in one scale block)
    int si = 0, sf = 0;  // the ring's stage: MMAs issued, promoted
    u32 ph = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const auto [z, c, tile] = unit_at(u, splits, chunks, wcast);
        const int kb0 = z * kb_per_split, kb1 = min(kbn, kb0 + kb_per_split);
        const int m0 = c * BN;
        const int row0 = tile * C::kRowTile + wg * 64 + wl * 16;  // this warp's first W row

        float acc[R];
#pragma unroll
        for (int i = 0; i < R; i++) acc[i] = 0.f;
        float d[R];
#pragma unroll
        for (int i = 0; i < R; i++) d[i] = 0.f;
        const int nq = (kb1 - kb0) * SUBS;  // scale blocks of the unit
        if constexpr (PIPE) {
            float e[R];
#pragma unroll
            for (int i = 0; i < R; i++) e[i] = 0.f;
            // Block q's promotion reads stage sf, which is q's (the issuing
            // side is one block ahead).
#define WG_PROMOTE(SUM, Q) \
    promote<BN, SB, WGS>(acc, SUM, (Q) % SUBS, w_scale<BN, SB, WGS>(scales, sf, wrow, (Q) % SUBS), scales, bars, t, lane, stages, mc, sf)
            mma_block<BN, SB, WGS>(d, 0, base, bars, wg, stages, si, ph);
            int q = 1;
            for (; q + 1 < nq; q += 2) {
                mma_block<BN, SB, WGS>(e, q % SUBS, base, bars, wg, stages, si, ph);
                wgmma_wait1();
                WG_PROMOTE(d, q - 1);
                mma_block<BN, SB, WGS>(d, (q + 1) % SUBS, base, bars, wg, stages, si, ph);
                wgmma_wait1();
                WG_PROMOTE(e, q);
            }
            if (q < nq) {
                mma_block<BN, SB, WGS>(e, q % SUBS, base, bars, wg, stages, si, ph);
                wgmma_wait1();
                WG_PROMOTE(d, q - 1);
                wgmma_wait0();
                WG_PROMOTE(e, q);
            } else {
                wgmma_wait0();
                WG_PROMOTE(d, q - 1);
            }
#undef WG_PROMOTE
        } else {
            for (int q = 0; q < nq; q++) {
                mma_block<BN, SB, WGS>(d, q % SUBS, base, bars, wg, stages, si, ph);
                const float wsc = w_scale<BN, SB, WGS>(scales, sf, wrow, q % SUBS);
                wgmma_wait0();
                promote<BN, SB, WGS>(acc, d, q % SUBS, wsc, scales, bars, t, lane, stages, mc, sf);
            }
        }
        if (u + (int)gridDim.x >= units) pdl_trigger();

        const int row = row0 + g;  // rows row (acc 4j, 4j+1) and row + 8 (4j+2, 4j+3)
        if (cluster) {
            // The partial tile [BN][kPartPitch] over the ring, which every
            // consumer warpgroup has finished reading (the unit is the block's only one).
            named_sync(3, 128 * WGS);
            float* pt = reinterpret_cast<float*>(gbase);
            const int r = row - tile * C::kRowTile;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int tk = 8 * j + 2 * t;
                pt[tk * C::kPartPitch + r] = acc[4 * j];
                pt[(tk + 1) * C::kPartPitch + r] = acc[4 * j + 1];
                pt[tk * C::kPartPitch + r + 8] = acc[4 * j + 2];
                pt[(tk + 1) * C::kPartPitch + r + 8] = acc[4 * j + 3];
            }
            continue;
        }
        if (splits > 1) {
            float* p = part + (size_t)z * m * n;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int tok = m0 + 8 * j + 2 * t;
                if (tok < m) {
                    p[(size_t)tok * n + row] = acc[4 * j];
                    p[(size_t)tok * n + row + 8] = acc[4 * j + 2];
                }
                if (tok + 1 < m) {
                    p[(size_t)(tok + 1) * n + row] = acc[4 * j + 1];
                    p[(size_t)(tok + 1) * n + row + 8] = acc[4 * j + 3];
                }
            }
            if (counters != nullptr)
                split_finish<WGS>(part, y, counters + tile * chunks + c, m, n, y_stride, splits, tile, m0, BN);
            continue;
        }
        // bf16 through this warpgroup's tile [BN][kEpiPitch], so that each
        // token's 128 bytes of the warpgroup's 64 rows go out in 16-byte stores.
        u16* tileg = reinterpret_cast<u16*>(gbase + (epi - base)) + wg * BN * kEpiPitch;
        named_sync(1 + wg, 128);  // the previous unit's stores have read the tile
        const int col = wl * 16 + g;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int r = 8 * j + 2 * t;
            const u32 v0 = bf16x2_rn(acc[4 * j], acc[4 * j + 1]);      // (r, col), (r + 1, col)
            const u32 v1 = bf16x2_rn(acc[4 * j + 2], acc[4 * j + 3]);  // (r, col + 8), (r + 1, col + 8)
            tileg[r * kEpiPitch + col] = (u16)(v0 & 0xffff);
            tileg[(r + 1) * kEpiPitch + col] = (u16)(v0 >> 16);
            tileg[r * kEpiPitch + col + 8] = (u16)(v1 & 0xffff);
            tileg[(r + 1) * kEpiPitch + col + 8] = (u16)(v1 >> 16);
        }
        named_sync(1 + wg, 128);
        const int rows = min(BN, m - m0);
        for (int i = tid; i < rows * 8; i += 128) {
            const int r = i >> 3, ch = i & 7;
            u8* dst = y + ((size_t)(m0 + r) * y_stride + tile * C::kRowTile + wg * 64) * 2 + ch * 16;
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(tileg + r * kEpiPitch + ch * 8);
        }
    }
}

// The split finish through distributed shared memory: the splits of a
// unit are one cluster (rank z = split z), each block's partial tile in
// its shared memory. After a cluster barrier each block adds a 1/splits
// share of the tile's outputs over the peers in split order (the same
// operations, so the same bits, as split_finish and gemm_fp8_reduce) and
// stores bf16 Y; a second barrier keeps every tile readable until all
// shares are done. Run by every thread of the block.
template <int BN, int WGS>
__device__ __forceinline__ void cluster_finish(u8* __restrict__ y, u32 base, int m, int y_stride, int splits, int chunks) {
    typedef Cfg<WGS> C;
    cluster_sync();
    const int u = blockIdx.x;
    const auto [z, c, tile] = unit_at(u, splits, chunks, 0);
    const int m0 = c * BN;
    constexpr int kGroups = BN * (C::kRowTile / 4);  // float4 groups of the tile
    const int g0 = z * kGroups / splits, g1 = (z + 1) * kGroups / splits;
    for (int i = g0 + (int)threadIdx.x; i < g1; i += C::kThreads) {
        const int tk = i / (C::kRowTile / 4), c4 = i % (C::kRowTile / 4);
        const u32 local = base + (u32)(tk * C::kPartPitch + 4 * c4) * 4;
        float4 acc = ld_cluster_f4(mapa(local, 0));
        for (int zz = 1; zz < splits; zz++) {
            const float4 v = ld_cluster_f4(mapa(local, zz));
            acc = add4_rn(acc, v);
        }
        if (m0 + tk < m)
            splitk_store4(reinterpret_cast<u16*>(y) + (size_t)(m0 + tk) * y_stride + tile * C::kRowTile + 4 * c4, acc);
    }
    cluster_sync();
}

template <int BN, int SB, int WGS, bool PIPE>
__device__ __forceinline__ void gemm_body(const TensorMap* tw, const TensorMap* tx, const float* __restrict__ ws,
                                          const float* xs, u8* __restrict__ y, float* __restrict__ part,
                                          int* counters, int m, int n, int k, int xs_stride, int y_stride, int kb_per_split,
                                          int splits, int chunks, int stages, int smem_bytes, int cluster,
                                          int multicast, int wcast) {
    static_assert(BN % 8 == 0 && BN >= 8 && BN <= 128, "wgmma N");
    static_assert(SB == 32 || SB == 64 || SB == 128, "scale block");
    typedef Layout<BN, SB, WGS> L;
    typedef Cfg<WGS> C;
    extern __shared__ u8 smem_raw[];
    const u32 raw = smem_u32(smem_raw);
    const u32 base = (raw + 1023) & ~1023u;  // the 128-byte swizzle wants 1024-byte aligned tiles
    u8* const gbase = smem_raw + (base - raw);
    const u32 epi = base + stages * L::kStage;
    const u32 scl = epi + L::kEpi;                     // stage s's scales at scl + s kScaleStage
    const u32 bars = scl + stages * L::kScaleStage;  // full[s] at bars + 8s, empty[s] at bars + 8 (stages + s)
    // The host sizes the allocation (gemm_wgmma.go's wgmmaSmemBytes): a
    // layout that outgrew it stops here instead of overwriting memory.
    if (bars + 16 * stages > raw + (u32)smem_bytes) __trap();
    // A cluster's block holds one unit (its partial tile over the ring).
    if (cluster && ((int)gridDim.x != (n / C::kRowTile) * splits * chunks || BN * C::kPartPitch * 4 > stages * L::kStage))
        __trap();
    // Shared X: one chunk (with W shared too: wcast chunks), no split,
    // whole clusters of units (the host's plan).
    if (multicast > 1 && (cluster || chunks != max(1, wcast) || splits != 1 || BN % (8 * multicast) != 0 ||
                          (n / C::kRowTile) % multicast != 0 || gridDim.x % (max(1, wcast) * multicast) != 0))
        __trap();
    // Shared W: the chunks of a tile in whole clusters, no split finish
    // in clusters.
    if (wcast > 1 && (cluster || chunks % wcast != 0 || C::kRowTile % (8 * wcast) != 0 || gridDim.x % wcast != 0))
        __trap();
    const int share = max(1, multicast) * max(1, wcast);  // the cluster's blocks, which fill each other's stages

    const int kbn = k >> 7;  // 128-wide K blocks (stages)
    const int kscales = k / SB;  // scale blocks a W scale row
    const int units = (n / C::kRowTile) * splits * chunks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(bars + 8 * s, 1 + 32);  // the producer's expect_tx, the loader's 32 lanes
            mbar_init(bars + 8 * (stages + s), WGS * 4 * share);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    // With X or W shared, every block's barriers exist before any block's
    // copy or arrival reaches them.
    if (share > 1)
        cluster_sync();
    else
        __syncthreads();

    if (warp >= WGS * 4) {
#ifdef WGMMA_SETMAXNREG
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
#endif
        if (warp == C::kLoaderWarp) {
            pdl_wait();  // X's scales come from the kernel before
            int s = 0;
            u32 ph = 0;
            for (int u = blockIdx.x; u < units; u += gridDim.x) {
                const auto [z, c, tile] = unit_at(u, splits, chunks, wcast);
                const int kb0 = z * kb_per_split, kb1 = min(kbn, kb0 + kb_per_split);
                const int m0 = c * BN;
                // The tile's first W scale row.
                const float* wst = ws + (size_t)(tile * C::kRowTile / SB) * kscales;
                for (int kb = kb0; kb < kb1; kb++) {
                    mbar_wait(bars + 8 * (stages + s), ph ^ 1);
                    const u32 dst = scl + s * L::kScaleStage;
                    for (int i = lane; i < L::kSubs * BN; i += 32) {
                        const int sub = i / BN, tok = m0 + i % BN;
                        const float* src = xs + (size_t)(kb * L::kSubs + sub) * xs_stride + tok;
                        cp_async4(dst + 4 * i, tok < m ? src : xs, tok < m ? 4 : 0);
                    }
                    for (int i = lane; i < L::kWRows * L::kSubs; i += 32) {
                        const int r = i / L::kSubs, sub = i % L::kSubs;
                        cp_async4(dst + 4 * (L::kSubs * BN + i), wst + (size_t)r * kscales + kb * L::kSubs + sub, 4);
                    }
                    cp_async_arrive(bars + 8 * s);
                    if (++s == stages) s = 0, ph ^= 1;
                }
            }
            asm volatile("cp.async.wait_all;" ::: "memory");  // no copy outlives its warp
        } else if (warp == WGS * 4 && lane == 0) {
            produce<BN, WGS>(tw, tx, base, bars, units, kbn, kb_per_split, splits, chunks, stages, multicast, wcast);
        }
    } else {
        consume<BN, SB, WGS, PIPE>(ws, xs, y, part, counters, gbase, base, epi, scl, bars, m, n, kbn, y_stride,
                                   kb_per_split, splits, chunks, stages, units, cluster, share, wcast);
    }
    if (cluster) cluster_finish<BN, WGS>(y, base, m, y_stride, splits, chunks);
    // No block leaves while another may still write its X or W slice into
    // it or arrive on its barriers.
    if (share > 1) cluster_sync();
}

}  // namespace wgm

// counters: nullptr, the partials then reduced by gemm_fp8_reduce; or
// chunks x (N / row tile) zeroed ints (left zeroed), the kernel finishing
// the split itself (split_finish). cluster: 1 when launched with clusters
// of `splits` blocks (part and counters unused). multicast: 0 or 1, or the
// size of the clusters it is launched with whose blocks share X (one
// chunk, no split; tx's box then BN / multicast rows). wcast: 0 or 1, or
// the size of the clusters whose blocks, wcast token chunks of one W tile
// and K range, share W (tw's box then 64 WGS / wcast rows; the units
// numbered chunk fastest: unit_at). Both: clusters of wcast x multicast
// blocks, multicast W tiles of wcast chunks (all of them, no split).
// Grid: min(units, SMs) blocks of wgm::Cfg<WGS>::kThreads (cluster:
// exactly the units x splits); smem_bytes is the dynamic shared memory
// launched with, stages * (64 WGS 128 + 128 BN + 16 + the stage's scales,
// 4 (BN + 1) bytes rounded up to 16 for SB 128) + WGS BN 144 + 1024 bytes
// (gemm_wgmma.go's wgmmaSmemBytes).
#define WGMMA_GEMM_KERNEL(NAME, BN, SB, WGS, PIPE)                                                                 \
    extern "C" __global__ void __launch_bounds__(wgm::Cfg<WGS>::kThreads, 1)                                      \
        NAME(const __grid_constant__ wgm::TensorMap tw, const __grid_constant__ wgm::TensorMap tx,                 \
             const float* ws, const float* xs, u8* y, float* part, int* counters, int m, int n, int k,             \
             int xs_stride, int y_stride, int kb_per_split, int splits, int chunks, int stages, int smem_bytes,    \
             int cluster, int multicast, int wcast) {                                                             \
        wgm::gemm_body<BN, SB, WGS, PIPE>(&tw, &tx, ws, xs, y, part, counters, m, n, k, xs_stride, y_stride,      \
                                          kb_per_split, splits, chunks, stages, smem_bytes, cluster, multicast,   \
                                          wcast);                                                                 \
    }

// The wide kernels (cudatune.WGMMAWide): two consumer warpgroups, 128 W
// rows a unit.
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_bn8, 8, 128, 2, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_bn16, 16, 128, 2, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_bn32, 32, 128, 2, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_bn64, 64, 128, 2, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_bn128, 128, 128, 2, false)
// The wide kernels with two MMA sums in turn (cudatune.WGMMAWidePipe), up
// to 64 tokens (at 128, three 64-register sets outgrow the 168 registers
// a thread of 384).
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_p_bn16, 16, 128, 2, true)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_p_bn32, 32, 128, 2, true)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_p_bn64, 64, 128, 2, true)
// The narrow kernels (cudatune.WGMMANarrow): one consumer warpgroup, 64 W
// rows a unit; and with two MMA sums in turn (cudatune.WGMMANarrowPipe:
// at 128 tokens three sets of 64 accumulator registers a thread, which
// one warpgroup's 256-register budget holds).
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1_bn16, 16, 128, 1, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1_bn32, 32, 128, 1, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1_bn64, 64, 128, 1, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1_bn128, 128, 128, 1, false)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1p_bn16, 16, 128, 1, true)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1p_bn32, 32, 128, 1, true)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1p_bn64, 64, 128, 1, true)
WGMMA_GEMM_KERNEL(gemm_fp8_wgmma_n1p_bn128, 128, 128, 1, true)
