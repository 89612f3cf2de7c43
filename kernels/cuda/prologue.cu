// DSv4 MLA prologue kernels: KV norm-RoPE-quant-store and the fused Q
// norm/RoPE/quant. Compiled by NVRTC at first use (attention/mla/cuda),
// with common.cuh (the shared helpers) and abi.h (generated from
// kernels/cuda/abi: the Params struct, the format ids, the metadata header
// indices and the layout constants) as in-memory headers.
//
// Every float operation uses an explicit _rn intrinsic so that no multiply
// and add are fused: the result must equal the Go reference byte for byte
// (docs/DESIGN.md section 4). Compile without -ftz: UE8M0's inverse scale
// 2^-127 is a subnormal.
//
// One warp owns one 512-value row; lane j holds values [16j, 16j+16), which
// is exactly the canonical reduction's partial j. Lanes 28..31 hold the rope
// tail, and lanes 4g..4g+3 hold UE8M0 group g.
//
// With PROLOGUE_HELPERS_ONLY defined, only the helpers are compiled (no
// kernel): the compressor's module (compress.cu) is built on them.

#include "common.cuh"

// The kernels assume the row layout below: lane j of a warp holds values
// [16j, 16j+16) of a 512-value row.
static_assert(HEAD_DIM == 32 * 16 && NOPE_DIM == 28 * 16 && ROPE_DIM == 4 * 16 && GROUP_SIZE == 4 * 16,
              "the warp-per-row mapping needs 512 = 448 + 64 values and 64-value groups");

// log2(n) when n is a power of two, else -1: the index splits below take a
// shift and a mask for the models' power-of-two head counts and query
// lengths, and one division otherwise.
__device__ __forceinline__ int pow2_log2(int n) { return (n & (n - 1)) == 0 ? __ffs(n) - 1 : -1; }

// i / n for i >= 0 (split_index's q alone); log2n is pow2_log2(n).
__device__ __forceinline__ int index_quotient(int i, int n, int log2n) { return log2n >= 0 ? i >> log2n : i / n; }

// i = q*n + r, 0 <= r < n, for i >= 0; log2n is pow2_log2(n).
__device__ __forceinline__ void split_index(int i, int n, int log2n, int& q, int& r) {
    if (log2n >= 0) {
        q = i >> log2n;
        r = i & (n - 1);
    } else {
        q = i / n;
        r = i - q * n;
    }
}

// A launch captured in a CUDA graph serves every generation batch of its
// padded size: the batch's own counts come from the metadata header, which
// each iteration rewrites at the same address.
__device__ __forceinline__ Params with_header(const Params& p0) {
    Params p = p0;
    if (p.from_hdr) {
        p.num_seqs = __ldg(p.hdr + HDR_NUM_GEN);
        p.valid_rows = __ldg(p.hdr + HDR_GEN_TOKENS);
        p.seq_len = max(__ldg(p.hdr + HDR_GEN_SEQ_LEN), 1);
        p.seq_len_log2 = pow2_log2(p.seq_len);
    }
    return p;
}

// Pack two values that are already exact bf16.
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

__device__ __forceinline__ float4 ld_f4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

__device__ __forceinline__ void st_u4(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

// fl(y * scale), or y itself when the caller knows the scale is 1: fl(y * 1)
// is y for every value the kernels scale (any NaN among them is the
// canonical positive one bf16x2_rn leaves, and e4m3 has one NaN a sign), so
// the unit-scale kernels (UNIT) give the same bytes without the multiplies.
template <bool UNIT>
__device__ __forceinline__ float scaled(float y, float scale) { return UNIT ? y : __fmul_rn(y, scale); }

// The one e4m3 packing of every FP8 output: e4m3(fl(y[i] * scale)) for the
// lane's 16 values, value i in byte i, as one 16-byte store.
template <bool UNIT = false>
__device__ __forceinline__ void st_e4m3x16(u8* dst, const float y[16], float scale) {
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 lo = e4m3x2(scaled<UNIT>(y[4 * i + 1], scale), scaled<UNIT>(y[4 * i], scale));
        u32 hi = e4m3x2(scaled<UNIT>(y[4 * i + 3], scale), scaled<UNIT>(y[4 * i + 2], scale));
        w[i] = lo | (hi << 16);
    }
    st_u4(dst, make_uint4(w[0], w[1], w[2], w[3]));
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

// The canonical inverse RMS of the warp's row; eps is the config's
// rms_norm_eps (Params.eps).
__device__ __forceinline__ float warp_rms_inv(const float x[16], float eps) {
    // The canonical sum starts at 0, and 0 + x0*x0 is x0*x0 bit for bit (a
    // square is never -0), so the first addition is left out.
    float s = __fmul_rn(x[0], x[0]);
#pragma unroll
    for (int i = 1; i < 16; i++) s = __fadd_rn(s, __fmul_rn(x[i], x[i]));
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL, s, d));
    // s / 512 and 1 / root, as multiplication by the exact 2^-9 and the
    // correctly rounded reciprocal: each equals the correctly rounded
    // quotient bit for bit, in fewer instructions.
    static_assert((HEAD_DIM & (HEAD_DIM - 1)) == 0, "the mean's divisor must be a power of two");
    float mean = __fmul_rn(s, 1.f / (float)HEAD_DIM);
    float root = __fsqrt_rn(__fadd_rn(mean, eps));
    return __frcp_rn(root);
}

// The last sequence b in [seq_begin, seq_begin+num_seqs) with cu_q[b] <= t,
// found by the whole warp: each round, the 32 lanes test 32 evenly spaced
// candidates at once, so up to 32 sequences take one memory round trip
// (1024 take two) instead of a dependent chain of log2(n) loads. All lanes
// must call it with the same t.
__device__ __forceinline__ int warp_find_seq(const Params& p, int t) {
    const int lane = threadIdx.x & 31;
    int lo = p.seq_begin, n = p.num_seqs;
    while (n > 1) {
        const int step = (n + 31) >> 5;
        const int idx = lo + lane * step;
        const bool le = idx < lo + n && __ldg(p.cu_q + idx) <= t;
        const unsigned m = __ballot_sync(FULL, le);
        const int k = m ? 31 - __clz(m) : 0;
        const int end = lo + n;
        lo += k * step;
        n = min(step, end - lo);
    }
    return lo;
}

