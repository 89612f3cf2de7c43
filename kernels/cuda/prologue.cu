// DSv4 MLA prologue kernels: KV norm-RoPE-quant-store and the fused Q
// norm/RoPE/quant. Compiled by NVRTC at first use (see kernels.go).
//
// Every float operation uses an explicit _rn intrinsic so that no multiply
// and add are fused: the result must equal the Go reference byte for byte
// (DESIGN.md section 4). Compile without -ftz: UE8M0's inverse scale 2^-127
// is a subnormal.
//
// One warp owns one 512-value row; lane j holds values [16j, 16j+16), which
// is exactly the canonical reduction's partial j. Lanes 28..31 hold the rope
// tail, and lanes 4g..4g+3 hold UE8M0 group g.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL 0xffffffffu

enum { FMT_FP8_UE8M0 = 0, FMT_BF16 = 1, FMT_FP8_PERTENSOR = 2 };
enum { PHASE_CONTEXT = 0, PHASE_GENERATION = 1 };

// Launch parameters, passed by value. Go packs the same layout
// (kernels.go: packParams): eight 8-byte pointers, then 4-byte fields.
struct Params {
    const u8* in;          // KV: latent base (offset applied); Q: QIn
    u8* out;               // KV: cache pool; Q: QOut
    const float* weight;   // KV only
    const float* rope;     // [positions][32]{cos, sin}
    const int* cu_q;       // metadata arrays (int32)
    const int* cached;
    const int* kv_len;
    const int* block_tables;
    u8* sched;             // scheduler region, or null
    u64 in_stride;         // bytes between consecutive input rows
    int row_begin, rows, valid_rows, seq_begin, num_seqs, seq_len, seq_len_log2;
    int heads, rope_positions, page_stride;
    int page_size_log2, page_bytes, num_pages;
    float scale;           // KV: kv_scale (fp8_pertensor); Q: q_scale (fp8)
    float q_deq, kv_deq, q_scaling, o_scale;
    int write_sched;
    int pad_;
};

__device__ __forceinline__ float bf16_to_f32(u32 h) { return __uint_as_float(h << 16); }

// Round to nearest even; every NaN becomes the canonical 0x7fff. Integer
// arithmetic, identical to numerics.BF16FromF32.
__device__ __forceinline__ u32 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// Two float32 to two e4m3 with the hardware conversion: hi goes to the upper byte.
__device__ __forceinline__ u32 e4m3x2(float hi, float lo) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float4 ld_f4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

__device__ __forceinline__ void st_u4(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

__device__ __forceinline__ float pow2i(int k) {
    // 2^k exactly for k in [-149, 127].
    if (k >= -126) return __uint_as_float((u32)(k + 127) << 23);
    return __uint_as_float(1u << (k + 149));
}

// unpack 16 bf16 from two 16-byte words
__device__ __forceinline__ void unpack16(uint4 a, uint4 b, float x[16]) {
    u32 w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        x[2 * i] = bf16_to_f32(w[i] & 0xffffu);
        x[2 * i + 1] = bf16_to_f32(w[i] >> 16);
    }
}

// The canonical inverse RMS of the warp's row.
__device__ __forceinline__ float warp_rms_inv(const float x[16]) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) s = __fadd_rn(s, __fmul_rn(x[i], x[i]));
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL, s, d));
    float mean = __fdiv_rn(s, 512.f);
    float root = __fsqrt_rn(__fadd_rn(mean, 1e-6f));
    return __fdiv_rn(1.f, root);
}

// Resolve a launch-local row to (batch index, position); false for padding.
__device__ __forceinline__ bool resolve(const Params& p, int local, int& b, int& pos) {
    if (local >= p.valid_rows) return false;
    if (p.seq_len == 0) {  // context: last b with cu_q[b] <= t
        int t = p.row_begin + local;
        int lo = p.seq_begin, hi = p.seq_begin + p.num_seqs - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (__ldg(p.cu_q + mid) <= t) lo = mid; else hi = mid - 1;
        }
        b = lo;
        pos = t - __ldg(p.cu_q + lo) + __ldg(p.cached + lo);
    } else {
        int g, r;
        if (p.seq_len_log2 >= 0) { g = local >> p.seq_len_log2; r = local & (p.seq_len - 1); }
        else { g = local / p.seq_len; r = local - g * p.seq_len; }
        b = p.seq_begin + g;
        pos = __ldg(p.kv_len + b) - p.seq_len + r;
    }
    return pos >= 0 && pos < p.rope_positions;
}

