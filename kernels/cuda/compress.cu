// DSv4's KV compressor on the device (DESIGN.md section 8): the gated
// pooling of a window's projections into one compressed entry, bit-identical
// to package compressor (compressor.PoolChannel, then Layer.FinishEntry).
// NVRTC compiles it with prologue.cu's helpers (PROLOGUE_HELPERS_ONLY: none
// of its kernels), exp32.cuh and indexer.cu, as one program
// (kernels/cuda.CompressSource; the includes are in-memory headers). Same
// rules as prologue.cu: every float operation is an explicit _rn
// intrinsic, no -ftz.
//
// compress_entries: one block of 512 threads per entry (a grid-stride loop
// over the jobs). Thread c pools channel c over the entry's candidates in
// the fixed order of PoolChannel:
//   m = max of the logits, ascending (a NaN logit is skipped)
//   s = sum of exp32(fl(G_j - m)), ascending
//   E = sum of fl(fl(exp32(fl(G_j - m)) / s) * K_j), ascending
// (e_j is recomputed in the last loop: same bits as keeping it). Warp 0 then
// turns the 512 pooled values into the entry exactly as the KV prologue
// turns a latent row into a token: bf16(E), RMSNorm with the compressor's
// norm weight (the canonical 32-partial sum of squares, lane j = partial j),
// RoPE of the tail at position index*ratio, UE8M0 store (ue8m0_store).
//
// Inputs (the host side is attention/mla/cuda/compress.go):
//   new_k, new_g, state_k, state_g: two row spaces of float32 projection
//     rows, `width` values a row (coff*512: 1024 for ratio 4, 512 for
//     ratio 128): the launch's own rows (new_*) and rows kept from earlier
//     iterations (state_*). K and G of a space share its row numbers.
//   cands: num_cands candidate codes; code >= 0 is row `code` of the new
//     space, code < 0 row ~code (= -code - 1) of the state space.
//   jobs: one int4 {index, cand, page, off} per entry: entry index i, its
//     candidates' codes at cands[cand .. cand+n), the pool page and in-page
//     offset it is stored at. The candidates, by ascending position: ratio
//     128, the window's 128 tokens (n = 128, columns [0, 512)); ratio 4,
//     the previous window's 4 tokens reading the "A" half (columns
//     [0, 512)) then the current window's 4 reading the "B" half (columns
//     [512, 1024)): n = 8, or n = 4 (the current window only) for i = 0.
//   A job whose index, page, offset or candidate codes are out of range
//   is skipped (nothing written); the host refuses such jobs before the
//   launch, so this only keeps a bad launch from touching foreign memory.

#include "common.cuh"
#define PROLOGUE_HELPERS_ONLY  // prologue.cu's helpers, none of its kernels
#include "prologue.cu"
#include "exp32.cuh"

#define COMPRESS_THREADS 512
static_assert(COMPRESS_THREADS == HEAD_DIM, "one thread per channel of the pooled row");

__device__ __forceinline__ const float* compress_row(const float* fresh, const float* state, int code, int width) {
    return code >= 0 ? fresh + (size_t)code * width : state + (size_t)(~code) * width;
}