// Sequence b's tokens [lo, next), batch token indices as cu_q's (next: no
// end for the launch's last sequence), and base: token t's position is
// t + base; lo is returned (the KV pipeline walks forward and needs only
// next). The streaming KV and Q pipelines keep these in registers.
__device__ __forceinline__ int seq_span(const Params& p, int b, int& next, int& base) {
    const int lo = __ldg(p.cu_q + b);
    next = b + 1 < p.seq_begin + p.num_seqs ? __ldg(p.cu_q + b + 1) : 0x7fffffff;
    base = __ldg(p.cached + b) - lo;
    return lo;
}

// Resolve a launch-local row to (batch index, position); false for padding.
// All lanes of the warp call it with the same row.
__device__ __forceinline__ bool resolve(const Params& p, int local, int& b, int& pos) {
    if (local >= p.valid_rows) return false;
    if (p.seq_len == 0) {  // context: last b with cu_q[b] <= t
        const int t = p.row_begin + local;
        b = warp_find_seq(p, t);
        pos = t - __ldg(p.cu_q + b) + __ldg(p.cached + b);
    } else {
        int g, r;
        split_index(local, p.seq_len, p.seq_len_log2, g, r);
        b = p.seq_begin + g;
        pos = __ldg(p.kv_len + b) - p.seq_len + r;
    }
    return pos >= 0 && pos < p.rope_positions;
}

__device__ __forceinline__ void write_scheduler(const Params& p) {
    float denom = __fmul_rn(p.q_scaling, __fsqrt_rn((float)HEAD_DIM));
    float b0 = __fdiv_rn(__fmul_rn(p.q_deq, p.kv_deq), denom);
    float b1 = __fmul_rn(b0, 1.4426950408889634f);
    float b2 = __fmul_rn(p.o_scale, p.kv_deq);
    u32* s = reinterpret_cast<u32*>(p.sched);
    s[SCHED_TILE_COUNTER] = 0u;
    s[SCHED_BMM1] = __float_as_uint(b0);
    s[SCHED_BMM1 + 1] = __float_as_uint(b1);
    s[SCHED_BMM2] = __float_as_uint(b2);
}

// The lane's 16 values, already exact bf16, as one 32-byte store.
__device__ __forceinline__ void st_bf16x16(u8* dst, const float y[16]) {
    u32 w[8];
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = pack2(y[2 * i], y[2 * i + 1]);
    st_u4(dst, make_uint4(w[0], w[1], w[2], w[3]));
    st_u4(dst + 16, make_uint4(w[4], w[5], w[6], w[7]));
}


// The nope part of the fp8_ue8m0 store of one 512-value row held by a warp
// (lane j: values [16j, 16j+16)): the 448 nope values as e4m3 with one
// UE8M0 exponent per 64-value group at vals, and group g's exponent byte at
// scales[g] (7 bytes; the padding byte is not written). Lanes 28..31 store
// nothing. All 32 lanes must call it.
__device__ __forceinline__ void ue8m0_store_nope(u8* vals, u8* scales, const float y[16], int lane) {
    // max(0, |y[0]|, ..., |y[15]|) as a tree: the maximum is the same in any
    // order (fmaxf returns the other operand of a NaN, and 0 is in every
    // order's set), and the tree's depth is 5 instead of 16.
    float m[8];
#pragma unroll
    for (int i = 0; i < 8; i++) m[i] = fmaxf(fabsf(y[2 * i]), fabsf(y[2 * i + 1]));
#pragma unroll
    for (int w = 4; w >= 1; w >>= 1)
#pragma unroll
        for (int i = 0; i < w; i++) m[i] = fmaxf(m[i], m[i + w]);
    float a = fmaxf(m[0], 0.f);
    a = fmaxf(a, __shfl_xor_sync(FULL, a, 1));
    a = fmaxf(a, __shfl_xor_sync(FULL, a, 2));
    if (lane < 28) {
        const int e = ue8m0_exp(a);
        float inv = pow2i(127 - e);
        st_e4m3x16(vals + lane * 16, y, inv);
        if ((lane & 3) == 0) scales[lane >> 2] = (u8)e;
    }
}

// The whole fp8_ue8m0 store of the row: ue8m0_store_nope, and the 64 rope
// values as bf16 at vals + UE8M0_ROPE_OFFSET from lanes 28..31. The
// streaming KV kernels and the compressor's entries (compress.cu) share it.
__device__ __forceinline__ void ue8m0_store(u8* vals, u8* scales, const float y[16], int lane) {
    ue8m0_store_nope(vals, scales, y, lane);
    if (lane >= 28) st_bf16x16(vals + UE8M0_ROPE_OFFSET + (lane - 28) * 32, y);
}

// Token slot off's row in a cache page of format FMT: its first value byte.
// ue8m0_scales: its scale bytes (FP8_UE8M0), which sit after the page's
// values.
template <int FMT>
__device__ __forceinline__ u8* kv_row(u8* page, int off) {
    const int bytes = FMT == FMT_BF16             ? BF16_TOKEN_BYTES
                      : FMT == FMT_FP8_PERTENSOR ? FP8_PERTENSOR_TOKEN_BYTES
                                                 : UE8M0_VALUE_BYTES;
    return page + (size_t)off * bytes;
}
__device__ __forceinline__ u8* ue8m0_scales(const Params& p, u8* page, int off) {
    return page + UE8M0_VALUE_BYTES * (1 << p.page_size_log2) + off * UE8M0_SCALE_BYTES;
}

// The lane's 16 finished KV values stored in token slot off of the page.
// NOPE_ONLY: lanes 28..31 store nothing (the direct path's row, whose rope
// tail kv_store_rope_pair stores a pair a lane).
template <int FMT, bool NOPE_ONLY = false>
__device__ __forceinline__ void kv_store(const Params& p, u8* page, int off, const float y[16], int lane) {
    u8* row = kv_row<FMT>(page, off);
    if (FMT == FMT_FP8_UE8M0) {
        if (NOPE_ONLY)
            ue8m0_store_nope(row, ue8m0_scales(p, page, off), y, lane);
        else
            ue8m0_store(row, ue8m0_scales(p, page, off), y, lane);
    } else if (!NOPE_ONLY || lane < NOPE_DIM / 16) {
        if (FMT == FMT_BF16)
            st_bf16x16(row + lane * 32, y);
        else  // FP8_PERTENSOR
            st_e4m3x16(row + lane * 16, y, p.scale);
    }
}

