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

// The normalized Walsh-Hadamard transform of R rows of the warp, v[r] the
// lane's four bf16 values of row r, rounded to bf16 in place; hscale is
// fl32(128^-0.5) (numerics.HadamardScale, from the host). Every row gets
// the same operations as one alone; the rows' shuffles interleave.
template <int R>
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
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float q[R];
#pragma unroll
            for (int r = 0; r < R; r++) q[r] = __shfl_xor_sync(FULL, v[r][i], d);
#pragma unroll
            for (int r = 0; r < R; r++) v[r][i] = upper ? __fsub_rn(q[r], v[r][i]) : __fadd_rn(v[r][i], q[r]);
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
__device__ __forceinline__ void mxfp4_store(u8* dst, const float v[4], float a, int lane) {
    a = fmaxf(a, __uint_as_float((u32)MXFP4_FLOOR_BITS));  // 6 * 2^-126
    const u32 tb = __float_as_uint(__fmul_rn(a, __uint_as_float((u32)MXFP4_INV6_BITS)));  // fl32(1/6)
    const int e = min((int)((tb >> 23) & 0xffu) + ((tb & 0x7fffffu) != 0u ? 1 : 0), 254);
    const float inv = pow2i(127 - e);
    const u32 q0 = e2m1(__fmul_rn(v[0], inv)), q1 = e2m1(__fmul_rn(v[1], inv));
    const u32 q2 = e2m1(__fmul_rn(v[2], inv)), q3 = e2m1(__fmul_rn(v[3], inv));
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
__device__ __forceinline__ void indexer_rope(float v[4], const float* rope, int pos, int lane) {
    if (lane >= 16) {
        const float4 cs = ld_f4(rope + (size_t)pos * ROPE_DIM + 4 * (lane - 16));
        rope_pair(v[0], v[1], cs.x, cs.y);
        rope_pair(v[2], v[3], cs.z, cs.w);
    }
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
        const float4 w = ld_f4(norm + 4 * lane);
        float v[4] = {__fmul_rn(__fmul_rn(x[0], r), w.x), __fmul_rn(__fmul_rn(x[1], r), w.y),
                      __fmul_rn(__fmul_rn(x[2], r), w.z), __fmul_rn(__fmul_rn(x[3], r), w.w)};
        round2(v[0], v[1]);
        round2(v[2], v[3]);
        indexer_rope(v, rope, J.index * ratio, lane);
        warp_hadamard(v, hscale, lane);
        warp_mxfp4_store(pool + ((size_t)J.page * page_size + J.off) * MXFP4_ROW_BYTES, v, lane);
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
extern "C" __global__ void __launch_bounds__(32 * IQ_WARPS)
    indexer_query(const Params p0, const IndexerQueryParams args) {
    constexpr int R = IQ_ROWS;
    void* w_out = args.w_out;
    const int w_stride = args.w_stride, fp8 = args.fp8;
    const float hscale = args.hscale, wscale = args.wscale;
    pdl_wait();
    pdl_trigger();
    const Params p = with_header(p0);
    const int lane = threadIdx.x % 32;
    const int warps = gridDim.x * IQ_WARPS;
    const float* weight = p.weight;
    const int row_bytes = fp8 ? INDEXER_DIM : MXFP4_ROW_BYTES;
    for (int unit = blockIdx.x * IQ_WARPS + threadIdx.x / 32; unit < p.rows * (INDEXER_HEADS / R); unit += warps) {
        const int local = unit / (INDEXER_HEADS / R), h0 = unit % (INDEXER_HEADS / R) * R;
        const int t = p.row_begin + local;
        const size_t row0 = (size_t)t * INDEXER_HEADS + h0;
        u8* dst0 = p.out + row0 * row_bytes;
        int b, pos;
        if (!resolve(p, local, b, pos)) {
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
        float4 cs = make_float4(0.f, 0.f, 0.f, 0.f);
        if (lane >= 16) cs = ld_f4(p.rope + (size_t)pos * ROPE_DIM + 4 * (lane - 16));
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
        warp_hadamard_rows<R>(v, hscale, lane);
        float wv[R];
        if (lane == 0) {
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
            mxfp4_store(dst0 + (size_t)r * row_bytes, v[r], a[r], lane);
            if (lane == 0) {
                const u32 wr = bf16x2_rn(wv[r], 0.f) << 16;
                static_cast<u16*>(w_out)[row0 + r] = (u16)(bf16x2_rn(__fmul_rn(__uint_as_float(wr), wscale), 0.f) & 0xffffu);
            }
        }
    }
}
