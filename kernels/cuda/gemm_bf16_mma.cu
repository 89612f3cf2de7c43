// bf16 GEMM with float32 output on tensor cores, for the KV compressor's
// projection at decode and small prefills (DESIGN.md section 8,
// mla.BF16GEMMArgs): Y[m][n] = sum_k x[m][k] * w[n][k], bf16 products
// (exact in float32) accumulated in float32 by mma.sync m16n8k16, Y not
// rounded. Needs sm_80+. Compiled by NVRTC at first use
// (attention/mla/cuda/bf16gemm.go), as a module of its own so that older
// devices still get gemm_bf16.cu.
//
// Weight streaming with split-K: at tens of rows the GEMM is the time to
// read W once (2 * N * K bytes), so the grid is (N / 64 output blocks) x
// (splits of K) x (chunks of 64 tokens) and each block reads its 64 x
// k_split piece of W exactly once, with 16-byte loads that bypass L1,
// issued two pipeline stages (of 64 k) ahead, the first two before the
// programmatic-dependent-launch wait (W does not depend on the kernel
// before). The block's tokens come from L2 into shared memory one k chunk
// at a time (zero rows past m), where its 4 warps read them. Each warp
// owns 16 W rows. With one split the block writes Y; with several it
// writes float32 partials part[split][m][n] and gemm_bf16_mma_reduce adds
// them in split order: every output has one fixed sequence of operations,
// so the result is the same bits on every run and in every graph replay.
//
// The MMA (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type"), lane = 4 * g + t (groupID g = lane / 4, threadID_in_group t):
//   A, 16 x 16 row-major, here 16 W rows x 16 k:
//     a0 = A[g][2t, 2t+1]     a1 = A[g+8][2t, 2t+1]
//     a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   B, 16 x 8 "col" (each column's k contiguous), here 16 k x 8 tokens:
//     b0 = B[2t, 2t+1][g]     b1 = B[2t+8, 2t+9][g]
//   D = A B + C, 16 x 8 float32, here 16 W rows x 8 tokens:
//     d0 = D[g][2t]  d1 = D[g][2t+1]  d2 = D[g+8][2t]  d3 = D[g+8][2t+1]
//   (each 32-bit register holds two bf16, the lower k in the low half).
// Lane (g, t) thus supplies the k slots {2t, 2t+1, 2t+8, 2t+9} of A rows g
// and g+8 and of B column g, and only those: any assignment of real k to a
// lane's slots that depends on t alone and is the same for A and B gives
// the same dot products. Lane t loads the 8 bf16 at k = s + 8t of its rows
// (one uint4 {x, y, z, w} of two bf16 each) and feeds .x (k = s+8t, s+8t+1)
// to slots 2t, 2t+1 and .y (s+8t+2, s+8t+3) to 2t+8, 2t+9 of one MMA, .z
// and .w to the next: the four lanes t cover k = s .. s+31 with two MMAs,
// every k once, and all loads are whole 16-byte vectors straight into the
// fragment registers (W never goes through shared memory).
//
// A stage is 64 k: per lane, W rows g and g+8 at s + 8t and s + 32 + 8t
// (four uint4), the token tile's X row g at the same offsets (two uint4
// from shared memory), four MMAs per token tile of 8.
//
// Alignment (mla.BF16GEMMArgs.Validate and the backend's routing): X rows
// start at 16-byte multiples (XOffset % 16, XStride % 8), K % 64 == 0 (W
// rows and every stage at 128-byte multiples), N % 16 == 0 (a warp's 16
// rows whole; warps past N idle), Y rows at 16-byte multiples for the
// reduction's float4 stores (YOffset % 16, YStride % 4).

#include "common.cuh"

// The block shape (BF16_MMA_WARPS warps, BF16_MMA_ROWS outputs and
// BF16_MMA_TOKENS tokens a block, BF16_MMA_STAGE k a pipeline stage,
// BF16_MMA_PAD bf16 past each shared X row) and the parameter structs
// (BF16MMAParams, SplitKParams) come from abi.h.
static_assert(BF16_MMA_ROWS == 16 * BF16_MMA_WARPS, "a warp owns 16 W rows");
static_assert(BF16_MMA_STAGE == 64 && BF16_MMA_TOKENS % 32 == 0, "a stage is four MMAs a token tile of 8, tiles four at a time (stage_mma_tiles)");