// Rope pair j = lane of the row (values NOPE_DIM+2j and NOPE_DIM+2j+1, a
// and c, finished) stored in token slot off of the page, in the bytes
// kv_store gives the rope tail.
template <int FMT>
__device__ __forceinline__ void kv_store_rope_pair(const Params& p, u8* page, int off, float a, float c, int lane) {
    u8* row = kv_row<FMT>(page, off);
    if (FMT == FMT_BF16)
        reinterpret_cast<u32*>(row + 2 * NOPE_DIM)[lane] = pack2(a, c);
    else if (FMT == FMT_FP8_PERTENSOR)
        reinterpret_cast<u16*>(row + NOPE_DIM)[lane] = (u16)e4m3x2(__fmul_rn(c, p.scale), __fmul_rn(a, p.scale));
    else  // FP8_UE8M0
        reinterpret_cast<u32*>(row + UE8M0_ROPE_OFFSET)[lane] = pack2(a, c);
}

__device__ __forceinline__ void load_rope(float cs[16], const float* rope, int pos, int lane) {
    const float* src = rope + (size_t)pos * 64 + (lane - 28) * 16;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float4 t = ld_f4(src + 4 * q);
        cs[4 * q] = t.x; cs[4 * q + 1] = t.y; cs[4 * q + 2] = t.z; cs[4 * q + 3] = t.w;
    }
}

// Rotate one pair (y0, y1) with its (c, s): DESIGN.md section 4 step 4.
__device__ __forceinline__ void rope_pair(float& y0, float& y1, float c, float s) {
    float r0 = __fsub_rn(__fmul_rn(y0, c), __fmul_rn(y1, s));
    float r1 = __fadd_rn(__fmul_rn(y0, s), __fmul_rn(y1, c));
    round2(r0, r1);
    y0 = r0;
    y1 = r1;
}

// Rotate the lane's 8 pairs (lanes 28..31) with their (cos, sin).
__device__ __forceinline__ void rope_pairs(float y[16], const float cs[16]) {
#pragma unroll
    for (int k = 0; k < 8; k++) rope_pair(y[2 * k], y[2 * k + 1], cs[2 * k], cs[2 * k + 1]);
}

// The RoPE row spread over the warp: lane j holds pair j's (cos, sin), two
// registers instead of sixteen (the direct path keeps it across the wait).
__device__ __forceinline__ float2 load_rope_pair(const float* rope, int pos, int lane) {
    return __ldg(reinterpret_cast<const float2*>(rope + (size_t)pos * 64 + 2 * lane));
}

// ---- One row: the arithmetic both paths share ------------------------------
// The streaming pipeline and the direct path differ only in how a row
// reaches the registers (va, vb: the lane's 32 bytes of the row), where the
// metadata comes from and which lane rotates a RoPE pair (the KV pipeline:
// lanes 28..31, eight pairs each, as compress.cu; the direct path and every
// Q row: lane j rotates pair j); the arithmetic (warp_rms_inv, kv_norm_pair,
// rope_pair, the e4m3 and UE8M0 packing) is shared, so the paths cannot
// produce different bytes, and the conformance suite runs both.

// One pair of the KV row's RMSNorm with the weight: bf16(fl(fl(x*r)*w)).
__device__ __forceinline__ void kv_norm_pair(float& a, float& c, float r, float wa, float wc) {
    a = __fmul_rn(__fmul_rn(a, r), wa);
    c = __fmul_rn(__fmul_rn(c, r), wc);
    round2(a, c);
}

// The KV row's RMSNorm with the weight w (the lane's 16 values): x (the
// lane's 32 bytes of the row) becomes bf16(fl(fl(x*r)*w)); r is returned.
__device__ __forceinline__ float kv_norm(const Params& p, uint4 va, uint4 vb, const float w[16], float x[16]) {
    unpack16(va, vb, x);
    const float r = warp_rms_inv(x, p.eps);
#pragma unroll
    for (int k = 0; k < 8; k++) kv_norm_pair(x[2 * k], x[2 * k + 1], r, w[2 * k], w[2 * k + 1]);
    return r;
}

// The lane's 16 finished Q values stored at dst in the Q format (UNIT:
// q_scale is 1).
template <int QFMT, bool UNIT>
__device__ __forceinline__ void q_store(const Params& p, u8* dst, const float x[16]) {
    if (QFMT == QFMT_BF16)
        st_bf16x16(dst, x);
    else
        st_e4m3x16<UNIT>(dst, x, p.scale);
}

// A padding (or unresolvable) Q row is written as zeros: the lane's 16 values.
template <int QFMT>
__device__ __forceinline__ void q_zero(u8* dst) {
    st_u4(dst, make_uint4(0, 0, 0, 0));
    if (QFMT == QFMT_BF16) st_u4(dst + 16, make_uint4(0, 0, 0, 0));
}