// compress_finish: warp 0 of a block turns the 512 pooled values of entry
// `index` into its entry exactly as the KV prologue turns a latent row into
// a token: bf16(E), RMSNorm with the compressor's norm weight (the canonical
// 32-partial sum of squares, lane j = partial j), RoPE of the tail at
// position index*ratio, UE8M0 store at in-page offset `off` of pool page
// `page`. Shared by compress_entries and compress_step.
__device__ __forceinline__ void compress_finish(const float* pooled, int index, int ratio, const float* norm, float eps,
                                                const float* rope, u8* pool, u64 page_bytes, int page_size, int page,
                                                int off, int lane) {
    float x[16];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float4 t = *reinterpret_cast<const float4*>(pooled + lane * 16 + 4 * q);
        x[4 * q] = t.x; x[4 * q + 1] = t.y; x[4 * q + 2] = t.z; x[4 * q + 3] = t.w;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) round2(x[2 * k], x[2 * k + 1]);
    const float r = warp_rms_inv(x, eps);
    float w[16];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float4 t = ld_f4(norm + lane * 16 + 4 * q);
        w[4 * q] = t.x; w[4 * q + 1] = t.y; w[4 * q + 2] = t.z; w[4 * q + 3] = t.w;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float a = __fmul_rn(__fmul_rn(x[2 * k], r), w[2 * k]);
        float b = __fmul_rn(__fmul_rn(x[2 * k + 1], r), w[2 * k + 1]);
        round2(a, b);
        x[2 * k] = a;
        x[2 * k + 1] = b;
    }
    if (lane >= 28) {
        float cs[16];
        load_rope(cs, rope, index * ratio, lane);
        rope_pairs(x, cs);
    }
    u8* base = pool + (size_t)page * page_bytes;
    ue8m0_store(base + (size_t)off * UE8M0_VALUE_BYTES,
                base + (size_t)page_size * UE8M0_VALUE_BYTES + (size_t)off * UE8M0_SCALE_BYTES, x, lane);
}

extern "C" __global__ void __launch_bounds__(COMPRESS_THREADS) compress_entries(const CompressParams args) {
    const float *new_k = args.new_k, *new_g = args.new_g, *state_k = args.state_k, *state_g = args.state_g;
    const int* cands = args.cands;
    const int4* jobs = args.jobs;
    const float *norm = args.norm, *rope = args.rope;
    u8* pool = args.pool;
    const u64 page_bytes = args.page_bytes;
    const int new_rows = args.new_rows, state_rows = args.state_rows, num_cands = args.num_cands, njobs = args.njobs,
              ratio = args.ratio, width = args.width, rope_positions = args.rope_positions, page_size = args.page_size,
              num_pages = args.num_pages;
    const float eps = args.eps;
    __shared__ __align__(16) float pooled[HEAD_DIM];
    const int c = threadIdx.x;
    pdl_wait();
    pdl_trigger();
    for (int jb = blockIdx.x; jb < njobs; jb += gridDim.x) {
        const int4 job = __ldg(jobs + jb);
        const int index = job.x;
        const int n = ratio == 4 ? (index > 0 ? 8 : 4) : ratio;
        const int nlo = ratio == 4 ? n - 4 : n;  // candidates [0, nlo) read columns [0, 512), the rest [512, 1024)
        const int* cj = cands + job.y;
        // Block-uniform checks: every thread reads the same values.
        bool ok = index >= 0 && (long long)index * ratio < rope_positions && job.y >= 0 && job.y <= num_cands - n &&
                  job.z >= 0 && job.z < num_pages && job.w >= 0 && job.w < page_size;
        for (int j = 0; ok && j < n; j++) {
            const int code = __ldg(cj + j);
            ok = code >= 0 ? code < new_rows : ~code < state_rows;
        }
        if (!ok) continue;

        float m = __uint_as_float(0xff800000u);  // -Inf
        for (int j = 0; j < n; j++) {
            const int col = j < nlo ? c : HEAD_DIM + c;
            const float g = ld_dep_f32(compress_row(new_g, state_g, __ldg(cj + j), width) + col);
            m = g > m ? g : m;
        }
        float s = 0.f;
        for (int j = 0; j < n; j++) {
            const int col = j < nlo ? c : HEAD_DIM + c;
            const float g = ld_dep_f32(compress_row(new_g, state_g, __ldg(cj + j), width) + col);
            s = __fadd_rn(s, exp32(__fsub_rn(g, m)));
        }
        float acc = 0.f;
        for (int j = 0; j < n; j++) {
            const int code = __ldg(cj + j);
            const int col = j < nlo ? c : HEAD_DIM + c;
            const float g = ld_dep_f32(compress_row(new_g, state_g, code, width) + col);
            const float k = ld_dep_f32(compress_row(new_k, state_k, code, width) + col);
            const float w = __fdiv_rn(exp32(__fsub_rn(g, m)), s);
            acc = __fadd_rn(acc, __fmul_rn(w, k));
        }
        pooled[c] = acc;
        __syncthreads();

        if (c < 32) compress_finish(pooled, index, ratio, norm, eps, rope, pool, page_bytes, page_size, job.z, job.w, c);
        __syncthreads();  // pooled is rewritten by the block's next job
    }
}

