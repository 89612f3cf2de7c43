// The lightning indexer's prologue on the device (DESIGN.md section 9),
// bit-identical to the CPU backend (package compressor's FinishIndexer,
// numerics.Hadamard128 and QuantizeMXFP4). Compiled after compress.cu in
// the compressor's module (kernels/cuda.CompressSource). Same rules as
// prologue.cu: every float operation an explicit _rn intrinsic, no -ftz.
//
// One warp owns one 128-value row (a query head's or a pooled entry's):
// lane j holds values [4j, 4j+4), which is exactly partial j of the
// canonical 32-partial sum of squares at W = 128; lanes 16..31 hold the
// rope half [64, 128), two GPT-J pairs each; lanes 8b..8b+7 hold MXFP4
// block b.
//
// The Hadamard transform's butterfly stages h = 1 and 2 pair values inside
// a lane; stages h = 4..64 pair lane j with lane j ^ (h/4): the lower lane
// of a pair keeps fl(a + b), the upper fl(a - b), a being the lower's
// value, as the contract's stage pairs (j, j+h). Every stage rounds each
// result once, so the order of the stages is all that matters, and it is
// the contract's.

#include "common.cuh"  // already in through compress.cu: the guard makes it a no-op

static_assert(INDEXER_DIM == 32 * 4 && MXFP4_BLOCK == 8 * 4 && MXFP4_ROW_BYTES == INDEXER_DIM / 2 + INDEXER_DIM / MXFP4_BLOCK,
              "the warp-per-row mapping needs 128 values, 4 a lane, 32-value MXFP4 blocks");

// The e2m1 nibble of x: nearest even on {0, 0.5, 1, 1.5, 2, 3, 4, 6},
// saturating at 6, the sign in bit 3, a NaN as +6 (numerics.E2M1FromF32;
// sm_90 has no e2m1 conversion instruction).
__device__ __forceinline__ u32 e2m1(float x) {
    const u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 7u;
    const u32 s = (u >> 28) & 8u;
    const float a = __uint_as_float(u & 0x7fffffffu);
    const u32 m = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u
                : a <= 2.5f ? 4u : a < 3.5f ? 5u : a <= 5.f ? 6u : 7u;
    return s | m;
}

// e2m1 without the compare chain (the lean query, indexer_query_lean):
// below 1 the index is rint(2a), one rounding of the exact 2a + 1.5*2^23;
// from 1 on, a rounded to one mantissa bit on its bits (nearest even),
// whose exponent and bit give the index 2(exp - 127) + 2 + bit, at most 7.
// Equal to e2m1 for every float32 (kernels/cuda TestE2M1IntMatchesReference:
// its host port against numerics.E2M1FromF32, all 2^32 inputs with
// PROLOGUE_EXHAUSTIVE=1).
__device__ __forceinline__ u32 e2m1_int(float x) {
    const u32 u = __float_as_uint(x);
    const u32 b = u & 0x7fffffffu;
    const u32 lo = __float_as_uint(__fadd_rn(__fadd_rn(__uint_as_float(b), __uint_as_float(b)), 12582912.0f)) - 0x4B400000u;
    const u32 hi = min(((b + 0x1FFFFFu + ((b >> 22) & 1u)) >> 22) - 252u, 7u);
    const u32 m = b < 0x3f800000u ? lo : hi;
    return b > 0x7f800000u ? 7u : (((u >> 28) & 8u) | m);
}

// e2m1 of fl(v * inv) for v exactly a bf16 whose NaNs are the canonical
// positive one (a value after round2) and inv a power of two
// (indexer_query_wide): e2m1_int with the sign taken from v, which is the
// product's for every v but a NaN, and so without the NaN select (a NaN's
// magnitude takes the saturating branch to 7, its sign is +); below 1,
// fl(2a + 1.5*2^23) in one fma (2a is exact). Equal to e2m1_int(fl(v *
// inv)) for every such v and every block scale (kernels/cuda
// TestE2M1ScaledMatchesReference: its host port against
// numerics.E2M1FromF32 on every bf16 and every exponent).
__device__ __forceinline__ u32 e2m1_scaled(float v, float inv) {
    const u32 b = __float_as_uint(__fmul_rn(v, inv)) & 0x7fffffffu;
    const u32 lo = __float_as_uint(__fmaf_rn(__uint_as_float(b), 2.0f, 12582912.0f)) - 0x4B400000u;
    // From 1 on b >= 254 << 22: the bias' 252 subtracted before the shift.
    const u32 hi = min((b + (0x1FFFFFu - (252u << 22)) + ((b >> 22) & 1u)) >> 22, 7u);
    return ((__float_as_uint(v) >> 28) & 8u) | (b < 0x3f800000u ? lo : hi);
}

// The normalized Walsh-Hadamard transform of R rows of the warp, v[r] the
// lane's four bf16 values of row r, rounded to bf16 in place; hscale is
// fl32(128^-0.5) (numerics.HadamardScale, from the host). Every row gets
// the same operations as one alone; the rows' shuffles interleave. LEAN:
// the upper lane's fl(b - a) as fl((-a) + b), the sign flipped by an xor
// instead of both results computed and one selected (IEEE defines b - a as
// b + (-a); a NaN's payload may differ, and the bf16 rounding after the
// transform makes every NaN the canonical one).
template <int R, bool LEAN = false>
__device__ __forceinline__ void warp_hadamard_rows(float (&v)[R][4], float hscale, int lane) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        float a, b;
        a = v[r][0]; b = v[r][1]; v[r][0] = __fadd_rn(a, b); v[r][1] = __fsub_rn(a, b);  // h = 1
        a = v[r][2]; b = v[r][3]; v[r][2] = __fadd_rn(a, b); v[r][3] = __fsub_rn(a, b);
        a = v[r][0]; b = v[r][2]; v[r][0] = __fadd_rn(a, b); v[r][2] = __fsub_rn(a, b);  // h = 2
        a = v[r][1]; b = v[r][3]; v[r][1] = __fadd_rn(a, b); v[r][3] = __fsub_rn(a, b);
    }
#pragma unroll
    for (int d = 1; d <= 16; d <<= 1) {  // h = 4d
        const bool upper = lane & d;
        const u32 flip = upper ? 0x80000000u : 0u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float q[R];
#pragma unroll
            for (int r = 0; r < R; r++) q[r] = __shfl_xor_sync(FULL, v[r][i], d);
#pragma unroll
            for (int r = 0; r < R; r++)
                v[r][i] = LEAN ? __fadd_rn(__uint_as_float(__float_as_uint(v[r][i]) ^ flip), q[r])
                               : upper ? __fsub_rn(q[r], v[r][i]) : __fadd_rn(v[r][i], q[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int i = 0; i < 4; i++) v[r][i] = __fmul_rn(v[r][i], hscale);
        round2(v[r][0], v[r][1]);
        round2(v[r][2], v[r][3]);
    }
}

// The transform of the warp's one row.
__device__ __forceinline__ void warp_hadamard(float v[4], float hscale, int lane) {
    float w[1][4] = {{v[0], v[1], v[2], v[3]}};
    warp_hadamard_rows<1>(w, hscale, lane);
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = w[0][i];
}

// max |v| (NaN ignored) of each row over lane groups of LANES lanes (8: an
// MXFP4 block, 32: the whole row of the FP8 layout), R rows' shuffles
// interleaved.
template <int R, int LANES>
__device__ __forceinline__ void warp_absmax_rows(const float (&v)[R][4], float (&a)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {  // fmaxf drops a NaN operand
        if (LANES == 8) {  // an MXFP4 block's, from +0
            a[r] = 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) a[r] = fmaxf(a[r], fabsf(v[r][i]));
        } else {  // as the FP8 row's
            a[r] = fmaxf(fmaxf(fabsf(v[r][0]), fabsf(v[r][1])), fmaxf(fabsf(v[r][2]), fabsf(v[r][3])));
        }
    }
#pragma unroll
    for (int d = 1; d < LANES; d <<= 1) {
        float q[R];
#pragma unroll
        for (int r = 0; r < R; r++) q[r] = __shfl_xor_sync(FULL, a[r], d);
#pragma unroll
        for (int r = 0; r < R; r++) a[r] = fmaxf(a[r], q[r]);
    }
}