__device__ __forceinline__ void mma_bf16(float d[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One lane's W of a stage: row g (r0, r1) and row g + 8 (h0, h1) at
// k = s + 8t (r0, h0) and s + 32 + 8t (r1, h1).
struct BF16Stage {
    uint4 r0, r1, h0, h1;
};

// row_g and row_h point at this lane's rows g and g + 8 plus 8t; s is the
// stage's first k.
__device__ __forceinline__ BF16Stage load_stage(const u16* row_g, const u16* row_h, int s) {
    BF16Stage w;
    w.r0 = ld_stream(row_g + s);
    w.r1 = ld_stream(row_g + s + 32);
    w.h0 = ld_stream(row_h + s);
    w.h1 = ld_stream(row_h + s + 32);
    return w;
}

// acc[j] += the stage's 16 W rows . token tile j for every tile j < tiles
// (xg: token g of tile 0 at the stage's first k, tiles pitch * 8 apart;
// A = W, B = X^T as above): a tile's X at s + 8t (xa) and s + 32 + 8t (xb),
// four MMAs a tile in k order (xa.x/.y, xa.z/.w, xb.x/.y, xb.z/.w against
// W's r/h .x/.y, .z/.w), issued four tiles at a time, MMA by MMA: the MMAs of a
// tile depend on each other (one accumulator) and mma_bf16's asm stays in
// program order, so tile by tile a warp waits out an MMA's latency three
// times a tile, here once every four tiles (measured on the H200,
// 2026-12-02: the tile-by-tile kernel took 22.4 us at 64 rows against
// 13.7 at 8 for the same weights).
__device__ __forceinline__ void stage_mma_tiles(float (&acc)[BF16_MMA_TOKENS / 8][4], const BF16Stage& w,
                                                const u16* xg, int pitch, int tiles) {
#pragma unroll
    for (int j0 = 0; j0 < BF16_MMA_TOKENS / 8; j0 += 4) {
        if (j0 < tiles) {
            uint4 xa[4], xb[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                xa[u] = xb[u] = make_uint4(0, 0, 0, 0);
                if (j0 + u < tiles) {
                    const u16* xj = xg + (j0 + u) * 8 * pitch;
                    xa[u] = *reinterpret_cast<const uint4*>(xj);
                    xb[u] = *reinterpret_cast<const uint4*>(xj + 32);
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u < tiles) mma_bf16(acc[j0 + u], w.r0.x, w.h0.x, w.r0.y, w.h0.y, xa[u].x, xa[u].y);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u < tiles) mma_bf16(acc[j0 + u], w.r0.z, w.h0.z, w.r0.w, w.h0.w, xa[u].z, xa[u].w);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u < tiles) mma_bf16(acc[j0 + u], w.r1.x, w.h1.x, w.r1.y, w.h1.y, xb[u].x, xb[u].y);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u < tiles) mma_bf16(acc[j0 + u], w.r1.z, w.h1.z, w.r1.w, w.h1.w, xb[u].z, xb[u].w);
        }
    }
}