// compress_step and compress_step_finish: one compressed layer's compressor
// step over an iteration (mla.CompressStepArgs is the contract;
// attention/mla/cuda/compress_step.go the host side). The plan (the
// iteration's sequences and the entries they complete) is read from device
// memory, so a CUDA graph replays the launches for any plan of the same
// capacity.
//
// compress_step, blocks [0, job_blocks): grid-stride over (entry, channel
// tile) pairs; an entry has dim channels (512, or 128 for the indexer's
// compressor: width = coff*dim), and its pooled values go to
// scratch[entry*dim ...]. A block of CSTEP_THREADS threads is G candidate groups of
// CSTEP_THREADS/G channels (G = 4 for ratio 4, 16 for ratio 128), so one
// entry spreads over 8 blocks (ratio 4) or 32 (ratio 128: 64K exp32 calls
// an entry, latency-bound per thread) and each thread walks n/G of the
// entry's n candidates. Thread (c, q) reads channel c of candidate group q
// (candidates [q*n/G, (q+1)*n/G), by position) into shared memory; the
// ascending-order rules of PoolChannel then hold exactly:
//   m: each group's maximum in ascending order, then the groups' maxima in
//      ascending group order (a strict > keeps the first of equal values
//      either way; a NaN is skipped either way);
//   e_j = exp32(fl(G_j - m)) by every thread for its group;
//   s: one thread per channel sums e_j over all candidates, ascending;
//   t_j = fl(fl(e_j / s) * K_j) by every thread for its group;
//   E: one thread per channel sums t_j, ascending, into scratch[entry].
// Position p of plan sequence s is read from the projections (p >= start:
// KG row row+p-start, kg_stride floats from one row to the next: K then G,
// G plus ape[p mod ratio] when ape is given) or from
// ring slot `from` (p < start).
// compress_step, the other blocks: the rows each sequence keeps, into ring
// slot `to` (grid-stride over (sequence, chunk of kept rows) pairs). Entries read
// slot `from` only at positions below start; a sequence writes slot `from`
// (from == to) only at positions >= start, and the host keeps such a step
// to at most InPlaceRows rows, so no block overwrites a row another reads.
// compress_step_finish: one warp per entry turns scratch[entry] into the
// entry (compress_finish); indexer_step_finish (indexer.cu) is its
// counterpart for the indexer's entries. A job or sequence with an index outside the
// buffers is skipped by both, as the CPU backend skips it.

// The threads of a compress_step block (CSTEP_THREADS), its candidate
// groups per ratio (CSTEP_GROUPS_R4, CSTEP_GROUPS_R128) and the warps of a
// compress_step_finish block (CFIN_WARPS) come from abi.h.
#define CSTEP_MAX_CANDIDATES 128
// Shared values of one block: an entry's candidates x the block's channels.
#define CSTEP_CAND_SLOTS (CSTEP_MAX_CANDIDATES * CSTEP_THREADS / CSTEP_GROUPS_R128)
// Candidates a compress_step thread loads into registers at a time.
#define CSTEP_BATCH 8
static_assert(HEAD_DIM % (CSTEP_THREADS / CSTEP_GROUPS_R4) == 0 && HEAD_DIM % (CSTEP_THREADS / CSTEP_GROUPS_R128) == 0,
              "whole channel tiles");