__device__ __forceinline__ void write_scheduler(const Params& p) {
    float denom = __fmul_rn(p.q_scaling, __fsqrt_rn(512.f));
    float b0 = __fdiv_rn(__fmul_rn(p.q_deq, p.kv_deq), denom);
    float b1 = __fmul_rn(b0, 1.4426950408889634f);
    float b2 = __fmul_rn(p.o_scale, p.kv_deq);
    u32* s = reinterpret_cast<u32*>(p.sched);
    s[0] = 0u;
    s[1] = __float_as_uint(b0);
    s[2] = __float_as_uint(b1);
    s[3] = __float_as_uint(b2);
}

template <int FMT>
__device__ __forceinline__ void kv_store(const Params& p, u8* page, int off, float y[16], int lane) {
    if (FMT == FMT_BF16) {
        u32 w[8];
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = f32_to_bf16(y[2 * i]) | (f32_to_bf16(y[2 * i + 1]) << 16);
        u8* dst = page + (size_t)off * 1024 + lane * 32;
        st_u4(dst, make_uint4(w[0], w[1], w[2], w[3]));
        st_u4(dst + 16, make_uint4(w[4], w[5], w[6], w[7]));
    } else if (FMT == FMT_FP8_PERTENSOR) {
        u32 w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 lo = e4m3x2(__fmul_rn(y[4 * i + 1], p.scale), __fmul_rn(y[4 * i], p.scale));
            u32 hi = e4m3x2(__fmul_rn(y[4 * i + 3], p.scale), __fmul_rn(y[4 * i + 2], p.scale));
            w[i] = lo | (hi << 16);
        }
        st_u4(page + (size_t)off * 512 + lane * 16, make_uint4(w[0], w[1], w[2], w[3]));
    } else {  // FP8_UE8M0
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < 16; i++) a = fmaxf(a, fabsf(y[i]));
        a = fmaxf(a, __shfl_xor_sync(FULL, a, 1));
        a = fmaxf(a, __shfl_xor_sync(FULL, a, 2));
        u8* vals = page + (size_t)off * 576;
        if (lane < 28) {
            a = fmaxf(a, 1e-4f);
            u32 tb = __float_as_uint(__fdiv_rn(a, 448.f));
            int e = (tb >> 23) & 0xff;
            if (tb & 0x7fffffu) e++;
            if (e > 254) e = 254;
            float inv = pow2i(127 - e);
            u32 w[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 lo = e4m3x2(__fmul_rn(y[4 * i + 1], inv), __fmul_rn(y[4 * i], inv));
                u32 hi = e4m3x2(__fmul_rn(y[4 * i + 3], inv), __fmul_rn(y[4 * i + 2], inv));
                w[i] = lo | (hi << 16);
            }
            st_u4(vals + lane * 16, make_uint4(w[0], w[1], w[2], w[3]));
            if ((lane & 3) == 0) page[576 * (1 << p.page_size_log2) + off * 8 + (lane >> 2)] = (u8)e;
        } else {
            u32 w[8];
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = f32_to_bf16(y[2 * i]) | (f32_to_bf16(y[2 * i + 1]) << 16);
            u8* dst = vals + 448 + (lane - 28) * 32;
            st_u4(dst, make_uint4(w[0], w[1], w[2], w[3]));
            st_u4(dst + 16, make_uint4(w[4], w[5], w[6], w[7]));
        }
    }
}

// Programmatic dependent launch: wait for the previous grid's memory before
// reading inputs it may have produced, and let the next grid start launching
// once this one has read what it needs. Both are no-ops without PDL.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