// One Q row, its RoPE tail spread over the warp (both paths): lane j
// also owns rope pair j (values NOPE_DIM+2j and NOPE_DIM+2j+1, the 4-byte
// word tail, with its (cos, sin) in cs as load_rope_pair left them), so
// the rotation takes no shuffles and each lane rotates one pair instead of
// lanes 28..31 rotating eight each (a third fewer instructions a row,
// which a decode layer's burst of rows is bound by). The arithmetic is
// the same on the same values: bf16(fl(x*r)) (the Q norm has no weight),
// then rope_pair. Lanes 28..31 still give their 16 values' squares to the
// norm but store nothing of their own; every lane stores its pair. dst is
// the row's first byte; UNIT: q_scale is 1 (see scaled).
//
// STAGED (bf16 rows of the streaming pipeline): the row goes through the
// warp's Q_STAGE_BYTES of shared memory at stage, and leaves it in two
// 16-byte stores a lane, each instruction writing 512 contiguous bytes;
// stored straight from the lanes, each of a lane's two 16-byte stores would
// write half of every 32-byte sector of 896 bytes (3-4 points of the copy
// bandwidth at 16K-64K context tokens: BENCHMARKS.md). The stage must not
// be in use by another row of the warp; it is free again on return.
template <int QFMT, bool UNIT, bool STAGED = false>
__device__ __forceinline__ void q_row_spread(const Params& p, u8* dst, uint4 va, uint4 vb, u32 tail, float2 cs, int lane,
                                             u8* stage = nullptr) {
    static_assert(!STAGED || QFMT == QFMT_BF16, "only bf16 rows are staged");
    float x[16];
    unpack16(va, vb, x);
    const float r = warp_rms_inv(x, p.eps);
    if (lane < NOPE_DIM / 16) {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float a = __fmul_rn(x[2 * k], r), c = __fmul_rn(x[2 * k + 1], r);
            round2(a, c);
            x[2 * k] = a;
            x[2 * k + 1] = c;
        }
        if (STAGED)
            st_bf16x16(stage + lane * 32, x);
        else
            q_store<QFMT, UNIT>(p, dst + lane * 16 * (QFMT == QFMT_BF16 ? 2 : 1), x);
    }
    float a = __fmul_rn(bf16_to_f32(tail & 0xffffu), r), c = __fmul_rn(bf16_to_f32(tail >> 16), r);
    round2(a, c);
    rope_pair(a, c, cs.x, cs.y);
    if (STAGED) {
        reinterpret_cast<u32*>(stage + 2 * NOPE_DIM)[lane] = pack2(a, c);
        __syncwarp();  // the row is in the stage: every lane reads other lanes' bytes
        const uint4 lo = *reinterpret_cast<const uint4*>(stage + 16 * lane);
        const uint4 hi = *reinterpret_cast<const uint4*>(stage + Q_STAGE_BYTES / 2 + 16 * lane);
        __syncwarp();  // every lane has read the stage: the next row may write it
        st_u4(dst + 16 * lane, lo);
        st_u4(dst + Q_STAGE_BYTES / 2 + 16 * lane, hi);
    } else if (QFMT == QFMT_BF16) {
        reinterpret_cast<u32*>(dst + 2 * NOPE_DIM)[lane] = pack2(a, c);
    } else {
        reinterpret_cast<u16*>(dst + NOPE_DIM)[lane] = (u16)e4m3x2(scaled<UNIT>(c, p.scale), scaled<UNIT>(a, p.scale));
    }
}

// The kv_a_layernorm weight of the lane's 16 values.
__device__ __forceinline__ void load_weight(float w[16], const float* weight, int lane) {
    const float* wp = weight + lane * 16;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float4 t = ld_f4(wp + 4 * q);
        w[4 * q] = t.x; w[4 * q + 1] = t.y; w[4 * q + 2] = t.z; w[4 * q + 3] = t.w;
    }
}

// ---- The streaming pipeline -------------------------------------------------
// Each KV warp owns a contiguous range of rows. Q warps take chunks of
// Q_CHUNK consecutive rows in turn (warp w of W the chunks w, w+W, ...), so
// that the rows in flight across the grid at any moment lie close together
// in memory, as a copy's do (2 to 5 points more of the copy's bandwidth at
// 16K and 64K context tokens than contiguous ranges: cudatune.DefaultQChunk).
// Each warp keeps DEPTH rows in flight:
// cp.async copies row i+DEPTH into shared memory while row i is computed, so
// the loads never wait for the arithmetic. Each lane copies its own 32 bytes
// of a row and waits for them with its own cp.async.wait_group; a KV lane
// reads only those, a Q lane also the RoPE tail word lanes 28..31 copied,
// after a __syncwarp. Slot indices are compile-time constants
// (the loop over a ring is unrolled), so per-row metadata stays in registers.
// A Q warp writing bf16 passes each finished row through its own stage after
// the rings (q_row_spread's STAGED), so its stores are contiguous.

#ifndef PIPE_WARPS
#define PIPE_WARPS 8
#endif
#ifndef KV_DEPTH
#define KV_DEPTH 4
#endif
#ifndef Q_DEPTH
#define Q_DEPTH 4
#endif
// The run of consecutive (token, head) rows a Q warp takes before the
// grid's other warps take theirs (cudatune.Knobs.QChunk).
#ifndef Q_CHUNK
#define Q_CHUNK 8
#endif

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void lds32(u32 addr, uint4& a, uint4& b) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w) : "r"(addr));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w) : "r"(addr + 16));
}

// The warp's contiguous share of n work rows.
// blk and nblk are the block's index and the block count of its part of
// the grid (a fused layer launch splits one grid between KV and Q).
__device__ __forceinline__ void warp_range(int n, int blk, int nblk, int& begin, int& end) {
    const int gw = blk * PIPE_WARPS + (threadIdx.x >> 5);
    const int nw = nblk * PIPE_WARPS;
    const int per = (n + nw - 1) / nw;
    begin = min(gw * per, n);
    end = min(begin + per, n);
}

// KV row resolution with the last sequence and page cached in registers:
// consecutive rows mostly stay in one sequence and one page.
struct KVState {
    int b;       // batch index of the last row, -1 before the first
    int next;    // context: first token row of sequence b+1
    int base;    // context: pos = t + base; generation: pos = base + r
    int lp, pp;  // last logical page and its physical page
};

__device__ __forceinline__ bool kv_resolve(const Params& p, KVState& st, int local, int& page, int& off, int& pos) {
    if (local >= p.valid_rows) return false;
    const int t = p.row_begin + local;
    if (p.seq_len == 0) {
        if (st.b < 0 || t >= st.next) {
            int b;
            if (st.b < 0) {  // first row of the warp: warp-wide search
                b = warp_find_seq(p, t);
            } else {  // rows ascend: walk forward
                b = st.b;
                while (b + 1 < p.seq_begin + p.num_seqs && __ldg(p.cu_q + b + 1) <= t) b++;
            }
            st.b = b;
            seq_span(p, b, st.next, st.base);
            st.lp = -1;
        }
        pos = t + st.base;
    } else {
        int g, r;
        split_index(local, p.seq_len, p.seq_len_log2, g, r);
        const int b = p.seq_begin + g;
        if (b != st.b) {
            st.b = b;
            st.base = __ldg(p.kv_len + b) - p.seq_len;
            st.lp = -1;
        }
        pos = st.base + r;
    }
    if (pos < 0 || pos >= p.rope_positions) return false;
    const int lp = pos >> p.page_size_log2;
    if (lp != st.lp) {
        st.lp = lp;
        st.pp = __ldg(p.block_tables + (size_t)st.b * p.page_stride + lp);
    }
    if (st.pp < 0 || st.pp >= p.num_pages) return false;
    page = st.pp;
    off = pos & ((1 << p.page_size_log2) - 1);
    return true;
}