// MXFP4 of one row into dst (MXFP4_ROW_BYTES bytes, 4-byte aligned),
// given a, the max |v| (NaN ignored) of the lane's block of 32 values (8
// lanes, warp_absmax_rows<R, 8>): a floored at 6*2^-126; t = fl(a *
// fl32(1/6)); e = t's biased exponent, plus one when its mantissa is
// non-zero, at most 254; nibble i = e2m1(fl(v_i * 2^(127-e))), element 2k
// in the low nibble of byte k; the scale bytes follow the 64 nibble bytes
// (numerics.QuantizeMXFP4).
template <bool LEAN = false>
__device__ __forceinline__ void mxfp4_store(u8* dst, const float v[4], float a, int lane) {
    a = fmaxf(a, __uint_as_float((u32)MXFP4_FLOOR_BITS));  // 6 * 2^-126
    const u32 tb = __float_as_uint(__fmul_rn(a, __uint_as_float((u32)MXFP4_INV6_BITS)));  // fl32(1/6)
    const int e = min((int)((tb >> 23) & 0xffu) + ((tb & 0x7fffffu) != 0u ? 1 : 0), 254);
    const float inv = pow2i(127 - e);
    auto q = [](float x) { return LEAN ? e2m1_int(x) : e2m1(x); };
    const u32 q0 = q(__fmul_rn(v[0], inv)), q1 = q(__fmul_rn(v[1], inv));
    const u32 q2 = q(__fmul_rn(v[2], inv)), q3 = q(__fmul_rn(v[3], inv));
    *reinterpret_cast<u16*>(dst + 2 * lane) = (u16)(q0 | (q1 << 4) | (q2 << 8) | (q3 << 12));
    if ((lane & 7) == 0) dst[INDEXER_DIM / 2 + lane / 8] = (u8)e;
}

// MXFP4 of the warp's one row.
__device__ __forceinline__ void warp_mxfp4_store(u8* dst, const float v[4], int lane) {
    const float w[1][4] = {{v[0], v[1], v[2], v[3]}};
    float a[1];
    warp_absmax_rows<1, 8>(w, a);
    mxfp4_store(dst, v, a[0], lane);
}

// RoPE of the lane's two pairs of the rope half (lanes 16..31: pairs
// 2(lane-16) and 2(lane-16)+1 of the table's row pos).
__device__ __forceinline__ float4 indexer_rope_cs(const float* rope, int pos, int lane) {
    return lane >= 16 ? ld_f4(rope + (size_t)pos * ROPE_DIM + 4 * (lane - 16)) : make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ void indexer_rope(float v[4], float4 cs, int lane) {
    if (lane >= 16) {
        rope_pair(v[0], v[1], cs.x, cs.y);
        rope_pair(v[2], v[3], cs.z, cs.w);
    }
}

// indexer_entry_store turns the lane's 4 pooled values x (values [4 lane,
// 4 lane + 4) of an entry, float32 as pooled) into the entry at dst: bf16,
// RMSNorm with the lane's norm weights w (W = 128), RoPE with the lane's
// table pairs cs (indexer_rope_cs at position index*4), Hadamard, MXFP4.
// The one source of the indexer entry's rounding: indexer_step_finish and
// indexer_step both call it.
__device__ __forceinline__ void indexer_entry_store(u8* dst, float x[4], float4 w, float4 cs, float eps, float hscale,
                                                    int lane) {
    round2(x[0], x[1]);
    round2(x[2], x[3]);
    // The canonical sum of squares at W = 128: lane j's 4 squares in
    // order (0 + x0*x0 is x0*x0 bit for bit), then the xor butterfly.
    float s = __fmul_rn(x[0], x[0]);
#pragma unroll
    for (int i = 1; i < 4; i++) s = __fadd_rn(s, __fmul_rn(x[i], x[i]));
#pragma unroll
    for (int d = 16; d >= 1; d >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL, s, d));
    // s / 128 and 1 / root as multiplication by the exact 2^-7 and the
    // correctly rounded reciprocal (warp_rms_inv's argument).
    const float r = __frcp_rn(__fsqrt_rn(__fadd_rn(__fmul_rn(s, 1.f / (float)INDEXER_DIM), eps)));
    float v[4] = {__fmul_rn(__fmul_rn(x[0], r), w.x), __fmul_rn(__fmul_rn(x[1], r), w.y),
                  __fmul_rn(__fmul_rn(x[2], r), w.z), __fmul_rn(__fmul_rn(x[3], r), w.w)};
    round2(v[0], v[1]);
    round2(v[2], v[3]);
    indexer_rope(v, cs, lane);
    warp_hadamard(v, hscale, lane);
    warp_mxfp4_store(dst, v, lane);
}

// indexer_step_finish: one warp per plan job turns the 128 pooled values
// scratch[job*128 ...] (compress_step with dim 128) into indexer entry
// `index`: bf16, RMSNorm with the compressor's norm weight (W = 128),
// RoPE of the rope half at position index*4, Hadamard, MXFP4, stored at
// pool + page*page_size*68 + off*68. Jobs are checked as compress_step
// checks them (cstep_job): a bad one writes nothing.
extern "C" __global__ void __launch_bounds__(32 * CFIN_WARPS) indexer_step_finish(const CompressFinishParams args) {
    const float* scratch = args.scratch;
    const int* plan = args.plan;
    const float *norm = args.norm, *rope = args.rope;
    u8* pool = args.pool;  // page p at pool + p*page_size*MXFP4_ROW_BYTES (args.page_bytes)
    const int max_seqs = args.max_seqs, max_jobs = args.max_jobs, kg_rows = args.kg_rows, slots = args.slots,
              ratio = args.ratio, rope_positions = args.rope_positions, page_size = args.page_size,
              num_pages = args.num_pages;
    const float eps = args.eps, hscale = args.hscale;
    pdl_wait();
    pdl_trigger();
    const int nseqs = min(max(plan[CPLAN_HDR_SEQS], 0), max_seqs);
    const int njobs = min(max(plan[CPLAN_HDR_JOBS], 0), max_jobs);
    const int* seqs = plan + CPLAN_HDR_WORDS;
    const int* jobs = seqs + (size_t)max_seqs * CPLAN_SEQ_WORDS;
    const int lane = threadIdx.x % 32;
    const int warps = gridDim.x * CFIN_WARPS;
    for (int jb = blockIdx.x * CFIN_WARPS + threadIdx.x / 32; jb < njobs; jb += warps) {
        CStepJob J;
        // Warp-uniform: every lane reads the same job.
        if (!cstep_job(seqs, jobs, nseqs, jb, kg_rows, slots, ratio, rope_positions, num_pages, page_size, J)) continue;
        const float4 p = *reinterpret_cast<const float4*>(scratch + (size_t)jb * INDEXER_DIM + 4 * lane);
        float x[4] = {p.x, p.y, p.z, p.w};
        indexer_entry_store(pool + ((size_t)J.page * page_size + J.off) * MXFP4_ROW_BYTES, x, ld_f4(norm + 4 * lane),
                            indexer_rope_cs(rope, J.index * ratio, lane), eps, hscale, lane);
    }
}

// indexer_step: the indexer compressor's whole step in one kernel
// (compress_step with dim 128, then indexer_step_finish, without the
// pooled values' round trip through scratch and the second launch). The
// arguments are the two kernels' (s: compress_step's, f:
// indexer_step_finish's; f.scratch unused), the same plan, the same
// checks, the same bytes.
//
// Blocks [0, s.job_blocks): one entry a block at a time (grid-stride over
// the plan's jobs), thread c pools channel c over all of the entry's n
// candidates exactly as compress_entries does (PoolChannel's order: m
// ascending with a strict >, s = sum of exp32(fl(G_j - m)) ascending, E =
// sum of fl(fl(e_j / s) * K_j) ascending), every candidate's G, ape and K
// loaded before the first use; the 128 pooled values go through shared
// memory to warp 0, which stores the entry (indexer_entry_store).
// The other blocks: compress_step's store of the kept rows (the same
// items, ring slots and hazards), four values a thread as one 16-byte
// load and store (KGStride, KGOffset and the rows are 16-byte multiples:
// mla.CompressStepArgs.Validate), every load of an item before its stores.
//
// Ordering under programmatic dependent launch, as the prologue's direct
// kernels (prologue.cu): before the wait a block reads only what no grid
// in flight writes: the plan (uploaded by the host with the iteration's
// metadata, engine Begin; read-only on the device), the norm weight and
// the RoPE table: its first job's (or store item's) plan words, the
// entry's norm weights and RoPE pairs. After the wait it reads the
// projections and the ring (the GEMM's and the previous step's outputs)
// and writes. So the wait is followed by one round of loads, not the five
// dependent rounds (the header, the job, the sequence's words one by one,
// the candidates, then K) of compress_step and four more of
// indexer_step_finish after the grid between them.
static_assert(IKEY_THREADS == INDEXER_DIM, "one thread per channel of the indexer's pooled row");
static_assert(CPLAN_HDR_SEQS == 0 && CPLAN_HDR_JOBS == 1 && CPLAN_HDR_WORDS == 4 && CPLAN_JOB_WORDS == 4 && CPLAN_JOB_INDEX == 0 &&
                  CPLAN_JOB_SEQ == 1 && CPLAN_JOB_PAGE == 2 && CPLAN_JOB_OFFSET == 3 && CPLAN_SEQ_WORDS == 8 &&
                  CPLAN_SEQ_ROW == 0 && CPLAN_SEQ_ROWS == 1 && CPLAN_SEQ_START == 2 && CPLAN_SEQ_FROM == 3 && CPLAN_SEQ_TO == 4,
              "indexer_step reads the plan's words as 16-byte vectors");
#define IKEY_STORE_VEC 8  // 16-byte pieces a store thread loads before it stores

// IKeyJob is plan job jb as indexer_step reads it: live (jb < the plan's
// job count), ok (live and every check of cstep_job passes) and the
// fields.
struct IKeyJob {
    bool live, ok;
    int index, page, off, row, start, from;
};