static_assert(8 * CSTEP_THREADS / CSTEP_GROUPS_R4 <= CSTEP_CAND_SLOTS, "a ratio-4 entry's candidates fit");
static_assert(INDEXER_DIM % (CSTEP_THREADS / CSTEP_GROUPS_R4) == 0, "whole channel tiles of the indexer's entries");
// ratio is 4 or 128 (a power of two: p mod ratio = p & (ratio - 1)), and
// the host keeps RingRows above the candidates (mla.InPlaceRowsMin).
static_assert(CSTEP_MAX_CANDIDATES % CSTEP_GROUPS_R128 == 0 && 4 % CSTEP_GROUPS_R4 == 0, "whole candidate groups");

__device__ __forceinline__ bool cplan_seq_ok(const int* q, int kg_rows, int slots) {
    const int row = q[CPLAN_SEQ_ROW], rows = q[CPLAN_SEQ_ROWS];
    return row >= 0 && rows >= 0 && row <= kg_rows - rows && q[CPLAN_SEQ_START] >= 0 && q[CPLAN_SEQ_FROM] >= 0 &&
           q[CPLAN_SEQ_FROM] < slots && q[CPLAN_SEQ_TO] >= 0 && q[CPLAN_SEQ_TO] < slots;
}

// CStepJob is one valid plan job with its sequence's fields.
struct CStepJob {
    int index, page, off, row, start, from;
};

// cstep_job reads job jb and says whether it is valid (both kernels skip
// the same jobs).
__device__ __forceinline__ bool cstep_job(const int* seqs, const int* jobs, int nseqs, int jb, int kg_rows, int slots,
                                          int ratio, int rope_positions, int num_pages, int page_size, CStepJob& j) {
    const int* job = jobs + (size_t)jb * CPLAN_JOB_WORDS;
    const int si = job[CPLAN_JOB_SEQ];
    j.index = job[CPLAN_JOB_INDEX];
    j.page = job[CPLAN_JOB_PAGE];
    j.off = job[CPLAN_JOB_OFFSET];
    if (si < 0 || si >= nseqs) return false;
    const int* q = seqs + (size_t)si * CPLAN_SEQ_WORDS;
    if (!cplan_seq_ok(q, kg_rows, slots)) return false;
    j.row = q[CPLAN_SEQ_ROW];
    j.start = q[CPLAN_SEQ_START];
    j.from = q[CPLAN_SEQ_FROM];
    const long long end = (long long)j.start + q[CPLAN_SEQ_ROWS];
    return j.index >= 0 && (long long)j.index * ratio < rope_positions && ((long long)j.index + 1) * ratio <= end &&
           j.page >= 0 && j.page < num_pages && j.off >= 0 && j.off < page_size;
}

