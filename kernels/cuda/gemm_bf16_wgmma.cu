// The compressor's bf16 projection GEMM for sm_90a with warpgroup MMA and
// the tensor memory accelerator (DESIGN.md sections 7-8, the same math as
// gemm_bf16.cu and gemm_bf16_mma.cu):
// Y[m][n] = sum_k x[m][k] w[n][k],  x, w bf16, float32 products and sums, float32 Y.
// Compiled by NVRTC for sm_90a only (wgmma and the bulk tensor copy; the
// helpers are sm90.cuh's, shared with gemm_fp8_wgmma.cu).
//
// gemm_fp8_wgmma.cu's weight streaming without its scales: W's rows are
// the MMA's M side (64 a consumer warpgroup, BF16_WGMMA_ROW_TILE a block)
// and up to BN tokens its N side (wgmma m64nBNk16, both operands K-major
// from shared memory with the 128-byte swizzle, which W [n][k] and X [m][k]
// are). A stage is one K block of BF16_WGMMA_STAGE_K = 64 bf16: the same
// 128 bytes a row as the FP8 kernel's 128-element block, so the tensor
// maps are byte matrices [rows][2k] and the descriptors the same. With no
// promotion the accumulators run over the unit's whole K range: each
// stage's four MMAs are one commit group, and a consumer keeps one group
// in flight (wait_group 1) while it issues the next, releasing a stage
// once its group is done.
//
// A work unit is (W tile of ROW_TILE rows, BN-token chunk, K range of a
// split), numbered split fastest, then chunk, then tile; the grid is
// persistent (at most one block an SM), each block walking the units
// blockIdx.x, + gridDim.x, ...; the ring runs on across units. Block: two
// consumer warpgroups, then a producer warpgroup whose first thread issues
// every bulk tensor copy into a ring of `stages` stages with full
// (transaction-counted) and empty (one arrival a consumer warp) mbarriers.
// Rows of W past n and tokens past m come in as zeros (the tensor map's
// out-of-bounds fill) and are never stored. Programmatic dependent launch:
// the producer issues the first stages' W copies before griddepcontrol.wait
// and their X copies after it; the consumers wait before any store. With
// l2_prefetch the producer first asks for the rest of its first unit's W
// into L2 (bulk tensor prefetches), so that HBM sees the whole stream at
// once rather than a ring's depth of it a block.
//
// Out (float32): with one split, Y straight from the accumulators. A split
// K is added in split order (deterministic, the same operations and so the
// same bits every way; splitk_reduce's) one of three ways (`finish`):
// BF16_WGMMA_FINISH_REDUCE, float32 partials part[z][m][n] that
// gemm_bf16_mma.cu's gemm_bf16_mma_reduce adds; BF16_WGMMA_FINISH_LAST,
// the same partials added by the unit's last block (counters); or
// BF16_WGMMA_FINISH_CLUSTER, launched as clusters of the splits (a block a
// unit), partial tiles in shared memory added across the cluster.
//
// Accumulator fragment of wgmma m64nN (f32): warp w of the warpgroup holds
// rows 16w..16w+15; lane (g = lane/4, t = lane%4) holds, for each 8-column
// chunk j, d[4j] = (16w+g, 8j+2t), d[4j+1] = (16w+g, 8j+2t+1),
// d[4j+2] = (16w+g+8, 8j+2t), d[4j+3] = (16w+g+8, 8j+2t+1).

#include "common.cuh"
#include "sm90.cuh"

namespace wgb {

using namespace sm90;

constexpr int kConsumerWGs = BF16_WGMMA_ROW_TILE / 64;
static_assert(kConsumerWGs * 64 == BF16_WGMMA_ROW_TILE, "64 W rows a consumer warpgroup");
static_assert(BF16_WGMMA_THREADS == 128 * (kConsumerWGs + 1), "consumers and one producer warpgroup");
static_assert(BF16_WGMMA_STAGE_K == 64, "a stage is one 128-byte swizzle row of bf16");
constexpr int kRowTile = BF16_WGMMA_ROW_TILE;
constexpr int kWStage = kRowTile * 128;  // bytes of W a stage
constexpr int kPartPitch = kRowTile + 4;  // floats a token row of a cluster's partial tile (conflict-free writes)

// wgmma.mma_async m64nNk16 bf16 x bf16 -> f32: D (N/2 registers a thread)
// = A . B^T (+ D when scale_d != 0), A and B K-major from descriptors (the
// immediates: scale A and B by 1, neither transposed).
template <int N>
struct Wgmma;

template <> struct Wgmma<8> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3"
            "}, %4, %5, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

template <> struct Wgmma<16> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7"
            "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

template <> struct Wgmma<32> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
            "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "l"(a), "l"(b), "r"(scale_d));
    }
};