// ikey_job reads job jb (< max_jobs) in two rounds: the header and the job
// together (the job's words are inside the plan whatever the count says),
// then the job's sequence, its two 16-byte halves at once. Every word of a
// round is loaded before any is tested (ld_dep_v4 is volatile asm, so no
// load sinks below a branch on another's value), and the checks are
// cstep_job's, without its short-circuit chain of loads.
__device__ __forceinline__ IKeyJob ikey_job(const int* plan, int jb, int max_seqs, int max_jobs, int kg_rows, int slots,
                                            int ratio, int rope_positions, int num_pages, int page_size) {
    const int* seqs = plan + CPLAN_HDR_WORDS;
    const int* jobs = seqs + (size_t)max_seqs * CPLAN_SEQ_WORDS;
    const uint4 hdr = ld_dep_v4(plan);
    const uint4 jw = ld_dep_v4(jobs + (size_t)jb * CPLAN_JOB_WORDS);
    IKeyJob J;
    const int nseqs = min(max((int)hdr.x, 0), max_seqs), njobs = min(max((int)hdr.y, 0), max_jobs);
    J.index = (int)jw.x;
    const int si = (int)jw.y;
    J.page = (int)jw.z;
    J.off = (int)jw.w;
    const uint4 q0 = ld_dep_v4(seqs + (size_t)min(max(si, 0), max_seqs - 1) * CPLAN_SEQ_WORDS);
    const uint4 q1 = ld_dep_v4(seqs + (size_t)min(max(si, 0), max_seqs - 1) * CPLAN_SEQ_WORDS + 4);
    J.row = (int)q0.x;
    const int rows = (int)q0.y;
    J.start = (int)q0.z;
    J.from = (int)q0.w;
    const int to = (int)q1.x;
    const long long end = (long long)J.start + rows;
    J.live = jb < njobs;
    J.ok = J.live & (si >= 0) & (si < nseqs) & (J.row >= 0) & (rows >= 0) & ((long long)J.row <= (long long)kg_rows - rows) &
           (J.start >= 0) & (J.from >= 0) & (J.from < slots) & (to >= 0) & (to < slots) & (J.index >= 0) &
           ((long long)J.index * ratio < rope_positions) & (((long long)J.index + 1) * ratio <= end) & (J.page >= 0) &
           (J.page < num_pages) & (J.off >= 0) & (J.off < page_size);
    return J;
}

// IKeySeq is plan sequence si as indexer_step's store blocks read it (with
// the header, in one round): live (si < the plan's sequence count), ok
// (live and cplan_seq_ok) and the fields.
struct IKeySeq {
    bool live, ok;
    int row, rows, start, from, to;
};

__device__ __forceinline__ IKeySeq ikey_seq(const int* plan, int si, int max_seqs, int kg_rows, int slots) {
    const int* q = plan + CPLAN_HDR_WORDS + (size_t)si * CPLAN_SEQ_WORDS;
    const uint4 hdr = ld_dep_v4(plan), q0 = ld_dep_v4(q), q1 = ld_dep_v4(q + 4);
    IKeySeq S;
    S.row = (int)q0.x;
    S.rows = (int)q0.y;
    S.start = (int)q0.z;
    S.from = (int)q0.w;
    S.to = (int)q1.x;
    S.live = si < min(max((int)hdr.x, 0), max_seqs);
    S.ok = S.live & (S.row >= 0) & (S.rows >= 0) & ((long long)S.row <= (long long)kg_rows - S.rows) & (S.start >= 0) &
           (S.from >= 0) & (S.from < slots) & (S.to >= 0) & (S.to < slots);
    return S;
}