// Resolve row local+1 from row local's batch index without a new search:
// consecutive context rows stay in one sequence or move to the next.
__device__ __forceinline__ bool resolve_next(const Params& p, int local, int& b, int& pos) {
    if (local >= p.valid_rows) return false;
    if (p.seq_len != 0) return resolve(p, local, b, pos);
    int t = p.row_begin + local;
    while (b + 1 < p.seq_begin + p.num_seqs && __ldg(p.cu_q + b + 1) <= t) b++;
    pos = t - __ldg(p.cu_q + b) + __ldg(p.cached + b);
    return pos >= 0 && pos < p.rope_positions;
}

__device__ __forceinline__ void load_rope(float cs[16], const float* rope, int pos, int lane) {
    const float* src = rope + (size_t)pos * 64 + (lane - 28) * 16;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float4 t = ld_f4(src + 4 * q);
        cs[4 * q] = t.x; cs[4 * q + 1] = t.y; cs[4 * q + 2] = t.z; cs[4 * q + 3] = t.w;
    }
}

// Rotate the lane's 8 pairs (lanes 28..31) with preloaded (cos, sin).
__device__ __forceinline__ void rope_pairs(float y[16], const float cs[16]) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float c = cs[2 * k], s = cs[2 * k + 1];
        float y0 = y[2 * k], y1 = y[2 * k + 1];
        y[2 * k] = round_bf16(__fsub_rn(__fmul_rn(y0, c), __fmul_rn(y1, s)));
        y[2 * k + 1] = round_bf16(__fadd_rn(__fmul_rn(y0, s), __fmul_rn(y1, c)));
    }
}

// KV: each warp owns K consecutive latent rows. All K rows' loads are issued
// first (they depend only on the row index), then the positions, pages and
// RoPE rows are resolved while those loads are in flight.
template <int FMT, int K>
__device__ __forceinline__ void kv_body(const Params& p) {
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int first = warp * K;
    pdl_wait();
    if (p.write_sched && blockIdx.x == 0 && threadIdx.x == 0) write_scheduler(p);
    if (first >= p.rows) { pdl_trigger(); return; }
    uint4 va[K], vb[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (first + k < p.rows) {
            const u8* src = p.in + (size_t)(p.row_begin + first + k) * p.in_stride + lane * 32;
            va[k] = ld_stream(src);
            vb[k] = ld_stream(src + 16);
        }
    }
    float w[16];
    {
        const float* wp = p.weight + lane * 16;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float4 t = ld_f4(wp + 4 * q);
            w[4 * q] = t.x; w[4 * q + 1] = t.y; w[4 * q + 2] = t.z; w[4 * q + 3] = t.w;
        }
    }
    int page[K], pos[K];
    int b = 0;
#pragma unroll
    for (int k = 0; k < K; k++) {
        page[k] = -1;
        bool ok = k == 0 ? resolve(p, first, b, pos[k]) : resolve_next(p, first + k, b, pos[k]);
        if (first + k < p.rows && ok) {
            int pg = __ldg(p.block_tables + (size_t)b * p.page_stride + (pos[k] >> p.page_size_log2));
            if (pg >= 0 && pg < p.num_pages) page[k] = pg;
        }
    }
    pdl_trigger();
#pragma unroll
    for (int k = 0; k < K; k++) {
        if (page[k] < 0) continue;  // warp-uniform
        float cs[16];
        if (lane >= 28) load_rope(cs, p.rope, pos[k], lane);
        float x[16];
        unpack16(va[k], vb[k], x);
        float r = warp_rms_inv(x);
#pragma unroll
        for (int i = 0; i < 16; i++) x[i] = round_bf16(__fmul_rn(__fmul_rn(x[i], r), w[i]));
        if (lane >= 28) rope_pairs(x, cs);
        u8* pg = p.out + (size_t)page[k] * p.page_bytes;
        kv_store<FMT>(p, pg, pos[k] & ((1 << p.page_size_log2) - 1), x, lane);
    }
}

#define KV_KERNELS(K)                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) kv_fp8_ue8m0_k##K(const Params p) { kv_body<FMT_FP8_UE8M0, K>(p); } \
    extern "C" __global__ void __launch_bounds__(256) kv_bf16_k##K(const Params p) { kv_body<FMT_BF16, K>(p); }           \
    extern "C" __global__ void __launch_bounds__(256) kv_fp8_pertensor_k##K(const Params p) { kv_body<FMT_FP8_PERTENSOR, K>(p); }