template <> struct Wgmma<64> {
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
            "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
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
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
            "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
            "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
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

// A stage: kRowTile W rows then BN token rows, 128 bytes each.
template <int BN>
struct Layout {
    static constexpr int kStage = kWStage + BN * 128;
};

// A work unit's coordinates, split fastest, then token chunk, then W tile.
struct Unit {
    int z, c, tile;
};
__device__ __forceinline__ Unit unit_at(int u, int splits, int chunks) {
    const int rest = u / splits;
    return Unit{u % splits, rest % chunks, rest / chunks};
}

// Four float32 at dst, one 16-byte store where dst is aligned (Y's row
// stride is a multiple of 4 and its offset of 16 bytes: always; checked
// so that a misaligned Y cannot fault).
__device__ __forceinline__ void store4(float* dst, float4 v) {
    if (((size_t)dst & 15) == 0) {
        *reinterpret_cast<float4*>(dst) = v;
    } else {
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
}

// The split-K finish by the unit's last block (BF16_WGMMA_FINISH_LAST):
// each block, its partials written, counts its split in; the block that
// brings the count to `splits` adds the unit's partials in split order
// (splitk_reduce's operations: the same bits whichever block is last),
// stores Y and resets the count for the next GEMM. An integer atomic
// decides who finishes; no float is added atomically. Run by the consumers.
__device__ __forceinline__ void split_finish(const BF16WGMMAParams& p, int* count, int tile, int m0, int bn) {
    __shared__ int last;
    __threadfence();  // this block's partials, before its count
    named_sync(3, 128 * kConsumerWGs);
    const int ctid = threadIdx.x;  // consumers are threads 0 .. 128 kConsumerWGs - 1
    if (ctid == 0) last = atomicAdd(count, 1) == p.splits - 1;
    named_sync(3, 128 * kConsumerWGs);
    if (!last) return;
    __threadfence();  // the other blocks' partials, after their counts
    const int m = p.m, n = p.n;
    const int rows = min(bn, m - m0);
    const int c0 = tile * kRowTile, per_row = min(kRowTile, n - c0) >> 2;  // float4 a token row
    for (int i = ctid; i < rows * per_row; i += 128 * kConsumerWGs) {
        const int tok = m0 + i / per_row, col = c0 + (i % per_row) * 4;
        float4 acc = __ldcg(reinterpret_cast<const float4*>(p.part + (size_t)tok * n + col));
        for (int z = 1; z < p.splits; z++) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(p.part + ((size_t)z * m + tok) * n + col));
            acc = add4_rn(acc, v);
        }
        store4(p.y + (size_t)tok * p.y_stride + col, acc);
    }
    if (ctid == 0) *count = 0;
}

// The producer thread: every bulk tensor copy of the block's units.
template <int BN>
__device__ __forceinline__ void produce(const TensorMap* tw, const TensorMap* tx, const BF16WGMMAParams& p, u32 base,
                                        u32 bars, int units, int kbn) {
    typedef Layout<BN> L;
    tma_prefetch_map(tw);
    tma_prefetch_map(tx);
    const int stages = p.stages;
    if (p.l2_prefetch && blockIdx.x < units) {
        // The first unit's W past the ring's first pass, asked of HBM now
        // into L2 (its stages then load from there).
        const auto [z, c, tile] = unit_at(blockIdx.x, p.splits, p.chunks);
        const int kb0 = z * p.kb_per_split, kb1 = min(kbn, kb0 + p.kb_per_split);
        for (int kb = kb0 + stages; kb < kb1; kb++) tma_prefetch_2d(tw, kb * 128, tile * kRowTile);
    }
    int s = 0;
    u32 ph = 0;
    bool first = true;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const auto [z, c, tile] = unit_at(u, p.splits, p.chunks);
        const int kb0 = z * p.kb_per_split, kb1 = min(kbn, kb0 + p.kb_per_split);
        // The first unit's first stages: W now, X after the wait.
        const int pre = first ? min(stages, kb1 - kb0) : 0;
        for (int kb = kb0; kb < kb1; kb++) {
            const u32 full = bars + 8 * s, empty = bars + 8 * (stages + s);
            mbar_wait(empty, ph ^ 1);
            mbar_expect_tx(full, L::kStage);
            const u32 st = base + s * L::kStage;
            tma_load_2d(st, tw, kb * 128, tile * kRowTile, full);
            if (kb - kb0 >= pre) tma_load_2d(st + kWStage, tx, kb * 128, c * BN, full);
            if (pre > 0 && kb - kb0 == pre - 1) {
                pdl_wait();
                for (int i = 0; i < pre; i++)
                    tma_load_2d(base + i * L::kStage + kWStage, tx, (kb0 + i) * 128, c * BN, bars + 8 * i);
            }
            if (++s == stages) s = 0, ph ^= 1;
        }
        first = false;
    }
    pdl_trigger();
}