// The rings' sizes: abi.StreamingSharedBytes (the host checks them against
// the 48 KiB of static shared memory a block).
#define KV_RING_BYTES (PIPE_WARPS * KV_DEPTH * KV_SLOT_BYTES)
#define Q_RING_BYTES (PIPE_WARPS * (Q_DEPTH * Q_SLOT_BYTES + Q_STAGE_BYTES))

template <int FMT>
__device__ __forceinline__ void kv_pipeline(const Params& p0, u8* ring, int blk, int nblk) {
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    // The header and the weight are never written by a grid in flight (the
    // host uploads the metadata before the iteration's first kernel): read
    // them before the wait.
    const Params p = with_header(p0);
    float w[16];
    load_weight(w, p.weight, lane);
    pdl_wait();
    if (p.write_sched && blk == 0 && threadIdx.x == 0) write_scheduler(p);
    int begin, end;
    warp_range(p.rows, blk, nblk, begin, end);
    KVState st;
    st.b = -1;
    int page[KV_DEPTH], off[KV_DEPTH];
    u8* const wring = ring + wib * KV_DEPTH * KV_SLOT_BYTES;
    const u32 base = smem_u32(wring);
    auto issue = [&](int i, int d) {
        int pos;
        page[d] = -1;
        if (i < end) {
            // The row's load depends only on its index: start it before the
            // metadata lookups, which then overlap it.
            const u8* src = p.in + (size_t)(p.row_begin + i) * p.in_stride + lane * 32;
            const u32 dst = base + d * KV_SLOT_BYTES + lane * 32;
            cp16(dst, src);
            cp16(dst + 16, src + 16);
        }
        if (i < end && kv_resolve(p, st, i, page[d], off[d], pos)) {
            if (lane >= 28) {
                const float* cs = p.rope + (size_t)pos * 64 + (lane - 28) * 16;
                const u32 rd = base + d * KV_SLOT_BYTES + 2 * HEAD_DIM + (lane - 28) * 64;
#pragma unroll
                for (int q = 0; q < 4; q++) cp16(rd + 16 * q, cs + 4 * q);
            }
        }
        cp_commit();
    };
#pragma unroll
    for (int d = 0; d < KV_DEPTH; d++) issue(begin + d, d);
    pdl_trigger();
    for (int row = begin; row < end; row += KV_DEPTH) {
#pragma unroll
        for (int d = 0; d < KV_DEPTH; d++) {
            const int i = row + d;
            if (i < end) {
                cp_wait<KV_DEPTH - 1>();
                if (page[d] >= 0) {  // warp-uniform
                    uint4 va, vb;
                    lds32(base + d * KV_SLOT_BYTES + lane * 32, va, vb);
                    float cs[16];
                    if (lane >= 28) {
                        const u8* rp = wring + d * KV_SLOT_BYTES + 2 * HEAD_DIM + (lane - 28) * 64;
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            float4 t = *reinterpret_cast<const float4*>(rp + 16 * q);
                            cs[4 * q] = t.x; cs[4 * q + 1] = t.y; cs[4 * q + 2] = t.z; cs[4 * q + 3] = t.w;
                        }
                    }
                    float x[16];
                    kv_norm(p, va, vb, w, x);
                    if (lane >= 28) rope_pairs(x, cs);
                    kv_store<FMT>(p, p.out + (size_t)page[d] * p.page_bytes, off[d], x, lane);
                }
                issue(i + KV_DEPTH, d);
            }
        }
    }
    cp_wait<0>();
}

#define KV_KERNEL(NAME, FMT)                                                                   \
    extern "C" __global__ void __launch_bounds__(PIPE_WARPS * 32) NAME(const Params p) {       \
        __shared__ __align__(16) u8 ring[KV_RING_BYTES];                                       \
        kv_pipeline<FMT>(p, ring, blockIdx.x, gridDim.x);                                      \
    }
#ifndef PROLOGUE_HELPERS_ONLY  // compress.cu reuses the helpers without these kernels
KV_KERNEL(kv_fp8_ue8m0, FMT_FP8_UE8M0)
KV_KERNEL(kv_bf16, FMT_BF16)
KV_KERNEL(kv_fp8_pertensor, FMT_FP8_PERTENSOR)
#endif

// A Q warp's context rows resolved with their last sequence's token range
// cached in registers: a warp's chunks ascend, and consecutive chunks
// mostly fall in one sequence, so a token costs no metadata load until the
// sequence changes (then warp_find_seq, as resolve). The same position as
// resolve: cu_q ascends, so a token in [cu_q[b], cu_q[b+1]) has b as the
// last sequence starting at or before it, and the last sequence's range
// has no end. Generation rows take resolve.
struct QCtxState {
    int lo, next;  // tokens [lo, next) are one sequence (empty before the first)
    int base;      // its pos = t + base
};

__device__ __forceinline__ bool q_resolve(const Params& p, QCtxState& st, int local, int& pos) {
    if (p.seq_len != 0) {
        int b;
        return resolve(p, local, b, pos);
    }
    if (local >= p.valid_rows) return false;
    const int t = p.row_begin + local;
    if (t < st.lo || t >= st.next) {
        st.lo = seq_span(p, warp_find_seq(p, t), st.next, st.base);
    }
    pos = t + st.base;
    return pos >= 0 && pos < p.rope_positions;
}