// One 16-byte cp.async of X into shared memory (zero-filled when !valid).
__device__ __forceinline__ void bf16_cp16(u16* dst, const u16* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

// Stage X's columns [c0, c1) of the block's token rows into xs (zeros past
// rows), every 16-byte piece one cp.async, all in flight at once (a
// load-then-store loop waits on L2 once a piece a thread), then wait for
// every copy and the whole block. cp.async.cg reads through L2, not the
// read-only path: X is an earlier kernel's output.
__device__ __forceinline__ void bf16_stage_x(u16* xs, const u16* x, int m0, int rows, int tiles, int x_stride, int c0,
                                             int c1, int pitch) {
    const int vecs = (c1 - c0) >> 3;
    for (int i = threadIdx.x; i < tiles * 8 * vecs; i += blockDim.x) {
        const int r = i / vecs, v = i - r * vecs;
        const bool ok = r < rows;
        bf16_cp16(xs + r * pitch + 8 * v, x + (size_t)(m0 + (ok ? r : 0)) * x_stride + c0 + 8 * v, ok);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
}

// w: [n][k] bf16; x: token r at x + r * x_stride. Grid: x = block of
// BF16_MMA_ROWS outputs, y = split of K (k_split a multiple of
// BF16_MMA_STAGE; the last split may be shorter), z = chunk of
// BF16_MMA_TOKENS tokens. out: row r of split z at out + (z * m + r) *
// out_stride (Y itself with one split, else the partials with out_stride
// = n). Dynamic shared memory: min(64, m rounded up to 8) rows of
// k_chunk + BF16_MMA_PAD bf16 (k_chunk a multiple of BF16_MMA_STAGE); the
// padding puts the two rows a quarter-warp reads in different banks.
extern "C" __global__ void __launch_bounds__(BF16_MMA_WARPS * 32, 4) gemm_bf16_mma(const BF16MMAParams p) {
    const u16* __restrict__ w = p.w;
    const u16* __restrict__ x = p.x;
    float* __restrict__ out = p.out;
    const int m = p.m, n = p.n, k = p.k, x_stride = p.x_stride, out_stride = p.out_stride, k_split = p.k_split,
              k_chunk = p.k_chunk;
    extern __shared__ __align__(16) u16 xs[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.z * BF16_MMA_TOKENS;
    const int rows = min(BF16_MMA_TOKENS, m - m0);  // the block's real tokens
    const int tiles = (rows + 7) >> 3;              // token tiles of 8
    const int k0 = blockIdx.y * k_split;
    const int k1 = min(k, k0 + k_split);
    const int n0 = blockIdx.x * BF16_MMA_ROWS + warp * 16;  // the warp's first W row
    const bool active = n0 < n;                             // the same for the whole warp
    const int pitch = k_chunk + BF16_MMA_PAD;

    const u16* row_g = w + (size_t)(active ? n0 + g : 0) * k + 8 * t;
    const u16* row_h = row_g + (size_t)8 * k;

    BF16Stage cur = {}, nxt = {};
    if (active) {
        cur = load_stage(row_g, row_h, k0);
        if (k0 + BF16_MMA_STAGE < k1) nxt = load_stage(row_g, row_h, k0 + BF16_MMA_STAGE);
    }
    pdl_wait();  // X is written by an earlier kernel
    // The next kernel may launch now: it waits for this one's end before
    // it reads anything (every kernel's pdl_wait), and it launches only
    // once all of this grid's blocks are resident, so it takes no slot one
    // of them needs; launching it early hides its launch under this one
    // (the reduction's, the next GEMM's weight prefetch).
    pdl_trigger();

    float acc[BF16_MMA_TOKENS / 8][4];
#pragma unroll
    for (int j = 0; j < BF16_MMA_TOKENS / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    for (int c0 = k0; c0 < k1; c0 += k_chunk) {
        const int c1 = min(k1, c0 + k_chunk);
        if (c0 != k0) __syncthreads();  // every warp is done with the previous chunk
        bf16_stage_x(xs, x, m0, rows, tiles, x_stride, c0, c1, pitch);
        for (int s = c0; s < c1; s += BF16_MMA_STAGE) {
            BF16Stage after = nxt;
            if (active && s + 2 * BF16_MMA_STAGE < k1) after = load_stage(row_g, row_h, s + 2 * BF16_MMA_STAGE);
            if (active) stage_mma_tiles(acc, cur, xs + g * pitch + (s - c0) + 8 * t, pitch, tiles);
            cur = nxt;
            nxt = after;
        }
    }
    if (active) {
        // d0: (W row n0+g, token 2t), d1: (n0+g, 2t+1), d2: (n0+g+8, 2t), d3: (n0+g+8, 2t+1).
        float* o = out + (size_t)blockIdx.y * m * out_stride;
        const int c = n0 + g;
#pragma unroll
        for (int j = 0; j < BF16_MMA_TOKENS / 8; j++) {
            const int r = m0 + j * 8 + 2 * t;
            if (r < m) {
                o[(size_t)r * out_stride + c] = acc[j][0];
                o[(size_t)r * out_stride + c + 8] = acc[j][2];
            }
            if (r + 1 < m) {
                o[(size_t)(r + 1) * out_stride + c] = acc[j][1];
                o[(size_t)(r + 1) * out_stride + c + 8] = acc[j][3];
            }
        }
    }
}

// The ring kernels (gemm_bf16_mma_d4, gemm_bf16_mma_d8; cudatune.Knobs.
// BF16MMADepth): gemm_bf16_mma with DEPTH stages of W in flight a lane
// instead of two, and X staged by cp.async. The same MMAs on the same
// fragments in the same order (stage by stage, token tile by token tile),
// so the same bits as gemm_bf16_mma for every plan; what differs is what
// waits:
//   - bytes in flight: a lane keeps DEPTH stages (64 B each) of W in
//     registers, the ring slot a stage's MMAs just read refilled with the
//     stage DEPTH ahead, the first DEPTH issued before the
//     programmatic-dependent-launch wait. At two stages a block has 16 KiB
//     of W in flight, 32 KiB a multiprocessor at the planner's two blocks:
//     about half of what keeps HBM busy at its latency;
//   - X: every 16-byte piece of the chunk's token rows is one cp.async
//     (zero-filled past m), all in flight at once, where gemm_bf16_mma's
//     load-then-store loop waits on L2 once per piece a thread (16 round
//     trips a thread at 32 rows and 512 k).
// The ring is indexed by compile-time slots only (the stage loop unrolled
// by DEPTH), so it stays in registers.
//
// FINISH (gemm_bf16_mma_d2f, _d4f, _d8f, _d4wf; Knobs.BF16MMAReduce): with several
// splits the kernel finishes the split K itself instead of the separate
// gemm_bf16_mma_reduce launch: each block writes its partials as before,
// then counts itself in at its (output block, token chunk)'s counter; the
// block that arrives last adds the splits' partials in split order with
// splitk_reduce's operations (the same bits as the reduction kernel, on
// every run: which block arrives last changes nothing but who adds) and
// writes Y, then zeroes the counter for the next launch. The partials are
// published by a device-scope fence before the count (an integer atomic)
// and read after one, through L2 (ld.global.cg: never a stale L1 line).
__device__ __forceinline__ float4 ld_cg_f4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

// The last-arriving block's finish of its output block and token chunk:
// Y[r][c..c+3] = part[0][r][c..] + part[1][r][c..] + ..., in split order.
__device__ __forceinline__ void bf16_mma_finish(const BF16MMAParams& p, int m0, int rows) {
    const float* out = p.out;  // the partials
    const int m = p.m, n = p.n, splits = (int)gridDim.y;
    const int c0 = blockIdx.x * BF16_MMA_ROWS;
    const int per_row = min(BF16_MMA_ROWS, n - c0) >> 2;  // float4 a row
    for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
        const int r = m0 + i / per_row, c = c0 + 4 * (i % per_row);
        float4 s = ld_cg_f4(out + (size_t)r * n + c);
        for (int z0 = 1; z0 < splits; z0 += 8) {  // eight loads in flight, then their adds in order
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (z0 + u < splits) v[u] = ld_cg_f4(out + ((size_t)(z0 + u) * m + r) * n + c);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (z0 + u < splits) s = add4_rn(s, v[u]);
            }
        }
        *reinterpret_cast<float4*>(p.y + (size_t)r * p.y_stride + c) = s;
    }
}

template <int DEPTH, int RG, bool FINISH>
__device__ __forceinline__ void bf16_mma_ring(const BF16MMAParams& p) {
    const u16* __restrict__ w = p.w;
    const u16* x = p.x;
    float* __restrict__ out = p.out;
    const int m = p.m, k = p.k, x_stride = p.x_stride, out_stride = p.out_stride, k_split = p.k_split,
              k_chunk = p.k_chunk;
    extern __shared__ __align__(16) u16 ring_xs[];
    u16* xs = ring_xs;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.z * BF16_MMA_TOKENS;
    const int rows = min(BF16_MMA_TOKENS, m - m0);
    const int tiles = (rows + 7) >> 3;
    const int k0 = blockIdx.y * k_split;
    const int k1 = min(k, k0 + k_split);
    const int ns = (k1 - k0) / BF16_MMA_STAGE;  // the split's stages, at least one
    const int n0 = blockIdx.x * BF16_MMA_ROWS + warp * 16 * RG;  // the warp's first W row
    const int pitch = k_chunk + BF16_MMA_PAD;

    // Row group q of the warp: W rows n0 + 16q .. + 15 (all real or none:
    // N % 16 == 0), this lane's rows g and g + 8 of it.
    bool active[RG];
    const u16* row_g[RG];
    const u16* row_h[RG];
#pragma unroll
    for (int q = 0; q < RG; q++) {
        active[q] = n0 + 16 * q < p.n;  // the same for the whole warp
        row_g[q] = w + (size_t)(active[q] ? n0 + 16 * q + g : 0) * k + 8 * t;
        row_h[q] = row_g[q] + (size_t)8 * k;
    }

    BF16Stage ring[DEPTH][RG];
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
#pragma unroll
        for (int q = 0; q < RG; q++) {
            ring[d][q] = BF16Stage{};
            if (active[q] && d < ns) ring[d][q] = load_stage(row_g[q], row_h[q], k0 + d * BF16_MMA_STAGE);
        }
    }
    pdl_wait();  // X is written by an earlier kernel
    // The next kernel may launch now: it waits for this one's end before
    // it reads anything (every kernel's pdl_wait), and it launches only
    // once all of this grid's blocks are resident, so it takes no slot one
    // of them needs; launching it early hides its launch under this one
    // (the reduction's, the next GEMM's weight prefetch).
    pdl_trigger();

    float acc[RG][BF16_MMA_TOKENS / 8][4];
#pragma unroll
    for (int q = 0; q < RG; q++) {
#pragma unroll
        for (int j = 0; j < BF16_MMA_TOKENS / 8; j++) acc[q][j][0] = acc[q][j][1] = acc[q][j][2] = acc[q][j][3] = 0.f;
    }

    int c0 = k0, c1 = min(k1, k0 + k_chunk);
    bf16_stage_x(xs, x, m0, rows, tiles, x_stride, c0, c1, pitch);
    for (int base = 0; base < ns; base += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            const int i = base + d;
            if (i < ns) {  // the same for the whole block
                const int s = k0 + i * BF16_MMA_STAGE;
                if (s == c1) {  // the next chunk of X, once every warp is done with this one
                    __syncthreads();
                    c0 = s;
                    c1 = min(k1, s + k_chunk);
                    bf16_stage_x(xs, x, m0, rows, tiles, x_stride, c0, c1, pitch);
                }
                if (active[0]) {
                    const u16* xg = xs + g * pitch + (s - c0) + 8 * t;
#pragma unroll
                    for (int q = 0; q < RG; q++) {
                        if (active[q]) stage_mma_tiles(acc[q], ring[d][q], xg, pitch, tiles);
                    }
#pragma unroll
                    for (int q = 0; q < RG; q++) {
                        if (active[q] && i + DEPTH < ns)
                            ring[d][q] = load_stage(row_g[q], row_h[q], s + DEPTH * BF16_MMA_STAGE);
                    }
                }
            }
        }
    }
    float* o = out + (size_t)blockIdx.y * m * out_stride;
#pragma unroll
    for (int q = 0; q < RG; q++) {
        if (active[q]) {
            // d0: (W row c, token 2t), d1: (c, 2t+1), d2: (c+8, 2t), d3: (c+8, 2t+1).
            const int c = n0 + 16 * q + g;
#pragma unroll
            for (int j = 0; j < BF16_MMA_TOKENS / 8; j++) {
                const int r = m0 + j * 8 + 2 * t;
                if (r < m) {
                    o[(size_t)r * out_stride + c] = acc[q][j][0];
                    o[(size_t)r * out_stride + c + 8] = acc[q][j][2];
                }
                if (r + 1 < m) {
                    o[(size_t)(r + 1) * out_stride + c] = acc[q][j][1];
                    o[(size_t)(r + 1) * out_stride + c + 8] = acc[q][j][3];
                }
            }
        }
    }
    if (FINISH && gridDim.y > 1) {
        __threadfence();  // this thread's partials, device-wide, before the count
        __syncthreads();
        int last = 0;
        if (threadIdx.x == 0) {
            int* count = p.counters + blockIdx.z * gridDim.x + blockIdx.x;
            __threadfence();  // release: the block's partials (before the barrier) before the count
            last = atomicAdd(count, 1) == (int)gridDim.y - 1;
            if (last) {
                *count = 0;       // every split has counted: ready for the next launch
                __threadfence();  // acquire: the other blocks' partials, after their counts
            }
        }
        if (__syncthreads_or(last)) bf16_mma_finish(p, m0, rows);  // thread 0's answer, to the whole block
    }
}