// The consumer warpgroups: the MMAs over each unit's K range and its
// output (Y, float32 partials, or, in a cluster, the partial tile in
// shared memory).
template <int BN>
__device__ __forceinline__ void consume(const BF16WGMMAParams& p, u8* gbase, u32 base, u32 bars, int units, int kbn) {
    typedef Layout<BN> L;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    pdl_wait();  // before any store (the kernel before may still read Y's memory)
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, t = lane & 3;
    constexpr int R = BN / 2;  // accumulator registers a thread
    const int stages = p.stages, m = p.m, n = p.n;
    int s = 0;
    u32 ph = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const auto [z, c, tile] = unit_at(u, p.splits, p.chunks);
        const int kb0 = z * p.kb_per_split, kb1 = min(kbn, kb0 + p.kb_per_split);
        const int m0 = c * BN;
        float d[R];
#pragma unroll
        for (int i = 0; i < R; i++) d[i] = 0.f;
        int prev = -1;  // the stage whose MMAs are in flight, released once they are done
        for (int kb = kb0; kb < kb1; kb++) {
            const u32 st = base + s * L::kStage;
            const u64 da = smem_desc(st + wg * 64 * 128);
            const u64 db = smem_desc(st + kWStage);
            mbar_wait(bars + 8 * s, ph);
            fence_regs<R>(d);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) Wgmma<BN>::mma(d, da + 2 * kk, db + 2 * kk, kb > kb0 || kk > 0);
            wgmma_commit();
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            fence_regs<R>(d);
            if (prev >= 0) {
                __syncwarp();
                if (lane == 0) mbar_arrive(bars + 8 * (stages + prev));
            }
            prev = s;
            if (++s == stages) s = 0, ph ^= 1;
        }
        wgmma_wait0();
        fence_regs<R>(d);
        if (prev >= 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bars + 8 * (stages + prev));
        }
        if (u + (int)gridDim.x >= units) pdl_trigger();

        const int r0 = wg * 64 + wl * 16 + g;  // tile rows r0 (d 4j, 4j+1) and r0 + 8 (4j+2, 4j+3)
        const int row = tile * kRowTile + r0;
        if (p.finish == BF16_WGMMA_FINISH_CLUSTER && p.splits > 1) {
            // The partial tile [BN][kPartPitch] over the ring, which both
            // warpgroups have finished reading (the unit is the block's only one).
            named_sync(3, 128 * kConsumerWGs);
            float* pt = reinterpret_cast<float*>(gbase);
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int tk = 8 * j + 2 * t;
                pt[tk * kPartPitch + r0] = d[4 * j];
                pt[(tk + 1) * kPartPitch + r0] = d[4 * j + 1];
                pt[tk * kPartPitch + r0 + 8] = d[4 * j + 2];
                pt[(tk + 1) * kPartPitch + r0 + 8] = d[4 * j + 3];
            }
            continue;
        }
        float* out = p.y;
        size_t stride = (size_t)p.y_stride;
        if (p.splits > 1) out = p.part + (size_t)z * m * n, stride = (size_t)n;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int tok = m0 + 8 * j + 2 * t;
            if (tok < m) {
                if (row < n) out[(size_t)tok * stride + row] = d[4 * j];
                if (row + 8 < n) out[(size_t)tok * stride + row + 8] = d[4 * j + 2];
            }
            if (tok + 1 < m) {
                if (row < n) out[(size_t)(tok + 1) * stride + row] = d[4 * j + 1];
                if (row + 8 < n) out[(size_t)(tok + 1) * stride + row + 8] = d[4 * j + 3];
            }
        }
        if (p.splits > 1 && p.finish == BF16_WGMMA_FINISH_LAST)
            split_finish(p, p.counters + tile * p.chunks + c, tile, m0, BN);
    }
}