// Q: the work rows are (token, head) pairs of the launch; a token's position
// and RoPE row are resolved once when the warp reaches its first head.
template <int QFMT, bool UNIT>
__device__ __forceinline__ void q_pipeline(const Params& p0, u8* ring, int blk, int nblk) {
    constexpr bool BF16OUT = QFMT == QFMT_BF16;
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const int es = BF16OUT ? 2 : 1;
    const Params p = with_header(p0);  // metadata: before the wait
    pdl_wait();
    const int n = p.rows * p.heads;
    const int gw = blk * PIPE_WARPS + wib, nw = nblk * PIPE_WARPS;
    const int heads_log2 = pow2_log2(p.heads);
    // The warp's k-th row: chunks of Q_CHUNK consecutive rows dealt round
    // robin to the grid's warps.
    auto row_of = [&](int k) { return (gw + (k / Q_CHUNK) * nw) * Q_CHUNK + k % Q_CHUNK; };
    const size_t row0 = (size_t)p.row_begin * p.heads;
    const u32 base = smem_u32(ring + wib * Q_DEPTH * Q_SLOT_BYTES);
    // The warp's bf16 stage, after every warp's ring.
    u8* const stage = ring + PIPE_WARPS * Q_DEPTH * Q_SLOT_BYTES + wib * Q_STAGE_BYTES;
    auto issue = [&](int k, int d) {
        const int i = row_of(k);
        if (i < n) {
            const u8* src = p.in + (row0 + i) * 1024 + lane * 32;
            const u32 dst = base + d * Q_SLOT_BYTES + lane * 32;
            cp16(dst, src);
            cp16(dst + 16, src + 16);
        }
        cp_commit();
    };
#pragma unroll
    for (int d = 0; d < Q_DEPTH; d++) issue(d, d);
    pdl_trigger();
    int tok = -1;
    bool live = false;
    float2 cs = make_float2(0.f, 0.f);
    QCtxState st{0x7fffffff, -0x7fffffff - 1, 0};
    for (int k0 = 0; row_of(k0) < n; k0 += Q_DEPTH) {
#pragma unroll
        for (int d = 0; d < Q_DEPTH; d++) {
            const int i = row_of(k0 + d);
            if (i < n) {
                const int t = index_quotient(i, p.heads, heads_log2);
                if (t != tok) {
                    tok = t;
                    int pos;
                    live = q_resolve(p, st, t, pos);
                    if (live) cs = load_rope_pair(p.rope, pos, lane);
                }
                cp_wait<Q_DEPTH - 1>();
                // The tail word a lane reads was copied by lanes 28..31, and
                // their next copy into the slot must wait until every lane
                // has read it: each lane's wait covers only its own copies,
                // so the warp meets before the reads and after them.
                __syncwarp();
                uint4 va, vb;
                u32 tail = 0;
                if (live) {
                    lds32(base + d * Q_SLOT_BYTES + lane * 32, va, vb);
                    tail = *reinterpret_cast<const u32*>(ring + (wib * Q_DEPTH + d) * Q_SLOT_BYTES + 2 * NOPE_DIM + 4 * lane);
                }
                __syncwarp();
                issue(k0 + d + Q_DEPTH, d);
                u8* dst = p.out + (row0 + i) * 512 * es;
                if (!live)
                    q_zero<QFMT>(dst + lane * 16 * es);
                else
                    q_row_spread<QFMT, UNIT, BF16OUT>(p, dst, va, vb, tail, cs, lane, stage);
            }
        }
    }
    cp_wait<0>();
}

// FP8 Q at q_scale 1 (the default) runs the UNIT instantiation: the same
// bytes without a multiplication a value (see scaled).
template <int QFMT>
__device__ __forceinline__ void run_q_pipeline(const Params& p, u8* ring, int blk, int nblk) {
    if (QFMT == QFMT_FP8 && p.scale == 1.f)
        q_pipeline<QFMT, true>(p, ring, blk, nblk);
    else
        q_pipeline<QFMT, false>(p, ring, blk, nblk);
}

#define Q_KERNEL(NAME, QFMT)                                                                   \
    extern "C" __global__ void __launch_bounds__(PIPE_WARPS * 32) NAME(const Params p) {       \
        __shared__ __align__(16) u8 ring[Q_RING_BYTES];                                        \
        run_q_pipeline<QFMT>(p, ring, blockIdx.x, gridDim.x);                                  \
    }
#ifndef PROLOGUE_HELPERS_ONLY  // compress.cu reuses the helpers without these kernels
Q_KERNEL(q_fp8, QFMT_FP8)
Q_KERNEL(q_bf16, QFMT_BF16)
#endif

// A whole layer's launch in one grid: blocks [0, kv_blocks) run the KV
// pipeline over the launch's latent rows, the rest the Q pipeline over its
// (token, head) rows. The two parts touch disjoint memory, so they run side
// by side and the KV part's fixed latency hides under the Q part's stream.
#define RING_BYTES (KV_RING_BYTES > Q_RING_BYTES ? KV_RING_BYTES : Q_RING_BYTES)
#define LAYER_KERNEL(NAME, FMT, QFMT)                                                          \
    extern "C" __global__ void __launch_bounds__(PIPE_WARPS * 32)                              \
        NAME(const Params kv, const Params q, const int kv_blocks) {                           \
        __shared__ __align__(16) u8 ring[RING_BYTES];                                          \
        if ((int)blockIdx.x < kv_blocks)                                                       \
            kv_pipeline<FMT>(kv, ring, blockIdx.x, kv_blocks);                                 \
        else                                                                                   \
            run_q_pipeline<QFMT>(q, ring, blockIdx.x - kv_blocks, gridDim.x - kv_blocks);      \
    }
#ifndef PROLOGUE_HELPERS_ONLY  // compress.cu reuses the helpers without these kernels
LAYER_KERNEL(layer_fp8_ue8m0_qfp8, FMT_FP8_UE8M0, QFMT_FP8)
LAYER_KERNEL(layer_fp8_ue8m0_qbf16, FMT_FP8_UE8M0, QFMT_BF16)
LAYER_KERNEL(layer_bf16_qfp8, FMT_BF16, QFMT_FP8)
LAYER_KERNEL(layer_bf16_qbf16, FMT_BF16, QFMT_BF16)
LAYER_KERNEL(layer_fp8_pertensor_qfp8, FMT_FP8_PERTENSOR, QFMT_FP8)
LAYER_KERNEL(layer_fp8_pertensor_qbf16, FMT_FP8_PERTENSOR, QFMT_BF16)
#endif

#ifndef PROLOGUE_HELPERS_ONLY  // the direct path: kernels and their helpers, not needed by compress.cu