// The ring kernels: d<DEPTH>, w: two row groups (32 W rows) a warp and two
// warps a block (each X fragment read from shared memory feeds twice the
// MMAs: at 64 tokens a block the four warps' X reads are four times the
// block's W), f: the split K finished in the kernel. The launch bounds'
// blocks a multiprocessor are what the registers allow (the planner's
// resident, bf16gemm.go).
#define BF16_RING(name, depth, rg, finish, minb)                                                               \
    extern "C" __global__ void __launch_bounds__(BF16_MMA_WARPS / (rg) * 32, minb) name(const BF16MMAParams p) { \
        bf16_mma_ring<depth, rg, finish>(p);                                                                   \
    }
BF16_RING(gemm_bf16_mma_d2f, 2, 1, true, 4)
BF16_RING(gemm_bf16_mma_d4, 4, 1, false, 3)
BF16_RING(gemm_bf16_mma_d8, 8, 1, false, 2)
BF16_RING(gemm_bf16_mma_d4f, 4, 1, true, 3)
BF16_RING(gemm_bf16_mma_d8f, 8, 1, true, 2)
BF16_RING(gemm_bf16_mma_d4w, 4, 2, false, 4)
BF16_RING(gemm_bf16_mma_d4wf, 4, 2, true, 4)

// Split-K finish: Y[r][c..c+3] = part[0][r][c..] + part[1][r][c..] + ...,
// the splits added in order (common.cuh's splitk_reduce). One thread per 4
// outputs (n % 4 == 0).
extern "C" __global__ void gemm_bf16_mma_reduce(const SplitKParams p) {
    splitk_reduce<float, true>(p);  // the next kernel launched early, as the GEMM's is
}
