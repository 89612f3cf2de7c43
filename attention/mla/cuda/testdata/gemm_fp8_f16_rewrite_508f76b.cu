// FP8 block-scaled GEMM for small and medium batches (DESIGN.md section 7):
// Y[m][n] = bf16( sum over 128-blocks kb of (x_scale[kb][m] * w_scale[n/128][kb])
//                 * sum_{k in kb} x[m][k] * w[n][k] ),  x, w e4m3.
// Compiled by NVRTC at first use (attention/mla/cuda/gemm.go); needs sm_89+
// (the e4m3 -> f16 conversion).
//
// Hopper has no e4m3 mma.sync: the compiler emulates it by converting both
// operands to f16 for every MMA, and those conversions (16 per clock per SM)
// were the kernel's bottleneck. So the kernel converts each operand once and
// runs the f16 MMA (m16n8k16, float32 accumulation) itself. The conversion
// is exact (every e4m3 value is an f16 value) and the tensor core adds the
// same exact products, so the sums are those of the e4m3 MMA.
//
// A block owns 256 rows of W (8 warps x 32 rows), 64 tokens and a range of
// K blocks (split-K when N is narrow, so that every SM has work):
// - Weights: each lane copies, with cp.async GEMM_STAGES - 1 K blocks ahead,
//   the 16-byte chunks of its warp's rows it later reads itself (so the ring
//   needs only the lane's own cp.async.wait_group), converts them to f16 in
//   registers once per K block (the A fragments of 32 rows x 128 K) and uses
//   each A fragment for every token of the block.
// - Tokens: the block converts the 64 x 128 tile of X to f16 in shared memory
//   once per K block (double-buffered, one __syncthreads per K block; the raw
//   bytes are loaded into registers one K block ahead) and every warp reads
//   its B fragments from there (each feeds two MMAs, one per 16 rows).
// Fragments: lane (g = lane/4, t = lane%4) supplies A rows g and g+8 and B
// column (token) g at the same four K slots (2t, 2t+1, 2t+8, 2t+9) of each
// MMA; any assignment of real K offsets to those slots that is the same for
// A and B gives the same sum. Lane t takes the bytes [16t, 16t+16) and
// [64+16t, 64+16t+16) of each 128-block, 4 bytes (one u32) per MMA: the u32's
// low two bytes go to slots 2t, 2t+1, its high two to 2t+8, 2t+9.
//
// Accumulation: each 128-block's MMA sum starts from zero, is scaled by
// x_scale * w_scale and added to a float32 running sum (the promotion that
// keeps tensor-core accumulation short, as the bound in package gemm
// assumes). Split-K partials go to a float32 workspace and a second kernel
// adds them in a fixed order (deterministic), then rounds to bf16 with the
// hardware conversion (nearest even, every NaN the canonical 0x7fff).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define GEMM_WARPS 8
#define GEMM_ROWS 256  // weight rows per block: GEMM_WARPS x 32
#define GEMM_MT 64     // tokens per block
#ifndef GEMM_STAGES
#define GEMM_STAGES 4  // weight K blocks in the ring (GEMM_STAGES - 1 in flight)
#endif
#define GEMM_WSTAGE 4096                  // one warp's K block: 32 rows x 128 bytes
#define GEMM_XROW 272                     // bytes per token row of the f16 tile: 128 halves + 16 (no bank conflicts)
#define GEMM_XCH (GEMM_MT * 8 / (GEMM_WARPS * 32))  // 16-byte chunks of X per thread and K block
#define GEMM_SMEM_W (GEMM_WARPS * GEMM_STAGES * GEMM_WSTAGE)
#define GEMM_SMEM_X (2 * GEMM_MT * GEMM_XROW)
#define GEMM_SMEM_BYTES (GEMM_SMEM_W + GEMM_SMEM_X + 2 * GEMM_MT * 4)
#define GEMM_TROW (GEMM_ROWS + 8)  // u16 per token row of the bf16 output tile (aliases the weight ring)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint4 ld_x(const u8* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Four e4m3 (one u32) to two f16x2: bytes 0, 1 to lo, bytes 2, 3 to hi, the
// lower byte in the lower half. Exact; NaN stays NaN.
__device__ __forceinline__ void e4m3x4_f16(u32 v, u32& lo, u32& hi) {
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(v));
}