// ---- The direct path ----------------------------------------------------------
// Small batches, and bf16 Q at every size (the host picks this path per
// launch: cudatune.Knobs.DirectMaxRows, DirectMaxRowsBF16). Latency, not
// bandwidth, sets a small batch's time; a large bf16 Q launch, writing as
// many bytes as it reads, moves them faster in this one-pass grid than
// through the streaming rings. One warp per latent row, one per DIRECT_QROWS (token, head) rows,
// and the grid covers every row, so a warp's only global round trip after
// the wait is its own rows (two 16-byte loads a lane each, straight into
// registers: lane j holds the canonical partial j; and the 4-byte word of
// rope pair j, which lane j rotates). No shared memory, so
// the next grid's blocks can become resident beside this one's.
//
// Ordering under programmatic dependent launch: the next grid may launch as
// soon as every block of this one has started (pdl_trigger first), and runs
// up to its own pdl_wait beside it. Before the wait a grid reads only what
// no grid in flight writes: the launch parameters, the metadata (header,
// kv_len, cu_q, cached, block tables: uploaded by the host before the
// iteration's first kernel, read-only on the device), the RoPE table and
// the kv_a_layernorm weight; and, first of all, it asks L2 to fetch its
// own rows (prefetch_l2, a hint that reads nothing), which the launch's
// shape alone names: a warp that starts late (V4-Pro's decode grid takes
// two waves) has its rows on the way while it reads the header and
// resolves its token, and padding rows, inside the buffers too, may be
// fetched for nothing. The rows the previous kernel
// may produce (the latent, QIn) are read, and every byte (cache, QOut,
// scheduler region) is written, only after the wait. Every thread waits
// before it exits, even one without a row, so this grid never completes
// ahead of the grids it follows.

// Warps a block at most (__launch_bounds__); a launch picks its block's
// warps (Knobs.DirectBlockWarps: half as many for a grid of more than a
// wave), and every index follows blockDim.
#ifndef DIRECT_WARPS
#define DIRECT_WARPS 4
#endif
// (Token, head) rows a Q warp owns.
#ifndef DIRECT_QROWS
#define DIRECT_QROWS 2
#endif
// Blocks a multiprocessor must be able to hold (__launch_bounds__' second
// argument: it caps the registers a thread, so 1 leaves them to the compiler).
#ifndef DIRECT_MIN_BLOCKS
#define DIRECT_MIN_BLOCKS 1
#endif

// Ask L2 to fetch bytes [p, p+n) (n a multiple of 16, p 16-byte aligned)
// ahead of the wait: a hint without semantics, so the grid in flight may
// still write them. L2 is where its writes land and where the loads after
// the wait (ld_row32: L2 only) read, so they see every byte it wrote and
// find the rest already out of DRAM instead of starting a round trip.
__device__ __forceinline__ void prefetch_l2(const void* p, u32 n) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
}

// The lane's 32 bytes of a row written by an earlier grid: two 16-byte loads
// cached in L2 only (the point of coherence with the grid that wrote them).
__device__ __forceinline__ void ld_row32(const u8* src, uint4& a, uint4& b) {
    a = __ldcg(reinterpret_cast<const uint4*>(src));
    b = __ldcg(reinterpret_cast<const uint4*>(src + 16));
}

// One KV row on the direct path, its RoPE tail spread over the warp as
// q_row_spread's: lane j also owns rope pair j (the row's 4-byte word tail,
// kv_a_layernorm's weight pair wt, the (cos, sin) in cs), so the rotation
// takes no shuffles and lanes 28..31 do not rotate eight pairs each while
// the rest wait. The arithmetic is kv_norm's, bf16(fl(fl(x*r)*w)), then
// rope_pair, on the same values; lanes 28..31 give their 16 values' squares
// to the norm but store nothing of their own (kv_store's NOPE_ONLY), every
// lane stores its pair (kv_store_rope_pair).
template <int FMT>
__device__ __forceinline__ void kv_row_spread(const Params& p, u8* page, int off, uint4 va, uint4 vb, const float w[16],
                                              u32 tail, float2 wt, float2 cs, int lane) {
    float x[16];
    const float r = kv_norm(p, va, vb, w, x);
    float a = bf16_to_f32(tail & 0xffffu), c = bf16_to_f32(tail >> 16);
    kv_norm_pair(a, c, r, wt.x, wt.y);
    rope_pair(a, c, cs.x, cs.y);
    kv_store<FMT, true>(p, page, off, x, lane);
    kv_store_rope_pair<FMT>(p, page, off, a, c, lane);
}

// KV: warp i of the part owns latent row i of the launch; it asks L2 for the
// row before it resolves the row's slot.
template <int FMT>
__device__ __forceinline__ void kv_direct(const Params& p0, int blk) {
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int i = blk * (blockDim.x >> 5) + (threadIdx.x >> 5);  // warp-uniform
    const u8* row = p0.in + (size_t)(p0.row_begin + i) * p0.in_stride;
    if (lane == 0 && i < p0.rows) prefetch_l2(row, 2 * HEAD_DIM);
    const Params p = with_header(p0);
    float w[16];
    load_weight(w, p.weight, lane);
    const float2 wt = __ldg(reinterpret_cast<const float2*>(p.weight + NOPE_DIM) + lane);
    KVState st;
    st.b = -1;
    int page = -1, off = 0, pos = 0;
    const bool live = i < p.rows && kv_resolve(p, st, i, page, off, pos);
    float2 cs = make_float2(0.f, 0.f);
    if (live) cs = load_rope_pair(p.rope, pos, lane);
    pdl_wait();
    if (p.write_sched && blk == 0 && threadIdx.x == 0) write_scheduler(p);
    if (!live) return;  // padding, a slot outside the pool: no byte changes
    uint4 va, vb;
    ld_row32(row + lane * 32, va, vb);
    const u32 tail = __ldcg(reinterpret_cast<const u32*>(row + 2 * NOPE_DIM) + lane);
    kv_row_spread<FMT>(p, p.out + (size_t)page * p.page_bytes, off, va, vb, w, tail, wt, cs, lane);
}