extern "C" __global__ void __launch_bounds__(IKEY_THREADS) indexer_step(const CompressStepParams s, const CompressFinishParams f) {
    const float *kg = s.kg, *ape = s.ape;
    float* ring = s.ring;
    const int* plan = s.plan;
    const int kg_rows = s.kg_rows, ring_rows = s.ring_rows, slots = s.slots, max_seqs = s.max_seqs,
              max_jobs = s.max_jobs, ratio = s.ratio, width = s.width, rope_positions = s.rope_positions,
              page_size = s.page_size, num_pages = s.num_pages, job_blocks = s.job_blocks;
    const size_t kg_stride = (size_t)s.kg_stride;
    const size_t row_vals = 2 * (size_t)width;  // K then G
    const int c = threadIdx.x, lane = threadIdx.x % 32;
    __shared__ __align__(16) float pooled[INDEXER_DIM];

    if ((int)blockIdx.x < job_blocks) {
        const float* rope = f.rope;
        u8* pool = f.pool;
        const float eps = f.eps, hscale = f.hscale;
        // Before the wait: warp 0's norm weights (every entry's), the
        // block's first job and its RoPE pairs.
        const float4 w = c < 32 ? ld_f4(f.norm + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
        int jb = blockIdx.x;
        IKeyJob J;
        J.live = J.ok = false;
        if (jb < max_jobs) J = ikey_job(plan, jb, max_seqs, max_jobs, kg_rows, slots, ratio, rope_positions, num_pages, page_size);
        float4 cs = c < 32 && J.ok ? indexer_rope_cs(rope, J.index * ratio, lane) : make_float4(0.f, 0.f, 0.f, 0.f);
        pdl_wait();
        pdl_trigger();
        // Block-uniform: every thread reads the same job.
        while (J.live) {
            if (J.ok) {
                const int index = J.index, jrow = J.row, jstart = J.start, jfrom = J.from;
                const int n = index > 0 ? 8 : 4;  // ratio 4
                const int nlo = n - 4;             // candidates [0, nlo) read columns [0, 128), the rest [128, 256)
                const int first = (index + 1) * ratio - n;  // position of candidate 0
                const int ring0 = first % ring_rows;
                const float* ring_s = ring + (size_t)jfrom * ring_rows * row_vals;
                const float* kg_s = kg + (size_t)jrow * kg_stride;
                float gv[8], kv[8], av[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    gv[j] = kv[j] = av[j] = 0.f;
                    if (j < n) {
                        // The candidates are n < ring_rows consecutive
                        // positions: ring row (first + j) mod ring_rows is
                        // first's row plus j, wrapped once at most.
                        const int p = first + j;
                        const int rr = ring0 + j >= ring_rows ? ring0 + j - ring_rows : ring0 + j;
                        const float* src = p >= jstart ? kg_s + (size_t)(p - jstart) * kg_stride : ring_s + (size_t)rr * row_vals;
                        const int col = j < nlo ? c : INDEXER_DIM + c;
                        gv[j] = src[width + col];
                        kv[j] = src[col];
                        if (p >= jstart && ape != nullptr) av[j] = ape[(size_t)(p & (ratio - 1)) * width + col];
                    }
                }
                float m = __uint_as_float(0xff800000u);  // -Inf
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (j < n) {
                        if (first + j >= jstart && ape != nullptr) gv[j] = __fadd_rn(gv[j], av[j]);
                        m = gv[j] > m ? gv[j] : m;
                    }
                }
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (j < n) {
                        gv[j] = exp32(__fsub_rn(gv[j], m));
                        sum = __fadd_rn(sum, gv[j]);
                    }
                }
                float acc = 0.f;
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < n) acc = __fadd_rn(acc, __fmul_rn(__fdiv_rn(gv[j], sum), kv[j]));
                pooled[c] = acc;
                __syncthreads();
                if (c < 32) {
                    const float4 pv = *reinterpret_cast<const float4*>(pooled + 4 * lane);
                    float x[4] = {pv.x, pv.y, pv.z, pv.w};
                    indexer_entry_store(pool + ((size_t)J.page * page_size + J.off) * MXFP4_ROW_BYTES, x, w, cs, eps, hscale, lane);
                }
                __syncthreads();  // pooled is rewritten by the block's next job
            }
            jb += job_blocks;
            if (jb >= max_jobs) break;
            J = ikey_job(plan, jb, max_seqs, max_jobs, kg_rows, slots, ratio, rope_positions, num_pages, page_size);
            cs = c < 32 && J.ok ? indexer_rope_cs(rope, J.index * ratio, lane) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        return;
    }

    // compress_step's store items: (sequence, chunk of CSTEP_STORE_ROWS
    // kept rows); the block's first item's plan words before the wait.
    const int sb = blockIdx.x - job_blocks, nsb = gridDim.x - job_blocks;
    const int chunks = (ring_rows + CSTEP_STORE_ROWS - 1) / CSTEP_STORE_ROWS;
    int item = sb;
    IKeySeq S;
    S.live = S.ok = false;
    if (item < max_seqs * chunks) S = ikey_seq(plan, item / chunks, max_seqs, kg_rows, slots);
    pdl_wait();
    pdl_trigger();
    while (S.live) {
        const int ch = item % chunks;
        const int row = S.row, start = S.start, from = S.from, to = S.to;
        const long long end = (long long)start + S.rows;
        const long long lo0 = to != from ? max(0LL, end - ring_rows) : max((long long)start, end - ring_rows);
        const long long lo = lo0 + (long long)ch * CSTEP_STORE_ROWS;
        const int rv4 = (int)row_vals / 4;
        const int vals4 = S.ok && lo < end ? (int)min((long long)CSTEP_STORE_ROWS, end - lo) * rv4 : 0;
        for (int i0 = threadIdx.x; i0 < vals4; i0 += IKEY_STORE_VEC * blockDim.x) {
            // Every load of the batch (the rows' values and their ape
            // terms) before the first add: an add right after its load
            // would hold the next load back until the first returns.
            float4 x[IKEY_STORE_VEC], a[IKEY_STORE_VEC];
#pragma unroll
            for (int u = 0; u < IKEY_STORE_VEC; u++) {
                const int i = i0 + u * blockDim.x;
                x[u] = a[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (i < vals4) {
                    const long long p = lo + i / rv4;
                    const int v = 4 * (i % rv4);
                    if (p >= start) {
                        x[u] = *reinterpret_cast<const float4*>(kg + (size_t)(row + (p - start)) * kg_stride + v);
                        if (v >= width && ape != nullptr)
                            a[u] = *reinterpret_cast<const float4*>(ape + (size_t)(p & (ratio - 1)) * width + (v - width));
                    } else {
                        x[u] = *reinterpret_cast<const float4*>(ring + ((size_t)from * ring_rows + (size_t)(p % ring_rows)) * row_vals + v);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < IKEY_STORE_VEC; u++) {
                const int i = i0 + u * blockDim.x;
                if (i < vals4 && lo + i / rv4 >= start && 4 * (i % rv4) >= width && ape != nullptr) {
                    x[u].x = __fadd_rn(x[u].x, a[u].x);
                    x[u].y = __fadd_rn(x[u].y, a[u].y);
                    x[u].z = __fadd_rn(x[u].z, a[u].z);
                    x[u].w = __fadd_rn(x[u].w, a[u].w);
                }
            }
#pragma unroll
            for (int u = 0; u < IKEY_STORE_VEC; u++) {
                const int i = i0 + u * blockDim.x;
                if (i < vals4) {
                    const long long p = lo + i / rv4;
                    *reinterpret_cast<float4*>(ring + ((size_t)to * ring_rows + (size_t)(p % ring_rows)) * row_vals + 4 * (i % rv4)) = x[u];
                }
            }
        }
        item += nsb;
        if (item >= max_seqs * chunks) break;
        S = ikey_seq(plan, item / chunks, max_seqs, kg_rows, slots);
    }
}

// indexer_query: one warp per IQ_ROWS (token, head) rows of one token of
// the launch (Params of the Q prologue: in = the indexer's wq_b output at
// its offset, in_stride its token stride in bytes, out = the query buffer,
// weight = the weights_proj GEMM's float32 output at its offset, w_stride
// its token stride in values, heads = 64), grid-stride. A real token at
// position pos: RoPE of the rope half with the table's row pos, Hadamard,
// then the format's store (mla.IndexerQueryFormat): fp8 = 0 (MXFP4) writes
// the 68-byte MXFP4 row into out [rows][64][68] and lane 0 the bf16 head
// weight bf16(fl(bf16(W) * wscale)) (wscale = mla.IndexerWeightScale);
// fp8 = 1 writes 128 e4m3 bytes into out [rows][64][128] and lane 0 the
// float32 head weight fl(fl(bf16(W) * wscale) * 2^(e-127)), the row's
// scale folded in. Padding rows and positions outside the table write
// zeros to both. The rows go side by side, each with one row's arithmetic.
static_assert(INDEXER_HEADS % IQ_ROWS == 0, "a warp's rows are heads of one token");
//
// indexer_query_early (EARLY): the same rows and bytes, but the metadata
// (the header, the token's sequence and position) and the RoPE pairs of
// the warp's first unit are read before pdl_wait, as the prologue's
// direct kernels read them (prologue.cu: before the wait a grid reads only
// what no grid in flight writes: the metadata, uploaded by the host before
// the iteration, and the RoPE table), and the head weight is loaded with
// the row instead of after the Hadamard: after the wait a warp has one
// round of loads (its rows and the weight) before its arithmetic, not
// three or four.
// indexer_query_lean (EARLY and LEAN): indexer_query_early with fewer
// instructions a row (at 128 rows the grid's 2048 warps keep every
// scheduler issuing): the Hadamard's LEAN stages and e2m1_int, the same
// bytes.
template <bool EARLY, bool LEAN>
__device__ __forceinline__ void indexer_query_impl(const Params& p0, const IndexerQueryParams& args) {
    constexpr int R = IQ_ROWS;
    void* w_out = args.w_out;
    const int w_stride = args.w_stride, fp8 = args.fp8;
    const float hscale = args.hscale, wscale = args.wscale;
    const int lane = threadIdx.x % 32;
    const int warps = gridDim.x * IQ_WARPS;
    const int unit0 = blockIdx.x * IQ_WARPS + threadIdx.x / 32;
    Params p;
    bool ok0 = false;
    int pos0 = 0;
    float4 cs0 = make_float4(0.f, 0.f, 0.f, 0.f);
    if (EARLY) {
        p = with_header(p0);
        if (unit0 < p.rows * (INDEXER_HEADS / R)) {
            int b;
            ok0 = resolve(p, unit0 / (INDEXER_HEADS / R), b, pos0);
            if (ok0 && lane >= 16) cs0 = ld_f4(p.rope + (size_t)pos0 * ROPE_DIM + 4 * (lane - 16));
        }
        pdl_wait();
        pdl_trigger();
    } else {
        pdl_wait();
        pdl_trigger();
        p = with_header(p0);
    }
    const float* weight = p.weight;
    const int row_bytes = fp8 ? INDEXER_DIM : MXFP4_ROW_BYTES;
    for (int unit = unit0; unit < p.rows * (INDEXER_HEADS / R); unit += warps) {
        const int local = unit / (INDEXER_HEADS / R), h0 = unit % (INDEXER_HEADS / R) * R;
        const int t = p.row_begin + local;
        const size_t row0 = (size_t)t * INDEXER_HEADS + h0;
        u8* dst0 = p.out + row0 * row_bytes;
        int b, pos;
        bool ok;
        float4 cs = make_float4(0.f, 0.f, 0.f, 0.f);
        if (EARLY && unit == unit0) {
            ok = ok0;
            pos = pos0;
            cs = cs0;
        } else {
            ok = resolve(p, local, b, pos);
            if (ok && lane >= 16) cs = ld_f4(p.rope + (size_t)pos * ROPE_DIM + 4 * (lane - 16));
        }
        if (!ok) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                u8* dst = dst0 + (size_t)r * row_bytes;
                if (fp8) {
                    *reinterpret_cast<u32*>(dst + 4 * lane) = 0;
                    if (lane == 0) static_cast<float*>(w_out)[row0 + r] = 0.f;
                } else {
                    *reinterpret_cast<u16*>(dst + 2 * lane) = 0;
                    if (lane < 4) dst[INDEXER_DIM / 2 + lane] = 0;
                    if (lane == 0) static_cast<u16*>(w_out)[row0 + r] = 0;
                }
            }
            continue;
        }
        const u8* src = p.in + (size_t)t * p.in_stride + ((size_t)h0 * INDEXER_DIM + 4 * lane) * 2;
        uint2 raw[R];
#pragma unroll
        for (int r = 0; r < R; r++) raw[r] = *reinterpret_cast<const uint2*>(src + (size_t)r * INDEXER_DIM * 2);
        float wv[R];
        if (EARLY && lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) wv[r] = ld_dep_f32(weight + (size_t)t * w_stride + h0 + r);
        }
        float v[R][4];
#pragma unroll
        for (int r = 0; r < R; r++) {
            v[r][0] = bf16_to_f32(raw[r].x & 0xffffu);
            v[r][1] = bf16_to_f32(raw[r].x >> 16);
            v[r][2] = bf16_to_f32(raw[r].y & 0xffffu);
            v[r][3] = bf16_to_f32(raw[r].y >> 16);
            if (lane >= 16) {  // indexer_rope's pairs
                rope_pair(v[r][0], v[r][1], cs.x, cs.y);
                rope_pair(v[r][2], v[r][3], cs.z, cs.w);
            }
        }
        warp_hadamard_rows<R, LEAN>(v, hscale, lane);
        if (!EARLY && lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) wv[r] = ld_dep_f32(weight + (size_t)t * w_stride + h0 + r);
        }
        float a[R];
        if (fp8) {
            // The FP8 layout (DESIGN.md section 9): one UE8M0 exponent e over
            // the row's 128 values (section 4.5's rule, NaN ignored), value
            // i as e4m3(fl(v_i * 2^(127-e))) at byte i.
            warp_absmax_rows<R, 32>(v, a);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int e = ue8m0_exp(a[r]);
                const float inv = pow2i(127 - e);
                const u32 lo = e4m3x2(__fmul_rn(v[r][1], inv), __fmul_rn(v[r][0], inv));
                const u32 hi = e4m3x2(__fmul_rn(v[r][3], inv), __fmul_rn(v[r][2], inv));
                *reinterpret_cast<u32*>(dst0 + (size_t)r * row_bytes + 4 * lane) = (lo & 0xffffu) | (hi << 16);
                if (lane == 0) {
                    const float ws = __fmul_rn(__uint_as_float(bf16x2_rn(wv[r], 0.f) << 16), wscale);
                    const float wf = __fmul_rn(ws, pow2i(e - 127));
                    // A NaN is written as F32_NAN_BITS whatever the arithmetic returned.
                    static_cast<float*>(w_out)[row0 + r] = wf != wf ? __uint_as_float((u32)F32_NAN_BITS) : wf;
                }
            }
            continue;
        }
        warp_absmax_rows<R, 8>(v, a);  // each MXFP4 block's maximum