KV_KERNELS(1)
KV_KERNELS(2)
KV_KERNELS(4)

#ifndef Q_WARPS
#define Q_WARPS 8
#endif
#ifndef Q_ROWS
#define Q_ROWS 8
#endif

// Q: one block per token; warp w owns heads w, w+Q_WARPS, ... and loads
// Q_ROWS of them at once. The token's position and RoPE row are resolved once
// per warp while the first rows' loads are in flight.
template <bool BF16OUT>
__device__ __forceinline__ void q_body(const Params& p) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int local = blockIdx.x;
    const int es = BF16OUT ? 2 : 1;
    const size_t row0 = (size_t)(p.row_begin + local) * p.heads;
    pdl_wait();
    uint4 va[Q_ROWS], vb[Q_ROWS];
    int h0 = warp;
#pragma unroll
    for (int k = 0; k < Q_ROWS; k++) {
        int h = h0 + k * Q_WARPS;
        if (h < p.heads) {
            const u8* src = p.in + (row0 + h) * 1024 + lane * 32;
            va[k] = ld_stream(src);
            vb[k] = ld_stream(src + 16);
        }
    }
    int b, pos;
    const bool live = resolve(p, local, b, pos);
    float cs[16];
    if (live && lane >= 28) load_rope(cs, p.rope, pos, lane);
    pdl_trigger();
    for (;;) {
#pragma unroll
        for (int k = 0; k < Q_ROWS; k++) {
            int h = h0 + k * Q_WARPS;
            if (h >= p.heads) break;
            u8* dst = p.out + (row0 + h) * 512 * es + lane * 16 * es;
            if (!live) {
                st_u4(dst, make_uint4(0, 0, 0, 0));
                if (BF16OUT) st_u4(dst + 16, make_uint4(0, 0, 0, 0));
                continue;
            }
            float x[16];
            unpack16(va[k], vb[k], x);
            float r = warp_rms_inv(x);
#pragma unroll
            for (int i = 0; i < 16; i++) x[i] = round_bf16(__fmul_rn(x[i], r));
            if (lane >= 28) rope_pairs(x, cs);
            if (BF16OUT) {
                u32 w[8];
#pragma unroll
                for (int i = 0; i < 8; i++) w[i] = f32_to_bf16(x[2 * i]) | (f32_to_bf16(x[2 * i + 1]) << 16);
                st_u4(dst, make_uint4(w[0], w[1], w[2], w[3]));
                st_u4(dst + 16, make_uint4(w[4], w[5], w[6], w[7]));
            } else {
                u32 w[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    u32 lo = e4m3x2(__fmul_rn(x[4 * i + 1], p.scale), __fmul_rn(x[4 * i], p.scale));
                    u32 hi = e4m3x2(__fmul_rn(x[4 * i + 3], p.scale), __fmul_rn(x[4 * i + 2], p.scale));
                    w[i] = lo | (hi << 16);
                }
                st_u4(dst, make_uint4(w[0], w[1], w[2], w[3]));
            }
        }
        h0 += Q_ROWS * Q_WARPS;
        if (h0 >= p.heads) break;
#pragma unroll
        for (int k = 0; k < Q_ROWS; k++) {
            int h = h0 + k * Q_WARPS;
            if (h < p.heads && live) {
                const u8* src = p.in + (row0 + h) * 1024 + lane * 32;
                va[k] = ld_stream(src);
                vb[k] = ld_stream(src + 16);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(Q_WARPS * 32) q_fp8(const Params p) { q_body<false>(p); }
extern "C" __global__ void __launch_bounds__(Q_WARPS * 32) q_bf16(const Params p) { q_body<true>(p); }

// The exhaustive conversion check: out[i] = e4m3(bits = base + i) for n inputs.
extern "C" __global__ void e4m3_sweep(u8* out, u32 base, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    u32 stride = gridDim.x * blockDim.x;
    for (; 2 * i < n; i += stride) {
        u32 a = base + 2 * i;
        u32 r = e4m3x2(__uint_as_float(a + 1), __uint_as_float(a));
        reinterpret_cast<u16*>(out)[i] = (u16)r;
    }
}