extern "C" __global__ void __launch_bounds__(CSTEP_THREADS) compress_step(const CompressStepParams args) {
    const float *kg = args.kg, *ape = args.ape;
    float* ring = args.ring;
    const int* plan = args.plan;
    float* scratch = args.scratch;
    const int kg_rows = args.kg_rows, ring_rows = args.ring_rows, slots = args.slots, max_seqs = args.max_seqs,
              max_jobs = args.max_jobs, ratio = args.ratio, width = args.width, dim = args.dim,
              rope_positions = args.rope_positions, page_size = args.page_size, num_pages = args.num_pages,
              job_blocks = args.job_blocks;
    const size_t kg_stride = (size_t)args.kg_stride;
    __shared__ float cand[CSTEP_CAND_SLOTS];  // [candidate][channel of the tile]: G, then e_j, then t_j
    __shared__ float red[CSTEP_THREADS];      // [group][channel of the tile]
    pdl_wait();
    pdl_trigger();
    const int nseqs = min(max(plan[CPLAN_HDR_SEQS], 0), max_seqs);
    const int njobs = min(max(plan[CPLAN_HDR_JOBS], 0), max_jobs);
    const int* seqs = plan + CPLAN_HDR_WORDS;
    const int* jobs = seqs + (size_t)max_seqs * CPLAN_SEQ_WORDS;
    const size_t row_vals = 2 * (size_t)width;  // K then G

    if ((int)blockIdx.x < job_blocks) {
        const int groups = ratio == 4 ? CSTEP_GROUPS_R4 : CSTEP_GROUPS_R128;
        const int tile = CSTEP_THREADS / groups;
        const int cl = threadIdx.x % tile, grp = threadIdx.x / tile;
        const int tiles = dim / tile;
        for (int item = blockIdx.x; item < njobs * tiles; item += job_blocks) {
            const int jb = item / tiles, c = (item % tiles) * tile + cl;
            CStepJob J;
            // Block-uniform: every thread reads the same job.
            if (!cstep_job(seqs, jobs, nseqs, jb, kg_rows, slots, ratio, rope_positions, num_pages, page_size, J)) continue;
            const int jstart = J.start, jrow = J.row, jfrom = J.from;  // registers, not the struct
            const int n = ratio == 4 ? (J.index > 0 ? 8 : 4) : ratio;
            const int nlo = ratio == 4 ? n - 4 : n;      // candidates [0, nlo) read columns [0, dim), the rest [dim, 2*dim)
            const int first = (J.index + 1) * ratio - n;  // position of candidate 0
            const int per = n / groups, j0 = grp * per;
            // src returns candidate j's row. The candidates are n < ring_rows
            // consecutive positions: ring row (first + j) mod ring_rows is
            // first's row plus j, wrapped once at most.
            const int ring0 = first % ring_rows;
            const float* ring_s = ring + (size_t)jfrom * ring_rows * row_vals;
            const float* kg_s = kg + (size_t)jrow * kg_stride;
            auto src = [=](int j) -> const float* {
                const int p = first + j;
                const int rr = ring0 + j >= ring_rows ? ring0 + j - ring_rows : ring0 + j;
                return p >= jstart ? kg_s + (size_t)(p - jstart) * kg_stride : ring_s + (size_t)rr * row_vals;
            };
            auto col = [=](int j) { return j < nlo ? c : dim + c; };

            // Loads go to registers a batch at a time before anything is
            // stored: cand is shared memory, and a generic pointer might
            // alias it, so a load after a store would wait for it (one DRAM
            // round trip a candidate).
            const int jend = j0 + per;
            float mq = __uint_as_float(0xff800000u);  // -Inf
            for (int jb0 = j0; jb0 < jend; jb0 += CSTEP_BATCH) {
                // Every load of the batch first (G and its ape term), then
                // the uses: an add right after its load, even predicated
                // off, would wait for that load before the next one issues.
                float gv[CSTEP_BATCH], av[CSTEP_BATCH];
#pragma unroll
                for (int u = 0; u < CSTEP_BATCH; u++) {
                    const int j = jb0 + u, p = first + j;
                    gv[u] = j < jend ? src(j)[width + col(j)] : 0.f;
                    av[u] = j < jend && p >= jstart && ape != nullptr ? ape[(size_t)(p & (ratio - 1)) * width + col(j)] : 0.f;
                }
#pragma unroll
                for (int u = 0; u < CSTEP_BATCH; u++) {
                    const int j = jb0 + u;
                    if (j < jend) {
                        const float g = first + j >= jstart && ape != nullptr ? __fadd_rn(gv[u], av[u]) : gv[u];
                        cand[j * tile + cl] = g;
                        mq = g > mq ? g : mq;
                    }
                }
            }
            red[grp * tile + cl] = mq;
            __syncthreads();
            float m = __uint_as_float(0xff800000u);
            for (int q = 0; q < groups; q++) {
                const float v = red[q * tile + cl];
                m = v > m ? v : m;
            }
#pragma unroll 8
            for (int j = j0; j < jend; j++) cand[j * tile + cl] = exp32(__fsub_rn(cand[j * tile + cl], m));
            __syncthreads();  // every e_j stored; red read by every thread
            if (grp == 0) {
                float s = 0.f;
#pragma unroll 8
                for (int j = 0; j < n; j++) s = __fadd_rn(s, cand[j * tile + cl]);
                red[cl] = s;
            }
            __syncthreads();
            const float s = red[cl];
            for (int jb0 = j0; jb0 < jend; jb0 += CSTEP_BATCH) {
                float kv[CSTEP_BATCH];
#pragma unroll
                for (int u = 0; u < CSTEP_BATCH; u++) kv[u] = jb0 + u < jend ? src(jb0 + u)[col(jb0 + u)] : 0.f;
#pragma unroll
                for (int u = 0; u < CSTEP_BATCH; u++)
                    if (jb0 + u < jend) cand[(jb0 + u) * tile + cl] = __fmul_rn(__fdiv_rn(cand[(jb0 + u) * tile + cl], s), kv[u]);
            }
            __syncthreads();
            if (grp == 0) {
                float acc = 0.f;
#pragma unroll 8
                for (int j = 0; j < n; j++) acc = __fadd_rn(acc, cand[j * tile + cl]);
                scratch[(size_t)jb * dim + c] = acc;
            }
            __syncthreads();  // cand and red are rewritten by the block's next item
        }
        return;
    }

    // Grid-stride over (sequence, chunk of CSTEP_STORE_ROWS kept rows): a
    // block reads the sequence's fields once, then every value of the
    // chunk's rows is spread over its threads, all loads independent; a
    // long chunk's rows spread over many blocks.
    const int sb = blockIdx.x - job_blocks, nsb = gridDim.x - job_blocks;
    const int chunks = (ring_rows + CSTEP_STORE_ROWS - 1) / CSTEP_STORE_ROWS;
    for (int item = sb; item < nseqs * chunks; item += nsb) {
        const int si = item / chunks, ch = item % chunks;
        const int* q = seqs + (size_t)si * CPLAN_SEQ_WORDS;
        if (!cplan_seq_ok(q, kg_rows, slots)) continue;
        const int row = q[CPLAN_SEQ_ROW], start = q[CPLAN_SEQ_START], from = q[CPLAN_SEQ_FROM], to = q[CPLAN_SEQ_TO];
        const long long end = (long long)start + q[CPLAN_SEQ_ROWS];
        const long long lo0 = to != from ? max(0LL, end - ring_rows) : max((long long)start, end - ring_rows);
        const long long lo = lo0 + (long long)ch * CSTEP_STORE_ROWS;
        if (lo >= end) continue;
        const int rv = (int)row_vals, vals = (int)min((long long)CSTEP_STORE_ROWS, end - lo) * rv;
        for (int i = threadIdx.x; i < vals; i += blockDim.x) {
            const long long p = lo + i / rv;
            const int v = i % rv;
            float x;
            if (p >= start) {
                x = kg[(size_t)(row + (p - start)) * kg_stride + v];
                if (v >= width && ape != nullptr) x = __fadd_rn(x, ape[(size_t)(p & (ratio - 1)) * width + (v - width)]);
            } else {
                x = ring[((size_t)from * ring_rows + (size_t)(p % ring_rows)) * row_vals + v];
            }
            ring[((size_t)to * ring_rows + (size_t)(p % ring_rows)) * row_vals + v] = x;
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * CFIN_WARPS) compress_step_finish(const CompressFinishParams args) {
    const float* scratch = args.scratch;
    const int* plan = args.plan;
    const float *norm = args.norm, *rope = args.rope;
    u8* pool = args.pool;
    const u64 page_bytes = args.page_bytes;
    const int max_seqs = args.max_seqs, max_jobs = args.max_jobs, kg_rows = args.kg_rows, slots = args.slots,
              ratio = args.ratio, rope_positions = args.rope_positions, page_size = args.page_size,
              num_pages = args.num_pages;
    const float eps = args.eps;
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
        compress_finish(scratch + (size_t)jb * HEAD_DIM, J.index, ratio, norm, eps, rope, pool, page_bytes, page_size,
                        J.page, J.off, lane);
    }
}