#pragma unroll
        for (int r = 0; r < R; r++) {
            mxfp4_store<LEAN>(dst0 + (size_t)r * row_bytes, v[r], a[r], lane);
            if (lane == 0) {
                const u32 wr = bf16x2_rn(wv[r], 0.f) << 16;
                static_cast<u16*>(w_out)[row0 + r] = (u16)(bf16x2_rn(__fmul_rn(__uint_as_float(wr), wscale), 0.f) & 0xffffu);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * IQ_WARPS)
    indexer_query(const Params p0, const IndexerQueryParams args) {
    indexer_query_impl<false, false>(p0, args);
}

extern "C" __global__ void __launch_bounds__(32 * IQ_WARPS)
    indexer_query_early(const Params p0, const IndexerQueryParams args) {
    indexer_query_impl<true, false>(p0, args);
}

extern "C" __global__ void __launch_bounds__(32 * IQ_WARPS)
    indexer_query_lean(const Params p0, const IndexerQueryParams args) {
    indexer_query_impl<true, true>(p0, args);
}

// indexer_query_wide: the same rows and bytes as indexer_query_lean,
// IQ_WIDE_ROWS (token, head) rows of one token a warp, four lanes a row:
// lane 4r + q holds value 64g + 16q + i of the warp's row r in v[16g + i]
// (g = 0, 1; i = 0..15), so that the Hadamard's stages h = 1, 2, 4, 8 and
// 64 pair values inside a lane (plain adds and subtracts), h = 16 and 32
// pair lane q with q ^ 1 and q ^ 2 (the lower keeps fl(a + b), the upper
// fl(a - b) as fma(-1, b, a): one rounding of the exact a - b), every lane
// holds eight RoPE pairs (g = 1), and MXFP4 block 2g + q/2 is v[16g..] of
// lanes q and q ^ 1. At 32 values a lane the warp issues about 40% fewer
// instructions a row than indexer_query_lean (158 PTX instructions a row
// against 268: the lean kernel's five cross-lane stages cost a shuffle and
// two operations a value, its MXFP4 maximum three shuffles a block, its
// rope half idles half the lanes), which bounds the lean kernel at
// prefill, where every scheduler is busy (4K tokens on the H200: 58.7
// against 78.4 us). The metadata and the first unit's RoPE pairs before
// the wait, as the early kernel.
static_assert(INDEXER_HEADS % IQ_WIDE_ROWS == 0 && IQ_WIDE_ROWS * 4 == 32, "a warp's rows are heads of one token, four lanes each");
extern "C" __global__ void __launch_bounds__(32 * IQ_WARPS)
    indexer_query_wide(const Params p0, const IndexerQueryParams args) {
    constexpr int UPT = INDEXER_HEADS / IQ_WIDE_ROWS;  // units (warps' worth of rows) a token
    void* w_out = args.w_out;
    const int w_stride = args.w_stride, fp8 = args.fp8;
    const float hscale = args.hscale, wscale = args.wscale;
    const int lane = threadIdx.x % 32, r = lane >> 2, q = lane & 3;
    const int warps = gridDim.x * IQ_WARPS;
    const int unit0 = blockIdx.x * IQ_WARPS + threadIdx.x / 32;
    const Params p = with_header(p0);
    // The lane's RoPE pairs: value pairs (64 + 16q + 2m, +1) rotate with
    // the table row's columns 16q + 2m (cos) and 16q + 2m + 1 (sin).
    float cs[16];
    auto load_cs = [&](int pos) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 c = ld_f4(p.rope + (size_t)pos * ROPE_DIM + 16 * q + 4 * k);
            cs[4 * k] = c.x, cs[4 * k + 1] = c.y, cs[4 * k + 2] = c.z, cs[4 * k + 3] = c.w;
        }
    };
    bool ok0 = false;
    if (unit0 < p.rows * UPT) {
        int b, pos0;
        ok0 = resolve(p, unit0 / UPT, b, pos0);
        if (ok0) load_cs(pos0);
    }
    pdl_wait();
    pdl_trigger();
    const float* weight = p.weight;
    const int row_bytes = fp8 ? INDEXER_DIM : MXFP4_ROW_BYTES;
    for (int unit = unit0; unit < p.rows * UPT; unit += warps) {
        const int local = unit / UPT, h = unit % UPT * IQ_WIDE_ROWS + r;
        const int t = p.row_begin + local;
        const size_t row = (size_t)t * INDEXER_HEADS + h;
        u8* dst = p.out + row * row_bytes;
        bool ok = ok0;
        if (unit != unit0) {
            int b, pos;
            ok = resolve(p, local, b, pos);
            if (ok) load_cs(pos);
        }
        if (!ok) {
#pragma unroll
            for (int g = 0; g < 2; g++) {
                if (fp8) {
                    *reinterpret_cast<uint4*>(dst + 64 * g + 16 * q) = make_uint4(0u, 0u, 0u, 0u);
                } else {
                    *reinterpret_cast<u32*>(dst + 32 * g + 8 * q) = 0u;
                    *reinterpret_cast<u32*>(dst + 32 * g + 8 * q + 4) = 0u;
                    if ((q & 1) == 0) dst[INDEXER_DIM / 2 + 2 * g + q / 2] = 0;
                }
            }
            if (q == 0) {
                if (fp8) static_cast<float*>(w_out)[row] = 0.f;
                else static_cast<u16*>(w_out)[row] = 0;
            }
            continue;
        }
        const u8* src = p.in + (size_t)t * p.in_stride + ((size_t)h * INDEXER_DIM + 16 * q) * 2;
        uint4 raw[4];  // raw[2g + k]: values 64g + 16q + 8k ..
#pragma unroll
        for (int k = 0; k < 4; k++) raw[k] = *reinterpret_cast<const uint4*>(src + 128 * (k >> 1) + 16 * (k & 1));
        const float wv = q == 0 ? ld_dep_f32(weight + (size_t)t * w_stride + h) : 0.f;
        float v[32];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 x[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[8 * k + 2 * i] = bf16_to_f32(x[i] & 0xffffu);
                v[8 * k + 2 * i + 1] = bf16_to_f32(x[i] >> 16);
            }
        }
        // indexer_rope's pairs: the lane's values of the rope half.
#pragma unroll
        for (int m = 0; m < 8; m++) rope_pair(v[16 + 2 * m], v[16 + 2 * m + 1], cs[2 * m], cs[2 * m + 1]);
        // The Hadamard's stages in the contract's order: h = 1, 2, 4, 8
        // inside the lane (v's stride h), 16 and 32 across lanes q ^ 1 and
        // q ^ 2, 64 inside the lane (v's stride 16).
        auto inlane = [&](int st) {
#pragma unroll
            for (int i = 0; i < 32; i++) {
                if ((i & st) == 0) {
                    const float a = v[i], b = v[i + st];
                    v[i] = __fadd_rn(a, b);
                    v[i + st] = __fsub_rn(a, b);
                }
            }
        };
        inlane(1);
        inlane(2);
        inlane(4);
        inlane(8);
#pragma unroll
        for (int d = 1; d <= 2; d <<= 1) {
            const float sgn = (q & d) ? -1.f : 1.f;
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = __fmaf_rn(sgn, v[i], __shfl_xor_sync(FULL, v[i], d));
        }
        inlane(16);
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            v[i] = __fmul_rn(v[i], hscale);
            v[i + 1] = __fmul_rn(v[i + 1], hscale);
            round2(v[i], v[i + 1]);
        }
        float a[2] = {0.f, 0.f};  // fmaxf drops a NaN operand
#pragma unroll
        for (int g = 0; g < 2; g++) {
#pragma unroll
            for (int i = 0; i < 16; i++) a[g] = fmaxf(a[g], fabsf(v[16 * g + i]));
            a[g] = fmaxf(a[g], __shfl_xor_sync(FULL, a[g], 1));  // the block's other half
        }
        if (fp8) {
            // The FP8 layout: one UE8M0 exponent over the row's 128 values
            // (as indexer_query_impl's), value i as e4m3 at byte i.
            float ar = fmaxf(a[0], a[1]);
            ar = fmaxf(ar, __shfl_xor_sync(FULL, ar, 2));
            const int e = ue8m0_exp(ar);
            const float inv = pow2i(127 - e);
#pragma unroll
            for (int g = 0; g < 2; g++) {
                u32 w8[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float* x = v + 16 * g + 4 * k;
                    const u32 lo = e4m3x2(__fmul_rn(x[1], inv), __fmul_rn(x[0], inv));
                    const u32 hi = e4m3x2(__fmul_rn(x[3], inv), __fmul_rn(x[2], inv));
                    w8[k] = (lo & 0xffffu) | (hi << 16);
                }
                *reinterpret_cast<uint4*>(dst + 64 * g + 16 * q) = make_uint4(w8[0], w8[1], w8[2], w8[3]);
            }
            if (q == 0) {
                const float ws = __fmul_rn(__uint_as_float(bf16x2_rn(wv, 0.f) << 16), wscale);
                const float wf = __fmul_rn(ws, pow2i(e - 127));
                static_cast<float*>(w_out)[row] = wf != wf ? __uint_as_float((u32)F32_NAN_BITS) : wf;
            }
            continue;
        }
        // MXFP4 of the lane's halves of blocks q/2 and 2 + q/2
        // (mxfp4_store's scale and nibbles).