// Q: warp w of the part owns (token, head) rows [w*R, w*R+R) of the launch,
// R = DIRECT_QROWS. Before the wait it asks L2 for its rows, then resolves
// its first token; after it, row k+1's loads go out before row k's arithmetic
// (the registers of two rows whatever R is). The compiler issues them once
// row k's have arrived (it copies row k's registers first); loading both
// rows together was slower (bench/results/2026-12-01-h200-i). A row's loads
// depend only on its index, not on its token's metadata; a later token of
// the warp (a row past a token's last head) is resolved when its first row
// is reached, so the warp holds one token's liveness and RoPE pair, not
// one per row.
template <int QFMT, bool UNIT>
__device__ __forceinline__ void q_direct(const Params& p0, int blk) {
    constexpr int R = DIRECT_QROWS;
    pdl_trigger();
    const int es = QFMT == QFMT_BF16 ? 2 : 1;
    const int lane = threadIdx.x & 31;
    const int i0 = (blk * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;  // warp-uniform
    const int n = p0.rows * p0.heads;                          // the launch's rows, padding included
    const size_t r0 = (size_t)p0.row_begin * p0.heads + i0;
#pragma unroll
    for (int k = 0; k < R; k++)
        if (lane == k && i0 + k < n) prefetch_l2(p0.in + (r0 + k) * 1024, 1024);
    const Params p = with_header(p0);
    const int nv = min(p.valid_rows, p.rows) * p.heads;        // those with an input row to read
    // Row i0's token and head; the next rows step the head.
    int t, h;
    split_index(i0, p.heads, pow2_log2(p.heads), t, h);
    int tok = t;
    bool live = false;
    float2 cs = make_float2(0.f, 0.f);
    if (i0 < n) {
        int b, pos;
        live = resolve(p, t, b, pos);
        if (live) cs = load_rope_pair(p.rope, pos, lane);
    }
    pdl_wait();
    auto load = [&](int k, uint4& a, uint4& b, u32& tl) {
        const u8* row = p.in + (r0 + k) * 1024;
        ld_row32(row + lane * 32, a, b);
        tl = __ldcg(reinterpret_cast<const u32*>(row + 2 * NOPE_DIM) + lane);
    };
    uint4 va = make_uint4(0, 0, 0, 0), vb = va;
    u32 tail = 0;
    if (i0 < nv) load(0, va, vb, tail);
#pragma unroll
    for (int k = 0; k < R; k++) {
        if (i0 + k >= n) break;
        const uint4 ca = va, cb = vb;
        const u32 ct = tail;
        if (k + 1 < R && i0 + k + 1 < nv) load(k + 1, va, vb, tail);
        if (t != tok) {
            tok = t;
            int b, pos;
            live = resolve(p, t, b, pos);
            if (live) cs = load_rope_pair(p.rope, pos, lane);
        }
        u8* row = p.out + (r0 + k) * 512 * es;
        if (!live) {
            q_zero<QFMT>(row + lane * 16 * es);
        } else {
            q_row_spread<QFMT, UNIT>(p, row, ca, cb, ct, cs, lane);
        }
        if (++h == p.heads) { h = 0; t++; }
    }
}

// q_direct's UNIT instantiation at q_scale 1, as run_q_pipeline.
template <int QFMT>
__device__ __forceinline__ void run_q_direct(const Params& p, int blk) {
    if (QFMT == QFMT_FP8 && p.scale == 1.f)
        q_direct<QFMT, true>(p, blk);
    else
        q_direct<QFMT, false>(p, blk);
}

#define KV_DIRECT_KERNEL(NAME, FMT)                                                            \
    extern "C" __global__ void __launch_bounds__(DIRECT_WARPS * 32, DIRECT_MIN_BLOCKS)         \
        NAME(const Params p) {                                                                 \
        kv_direct<FMT>(p, blockIdx.x);                                                         \
    }
KV_DIRECT_KERNEL(kv_fp8_ue8m0_direct, FMT_FP8_UE8M0)
KV_DIRECT_KERNEL(kv_bf16_direct, FMT_BF16)
KV_DIRECT_KERNEL(kv_fp8_pertensor_direct, FMT_FP8_PERTENSOR)

#define Q_DIRECT_KERNEL(NAME, QFMT)                                                            \
    extern "C" __global__ void __launch_bounds__(DIRECT_WARPS * 32, DIRECT_MIN_BLOCKS)         \
        NAME(const Params p) {                                                                 \
        run_q_direct<QFMT>(p, blockIdx.x);                                                     \
    }
Q_DIRECT_KERNEL(q_fp8_direct, QFMT_FP8)
Q_DIRECT_KERNEL(q_bf16_direct, QFMT_BF16)

// The fused layer grid of the direct path: blocks [0, kv_blocks) own the
// launch's latent rows, one warp each, the rest its (token, head) rows,
// DIRECT_QROWS a warp.
#define LAYER_DIRECT_KERNEL(NAME, FMT, QFMT)                                                   \
    extern "C" __global__ void __launch_bounds__(DIRECT_WARPS * 32, DIRECT_MIN_BLOCKS)         \
        NAME(const Params kv, const Params q, const int kv_blocks) {                           \
        if ((int)blockIdx.x < kv_blocks)                                                       \
            kv_direct<FMT>(kv, blockIdx.x);                                                    \
        else                                                                                   \
            run_q_direct<QFMT>(q, blockIdx.x - kv_blocks);                                     \
    }
LAYER_DIRECT_KERNEL(layer_fp8_ue8m0_qfp8_direct, FMT_FP8_UE8M0, QFMT_FP8)
LAYER_DIRECT_KERNEL(layer_fp8_ue8m0_qbf16_direct, FMT_FP8_UE8M0, QFMT_BF16)
LAYER_DIRECT_KERNEL(layer_bf16_qfp8_direct, FMT_BF16, QFMT_FP8)
LAYER_DIRECT_KERNEL(layer_bf16_qbf16_direct, FMT_BF16, QFMT_BF16)
LAYER_DIRECT_KERNEL(layer_fp8_pertensor_qfp8_direct, FMT_FP8_PERTENSOR, QFMT_FP8)
LAYER_DIRECT_KERNEL(layer_fp8_pertensor_qbf16_direct, FMT_FP8_PERTENSOR, QFMT_BF16)
#endif  // PROLOGUE_HELPERS_ONLY