// The split finish through distributed shared memory: the splits of a
// unit are one cluster (rank z = split z), each block's partial tile in
// its shared memory. After a cluster barrier each block adds a 1/splits
// share of the tile's outputs over the peers in split order (the same
// operations, so the same bits, as split_finish and gemm_bf16_mma_reduce)
// and stores Y; a second barrier keeps every tile readable until all
// shares are done. Run by every thread of the block.
template <int BN>
__device__ __forceinline__ void cluster_finish(const BF16WGMMAParams& p, u32 base) {
    cluster_sync();
    const auto [z, c, tile] = unit_at(blockIdx.x, p.splits, p.chunks);
    const int m0 = c * BN, c0 = tile * kRowTile;
    constexpr int kGroups = BN * (kRowTile / 4);  // float4 groups of the tile
    const int g0 = z * kGroups / p.splits, g1 = (z + 1) * kGroups / p.splits;
    for (int i = g0 + (int)threadIdx.x; i < g1; i += BF16_WGMMA_THREADS) {
        const int tk = i / (kRowTile / 4), c4 = i % (kRowTile / 4);
        const u32 local = base + (u32)(tk * kPartPitch + 4 * c4) * 4;
        float4 acc = ld_cluster_f4(mapa(local, 0));
        for (int zz = 1; zz < p.splits; zz++) {
            const float4 v = ld_cluster_f4(mapa(local, zz));
            acc = add4_rn(acc, v);
        }
        if (m0 + tk < p.m && c0 + 4 * c4 < p.n) store4(p.y + (size_t)(m0 + tk) * p.y_stride + c0 + 4 * c4, acc);
    }
    cluster_sync();
}

template <int BN>
__device__ __forceinline__ void gemm_body(const TensorMap* tw, const TensorMap* tx, const BF16WGMMAParams& p) {
    static_assert(BN % 8 == 0 && BN >= 8 && BN <= 128, "wgmma N");
    typedef Layout<BN> L;
    extern __shared__ u8 smem_raw[];
    const u32 raw = smem_u32(smem_raw);
    const u32 base = (raw + 1023) & ~1023u;  // the 128-byte swizzle wants 1024-byte aligned tiles
    u8* const gbase = smem_raw + (base - raw);
    const int stages = p.stages;
    const u32 bars = base + stages * L::kStage;  // full[s] at bars + 8s, empty[s] at bars + 8 (stages + s)
    const int kbn = p.k / BF16_WGMMA_STAGE_K;
    const int tiles = (p.n + kRowTile - 1) / kRowTile;
    const int units = tiles * p.splits * p.chunks;
    const bool cluster = p.finish == BF16_WGMMA_FINISH_CLUSTER && p.splits > 1;
    // The host sizes the allocation (bf16wgmma.go's bf16WGMMASmemBytes): a
    // layout that outgrew it stops here instead of overwriting memory.
    if (bars + 16 * stages > raw + (u32)p.smem_bytes) __trap();
    // A cluster's block holds one unit (its partial tile over the ring).
    if (cluster && ((int)gridDim.x != units || BN * kPartPitch * 4 > stages * L::kStage)) __trap();

    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(bars + 8 * s, 1);                           // the producer's expect_tx
            mbar_init(bars + 8 * (stages + s), kConsumerWGs * 4);  // one arrival a consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();

    if (warp >= kConsumerWGs * 4) {
        if (warp == kConsumerWGs * 4 && (threadIdx.x & 31) == 0) produce<BN>(tw, tx, p, base, bars, units, kbn);
    } else {
        consume<BN>(p, gbase, base, bars, units, kbn);
    }
    if (cluster) cluster_finish<BN>(p, base);
}

}  // namespace wgb

// Grid: min(units, SMs) blocks of BF16_WGMMA_THREADS (cluster finish:
// exactly the units, in clusters of `splits`); the dynamic shared memory
// is p.smem_bytes, stages * (BF16_WGMMA_ROW_TILE + BN) * 128 + 16 stages
// + 1024 bytes (bf16wgmma.go's bf16WGMMASmemBytes). tw: W as a byte
// matrix [n][2k], boxes of 128 bytes x BF16_WGMMA_ROW_TILE rows; tx: X as
// [m][2 x_stride] bytes (2k wide), boxes of 128 bytes x BN rows; both with
// the 128-byte swizzle.
#define BF16_WGMMA_KERNEL(NAME, BN)                                                                  \
    extern "C" __global__ void __launch_bounds__(BF16_WGMMA_THREADS, 1)                              \
        NAME(const __grid_constant__ sm90::TensorMap tw, const __grid_constant__ sm90::TensorMap tx, \
             const __grid_constant__ BF16WGMMAParams p) {                                            \
        wgb::gemm_body<BN>(&tw, &tx, p);                                                             \
    }

BF16_WGMMA_KERNELS(BF16_WGMMA_KERNEL)