#pragma unroll
        for (int g = 0; g < 2; g++) {
            const float am = fmaxf(a[g], __uint_as_float((u32)MXFP4_FLOOR_BITS));
            const u32 tb = __float_as_uint(__fmul_rn(am, __uint_as_float((u32)MXFP4_INV6_BITS)));
            const int e = min((int)((tb >> 23) & 0xffu) + ((tb & 0x7fffffu) != 0u ? 1 : 0), 254);
            const float inv = pow2i(127 - e);
#pragma unroll
            for (int w = 0; w < 2; w++) {
                u32 word = 0u;
#pragma unroll
                for (int j = 0; j < 8; j++) word |= e2m1_scaled(v[16 * g + 8 * w + j], inv) << (4 * j);
                *reinterpret_cast<u32*>(dst + 32 * g + 8 * q + 4 * w) = word;
            }
            if ((q & 1) == 0) dst[INDEXER_DIM / 2 + 2 * g + q / 2] = (u8)e;
        }
        if (q == 0) {
            const u32 wr = bf16x2_rn(wv, 0.f) << 16;
            static_cast<u16*>(w_out)[row] = (u16)(bf16x2_rn(__fmul_rn(__uint_as_float(wr), wscale), 0.f) & 0xffffu);
        }
    }
}

// bf16x2 arithmetic (two bf16 in a u32, the low half first), one rounding
// to nearest even a result, subnormals kept (sm_80's fma, min and max of
// bf16x2: no flush-to-zero form exists for them).
__device__ __forceinline__ u32 bf2_fma(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// |a| of both halves (the sign bits cleared, a NaN's too), where ptxas
// may fold it into the consumer's operand.
__device__ __forceinline__ u32 bf2_abs(u32 a) {
    u32 d;
    asm("abs.bf16x2 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}
// min and max drop a NaN operand (a NaN only when both are).
__device__ __forceinline__ u32 bf2_min(u32 a, u32 b) {
    u32 d;
    asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 bf2_max(u32 a, u32 b) {
    u32 d;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// The e2m1 magnitudes of a bf16x2 pair of magnitudes m (|v|, v a bf16 as
// round2 leaves it) under the block scale 2^(127-e): each half 192 + the
// index of e2m1(fl(v * 2^(127-e))) on the grid {0, 0.5, 1, 1.5, 2, 3, 4,
// 6}, in bf16 (0x4340 + index). s1, s2, s4 = 2^(128-e), 2^(127-e),
// 2^(126-e) as bf16x2 (subnormal near e = 254). With x = v * 2^(127-e)
// (exact, or below 2^-126 where every term gives index 0), the grid's
// index as a function of x is concave and piecewise linear, 2x up to 2
// (step 0.5), x + 2 up to 4 (step 1), x/2 + 4 up to 6 (step 2), and
// rounding to nearest even is monotone, so the index is min(rint(2x),
// rint(x + 2), rint(x/2 + 4), 7): each rint one fma into 192 + (ulp 1 in
// [128, 256), even indices being the grid's even mantissas, e2m1's ties).
// A finite block's x is at most 6 (x/2 + 4 <= 7); the 7 is for a NaN,
// which every fma keeps and min drops, and an Inf. Equal to e2m1_scaled
// for every bf16 and every block scale (kernels/cuda
// TestE2M1PairMatchesReference: its host port against
// numerics.E2M1FromF32).
__device__ __forceinline__ u32 e2m1x2_mag(u32 m, u32 s1, u32 s2, u32 s4) {
    const u32 lo = bf2_min(bf2_fma(m, s1, 0x43404340u), bf2_fma(m, s2, 0x43424342u));  // 192 + 2x, 194 + x
    return bf2_min(lo, bf2_min(bf2_fma(m, s4, 0x43444344u), 0x43474347u));             // 196 + x/2, 199
}

// The MXFP4 word of 8 values from four bf16x2 pairs P[j] = (value j, value
// j + 4) and their e2m1 magnitudes Y[j] (e2m1x2_mag): nibble i is value
// i's index | its sign << 3. The indices by Horner's rule on Y - 0x43404340
// (no carries: each nibble receives one index <= 7), the signs (bits 15
// and 31 of P[j]) shifted to bits 4j + 3 and 4j + 19.
__device__ __forceinline__ u32 mxfp4_word(const u32 (&P)[4], const u32 (&Y)[4]) {
    constexpr u32 S = 0x80008000u;
    u32 s = P[0] & S;
    s = (s >> 4) | (P[1] & S);
    s = (s >> 4) | (P[2] & S);
    s = (s >> 4) | (P[3] & S);
    const u32 w = ((Y[3] * 16u + Y[2]) * 16u + Y[1]) * 16u + Y[0];
    return w - 0x43404340u * 0x1111u + s;
}

// indexer_query_stream: the rows, lanes and bytes of indexer_query_wide
// with fewer instructions a row and the next unit's loads in flight under
// the current unit's arithmetic. The MXFP4 tail runs on bf16x2 pairs: the
// Hadamard's outputs rounded to bf16 as pairs (value j, value j + 4) of
// each 8-value nibble word and left packed; each block's maximum by
// max.bf16x2 over the magnitudes; e2m1 by e2m1x2_mag (seven bf16x2
// operations a pair, where e2m1_scaled takes about a dozen integer
// operations a value on sm_90's half-rate integer pipe); the word by
// mxfp4_word. The grid-stride loop converts and rotates the unit's row,
// then issues the next unit's metadata, RoPE pairs, row and head-weight
// loads before the transform. The FP8 layout as the wide kernel.
template <bool TOK>
__device__ __forceinline__ void query_stream_body(const Params& p0, const IndexerQueryParams& args) {
    constexpr int UPT = INDEXER_HEADS / IQ_WIDE_ROWS;
    void* w_out = args.w_out;
    const int w_stride = args.w_stride, fp8 = args.fp8;
    const float hscale = args.hscale, wscale = args.wscale;
    const int lane = threadIdx.x % 32, r = lane >> 2, q = lane & 3;
    const int warps = gridDim.x * IQ_WARPS;
    const Params p = with_header(p0);
    const int units = p.rows * UPT;
    float cs[16];
    auto load_cs = [&](int pos) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 c = ld_f4(p.rope + (size_t)pos * ROPE_DIM + 16 * q + 4 * k);
            cs[4 * k] = c.x, cs[4 * k + 1] = c.y, cs[4 * k + 2] = c.z, cs[4 * k + 3] = c.w;
        }
    };
    // The stream kernel: warp w's units w, w + warps, ... The token-major
    // kernel (TOK): a contiguous run of units [unit, end), the token's
    // position and RoPE pairs resolved once a token.
    const int wid = blockIdx.x * IQ_WARPS + threadIdx.x / 32;
    int unit = wid, end = units;
    if (TOK) {
        const int per = units / warps, extra = units % warps;
        unit = wid * per + min(wid, extra);
        end = unit + per + (wid < extra ? 1 : 0);
    }
    bool ok = false;
    if (unit < end) {
        int b, pos;
        ok = resolve(p, unit / UPT, b, pos);
        if (ok) load_cs(pos);
    }
    pdl_wait();
    pdl_trigger();
    const float* weight = p.weight;
    const int row_bytes = fp8 ? INDEXER_DIM : MXFP4_ROW_BYTES;
    uint4 raw[4];  // raw[2g + k]: values 64g + 16q + 8k ..
    float wv = 0.f;
    auto load_row = [&](int u) {
        const int t = p.row_begin + u / UPT, h = u % UPT * IQ_WIDE_ROWS + r;
        const u8* src = p.in + (size_t)t * p.in_stride + ((size_t)h * INDEXER_DIM + 16 * q) * 2;
#pragma unroll
        for (int k = 0; k < 4; k++) raw[k] = *reinterpret_cast<const uint4*>(src + 128 * (k >> 1) + 16 * (k & 1));
        wv = q == 0 ? ld_dep_f32(weight + (size_t)t * w_stride + h) : 0.f;
    };
    // The token-major kernel loads a row whatever its position says (the
    // address depends on the unit only, every launch row is in the
    // buffer), so the load does not wait for the metadata.
    if (unit < end && (TOK || ok)) load_row(unit);
    for (; unit < end; unit += TOK ? 1 : warps) {
        const int local = unit / UPT, h = unit % UPT * IQ_WIDE_ROWS + r;
        const int t = p.row_begin + local;
        const size_t row = (size_t)t * INDEXER_HEADS + h;
        u8* dst = p.out + row * row_bytes;
        const bool cur_ok = ok;
        float v[32];
        const float wcur = wv;
        if (cur_ok) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const u32 x[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    v[8 * k + 2 * i] = bf16_to_f32(x[i] & 0xffffu);
                    v[8 * k + 2 * i + 1] = bf16_to_f32(x[i] >> 16);
                }
            }
#pragma unroll
            for (int m = 0; m < 8; m++) rope_pair(v[16 + 2 * m], v[16 + 2 * m + 1], cs[2 * m], cs[2 * m + 1]);
        }
        // The next unit's loads, under this one's arithmetic.
        if (TOK) {
            const int next = unit + 1;
            if (next < end) {
                load_row(next);
                if (next / UPT != local) {
                    int b, pos;
                    ok = resolve(p, next / UPT, b, pos);
                    if (ok) load_cs(pos);
                }
            }
        } else {
            const int next = unit + warps;
            ok = false;
            if (next < units) {
                int b, pos;
                ok = resolve(p, next / UPT, b, pos);
                if (ok) {
                    load_cs(pos);
                    load_row(next);
                }
            }
        }
        if (!cur_ok) {
#pragma unroll
            for (int g = 0; g < 2; g++) {
                if (fp8) {
                    *reinterpret_cast<uint4*>(dst + 64 * g + 16 * q) = make_uint4(0u, 0u, 0u, 0u);
                } else {
                    *reinterpret_cast<u32*>(dst + 32 * g + 8 * q) = 0u;
                    *reinterpret_cast<u32*>(dst + 32 * g + 8 * q + 4) = 0u;
                    if ((q & 1) == 0) dst[INDEXER_DIM / 2 + 2 * g + q / 2] = 0;
                }
            }
            if (q == 0) {
                if (fp8) static_cast<float*>(w_out)[row] = 0.f;
                else static_cast<u16*>(w_out)[row] = 0;
            }
            continue;
        }
        // The Hadamard as the wide kernel's: h = 1, 2, 4, 8 inside the
        // lane, 16 and 32 across lanes q ^ 1 and q ^ 2, 64 inside the lane.
        auto inlane = [&](int st) {
#pragma unroll
            for (int i = 0; i < 32; i++) {
                if ((i & st) == 0) {
                    const float a = v[i], b = v[i + st];
                    v[i] = __fadd_rn(a, b);
                    v[i + st] = __fsub_rn(a, b);
                }
            }
        };
        inlane(1);
        inlane(2);
        inlane(4);
        inlane(8);
#pragma unroll
        for (int d = 1; d <= 2; d <<= 1) {
            const float sgn = (q & d) ? -1.f : 1.f;
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = __fmaf_rn(sgn, v[i], __shfl_xor_sync(FULL, v[i], d));
        }
        inlane(16);
        if (fp8) {
#pragma unroll
            for (int i = 0; i < 32; i += 2) {
                v[i] = __fmul_rn(v[i], hscale);
                v[i + 1] = __fmul_rn(v[i + 1], hscale);
                round2(v[i], v[i + 1]);
            }
            float ar = 0.f;
#pragma unroll
            for (int i = 0; i < 32; i++) ar = fmaxf(ar, fabsf(v[i]));
            ar = fmaxf(ar, __shfl_xor_sync(FULL, ar, 1));
            ar = fmaxf(ar, __shfl_xor_sync(FULL, ar, 2));
            const int e = ue8m0_exp(ar);
            const float inv = pow2i(127 - e);
#pragma unroll
            for (int g = 0; g < 2; g++) {
                u32 w8[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float* x = v + 16 * g + 4 * k;
                    const u32 lo = e4m3x2(__fmul_rn(x[1], inv), __fmul_rn(x[0], inv));
                    const u32 hi = e4m3x2(__fmul_rn(x[3], inv), __fmul_rn(x[2], inv));
                    w8[k] = (lo & 0xffffu) | (hi << 16);
                }
                *reinterpret_cast<uint4*>(dst + 64 * g + 16 * q) = make_uint4(w8[0], w8[1], w8[2], w8[3]);
            }
            if (q == 0) {
                const float ws = __fmul_rn(__uint_as_float(bf16x2_rn(wcur, 0.f) << 16), wscale);
                const float wf = __fmul_rn(ws, pow2i(e - 127));
                static_cast<float*>(w_out)[row] = wf != wf ? __uint_as_float((u32)F32_NAN_BITS) : wf;
            }
            continue;
        }
        // P[g][w][j]: values 16g + 8w + j and + 4 of the lane, scaled and
        // rounded to bf16 as a pair; M their magnitudes.
        u32 P[2][2][4], M[2][2][4];
#pragma unroll
        for (int g = 0; g < 2; g++)
#pragma unroll
            for (int w = 0; w < 2; w++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int i = 16 * g + 8 * w + j;
                    P[g][w][j] = bf16x2_rn(__fmul_rn(v[i], hscale), __fmul_rn(v[i + 4], hscale));
                    M[g][w][j] = bf2_abs(P[g][w][j]);
                }
#pragma unroll
        for (int g = 0; g < 2; g++) {
            u32 mx = M[g][0][0];
#pragma unroll
            for (int k = 1; k < 8; k++) mx = bf2_max(mx, M[g][k >> 2][k & 3]);
            // The block's maximum, NaN ignored (a NaN only if all are: the
            // floor then, as fmaxf from 0).
            float a = fmaxf(__uint_as_float(mx << 16), __uint_as_float(mx & 0xffff0000u));
            a = fmaxf(a, __shfl_xor_sync(FULL, a, 1));  // the block's other half
            const float am = fmaxf(a, __uint_as_float((u32)MXFP4_FLOOR_BITS));
            const u32 tb = __float_as_uint(__fmul_rn(am, __uint_as_float((u32)MXFP4_INV6_BITS)));
            const int e = min((int)((tb >> 23) & 0xffu) + ((tb & 0x7fffffu) != 0u ? 1 : 0), 254);
            const u32 s1 = (__float_as_uint(pow2i(128 - e)) >> 16) * 0x00010001u;
            const u32 s2 = (__float_as_uint(pow2i(127 - e)) >> 16) * 0x00010001u;
            const u32 s4 = (__float_as_uint(pow2i(126 - e)) >> 16) * 0x00010001u;
#pragma unroll
            for (int w = 0; w < 2; w++) {
                u32 Y[4];
#pragma unroll
                for (int j = 0; j < 4; j++) Y[j] = e2m1x2_mag(M[g][w][j], s1, s2, s4);
                *reinterpret_cast<u32*>(dst + 32 * g + 8 * q + 4 * w) = mxfp4_word(P[g][w], Y);
            }
            if ((q & 1) == 0) dst[INDEXER_DIM / 2 + 2 * g + q / 2] = (u8)e;
        }
        if (q == 0) {
            const u32 wr = bf16x2_rn(wcur, 0.f) << 16;
            static_cast<u16*>(w_out)[row] = (u16)(bf16x2_rn(__fmul_rn(__uint_as_float(wr), wscale), 0.f) & 0xffffu);
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * IQ_WARPS)
    indexer_query_stream(const Params p0, const IndexerQueryParams args) {
    query_stream_body<false>(p0, args);
}

// indexer_query_tok: indexer_query_stream's lanes and arithmetic over a
// contiguous run of units a warp (the host launches one wave), so that the
// eight units of a token share its position and RoPE pairs (resolved once
// a token), and the next unit's row is loaded before its metadata is
// known (its address does not depend on it): at prefill the stream
// kernel's warps each ran one or two units, every first one behind its
// metadata's dependent loads. The same bytes.
extern "C" __global__ void __launch_bounds__(32 * IQ_WARPS)
    indexer_query_tok(const Params p0, const IndexerQueryParams args) {
    query_stream_body<true>(p0, args);
}

// indexer_query_lane: the same bytes as indexer_query_wide, one lane a
// (token, head) row: a warp owns 32 rows of one token (unit u: token u/2,
// heads 32(u%2) ..), so that the whole Hadamard is in the lane (no
// shuffle), each block's maximum too, and the MXFP4 tail is the stream
// kernel's on bf16x2 pairs. The rows come through shared memory: the
// unit's 8 KB and its token's RoPE row by cp.async (16-byte pieces, each
// warp access 512 contiguous bytes), two buffers a warp, the next unit's
// copies in flight under the current one's arithmetic; the lane reads its
// row at a stride of 272 bytes (conflict-free 16-byte reads). The outputs
// go back through the same buffer, the lane's row at a stride of its row
// bytes, then out in 16-byte pieces (the warp's rows are contiguous in
// the query buffer, 2176 or 4096 bytes) and the head weights one a lane.
// The host launches at most IQL_BLOCKS_PER_SM blocks a multiprocessor
// (one wave); a warp loops over units.
static_assert(INDEXER_HEADS == 64 && ROPE_DIM == 64, "two units a token, the RoPE row's 32 (cos, sin) pairs");
extern "C" __global__ void __launch_bounds__(32 * IQL_WARPS, IQL_BLOCKS_PER_SM)
    indexer_query_lane(const Params p0, const IndexerQueryParams args) {
    constexpr int RS = INDEXER_DIM * 2 + 16;     // a row in shared memory, padded
    constexpr int BUF = 32 * RS + ROPE_DIM * 4;  // 32 rows and the RoPE row
    __shared__ __align__(16) u8 smem[IQL_WARPS][2][BUF];
    void* w_out = args.w_out;
    const int w_stride = args.w_stride, fp8 = args.fp8;
    const float hscale = args.hscale, wscale = args.wscale;
    const int lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    const int warps = gridDim.x * IQL_WARPS;
    const Params p = with_header(p0);
    const int units = p.rows * 2;
    auto res = [&](int u, int& pos) {
        int b;
        return resolve(p, u / 2, b, pos);
    };
    int unit = blockIdx.x * IQL_WARPS + wib;
    int pos = 0;
    bool ok = unit < units && res(unit, pos);
    pdl_wait();
    pdl_trigger();
    const float* weight = p.weight;
    const int row_bytes = fp8 ? INDEXER_DIM : MXFP4_ROW_BYTES;
    const u32 base = smem_u32(&smem[wib][0][0]);
    auto issue = [&](int u, bool uok, int upos, int d) {
        if (uok) {
            const u8* src = p.in + (size_t)(p.row_begin + u / 2) * p.in_stride + (size_t)(u & 1) * 32 * INDEXER_DIM * 2;
            const u32 dst = base + d * BUF;
#pragma unroll
            for (int k = 0; k < 16; k++) {
                const int c = lane + 32 * k;  // piece c % 16 of row c / 16
                cp16(dst + (c >> 4) * RS + (c & 15) * 16, src + 16 * c);
            }
            if (lane < ROPE_DIM / 4) cp16(dst + 32 * RS + 16 * lane, p.rope + (size_t)upos * ROPE_DIM + 4 * lane);
        }
        cp_commit();
    };
    issue(unit, ok, pos, 0);
    int d = 0;
    for (; unit < units; unit += warps) {
        const int next = unit + warps;
        int npos = 0;
        const bool nok = next < units && res(next, npos);
        issue(next, nok, npos, d ^ 1);
        const int t = p.row_begin + unit / 2, h = (unit & 1) * 32 + lane;
        const size_t row = (size_t)t * INDEXER_HEADS + h;
        const float wv = ok ? ld_dep_f32(weight + (size_t)t * w_stride + h) : 0.f;
        cp_wait<1>();
        __syncwarp();
        u8* buf = &smem[wib][d][0];
        u32* so = reinterpret_cast<u32*>(buf + lane * row_bytes);  // the lane's output row, once every row is read
        if (!ok) {
            __syncwarp();
            for (int i = 0; i < row_bytes / 4; i++) so[i] = 0u;
            if (fp8) static_cast<float*>(w_out)[row] = 0.f;
            else static_cast<u16*>(w_out)[row] = 0;
        } else {
            float v[128];
            const u8* rb = buf + lane * RS;
#pragma unroll
            for (int k = 0; k < 16; k++) {
                const uint4 x = *reinterpret_cast<const uint4*>(rb + 16 * k);
                const u32 w4[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    v[8 * k + 2 * i] = bf16_to_f32(w4[i] & 0xffffu);
                    v[8 * k + 2 * i + 1] = bf16_to_f32(w4[i] >> 16);
                }
            }
            // indexer_rope's pairs: value pair 64 + 2m with the RoPE row's
            // columns 2m (cos) and 2m + 1 (sin), read by every lane at once.
            const float* rs = reinterpret_cast<const float*>(buf + 32 * RS);
#pragma unroll
            for (int m = 0; m < 32; m += 2) {
                const float4 c = *reinterpret_cast<const float4*>(rs + 2 * m);
                rope_pair(v[64 + 2 * m], v[65 + 2 * m], c.x, c.y);
                rope_pair(v[66 + 2 * m], v[67 + 2 * m], c.z, c.w);
            }
            __syncwarp();  // every row read: the buffer takes the outputs
            // The Hadamard's stages h = 1, 2, .., 64 in the contract's
            // order, the lower value of each pair keeping fl(a + b).
#pragma unroll
            for (int st = 1; st < 128; st <<= 1) {
#pragma unroll
                for (int i = 0; i < 128; i++) {
                    if ((i & st) == 0) {
                        const float a = v[i], b = v[i + st];
                        v[i] = __fadd_rn(a, b);
                        v[i + st] = __fsub_rn(a, b);
                    }
                }
            }
            if (fp8) {
#pragma unroll
                for (int i = 0; i < 128; i += 2) {
                    v[i] = __fmul_rn(v[i], hscale);
                    v[i + 1] = __fmul_rn(v[i + 1], hscale);
                    round2(v[i], v[i + 1]);
                }
                float ar = 0.f;
#pragma unroll
                for (int i = 0; i < 128; i++) ar = fmaxf(ar, fabsf(v[i]));
                const int e = ue8m0_exp(ar);
                const float inv = pow2i(127 - e);
#pragma unroll
                for (int k = 0; k < 32; k++) {
                    const float* x = v + 4 * k;
                    const u32 lo = e4m3x2(__fmul_rn(x[1], inv), __fmul_rn(x[0], inv));
                    const u32 hi = e4m3x2(__fmul_rn(x[3], inv), __fmul_rn(x[2], inv));
                    so[k] = (lo & 0xffffu) | (hi << 16);
                }
                const float ws = __fmul_rn(__uint_as_float(bf16x2_rn(wv, 0.f) << 16), wscale);
                const float wf = __fmul_rn(ws, pow2i(e - 127));
                static_cast<float*>(w_out)[row] = wf != wf ? __uint_as_float((u32)F32_NAN_BITS) : wf;
            } else {
                u32 scales = 0u;
#pragma unroll
                for (int blk = 0; blk < 4; blk++) {
                    // P[4w + j]: values 32blk + 8w + j and + 4, scaled and
                    // rounded to bf16 as a pair; M their magnitudes.
                    u32 P[16], M[16];
#pragma unroll
                    for (int w = 0; w < 4; w++)
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const int i = 32 * blk + 8 * w + j;
                            P[4 * w + j] = bf16x2_rn(__fmul_rn(v[i], hscale), __fmul_rn(v[i + 4], hscale));
                            M[4 * w + j] = bf2_abs(P[4 * w + j]);
                        }
                    u32 mx[4] = {M[0], M[1], M[2], M[3]};
#pragma unroll
                    for (int k = 4; k < 16; k++) mx[k & 3] = bf2_max(mx[k & 3], M[k]);
                    const u32 m2 = bf2_max(bf2_max(mx[0], mx[1]), bf2_max(mx[2], mx[3]));
                    // NaN ignored (a NaN only if all are: the floor then, as fmaxf from 0).
                    const float a = fmaxf(__uint_as_float(m2 << 16), __uint_as_float(m2 & 0xffff0000u));
                    const float am = fmaxf(a, __uint_as_float((u32)MXFP4_FLOOR_BITS));
                    const u32 tb = __float_as_uint(__fmul_rn(am, __uint_as_float((u32)MXFP4_INV6_BITS)));
                    const int e = min((int)((tb >> 23) & 0xffu) + ((tb & 0x7fffffu) != 0u ? 1 : 0), 254);
                    const u32 s1 = (__float_as_uint(pow2i(128 - e)) >> 16) * 0x00010001u;
                    const u32 s2 = (__float_as_uint(pow2i(127 - e)) >> 16) * 0x00010001u;
                    const u32 s4 = (__float_as_uint(pow2i(126 - e)) >> 16) * 0x00010001u;
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        const u32 Pw[4] = {P[4 * w], P[4 * w + 1], P[4 * w + 2], P[4 * w + 3]};
                        u32 Y[4];
#pragma unroll
                        for (int j = 0; j < 4; j++) Y[j] = e2m1x2_mag(M[4 * w + j], s1, s2, s4);
                        so[4 * blk + w] = mxfp4_word(Pw, Y);
                    }
                    scales |= (u32)e << (8 * blk);
                }
                so[16] = scales;
                const u32 wr = bf16x2_rn(wv, 0.f) << 16;
                static_cast<u16*>(w_out)[row] = (u16)(bf16x2_rn(__fmul_rn(__uint_as_float(wr), wscale), 0.f) & 0xffffu);
            }
        }
        __syncwarp();
        // The warp's 32 rows out, 16 bytes a lane at a time.
        u8* dst = p.out + ((size_t)t * INDEXER_HEADS + (unit & 1) * 32) * row_bytes;
        const int chunks = 2 * row_bytes;  // 32 rows * row_bytes / 16
        for (int c = lane; c < chunks; c += 32) st_u4(dst + 16 * c, *reinterpret_cast<const uint4*>(buf + 16 * c));
        __syncwarp();  // the buffer is the one after next's
        ok = nok;
        pos = npos;
        d ^= 1;
    }
}