__device__ __forceinline__ void mma_f16(float d[4], const u32 a[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two float32 to bf16 (nearest even, canonical NaN), lo in the low half.
__device__ __forceinline__ u32 bf16x2_rn(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One K block of the warp's 32 weight rows into the lane's ring slot: chunk
// c = 2 * ri + h is row g + 8 ri, bytes 64 h + 16 t, at slot + 512 c (the
// warp's 32 chunks of one c side by side: conflict-free reads).
__device__ __forceinline__ void issue_w(u32 slot, const u8* src, int k) {
#pragma unroll
    for (int c = 0; c < 8; c++) cp16(slot + c * 512, src + (size_t)(c >> 1) * 8 * k + (c & 1) * 64);
}

// One K block of the warp's 32 rows x 16 NP tokens: the MMA sums of the
// block from zero (d), then acc += d * x_scale * w_scale. The loop runs over
// pairs of MMA steps (s = 2 sp, 2 sp + 1), converting only the A fragments
// of those steps, so that the conversions interleave with the MMAs of the
// warp and no branch separates the tiles. Step s uses the lane's u32 s of
// each row: bytes 16 t + 4 s of the row (s < 4), 64 + 16 t + 4 (s - 4) after,
// the f16 of the same K in the token tile.
// wsl: the lane's ring slot (chunk c = 2 ri + h of row g + 8 ri at 512 c);
// xb: the lane's token g of tile 0 at its K offset; sb: token scales of
// tokens 2t, 2t+1 of tile 0.
template <int NP>
__device__ __forceinline__ void kblock_mma(float (&acc)[GEMM_MT / 8][2][4], const u8* wsl, const u8* xb,
                                           const float* sb, float wsc) {
    float d[2 * NP][2][4];
#pragma unroll
    for (int j = 0; j < 2 * NP; j++)
#pragma unroll
        for (int rt = 0; rt < 2; rt++) d[j][rt][0] = d[j][rt][1] = d[j][rt][2] = d[j][rt][3] = 0.f;
    uint4 raw[4];  // chunk h of rows g, g + 8, g + 16, g + 24
#pragma unroll
    for (int sp = 0; sp < 4; sp++) {
        const int h = sp >> 1;
        if ((sp & 1) == 0) {
#pragma unroll
            for (int ri = 0; ri < 4; ri++) raw[ri] = *reinterpret_cast<const uint4*>(wsl + (2 * ri + h) * 512);
        }
        // a[rt][e]: A of step 2 sp + e for rows 16 rt + g (regs 0, 2) and + 8 (regs 1, 3).
        u32 a[2][2][4];
#pragma unroll
        for (int ri = 0; ri < 4; ri++) {
            const int rt = ri >> 1, hi = ri & 1;
            const u32 w0 = (sp & 1) ? raw[ri].z : raw[ri].x;
            const u32 w1 = (sp & 1) ? raw[ri].w : raw[ri].y;
            e4m3x4_f16(w0, a[rt][0][hi], a[rt][0][2 + hi]);
            e4m3x4_f16(w1, a[rt][1][hi], a[rt][1][2 + hi]);
        }
#pragma unroll
        for (int j = 0; j < 2 * NP; j++) {
            // f16 of K 16 t + 8 (sp & 1) .. + 8 of chunk h: steps 2 sp (x, y) and 2 sp + 1 (z, w).
            const uint4 q = *reinterpret_cast<const uint4*>(xb + j * 8 * GEMM_XROW + h * 128 + (sp & 1) * 16);
#pragma unroll
            for (int rt = 0; rt < 2; rt++) {
                mma_f16(d[j][rt], a[rt][0], q.x, q.y);
                mma_f16(d[j][rt], a[rt][1], q.z, q.w);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 2 * NP; j++) {
        // D: (row g, tokens 2t, 2t+1) in d0, d1; row g + 8 in d2, d3.
        const float2 sx = *reinterpret_cast<const float2*>(sb + j * 8);
        const float s0 = __fmul_rn(sx.x, wsc), s1 = __fmul_rn(sx.y, wsc);
#pragma unroll
        for (int rt = 0; rt < 2; rt++) {
            acc[j][rt][0] = __fmaf_rn(d[j][rt][0], s0, acc[j][rt][0]);
            acc[j][rt][1] = __fmaf_rn(d[j][rt][1], s1, acc[j][rt][1]);
            acc[j][rt][2] = __fmaf_rn(d[j][rt][2], s0, acc[j][rt][2]);
            acc[j][rt][3] = __fmaf_rn(d[j][rt][3], s1, acc[j][rt][3]);
        }
    }
}

// Grid: x = token chunk of GEMM_MT (fastest, so the chunks that share a
// weight tile run together and the later ones read it from L2), y = block of
// GEMM_ROWS rows of W, z = split of K. Y is written as bf16 when part is
// null, else as float32 partials part[z][m][n]. Dynamic shared memory:
// GEMM_SMEM_BYTES.
extern "C" __global__ void __launch_bounds__(GEMM_WARPS * 32, 1)
    gemm_fp8(const u8* __restrict__ w, const float* __restrict__ ws, const u8* __restrict__ x,
             const float* __restrict__ xs, u8* __restrict__ y, float* __restrict__ part, int m, int n, int k,
             int xs_stride, int y_stride, int kb_per_split) {
    extern __shared__ __align__(16) u8 smem[];
    {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < GEMM_SMEM_BYTES) __trap();  // launched with a different GEMM_STAGES
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * GEMM_MT;
    const int row0 = blockIdx.y * GEMM_ROWS + warp * 32;  // the warp's first weight row
    const bool active = row0 < n;  // N is a multiple of 128: all 32 rows or none
    const int kbn = k >> 7;
    const int kb0 = blockIdx.z * kb_per_split;
    const int nkb = min(kbn, kb0 + kb_per_split) - kb0;
    const int pairs = min(GEMM_MT / 16, (m - m0 + 15) >> 4);  // 16-token tile pairs holding a real token
    const int rows16 = pairs * 16;                             // token rows converted (zeros past m)

    const u8* wsrc = w + (size_t)(row0 + g) * k + t * 16;
    const float* wsp = ws + (size_t)(row0 >> 7) * kbn;
    const u32 wring = smem_u32(smem + warp * (GEMM_STAGES * GEMM_WSTAGE) + lane * 16);
    const u8* wlane = smem + warp * (GEMM_STAGES * GEMM_WSTAGE) + lane * 16;
    u8* xh = smem + GEMM_SMEM_W;
    float* xsc = reinterpret_cast<float*>(smem + GEMM_SMEM_W + GEMM_SMEM_X);

    // The weights do not depend on the kernel before: start streaming them
    // before waiting for it. One commit group per K block, empty ones too,
    // so that group i is always K block kb0 + i.
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; s++) {
        if (active && s < nkb) issue_w(wring + s * GEMM_WSTAGE, wsrc + (size_t)(kb0 + s) * 128, k);
        cp_commit();
    }
    pdl_wait();

    // X chunk q = tid + 256 u of a K block: token q % GEMM_MT, bytes 16 (q / GEMM_MT).
    uint4 xv[GEMM_XCH];
    float xsv;
    auto load_x = [&](int kb) {
#pragma unroll
        for (int u = 0; u < GEMM_XCH; u++) {
            const int q = tid + u * GEMM_WARPS * 32;
            const int r = q % GEMM_MT, c = q / GEMM_MT;
            xv[u] = make_uint4(0, 0, 0, 0);
            if (r < rows16 && m0 + r < m) xv[u] = ld_x(x + (size_t)(m0 + r) * k + kb * 128 + c * 16);
        }
        xsv = 0.f;
        if (tid < GEMM_MT && m0 + tid < m) xsv = __ldg(xs + (size_t)kb * xs_stride + m0 + tid);
    };
    auto store_x = [&](int buf) {
#pragma unroll
        for (int u = 0; u < GEMM_XCH; u++) {
            const int q = tid + u * GEMM_WARPS * 32;
            const int r = q % GEMM_MT, c = q / GEMM_MT;
            if (r < rows16) {
                uint4 lo, hi;
                e4m3x4_f16(xv[u].x, lo.x, lo.y);
                e4m3x4_f16(xv[u].y, lo.z, lo.w);
                e4m3x4_f16(xv[u].z, hi.x, hi.y);
                e4m3x4_f16(xv[u].w, hi.z, hi.w);
                u8* dst = xh + (buf * GEMM_MT + r) * GEMM_XROW + c * 32;
                *reinterpret_cast<uint4*>(dst) = lo;
                *reinterpret_cast<uint4*>(dst + 16) = hi;
            }
        }
        if (tid < GEMM_MT) xsc[buf * GEMM_MT + tid] = xsv;
    };

    float acc[GEMM_MT / 8][2][4];
#pragma unroll
    for (int j = 0; j < GEMM_MT / 8; j++)
#pragma unroll
        for (int rt = 0; rt < 2; rt++) acc[j][rt][0] = acc[j][rt][1] = acc[j][rt][2] = acc[j][rt][3] = 0.f;

    float wsc = active ? __ldg(wsp + kb0) : 0.f;
    load_x(kb0);
    store_x(0);
    if (nkb > 1) load_x(kb0 + 1);

    for (int i = 0; i < nkb; i++) {
        const int kb = kb0 + i;
        if (active && i + GEMM_STAGES - 1 < nkb)
            issue_w(wring + ((i + GEMM_STAGES - 1) % GEMM_STAGES) * GEMM_WSTAGE,
                    wsrc + (size_t)(kb + GEMM_STAGES - 1) * 128, k);
        cp_commit();
        const float wsc_next = (active && i + 1 < nkb) ? __ldg(wsp + kb + 1) : 0.f;
        cp_wait<GEMM_STAGES - 1>();  // this lane's copies of K block i have landed
        // The tokens of K block i are converted (buffer i & 1); every warp is
        // done with buffer (i + 1) & 1 (K block i - 1).
        __syncthreads();
        if (i + 1 < nkb) store_x((i + 1) & 1);
        if (i + 2 < nkb) load_x(kb + 2);

        if (active) {
            const u8* wsl = wlane + (i % GEMM_STAGES) * GEMM_WSTAGE;
            const u8* xb = xh + ((i & 1) * GEMM_MT + g) * GEMM_XROW + t * 32;
            const float* sb = xsc + (i & 1) * GEMM_MT + 2 * t;
            switch (pairs) {  // the tiles holding a real token, as a constant for each case
                case 1: kblock_mma<1>(acc, wsl, xb, sb, wsc); break;
                case 2: kblock_mma<2>(acc, wsl, xb, sb, wsc); break;
                case 3: kblock_mma<3>(acc, wsl, xb, sb, wsc); break;
                default: kblock_mma<4>(acc, wsl, xb, sb, wsc); break;
            }
        }
        wsc = wsc_next;
    }
    pdl_trigger();

    if (part != nullptr) {
        if (!active) return;
        float* pz = part + (size_t)blockIdx.z * m * n;
#pragma unroll
        for (int j = 0; j < GEMM_MT / 8; j++) {
            const int mc = m0 + j * 8 + 2 * t;  // this lane's tokens: mc, mc + 1
#pragma unroll
            for (int rt = 0; rt < 2; rt++) {
                const int nr = row0 + 16 * rt + g;  // rows nr (d0, d1) and nr + 8 (d2, d3)
                if (mc < m) {
                    pz[(size_t)mc * n + nr] = acc[j][rt][0];
                    pz[(size_t)mc * n + nr + 8] = acc[j][rt][2];
                }
                if (mc + 1 < m) {
                    pz[(size_t)(mc + 1) * n + nr] = acc[j][rt][1];
                    pz[(size_t)(mc + 1) * n + nr + 8] = acc[j][rt][3];
                }
            }
        }
        return;
    }

    // bf16 through shared memory (the weight ring, once every warp is done
    // with it), so that each token's row of the block goes out in 16-byte
    // stores.
    __syncthreads();
    u16* tile = reinterpret_cast<u16*>(smem);  // [GEMM_MT][GEMM_TROW]
    if (active) {
#pragma unroll
        for (int j = 0; j < GEMM_MT / 8; j++) {
            const int r = j * 8 + 2 * t;
#pragma unroll
            for (int rt = 0; rt < 2; rt++) {
                const int c = warp * 32 + 16 * rt + g;
                const u32 v0 = bf16x2_rn(acc[j][rt][0], acc[j][rt][1]);  // (r, c), (r + 1, c)
                const u32 v1 = bf16x2_rn(acc[j][rt][2], acc[j][rt][3]);  // (r, c + 8), (r + 1, c + 8)
                tile[r * GEMM_TROW + c] = (u16)(v0 & 0xffff);
                tile[(r + 1) * GEMM_TROW + c] = (u16)(v0 >> 16);
                tile[r * GEMM_TROW + c + 8] = (u16)(v1 & 0xffff);
                tile[(r + 1) * GEMM_TROW + c + 8] = (u16)(v1 >> 16);
            }
        }
    }
    __syncthreads();
    const int rows = min(GEMM_MT, m - m0);
    const int chunks = min(GEMM_ROWS, n - (int)blockIdx.y * GEMM_ROWS) >> 3;  // 16-byte chunks per token row
    for (int q = tid; q < rows * (GEMM_ROWS / 8); q += GEMM_WARPS * 32) {
        const int r = q / (GEMM_ROWS / 8), ch = q % (GEMM_ROWS / 8);
        if (ch < chunks) {
            u8* dst = y + ((size_t)(m0 + r) * y_stride + (size_t)blockIdx.y * GEMM_ROWS + ch * 8) * 2;
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&tile[r * GEMM_TROW + ch * 8]);
        }
    }
}

// Split-K finish: Y[r][c..c+3] = bf16(part[0][r][c..] + part[1][r][c..] + ...),
// the splits added in order. One thread per 4 outputs.
extern "C" __global__ void gemm_fp8_reduce(const float* __restrict__ part, u8* __restrict__ y, int m, int n,
                                           int y_stride, int splits) {
    pdl_wait();
    const int per_row = n >> 2;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m * per_row) {
        const int r = i / per_row, c = (i - r * per_row) * 4;
        float4 s = __ldg(reinterpret_cast<const float4*>(part + (size_t)r * n + c));
        for (int z = 1; z < splits; z++) {
            const float4 v = __ldg(reinterpret_cast<const float4*>(part + ((size_t)z * m + r) * n + c));
            s.x = __fadd_rn(s.x, v.x);
            s.y = __fadd_rn(s.y, v.y);
            s.z = __fadd_rn(s.z, v.z);
            s.w = __fadd_rn(s.w, v.w);
        }
        uint2 out = make_uint2(bf16x2_rn(s.x, s.y), bf16x2_rn(s.z, s.w));
        *reinterpret_cast<uint2*>(y + ((size_t)r * y_stride + c) * 2) = out;
    }
    pdl_trigger();
}
