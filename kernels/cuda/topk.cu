// The lightning indexer's top-k selection (DESIGN.md section 9,
// "Selection"), bit-identical to attention/mla/cpu's IndexerTopK:
//
//   topk_score   grid (rows, tile blocks): block (r, x) scores the tiles
//                x, x + gridDim.y, ... of row r's visible entries, one
//                entry a thread, and writes each score's key
//                (mla.TopKKey) to the row's keys in the scratch space.
//   topk_score_mma4x  grid (row groups of 4, tile blocks): the block dots
//                on the int8 tensor cores (mma.sync) for four rows of a
//                sequence at a time (decode's 1+MTP tokens), each entry
//                read once for them, in blocks of 8 warps: the same keys.
//   topk_select4n  grid (rows): block r finds the threshold key by a radix
//                select over row r's keys (4 passes of 8 bits from the
//                top, the keys in shared memory where they fit, else one
//                sampled candidate sweep), then writes the entries above it
//                and the first ones equal to it in ascending index order;
//                blocks of 256 threads, for launches of many short rows.
//   topk_select5e the same indices in blocks of 1024 threads, with up to
//                three radix passes of 11, 11 and 10 bits where a row's
//                keys fit shared memory, ending after the first pass whose
//                bin's keys are all taken.
// (The variants before these, topk_score_mma, topk_score_mma4..mma4w,
// topk_select..topk_select5 (5 without the early end), topk_select5n, topk_select6 and
// topk_score_mma4xs (the select in the score kernel's clusters), are in the
// history up to 2026-12-02; BENCHMARKS.md has their measurements.)
//
// The score is exact by construction: e2m1 values doubled are small
// integers, so a 32-value block's dot product is an exact int32 (dp4a);
// scaling it by its two power-of-two scales rounds once to float32 (as
// the host does in float64), and the four block partials, relu, the head
// weight and the head sum follow in the fixed order with _rn intrinsics
// (compiled with --fmad=false as well). A row that sees at most top_k
// entries selects them all: neither kernel reads its keys or the cache.
// Both kernels read the plan as mla.ResolveTopKRow and mla.TopKPage do.

#include "common.cuh"

// One row's place in the plan (mla.TopKRow).
struct TkRow {
    int valid, seq, visible;
    long long keys;
};

// ns: the plan's header word TOPK_PLAN_HDR_SEQS; the search reads
// sequence m's first row at firsts[m * fstride] (in the plan, or a copy).
__device__ __forceinline__ TkRow tk_resolve_in(const TopKParams& p, int ns, const int* firsts, int fstride, int r) {
    TkRow t = {0, 0, 0, 0};
    if (ns < 0 || ns > p.max_seqs) ns = 0;
    const int* seqs = p.plan + TOPK_PLAN_HDR_WORDS;
    int lo = 0, hi = ns;
    while (lo < hi) {
        int m = (lo + hi) >> 1;
        if (firsts[m * fstride] <= r) lo = m + 1;
        else hi = m;
    }
    int i = lo - 1;
    if (i < 0) return t;
    const int* s = seqs + i * TOPK_SEQ_WORDS;
    long long row = s[TOPK_SEQ_ROW], rows = s[TOPK_SEQ_ROWS], start = s[TOPK_SEQ_START];
    if ((long long)r >= row + rows || start < 0 || start > (long long)MAX_TOPK_POSITIONS - 1 - (r - row)) return t;
    long long pos = start + (r - row);
    t.valid = 1;
    t.seq = i;
    t.visible = (int)((pos + 1) / 4);
    if (t.visible <= p.top_k) return t;
    long long scratch = s[TOPK_SEQ_SCRATCH], stride = s[TOPK_SEQ_STRIDE];
    t.keys = scratch + (r - row) * stride;
    if (scratch < 0 || stride < t.visible || t.keys + t.visible > (long long)p.scratch_entries) {
        TkRow none = {0, 0, 0, 0};
        return none;
    }
    return t;
}

__device__ __forceinline__ TkRow tk_resolve(const TopKParams& p, int r) {
    return tk_resolve_in(p, p.plan[TOPK_PLAN_HDR_SEQS], p.plan + TOPK_PLAN_HDR_WORDS + TOPK_SEQ_ROW, TOPK_SEQ_WORDS, r);
}

// The cache page of entry e of sequence seq, or -1 (mla.TopKPage).
__device__ __forceinline__ int tk_page(const TopKParams& p, const int* table, int e) {
    int j = e / p.page_size;
    if (j >= p.page_stride) return -1;
    int pg = table[j];
    return pg >= 0 && pg < p.num_pages ? pg : -1;
}

// Four e2m1 nibbles, one in bits 0-3 of each byte, as four int8 doubled
// values: the magnitude code indexes {0, 1, 2, 3, 4, 6, 8, 12} by a byte
// permute, bit 3 negates the byte.
__device__ __forceinline__ u32 tk_nib4(u32 c) {
    u32 sel = (c & 0x7u) | ((c >> 4) & 0x70u) | ((c >> 8) & 0x700u) | ((c >> 12) & 0x7000u);
    u32 mag = __byte_perm(0x03020100u, 0x0C080604u, sel);
    u32 neg = ((c >> 3) & 0x01010101u) * 0xFFu;
    return (mag & ~neg) | (__vsub4(0u, mag) & neg);
}

// One word of nibble bytes (8 values) as two words of doubled int8: the
// even elements, then the odd ones. Query and key use the same order, so
// the dot products pair the same elements.
__device__ __forceinline__ void tk_decode(u32 x, u32& lo, u32& hi) {
    lo = tk_nib4(x & 0x0F0F0F0Fu);
    hi = tk_nib4((x >> 4) & 0x0F0F0F0Fu);
}

// d * 2^x rounded once to float32 (d the exact block dot of doubled
// values, x = eq + ek - 256): one float multiply where 2^x is a float32
// (exact operands, so the product is rounded once, subnormals included),
// double otherwise (x in [-256, 254], every such 2^x a normal double).
__device__ __forceinline__ float tk_scale(int d, int x) {
    if (x >= -149 && x <= 127) {
        float s = x >= -126 ? __int_as_float((x + 127) << 23) : __int_as_float(1 << (x + 149));
        return __fmul_rn(__int2float_rn(d), s);
    }
    return __double2float_rn(__dmul_rn((double)d, __longlong_as_double((long long)(x + 1023) << 52)));
}

// mla.TopKKey.
__device__ __forceinline__ u32 tk_key(float f) {
    u32 b = __float_as_uint(f);
    u32 a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0u;
    if (a == 0u) return 0x80000000u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

#define TK_KW 17 // 32-bit words of one 68-byte entry

extern "C" __global__ void __launch_bounds__(TOPK_SCORE_THREADS) topk_score(const TopKParams p) {
    __shared__ u32 qs[INDEXER_HEADS * 32];  // doubled query values: head h, block b at [h*32 + b*8, +8)
    __shared__ int qe[INDEXER_HEADS * 4];   // query scale bytes
    __shared__ float qw[INDEXER_HEADS];     // head weights
    __shared__ u32 ks[TOPK_SCORE_THREADS * TK_KW]; // the tile's entries as stored
    pdl_wait();
    pdl_trigger();
    const int r = blockIdx.x;
    if (r >= p.rows) return;
    const TkRow t = tk_resolve(p, r);
    if (!t.valid || t.visible <= p.top_k) return;
    const int n = t.visible;
    const int ntiles = (n + TOPK_SCORE_THREADS - 1) / TOPK_SCORE_THREADS;
    if ((int)blockIdx.y >= ntiles) return;
    const int* table = p.plan + TOPK_PLAN_HDR_WORDS + p.max_seqs * TOPK_SEQ_WORDS + (long long)t.seq * p.page_stride;
    const u8* qrow = p.q + (size_t)r * (INDEXER_HEADS * MXFP4_ROW_BYTES);
    for (int i = threadIdx.x; i < INDEXER_HEADS * 16; i += TOPK_SCORE_THREADS) {
        int h = i >> 4, j = i & 15; // word j of head h: elements [8j, 8j+8), block j/4
        u32 lo, hi;
        tk_decode(*(const u32*)(qrow + h * MXFP4_ROW_BYTES + 4 * j), lo, hi);
        qs[h * 32 + 2 * j] = lo;
        qs[h * 32 + 2 * j + 1] = hi;
    }
    for (int i = threadIdx.x; i < INDEXER_HEADS * 4; i += TOPK_SCORE_THREADS) qe[i] = qrow[(i >> 2) * MXFP4_ROW_BYTES + 64 + (i & 3)];
    for (int i = threadIdx.x; i < INDEXER_HEADS; i += TOPK_SCORE_THREADS)
        qw[i] = __uint_as_float((u32)p.w[(size_t)r * INDEXER_HEADS + i] << 16);
    u32* keys = p.scratch + t.keys;
    const size_t page_bytes = (size_t)p.page_size * MXFP4_ROW_BYTES;
    for (int tile = blockIdx.y; tile < ntiles; tile += gridDim.y) {
        const int s0 = tile * TOPK_SCORE_THREADS;
        const int cnt = min(TOPK_SCORE_THREADS, n - s0);
        __syncthreads(); // the previous tile's entries are read (and, first, the query is in place)
        for (int i = threadIdx.x; i < cnt * TK_KW; i += TOPK_SCORE_THREADS) {
            int e = i / TK_KW, wd = i - e * TK_KW;
            int s = s0 + e;
            int pg = tk_page(p, table, s);
            u32 v = 0;
            if (pg >= 0) v = *(const u32*)(p.cache + (size_t)pg * page_bytes + (size_t)(s % p.page_size) * MXFP4_ROW_BYTES + 4 * wd);
            ks[i] = v;
        }
        __syncthreads();
        if ((int)threadIdx.x < cnt) {
            const int s = s0 + threadIdx.x;
            u32 key = 0u; // an entry without a page scores NaN
            if (tk_page(p, table, s) >= 0) {
                u32 k[32];
                const u32* kw = ks + threadIdx.x * TK_KW;
#pragma unroll
                for (int j = 0; j < 16; j++) tk_decode(kw[j], k[2 * j], k[2 * j + 1]);
                const u32 sc = kw[16];
                int ke[4];
#pragma unroll
                for (int b = 0; b < 4; b++) ke[b] = (int)((sc >> (8 * b)) & 0xFFu) - 256;
                float score = 0.f;
                for (int h = 0; h < INDEXER_HEADS; h++) {
                    float dot = 0.f;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        int d = 0;
#pragma unroll
                        for (int j = 0; j < 8; j++) d = __dp4a((int)qs[h * 32 + b * 8 + j], (int)k[b * 8 + j], d);
                        float pb = tk_scale(d, qe[h * 4 + b] + ke[b]);
                        dot = b == 0 ? pb : __fadd_rn(dot, pb);
                    }
                    float rl = dot > 0.f ? dot : 0.f;
                    score = __fadd_rn(score, __fmul_rn(qw[h], rl));
                }
                key = tk_key(score);
            }
            keys[s] = key;
        }
    }
}

// 2^e as a float32, e in [-149, 127] (subnormal below -126).
__device__ __forceinline__ float tk_pow2(int e) {
    return e >= -126 ? __int_as_float((e + 127) << 23) : __int_as_float(1 << (e + 149));
}

#define TK4_QC 264 // words between the rows of qc: 4 x 64 and 8, so the rows' LDS.64 hit distinct banks

// tk_dec4's tables: the doubled e2m1 magnitudes {0, 1, 2, 3, 4, 6, 8, 12}
// by magnitude code, bytes 0-3 and 4-7 (each times 2^s for a shift s <= 3:
// every byte stays below 128, none spills into the next).
#define TK_DEC_LO 0x03020100u
#define TK_DEC_HI 0x0C080604u

// The four e2m1 nibbles in bits 0-15 of v (value i at bits 4i..4i+3) as
// four int8 doubled values times 2^s, given the tables shifted by s. A
// prmt selector nibble with bit 3 set replicates its byte's sign bit
// instead of copying it: 0 for every table byte, so the first permute
// keeps the positive values' magnitudes and the second, with the signs
// flipped, the negative ones'; those are negated bytewise (0x80 - m never
// borrows for m <= 96) and the two merged.
__device__ __forceinline__ u32 tk_dec4(u32 v, u32 tlo, u32 thi) {
    u32 pos, neg;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(pos) : "r"(tlo), "r"(thi), "r"(v));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(neg) : "r"(tlo), "r"(thi), "r"(v ^ 0x8888u));
    return pos | ((0x80808080u - neg) ^ 0x80808080u);
}

// One 32-bit word copied to shared memory asynchronously (cp.async,
// through L1), zeros where !ok (nothing is read then).
__device__ __forceinline__ void tk_cp4(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src), "r"(ok ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void tk_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void tk_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// A warp's tile buffer (its 32 entries as stored), words.
#define TK4P_WBUF (32 * TK_KW)

// 16 bytes copied to shared memory asynchronously (cp.async, L2 only);
// both addresses 16-byte aligned.
__device__ __forceinline__ void tk_cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}

// The word of qc (the query's C words) of row t, block b, head h:
// [t][b][h] for JG 0; [t][h / 2][b][h % 2] otherwise, a head pair's words
// for its four blocks in 8 consecutive words, so that one 16-byte load
// gives blocks 0 and 1, {c0, c1, c0', c1'}: the pair's C quad itself on
// the exact path (every block of a shifted head has the same C), and two
// loads give the four blocks'.
template <int JG>
__device__ __forceinline__ int tk4_qc(int t, int b, int h) {
    return JG == 0 ? t * TK4_QC + b * 64 + h : t * TK4_QC + (h >> 1) * 8 + b * 2 + (h & 1);
}

// D = A . B + C over one 32-value block (A 16 entries, B 8 columns: four
// rows, two heads each; C a register quad), exact int32, and D += A . B:
// plain asm (no side effect, so the compiler may interleave independent
// ones).
__device__ __forceinline__ void tk_mma_q(int d[4], const uint4 a, const uint2 b, const uint4 c) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y), "r"(c.x), "r"(c.y), "r"(c.z), "r"(c.w));
}
__device__ __forceinline__ void tk_mma_accq(int d[4], const uint4 a, const uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}

// topk_score_mma4x's dynamic shared memory (bytes): the query's B
// fragments and C words, the head weights as quads {w0, w1, nm0, nm1} a
// head pair (wn: the weights and the exact path's products), two tile buffers a warp
// (first the pass's query rows as stored), the query's base bytes.
#define TK4X_WN 34 // float4 between the rows of wn: 32 and 2, so the rows' LDS.128 hit distinct banks
#define TK4X_QF 0
#define TK4X_QC (TK4X_QF + 32 * 4 * 32 * 8)
#define TK4X_QN (TK4X_QC + TOPK_SCORE4_ROWS * TK4_QC * 4)
#define TK4X_KS (TK4X_QN + TOPK_SCORE4_ROWS * TK4X_WN * 16)
#define TK4X_QB (TK4X_KS + TOPK_SCORE4X_THREADS / 32 * 2 * TK4P_WBUF * 4)
static_assert(TK4X_QB + TOPK_SCORE4_ROWS * INDEXER_HEADS == TOPK_SCORE4X_SHARED, "TOPK_SCORE4X_SHARED is topk_score_mma4x's layout");
static_assert(TOPK_SCORE4_ROWS * INDEXER_HEADS * MXFP4_ROW_BYTES <= TK4X_QB - TK4X_KS, "the pass's query rows fit the tile buffers");
static_assert(TK4X_KS % 16 == 0 && TK4X_QN % 16 == 0 && TK4X_QC % 16 == 0, "cp.async destinations and 16-byte loads aligned");
static_assert((INDEXER_HEADS * MXFP4_ROW_BYTES) % 16 == 0, "a query row is whole 16-byte chunks");

// The uint4 of topk_score_mma4x's B fragments that lane l reads for head
// pair j, blocks 2 bp and 2 bp + 1: {block 2 bp's pair, block 2 bp + 1's}.
// One 16-byte load gives two blocks' fragments, 32 lanes 512 consecutive
// bytes (no bank conflict).
__device__ __forceinline__ int tk4x_qf(int j, int bp, int l) { return (j * 2 + bp) * 32 + l; }

// topk_score_mma4x: block (x, y) takes rows 4x..4x+3, a pass for each sequence among them
// (one in decode with MTP 3). A pass copies the rows' queries to shared
// memory in 16-byte chunks, resolves their scales (an exact integer path
// where a row's four block scales lie within 3 of their least, the
// general one otherwise) and decodes the mma's B fragments (two blocks'
// in one 16-byte load, tk4x_qf); then it scores tiles y, y + gridDim.y,
// ... of TOPK_SCORE4X_THREADS entries, each warp streaming its own 32
// entries through two cp.async buffers: the block dots on the int8 mma
// (the entries its M, the (row, head) pairs its N), each block partial
// scaled and summed with the head weights in the contract's float32
// order, the exact path's weights and products fl(-w M) set once a pass
// in one float4 a head pair. Blocks of 8 warps, two a multiprocessor (the
// registers). (Its predecessors topk_score_mma4..mma4w, with the same
// integer dots and float32 instructions in the same order, and what each
// step bought: BENCHMARKS.md, bench/results/2026-12-02-h200-j/tscore; in
// blocks of 4 warps, with its exact loop software-pipelined, or with a
// pass's first tile copied before its setup it was no faster.)
extern "C" __global__ void __launch_bounds__(TOPK_SCORE4X_THREADS, 2) topk_score_mma4x(const TopKParams p) {
    constexpr int NT = TOPK_SCORE4X_THREADS;
    extern __shared__ __align__(16) u8 tk4x_smem[];
    uint4* qf = (uint4*)(tk4x_smem + TK4X_QF);   // B fragments: tk4x_qf
    u32* qc = (u32*)(tk4x_smem + TK4X_QC);       // C: tk4_qc<2>; 0 where E_b > 231
    float4* wn = (float4*)(tk4x_smem + TK4X_QN); // row t, pair j at t*TK4X_WN + j: {w0, w1, fl(-w0 M0), fl(-w1 M1)}
    float* wnf = (float*)wn;                     // head h's weight at wq(t, h), its nm 2 floats on
    u8* qraw = tk4x_smem + TK4X_KS;              // the pass's query rows as stored, [t][h][MXFP4_ROW_BYTES]
    u8* qbase = tk4x_smem + TK4X_QB;             // row t, head h: E where its blocks are shifted, else 255
    auto wq = [](int t, int h) { return (t * TK4X_WN + (h >> 1)) * 4 + (h & 1); };
    __shared__ int rseq[TOPK_SCORE4_ROWS], rvis[TOPK_SCORE4_ROWS];
    __shared__ long long rkeys[TOPK_SCORE4_ROWS];
    __shared__ int qmn[4], qmx[4]; // the pass's least and largest query scale byte per block
    __shared__ int klo, khi, xbad;  // the exact path: ek_min's range, and whether some query head rules it out
    const int r0 = blockIdx.x * TOPK_SCORE4_ROWS;
    if (r0 >= p.rows) return;
    if (threadIdx.x < TOPK_SCORE4_ROWS) {
        const int r = r0 + threadIdx.x;
        TkRow t = {0, 0, 0, 0};
        if (r < p.rows) t = tk_resolve(p, r);
        const bool scored = t.valid && t.visible > p.top_k; // else the select needs no keys
        rseq[threadIdx.x] = scored ? t.seq : -1;
        rvis[threadIdx.x] = scored ? t.visible : 0;
        rkeys[threadIdx.x] = t.keys;
    }
    __syncthreads();
    pdl_wait(); // the rows resolved before the wait, as the selects do: no kernel writes the plan
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const size_t page_bytes = (size_t)p.page_size * MXFP4_ROW_BYTES;
    u32* wks = (u32*)(tk4x_smem + TK4X_KS) + warp * 2 * TK4P_WBUF; // this warp's two tile buffers
    int done = 0; // rows of earlier passes (bit t)
    for (;;) {
        int seq = -1;
        for (int t = 0; t < TOPK_SCORE4_ROWS; t++)
            if (!((done >> t) & 1) && rseq[t] >= 0) {
                seq = rseq[t];
                break;
            }
        if (seq < 0) break;
        int act = 0, n = 0;
        for (int t = 0; t < TOPK_SCORE4_ROWS; t++)
            if (rseq[t] == seq) {
                act |= 1 << t;
                n = max(n, rvis[t]);
            }
        done |= act;
        const int ntiles = (n + NT - 1) / NT;
        if ((int)blockIdx.y >= ntiles) continue; // block-uniform
        __syncthreads(); // the previous pass is done with the query arrays and the tile buffers
        const int* table = p.plan + TOPK_PLAN_HDR_WORDS + p.max_seqs * TOPK_SEQ_WORDS + (long long)seq * p.page_stride;
        const int gy = gridDim.y;
        // log2 of the page size where it is a power of two, else -1.
        const int pshift = (p.page_size & (p.page_size - 1)) == 0 ? __ffs(p.page_size) - 1 : -1;
        // The byte offset of this lane's entry of tile x in the cache, -1
        // past the pass's entries or without a page (tk_page, the division
        // a shift where it can be).
        auto entry_off = [&](int x) -> long long {
            const int s = x * NT + warp * 32 + lane;
            if (x >= ntiles || s >= n) return -1;
            const int j = pshift >= 0 ? s >> pshift : s / p.page_size;
            const int pg = j < p.page_stride ? table[j] : -1;
            return pg >= 0 && pg < p.num_pages ? (long long)pg * (long long)page_bytes + (long long)(s - j * p.page_size) * MXFP4_ROW_BYTES : -1;
        };
        // The warp's 32 entries of a tile into buffer buf, lane l's offset
        // o: word i of the buffer is word i % TK_KW of entry i / TK_KW; as
        // 16-byte chunks where they are one aligned run (the usual case).
        auto issue = [&](int buf, long long o) {
            u32* dst = wks + buf * TK4P_WBUF;
            const long long o0 = __shfl_sync(0xFFFFFFFFu, o, 0);
            const u8* src = p.cache + o0;
            if (__all_sync(0xFFFFFFFFu, o >= 0 && o == o0 + (long long)MXFP4_ROW_BYTES * lane) && ((size_t)src & 15u) == 0) {
#pragma unroll
                for (int c = lane; c < TK4P_WBUF / 4; c += 32) tk_cp16(dst + 4 * c, src + 16 * c);
                return;
            }
#pragma unroll
            for (int m = 0; m < TK_KW; m++) {
                const int i = m * 32 + lane, el = i / TK_KW, wd = i - el * TK_KW;
                const long long oe = __shfl_sync(0xFFFFFFFFu, o, el);
                tk_cp4(dst + i, p.cache + (oe >= 0 ? oe + 4 * wd : 0), oe >= 0);
            }
        };
        int tile = blockIdx.y;
        {
            const u8* src = p.q + (size_t)r0 * (INDEXER_HEADS * MXFP4_ROW_BYTES);
            constexpr int RW = INDEXER_HEADS * MXFP4_ROW_BYTES; // bytes of a row
            if (((size_t)src & 15u) == 0) { // block-uniform
                for (int i = threadIdx.x; i < TOPK_SCORE4_ROWS * RW / 16; i += NT)
                    if ((act >> (i / (RW / 16))) & 1) tk_cp16(qraw + 16 * i, src + 16 * (size_t)i);
            } else {
                for (int i = threadIdx.x; i < TOPK_SCORE4_ROWS * RW / 4; i += NT)
                    if ((act >> (i / (RW / 4))) & 1) tk_cp4(qraw + 4 * i, src + 4 * (size_t)i, true);
            }
        }
        tk_cp_commit();
        if (threadIdx.x < 4) {
            qmn[threadIdx.x] = 255;
            qmx[threadIdx.x] = 0;
        }
        if (threadIdx.x == 0) {
            klo = -1024;
            khi = 1024;
            xbad = 0;
        }
        for (int i = threadIdx.x; i < TOPK_SCORE4_ROWS * INDEXER_HEADS; i += NT) {
            const int t = i >> 6, h = i & 63;
            wnf[wq(t, h)] = (act >> t) & 1 ? __uint_as_float((u32)p.w[(size_t)(r0 + t) * INDEXER_HEADS + h] << 16) : 0.f;
        }
        tk_cp_wait<0>();
        __syncthreads(); // the query rows, the weights, qmn, qmx, klo, khi, xbad in place
        // Each thread's share of the ranges, then one atomic a warp for each.
        int tmn[4] = {255, 255, 255, 255}, tmx[4] = {0, 0, 0, 0}, tbad = 0, tlo = -1024, thi = 1024;
        for (int i = threadIdx.x; i < TOPK_SCORE4_ROWS * INDEXER_HEADS; i += NT) {
            const int t = i >> 6, h = i & 63;
            int base = 255;
            if ((act >> t) & 1) {
                const u8* row = qraw + (t * INDEXER_HEADS + h) * MXFP4_ROW_BYTES;
                int eq[4], mn = 255, mx = 0;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    eq[b] = row[64 + b];
                    mn = min(mn, eq[b]);
                    mx = max(mx, eq[b]);
                    tmn[b] = min(tmn[b], eq[b]);
                    tmx[b] = max(tmx[b], eq[b]);
                }
                const bool shifted = mx - mn <= 3 && mx <= 231;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const int e = shifted ? mn : eq[b];
                    qc[tk4_qc<2>(t, b, h)] = e <= 231 ? ((u32)(e + 23) << 23) | 0x400000u : 0u;
                }
                if (shifted) base = mn;
                const u32 wb = __float_as_uint(wnf[wq(t, h)]) >> 16; // the bf16 weight
                const int ef = (int)((wb >> 7) & 0xFFu);
                const bool wzero = (wb & 0x7FFFu) == 0u;
                bool bad = !shifted || ef == 255 || (ef == 0 && !wzero);
                int lo = 107 - mn, hi = 362 - mn;
                if (!bad && !wzero) {
                    const int we = ef - 127 + mn;
                    bad = we < 1 || we > 225;
                    lo = max(lo, 130 - we);
                    hi = min(hi, 354 - we);
                }
                tbad |= bad;
                tlo = max(tlo, lo);
                thi = min(thi, hi);
            } else {
#pragma unroll
                for (int b = 0; b < 4; b++) qc[tk4_qc<2>(t, b, h)] = 0u;
            }
            qbase[i] = (u8)base;
        }
#pragma unroll
        for (int b = 0; b < 4; b++) {
            tmn[b] = __reduce_min_sync(0xFFFFFFFFu, tmn[b]);
            tmx[b] = __reduce_max_sync(0xFFFFFFFFu, tmx[b]);
        }
        tbad = __reduce_or_sync(0xFFFFFFFFu, (unsigned)tbad);
        tlo = __reduce_max_sync(0xFFFFFFFFu, tlo);
        thi = __reduce_min_sync(0xFFFFFFFFu, thi);
        if (lane == 0) {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                atomicMin(&qmn[b], tmn[b]);
                atomicMax(&qmx[b], tmx[b]);
            }
            if (tbad) atomicMax(&xbad, 1);
            atomicMax(&klo, tlo);
            atomicMin(&khi, thi);
        }
        __syncthreads(); // qc, qbase, qmn, qmx, klo, khi, xbad written
        // Item (t, h, bp): B column gg = 2 t + h % 2 of fragments (h / 2,
        // 2 bp) and (h / 2, 2 bp + 1), lanes 4 gg + tt: tk_dec4 of the
        // block's word tt, low half (x) and high half (y).
        for (int i = threadIdx.x; i < TOPK_SCORE4_ROWS * INDEXER_HEADS * 2; i += NT) {
            const int bp = i & 1, th = i >> 1, t = th >> 6, h = th & 63, gg = 2 * t + (h & 1);
            uint4 v[4] = {}; // lane 4 gg + tt: {block 2 bp: x, y, block 2 bp + 1: x, y}
            if ((act >> t) & 1) {
                const u8* raw = qraw + th * MXFP4_ROW_BYTES;
                const int base = qbase[th];
#pragma unroll
                for (int hb = 0; hb < 2; hb++) {
                    const int b = 2 * bp + hb;
                    const int sh = base == 255 ? 0 : raw[64 + b] - base;
                    const u32 tlo = TK_DEC_LO << sh, thi = TK_DEC_HI << sh;
                    const u32* w = (const u32*)(raw + 16 * b); // 4-byte aligned (68-byte rows)
                    const u32 ws[4] = {w[0], w[1], w[2], w[3]};
#pragma unroll
                    for (int tt = 0; tt < 4; tt++) {
                        const u32 x = tk_dec4(ws[tt], tlo, thi), y = tk_dec4(ws[tt] >> 16, tlo, thi);
                        if (hb == 0) {
                            v[tt].x = x;
                            v[tt].y = y;
                        } else {
                            v[tt].z = x;
                            v[tt].w = y;
                        }
                    }
                }
            }
#pragma unroll
            for (int tt = 0; tt < 4; tt++) qf[tk4x_qf(h >> 1, bp, 4 * gg + tt)] = v[tt];
        }
        // The exact path's products nm = fl(-w M), M block 0's C (inactive
        // rows: w = 0, M = 0).
        for (int i = threadIdx.x; i < TOPK_SCORE4_ROWS * INDEXER_HEADS; i += NT) {
            const int t = i >> 6, h = i & 63;
            wnf[wq(t, h) + 2] = __fmul_rn(-wnf[wq(t, h)], __uint_as_float(qc[tk4_qc<2>(t, 0, h)]));
        }
        __syncthreads(); // the query arrays in place; the query rows are read: the tile buffers are free
        const bool mine = (act >> tq) & 1; // this lane's row is in the pass
        const int vis = rvis[tq];
        u32* keys = p.scratch + rkeys[tq];
        const u8* qrow = p.q + (size_t)(r0 + tq) * (INDEXER_HEADS * MXFP4_ROW_BYTES);
        const u32* qcr = qc + tq * TK4_QC;
        const float4* wnr = wn + tq * TK4X_WN;
        long long ocur = entry_off(tile);
        issue(0, ocur);
        tk_cp_commit();
        long long onxt = entry_off(tile + gy);
        for (int it = 0; tile < ntiles; it++, tile += gy) {
            if (tile + gy < ntiles) issue((it + 1) & 1, onxt); // warp-uniform
            tk_cp_commit();
            const long long onn = entry_off(tile + 2 * gy); // its table read overlaps this tile's scoring
            tk_cp_wait<1>();
            __syncwarp(); // every lane's copies of this tile landed
            const u32* ks = wks + (it & 1) * TK4P_WBUF;
            const int sw = tile * NT + warp * 32; // the entry of ks's first
            const unsigned have = __ballot_sync(0xFFFFFFFFu, ocur >= 0); // entries with a page
            if (sw < n) { // warp-uniform
                bool fok = true, xok = true;
                if (ocur >= 0) {
                    const u32 sc = ks[lane * TK_KW + 16];
                    int mn = 255, mx = 0;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        const int ek = (int)((sc >> (8 * b)) & 0xFFu);
                        fok = fok && qmx[b] <= 231 && ek + qmn[b] >= 107 && ek + qmx[b] <= 371;
                        mn = min(mn, ek);
                        mx = max(mx, ek);
                    }
                    xok = mx - mn <= 3 && mn >= klo && mn <= khi;
                }
                const bool exact = __all_sync(0xFFFFFFFFu, xok) && xbad == 0;
                const bool fast = __all_sync(0xFFFFFFFFu, fok);
                uint4 a[2][4];
                u32 ksc[2][2];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const u32* k0 = ks + (mt * 16 + g) * TK_KW;
                    const u32* k1 = k0 + 8 * TK_KW;
                    ksc[mt][0] = k0[16];
                    ksc[mt][1] = k1[16];
                    int m0 = 0, m1 = 0;
                    if (exact) {
                        m0 = 255;
                        m1 = 255;
#pragma unroll
                        for (int b = 0; b < 4; b++) {
                            m0 = min(m0, (int)((ksc[mt][0] >> (8 * b)) & 0xFFu));
                            m1 = min(m1, (int)((ksc[mt][1] >> (8 * b)) & 0xFFu));
                        }
                    }
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        const int s0b = exact ? (int)((ksc[mt][0] >> (8 * b)) & 0xFFu) - m0 : 0;
                        const int s1b = exact ? (int)((ksc[mt][1] >> (8 * b)) & 0xFFu) - m1 : 0;
                        const u32 t0l = TK_DEC_LO << s0b, t0h = TK_DEC_HI << s0b, t1l = TK_DEC_LO << s1b, t1h = TK_DEC_HI << s1b;
                        const u32 w0 = k0[4 * b + tq], w1 = k1[4 * b + tq];
                        a[mt][b].x = tk_dec4(w0, t0l, t0h);
                        a[mt][b].y = tk_dec4(w1, t1l, t1h);
                        a[mt][b].z = tk_dec4(w0 >> 16, t0l, t0h);
                        a[mt][b].w = tk_dec4(w1 >> 16, t1l, t1h);
                    }
                }
                float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}}; // the head sums of (m-tile, entry c)
                const uint4* qfp = qf + lane;
                if (exact) {
                    // The exact loop, two head pairs a step; its nm from wn.
                    const u32* qcp = qcr;
                    const float4* wnp = wnr;
#pragma unroll 1
                    for (int j0 = 0; j0 < 32; j0 += 2, qfp += 2 * 2 * 32, qcp += 2 * 8, wnp += 2) {
                        uint4 cm[2]; // {c0, c1, c0, c1}: pair j0 + jj's C quad
                        int d[2][2][4];
#pragma unroll
                        for (int jj = 0; jj < 2; jj++) cm[jj] = *(const uint4*)(qcp + jj * 8);
#pragma unroll
                        for (int bp = 0; bp < 2; bp++) {
                            uint4 bq2[2];
#pragma unroll
                            for (int jj = 0; jj < 2; jj++) bq2[jj] = qfp[(jj * 2 + bp) * 32];
#pragma unroll
                            for (int hb = 0; hb < 2; hb++)
#pragma unroll
                                for (int jj = 0; jj < 2; jj++) {
                                    const int b = 2 * bp + hb;
                                    const uint2 bq = hb ? make_uint2(bq2[jj].z, bq2[jj].w) : make_uint2(bq2[jj].x, bq2[jj].y);
#pragma unroll
                                    for (int mt = 0; mt < 2; mt++) {
                                        if (b == 0)
                                            tk_mma_q(d[jj][mt], a[mt][0], bq, cm[jj]);
                                        else
                                            tk_mma_accq(d[jj][mt], a[mt][b], bq);
                                    }
                                }
                        }
#pragma unroll
                        for (int jj = 0; jj < 2; jj++) {
                            const float4 w4 = wnp[jj]; // {w0, w1, nm0, nm1}
#pragma unroll
                            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                                for (int i = 0; i < 4; i++) {
                                    const int c = i >> 1, hp = i & 1;
                                    const float f = __int_as_float(max(d[jj][mt][i], (int)(hp ? cm[jj].y : cm[jj].x)));
                                    acc[mt][c] = __fadd_rn(acc[mt][c], __fmaf_rn(hp ? w4.y : w4.x, f, hp ? w4.w : w4.z));
                                }
                        }
                    }
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            int mn = 255;
#pragma unroll
                            for (int b = 0; b < 4; b++) mn = min(mn, (int)((ksc[mt][c] >> (8 * b)) & 0xFFu));
                            acc[mt][c] = __fmul_rn(acc[mt][c], tk_pow2(mn - 129));
                        }
                } else if (fast) {
                    float sk[2][2][4]; // 2^(ek_b - 129) of this lane's entries
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int c = 0; c < 2; c++)
#pragma unroll
                            for (int b = 0; b < 4; b++) sk[mt][c][b] = tk_pow2((int)((ksc[mt][c] >> (8 * b)) & 0xFFu) - 129);
                    // The fast path: block by block, each block's dots
                    // folded into the (pair, head) sums at once.
                    const u32* qcp = qcr;
                    const float4* wnp = wnr;
#pragma unroll 2
                    for (int j = 0; j < 32; j++, qfp += 2 * 32, qcp += 8, wnp++) {
                        const uint4 c01 = *(const uint4*)qcp, c23 = *(const uint4*)(qcp + 4);
                        const uint2 cq[4] = {make_uint2(c01.x, c01.y), make_uint2(c01.z, c01.w), make_uint2(c23.x, c23.y), make_uint2(c23.z, c23.w)};
                        const uint4 q01 = qfp[0], q23 = qfp[32];
                        const uint2 bqs[4] = {make_uint2(q01.x, q01.y), make_uint2(q01.z, q01.w), make_uint2(q23.x, q23.y), make_uint2(q23.z, q23.w)};
                        float dot[2][4];
#pragma unroll
                        for (int b = 0; b < 4; b++) {
                            int d[2][4];
#pragma unroll
                            for (int mt = 0; mt < 2; mt++) tk_mma_q(d[mt], a[mt][b], bqs[b], make_uint4(cq[b].x, cq[b].y, cq[b].x, cq[b].y));
#pragma unroll
                            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                                for (int i = 0; i < 4; i++) {
                                    const int c = i >> 1, hp = i & 1;
                                    const float pq = __fsub_rn(__int_as_float(d[mt][i]), __uint_as_float(hp ? cq[b].y : cq[b].x));
                                    dot[mt][i] = b == 0 ? __fmul_rn(pq, sk[mt][c][b]) : __fmaf_rn(pq, sk[mt][c][b], dot[mt][i]);
                                }
                        }
                        const float2 w2 = *(const float2*)wnp;
#pragma unroll
                        for (int mt = 0; mt < 2; mt++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                const int c = i >> 1, hp = i & 1;
                                acc[mt][c] = __fadd_rn(acc[mt][c], __fmul_rn(hp ? w2.y : w2.x, fmaxf(dot[mt][i], 0.f)));
                            }
                    }
                } else {
#pragma unroll 1
                    for (int j = 0; j < 32; j++) {
                        const uint4 c01 = *(const uint4*)(qcr + j * 8), c23 = *(const uint4*)(qcr + j * 8 + 4);
                        const uint2 cq[4] = {make_uint2(c01.x, c01.y), make_uint2(c01.z, c01.w), make_uint2(c23.x, c23.y), make_uint2(c23.z, c23.w)};
                        const uint4 q01 = qf[tk4x_qf(j, 0, lane)], q23 = qf[tk4x_qf(j, 1, lane)];
                        const uint2 bqs[4] = {make_uint2(q01.x, q01.y), make_uint2(q01.z, q01.w), make_uint2(q23.x, q23.y), make_uint2(q23.z, q23.w)};
                        int d[2][4][4];
#pragma unroll
                        for (int b = 0; b < 4; b++)
#pragma unroll
                            for (int mt = 0; mt < 2; mt++) tk_mma_q(d[mt][b], a[mt][b], bqs[b], make_uint4(cq[b].x, cq[b].y, cq[b].x, cq[b].y));
                        const float2 w2 = *(const float2*)(wnr + j);
#pragma unroll
                        for (int mt = 0; mt < 2; mt++)
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                const int c = i >> 1, hp = i & 1, h = 2 * j + hp;
                                float dot = 0.f;
#pragma unroll
                                for (int b = 0; b < 4; b++) {
                                    const u32 cb = hp ? cq[b].y : cq[b].x;
                                    const int dd = d[mt][b][i] - (int)cb;
                                    const int e = cb != 0u ? (int)(cb >> 23) - 23 : (mine ? (int)qrow[h * MXFP4_ROW_BYTES + 64 + b] : 0);
                                    const int ek = (int)((ksc[mt][c] >> (8 * b)) & 0xFFu);
                                    const float pb = tk_scale(dd, e + ek - 256);
                                    dot = b == 0 ? pb : __fadd_rn(dot, pb);
                                }
                                const float rl = dot > 0.f ? dot : 0.f;
                                acc[mt][c] = __fadd_rn(acc[mt][c], __fmul_rn(hp ? w2.y : w2.x, rl));
                            }
                    }
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int l = mt * 16 + c * 8 + g, s = sw + l;
                        if (mine && s < vis) keys[s] = (have >> l) & 1u ? tk_key(acc[mt][c]) : 0u; // an entry without a page scores NaN
                    }
            }
            __syncwarp(); // the buffer is read before the next tile but one is copied into it
            ocur = onxt;
            onxt = onn;
        }
        tk_cp_wait<0>(); // nothing in flight into the buffers the next pass's query rows take
    }
}

// Key i of a row: from shared memory (SH) or, read-only, from global.
template <bool SH>
__device__ __forceinline__ u32 tk_key_at(const u32* sk, const u32* gk, int i) {
    if (SH) return sk[i];
    return __ldg(gk + i);
}

// The radix select over n keys (in shared memory if SH,
// else read-only global memory): *th receives the want-th largest key and
// *take how many of the keys equal to it are among the want largest. Every
// thread must call it.
//
// PP (per-pass arrays): two barriers a pass instead of four.
// hist holds four histograms (4 x 256 words, 16-byte aligned), one a pass,
// zeroed at once, and s_pick a pair a pass (8 words), so that nothing is
// rewritten while a warp may still read it; the caller puts a barrier
// between two calls (a warp may still read the last pass's choice when
// another returns). A warp also carries its leading bin's count over its
// iterations (below).
template <bool SH, bool PP = false, int NT = TOPK_SELECT_THREADS>
__device__ __forceinline__ void tk_radix(const u32* sk, const u32* gk, int n, u32 want, u32* hist, u32* s_pick, u32* th,
                                         u32* take) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned full = 0xFFFFFFFFu;
    u32 prefix = 0u, mask = 0u, remain = want;
    if (PP) {
        for (int i = threadIdx.x; i < 4 * 256; i += NT) hist[i] = 0u;
        __syncthreads();
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        const int pass = 3 - shift / 8;
        u32* h = PP ? hist + pass * 256 : hist;
        u32* pick = PP ? s_pick + 2 * pass : s_pick;
        if (!PP) {
            for (int i = threadIdx.x; i < 256; i += NT) hist[i] = 0u;
            __syncthreads();
        }
        // A row's keys share their top bits, so most lanes of a warp fall
        // in the first active lane's bin: that lane adds their count at
        // once, the others one each (atomics on one address serialize).
        // With PP the warp also carries that count over its iterations
        // while the bin stays the same (run, warp-uniform), adding it once
        // the bin changes or the keys end: one atomic a warp a pass where
        // its keys share the pass's byte.
        u32 run = 0xFFFFFFFFu, rcnt = 0u;
#pragma unroll 4
        for (int b0 = warp * 32; b0 < n; b0 += NT) { // warp-uniform
            const int i = b0 + lane;
            const u32 k = i < n ? tk_key_at<SH>(sk, gk, i) : 0u;
            const bool in = i < n && (k & mask) == prefix;
            const u32 bin = (k >> shift) & 0xFFu;
            const unsigned act = __ballot_sync(full, in);
            if (act == 0u) continue;
            const int ld = __ffs(act) - 1;
            const u32 lbin = __shfl_sync(full, bin, ld);
            const unsigned same = __ballot_sync(full, in && bin == lbin);
            if (PP) {
                if (lbin != run) {
                    if (lane == 0 && rcnt != 0u) atomicAdd(&h[run], rcnt);
                    run = lbin;
                    rcnt = 0u;
                }
                rcnt += (u32)__popc(same);
                if (in && bin != lbin) atomicAdd(&h[bin], 1u);
            } else {
                if (lane == ld) atomicAdd(&h[lbin], (u32)__popc(same));
                else if (in && bin != lbin) atomicAdd(&h[bin], 1u);
            }
        }
        if (PP && lane == 0 && rcnt != 0u) atomicAdd(&h[run], rcnt);
        __syncthreads();
        if (warp == 0) { // the choice of the bin
            u32 c[8], sum = 0u;
            if (PP) { // bins 255 - 8 lane down to 248 - 8 lane, two vector loads
                const uint4 hi = *reinterpret_cast<const uint4*>(h + 252 - 8 * lane);
                const uint4 lo = *reinterpret_cast<const uint4*>(h + 248 - 8 * lane);
                c[0] = hi.w, c[1] = hi.z, c[2] = hi.y, c[3] = hi.x, c[4] = lo.w, c[5] = lo.z, c[6] = lo.y, c[7] = lo.x;
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) c[j] = hist[255 - (lane * 8 + j)];
            }
#pragma unroll
            for (int j = 0; j < 8; j++) sum += c[j];
            u32 incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                u32 y = __shfl_up_sync(full, incl, o);
                if (lane >= o) incl += y;
            }
            const int first = __ffs(__ballot_sync(full, incl >= remain)) - 1;
            if (lane == first) {
                u32 acc = incl - sum;
                int j = 0;
                for (; j < 7 && acc + c[j] < remain; j++) acc += c[j];
                const u32 np = prefix | ((u32)(255 - (lane * 8 + j)) << shift), nr = remain - acc;
                pick[0] = np;
                pick[1] = nr;
            }
        }
        __syncthreads();
        prefix = pick[0];
        remain = pick[1];
        mask |= 0xFFu << shift;
        if (!PP) __syncthreads(); // s_pick and hist are rewritten by the next pass
    }
    *th = prefix;
    *take = remain;
}

// The select's output given the threshold key prefix: the keys above it
// and the first remain keys equal to it, in ascending index. Warp w
// gathers keys [w*seg, w*seg + seg) in order: a taken key's place is the
// keys above the threshold before it plus min(remain, the keys equal to it
// before it), the warps' counts first added up. Every thread must call it.
template <bool SH, int NT = TOPK_SELECT_THREADS>
__device__ __forceinline__ void tk_gather(const u32* sk, const u32* gk, int n, u32 prefix, u32 remain, int* out, int (*wsum)[32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned full = 0xFFFFFFFFu;
    const int seg = (n + NT - 1) / NT * 32; // keys a warp
    const int lo = warp * seg, hi = min(n, lo + seg);
    int ngt = 0, neq = 0;
    for (int b = lo; b < hi; b += 32) {
        const int i = b + lane;
        const u32 k = i < hi ? tk_key_at<SH>(sk, gk, i) : 0u;
        ngt += __popc(__ballot_sync(full, i < hi && k > prefix));
        neq += __popc(__ballot_sync(full, i < hi && k == prefix));
    }
    if (lane == 0) {
        wsum[0][warp] = ngt;
        wsum[1][warp] = neq;
    }
    __syncthreads();
    int gs = __reduce_add_sync(full, lane < warp ? wsum[0][lane] : 0);
    int es = __reduce_add_sync(full, lane < warp ? wsum[1][lane] : 0);
    const unsigned below = (1u << lane) - 1u;
    for (int b = lo; b < hi; b += 32) {
        const int i = b + lane;
        const u32 k = i < hi ? tk_key_at<SH>(sk, gk, i) : 0u;
        const bool gt = i < hi && k > prefix, eq = i < hi && k == prefix;
        const unsigned gm = __ballot_sync(full, gt), em = __ballot_sync(full, eq);
        const int er = es + __popc(em & below);
        if (gt || (eq && er < (int)remain)) out[gs + __popc(gm & below) + min(er, (int)remain)] = i;
        gs += __popc(gm);
        es += __popc(em);
    }
}

// The select of a row's n keys (SH: staged in shared memory; PP:
// tk_radix's per-pass arrays).
template <bool SH, bool PP = false, int NT = TOPK_SELECT_THREADS>
__device__ __forceinline__ void tk_select2(const TopKParams& p, const u32* sk, const u32* gk, int n, int* out, u32* hist,
                                           u32* s_pick, int (*wsum)[32]) {
    u32 th, take;
    tk_radix<SH, PP, NT>(sk, gk, n, (u32)p.top_k, hist, s_pick, &th, &take);
    tk_gather<SH, NT>(sk, gk, n, th, take, out, wsum);
}

// tk_gather over the m entry indices at ol (ascending, each key at least
// the threshold): the same output.
template <int NT = TOPK_SELECT_THREADS>
__device__ __forceinline__ void tk_gather_list(const u32* ol, int m, const u32* gk, u32 prefix, u32 remain, int* out, int (*wsum)[32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned full = 0xFFFFFFFFu;
    const int seg = (m + NT - 1) / NT * 32;
    const int lo = warp * seg, hi = min(m, lo + seg);
    int ngt = 0, neq = 0;
    for (int b = lo; b < hi; b += 32) {
        const int s = b + lane;
        const u32 k = s < hi ? __ldg(gk + ol[s]) : 0u;
        ngt += __popc(__ballot_sync(full, s < hi && k > prefix));
        neq += __popc(__ballot_sync(full, s < hi && k == prefix));
    }
    if (lane == 0) {
        wsum[0][warp] = ngt;
        wsum[1][warp] = neq;
    }
    __syncthreads();
    int gs = __reduce_add_sync(full, lane < warp ? wsum[0][lane] : 0);
    int es = __reduce_add_sync(full, lane < warp ? wsum[1][lane] : 0);
    const unsigned below = (1u << lane) - 1u;
    for (int b = lo; b < hi; b += 32) {
        const int s = b + lane;
        const u32 k = s < hi ? __ldg(gk + ol[s]) : 0u;
        const bool gt = s < hi && k > prefix, eq = s < hi && k == prefix;
        const unsigned gm = __ballot_sync(full, gt), em = __ballot_sync(full, eq);
        const int er = es + __popc(em & below);
        if (gt || (eq && er < (int)remain)) out[gs + __popc(gm & below) + min(er, (int)remain)] = (int)ol[s];
        gs += __popc(gm);
        es += __popc(em);
    }
}

// tk_select3 selects row r (t resolved) with the kernel's shared memory
// (tks3 the dynamic part; hist and s_pick as tk_radix<PP> takes them):
// with the row's keys copied there where they fit (tk_select2). For a row
// whose keys do not (a long context), which tk_select2 would read from
// global memory six times (four radix passes, two gather sweeps): a sample (8 keys of every 128) in shared memory gives, by
// its radix select, a key L that about twice index_topk keys reach; one
// sweep copies the keys >= L with their indices to shared memory; the
// radix select over them finds the threshold (the row's own, as every key
// above it is among them); the indices of the keys at or above it are
// sorted (bitonic) and gathered. Where L lets fewer than index_topk keys
// or more than the room through, or the room is short, the row takes
// tk_select2's way from global memory.
template <bool PP, int NT = TOPK_SELECT_THREADS>
__device__ __forceinline__ void tk_select3(const TopKParams& p, int r, const TkRow& t, u32* tks3, u32* hist, u32* s_pick,
                                           int (*wsum)[32], int& s_cnt) {
    int* out = p.out + (size_t)r * p.top_k;
    const int n = t.valid ? t.visible : 0;
    if (n <= p.top_k) {
        for (int i = threadIdx.x; i < p.top_k; i += NT) out[i] = i < n ? i : -1;
        return;
    }
    const u32* keys = p.scratch + t.keys;
    u32 dsm;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsm));
    const int cap = (int)(dsm / 4u); // words
    if (n <= cap) {
        for (int i = threadIdx.x; i < n; i += NT) tk_cp4(tks3 + i, keys + i, true);
        tk_cp_commit();
        tk_cp_wait<0>();
        tk_select2<true, PP, NT>(p, tks3, keys, n, out, hist, s_pick, wsum);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned full = 0xFFFFFFFFu, below = (1u << lane) - 1u;
    const int top = p.top_k;
    const int ns = (n >> 7) * 8 + min(8, n & 127);    // the sample: keys i with i % 128 < 8
    const int q = min(ns, 2 * ((top + 15) / 16) + 8); // its rank of L: about 2 * top keys of the row reach it
    const int room = (cap - ns) / 3;                   // candidates: keys, indices, then the sorted indices
    bool ok = room >= 2 * top;
    if (ok) {
        u32* samp = tks3;
        u32* ck = samp + ns;
        u32* ci = ck + room;
        u32* ol = ci + room;
        for (int j = threadIdx.x; j < ns; j += NT) samp[j] = __ldg(keys + (j >> 3) * 128 + (j & 7));
        if (threadIdx.x == 0) s_cnt = 0;
        // (tk_radix's first barrier makes the sample and s_cnt visible)
        u32 L, lt;
        tk_radix<true, PP, NT>(samp, keys, ns, (u32)q, hist, s_pick, &L, &lt);
#pragma unroll 4
        for (int b0 = warp * 32; b0 < n; b0 += NT) { // warp-uniform
            const int i = b0 + lane;
            const u32 k = i < n ? __ldg(keys + i) : 0u;
            const bool c = i < n && k >= L;
            const unsigned cm = __ballot_sync(full, c);
            if (cm == 0u) continue;
            int base = 0;
            if (lane == 0) base = atomicAdd(&s_cnt, __popc(cm));
            base = __shfl_sync(full, base, 0);
            const int pos = base + __popc(cm & below);
            if (c && pos < room) {
                ck[pos] = k;
                ci[pos] = (u32)i;
            }
        }
        __syncthreads();
        const int cnt = s_cnt;
        ok = cnt >= top && cnt <= room;
        if (ok) {
            u32 T, take;
            tk_radix<true, PP, NT>(ck, keys, cnt, (u32)top, hist, s_pick, &T, &take); // every thread read cnt before its barriers
            if (threadIdx.x == 0) s_cnt = 0;
            __syncthreads();
            for (int b0 = warp * 32; b0 < cnt; b0 += NT) {
                const int i = b0 + lane;
                const bool c = i < cnt && ck[i] >= T;
                const unsigned cm = __ballot_sync(full, c);
                if (cm == 0u) continue;
                int base = 0;
                if (lane == 0) base = atomicAdd(&s_cnt, __popc(cm));
                base = __shfl_sync(full, base, 0);
                if (c) ol[base + __popc(cm & below)] = ci[i];
            }
            __syncthreads();
            const int m = s_cnt; // at least top, at most cnt
            int P = 1;
            while (P < m) P <<= 1;
            ok = P <= room;
            if (ok) {
                for (int i = m + threadIdx.x; i < P; i += NT) ol[i] = 0x7FFFFFFFu;
                __syncthreads();
                for (int k = 2; k <= P; k <<= 1)
                    for (int j = k >> 1; j > 0; j >>= 1) {
                        for (int i = threadIdx.x; i < P; i += NT) {
                            const int l = i ^ j;
                            if (l > i) {
                                const u32 a = ol[i], b = ol[l];
                                if ((a > b) == ((i & k) == 0)) {
                                    ol[i] = b;
                                    ol[l] = a;
                                }
                            }
                        }
                        __syncthreads();
                    }
                tk_gather_list<NT>(ol, m, keys, T, take, out, wsum);
            }
        }
    }
    if (!ok) tk_select2<false, PP, NT>(p, tks3, keys, n, out, hist, s_pick, wsum);
}

// TK_RSEQS: the sequences whose first rows a select kernel copies to shared
// memory to find its row's there (a plan of more searches global memory).
#define TK_RSEQS 256

// tk_select4 is topk_select4n's body (tk_select3 on the block's row) with
// the fixed cost of a row cut, the whole of a short row's select. The row
// is resolved before waiting for the score kernel (the plan is the
// launch's input, written before it, and a dependent grid starts only
// after every block of the score kernel has passed its own wait),
// searching a copy of the sequences' first rows made at once (two reads
// of global memory, not the binary search's six dependent ones);
// tk_radix's passes take two barriers each (PP: eight in all instead of
// sixteen), and a warp's histogram atomics are carried over its
// iterations while their bin stays the same.
template <int NT>
__device__ __forceinline__ void tk_select4(const TopKParams& p) {
    extern __shared__ u32 tks4[];
    __shared__ __align__(16) u32 hist[4 * 256];
    __shared__ u32 s_pick[8];
    __shared__ int wsum[2][32];
    __shared__ int s_cnt;
    __shared__ int s_rows[1 + TK_RSEQS]; // the plan's sequence count, then each sequence's first row
    const int r = blockIdx.x;
    TkRow t = {0, 0, 0, 0};
    if (r < p.rows) {
        if (p.max_seqs <= TK_RSEQS) { // block-uniform; the plan's buffer holds max_seqs sequences
            for (int i = threadIdx.x; i <= p.max_seqs; i += NT)
                s_rows[i] = i == 0 ? p.plan[TOPK_PLAN_HDR_SEQS] : p.plan[TOPK_PLAN_HDR_WORDS + (i - 1) * TOPK_SEQ_WORDS + TOPK_SEQ_ROW];
            __syncthreads();
            t = tk_resolve_in(p, s_rows[0], s_rows + 1, 1, r);
        } else {
            t = tk_resolve(p, r);
        }
    }
    pdl_wait();
    pdl_trigger();
    if (r >= p.rows) return;
    tk_select3<true, NT>(p, r, t, tks4, hist, s_pick, wsum, s_cnt);
}

// topk_select4n is tk_select4 in blocks of TOPK_SELECT4N_THREADS, for
// launches of many short rows (a prefill's: a row of 4,096 keys leaves most
// of 1,024 threads idle and holds a multiprocessor alone; here four or more
// rows share one). The same indices.
extern "C" __global__ void __launch_bounds__(TOPK_SELECT4N_THREADS) topk_select4n(const TopKParams p) { tk_select4<TOPK_SELECT4N_THREADS>(p); }

// tk_radix's result (*th the want-th largest of the n keys at sk, in shared
// memory; *take how many keys equal to it are among the want largest) in
// three passes of 11, 11 and 10 bits instead of four of 8. Each pass has
// its own histogram (hist: 3 x 2048 words) and its own warp totals (wtot:
// 3 x 32 words), so nothing is rewritten while a warp may still read it,
// and two barriers: after the histogram, and after each warp's total of
// its segment of the bins (the bins taken from the top, NT/32 segments);
// then every warp finds the pass's bin itself (the segment by a scan of
// the totals, the lane by a scan of the segment's bins, the bin within the
// lane's), so that no third barrier hands a choice over. Every thread must
// call it; the keys must be visible to every thread before (its first
// barrier orders the histograms' zeroing only).
//
// EARLY: where a pass's bin holds exactly the keys still wanted (every key
// of it is taken: at decode 8K, after the second pass, where the bin is
// one key), the select ends there with *th = that prefix less 1 and *take
// = 0: the keys above *th are the keys at or above the prefix, the same
// want keys (tk_gather's output is the same). Every warp reads the same
// bins, so all of them end at the same pass.
template <int NT, bool EARLY = false>
__device__ __forceinline__ void tk_radix11(const u32* sk, int n, u32 want, u32* hist, u32* wtot, u32* th, u32* take) {
    constexpr int NW = NT / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned full = 0xFFFFFFFFu;
    for (int i = threadIdx.x; i < 3 * 2048; i += NT) hist[i] = 0u;
    __syncthreads();
    u32 prefix = 0u, mask = 0u, remain = want;
#pragma unroll
    for (int pass = 0; pass < 3; pass++) {
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
        const int nb = pass < 2 ? 2048 : 1024;
        const int seg = nb / NW, q = seg / 32; // bins a warp's segment, a lane's
        u32* h = hist + pass * 2048;
        u32* wt = wtot + pass * 32;
        // tk_radix's aggregation: the first active lane adds its bin's
        // count for the warp, the others one each.
#pragma unroll 4
        for (int b0 = warp * 32; b0 < n; b0 += NT) { // warp-uniform
            const int i = b0 + lane;
            const u32 k = i < n ? sk[i] : 0u;
            const bool in = i < n && (k & mask) == prefix;
            const u32 bin = (k >> shift) & (u32)(nb - 1);
            const unsigned act = __ballot_sync(full, in);
            if (act == 0u) continue;
            const int ld = __ffs(act) - 1;
            const u32 lbin = __shfl_sync(full, bin, ld);
            const unsigned same = __ballot_sync(full, in && bin == lbin);
            if (lane == ld) atomicAdd(&h[lbin], (u32)__popc(same));
            else if (in && bin != lbin) atomicAdd(&h[bin], 1u);
        }
        __syncthreads();
        // Lane l of warp w holds bins nb-1-(w*seg + l*q) down, q of them.
        u32 s = 0u;
        for (int j = 0, b = nb - 1 - (warp * seg + lane * q); j < q; j++) s += h[b - j];
        s = __reduce_add_sync(full, s);
        if (lane == 0) wt[warp] = s;
        __syncthreads();
        const u32 wv = lane < NW ? wt[lane] : 0u;
        u32 wi = wv;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(full, wi, o);
            if (lane >= o) wi += y;
        }
        const int sg = __ffs(__ballot_sync(full, wi >= remain)) - 1; // the in-keys reach remain: some segment does
        const u32 before = __shfl_sync(full, wi - wv, sg);
        u32 c = 0u;
        for (int j = 0, b = nb - 1 - (sg * seg + lane * q); j < q; j++) c += h[b - j];
        u32 ci = c;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(full, ci, o);
            if (lane >= o) ci += y;
        }
        const int fl = __ffs(__ballot_sync(full, before + ci >= remain)) - 1;
        u32 acc = before + __shfl_sync(full, ci - c, fl);
        int bin = nb - 1 - (sg * seg + fl * q);
        for (int j = 0; j < q - 1 && acc + h[bin] < remain; j++) acc += h[bin--];
        prefix |= (u32)bin << shift;
        remain -= acc;
        mask |= (u32)(nb - 1) << shift;
        if (EARLY && pass < 2 && h[bin] == remain && prefix != 0u) { // block-uniform
            *th = prefix - 1u;
            *take = 0u;
            return;
        }
    }
    *th = prefix;
    *take = remain;
}

// tk_select5 is tk_select4 (the same indices) in blocks of NT threads
// with a row whose keys fit its shared memory selected by tk_radix11:
// three passes of two barriers instead of four (decode at 8K: a row's
// select is its fixed cost). Rows past the shared memory take tk_select3's
// sweep.
template <int NT, bool EARLY = false>
__device__ __forceinline__ void tk_select5(const TopKParams& p) {
    extern __shared__ u32 tks5[];
    __shared__ __align__(16) u32 hist[3 * 2048]; // tk_radix11's; tk_select3 uses the first 4 x 256
    __shared__ u32 wtot[3 * 32];
    __shared__ u32 s_pick[8];
    __shared__ int wsum[2][32];
    __shared__ int s_cnt;
    __shared__ int s_rows[1 + TK_RSEQS];
    const int r = blockIdx.x;
    TkRow t = {0, 0, 0, 0};
    if (r < p.rows) {
        if (p.max_seqs <= TK_RSEQS) {
            for (int i = threadIdx.x; i <= p.max_seqs; i += NT)
                s_rows[i] = i == 0 ? p.plan[TOPK_PLAN_HDR_SEQS] : p.plan[TOPK_PLAN_HDR_WORDS + (i - 1) * TOPK_SEQ_WORDS + TOPK_SEQ_ROW];
            __syncthreads();
            t = tk_resolve_in(p, s_rows[0], s_rows + 1, 1, r);
        } else {
            t = tk_resolve(p, r);
        }
    }
    pdl_wait();
    pdl_trigger();
    if (r >= p.rows) return;
    const int n = t.valid ? t.visible : 0;
    u32 dsm;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsm));
    if (n <= p.top_k || n > (int)(dsm / 4u)) {
        tk_select3<true, NT>(p, r, t, tks5, hist, s_pick, wsum, s_cnt);
        return;
    }
    const u32* keys = p.scratch + t.keys;
    for (int i = threadIdx.x; i < n; i += NT) tk_cp4(tks5 + i, keys + i, true);
    tk_cp_commit();
    tk_cp_wait<0>(); // tk_radix11's first barrier makes every thread's copies visible
    u32 th, take;
    tk_radix11<NT, EARLY>(tks5, n, (u32)p.top_k, hist, wtot, &th, &take);
    tk_gather<true, NT>(tks5, keys, n, th, take, p.out + (size_t)r * p.top_k, wsum);
}


// topk_select5e is tk_select5 ending its radix select at the first pass
// whose bin's keys are all taken (tk_radix11's EARLY: at decode 8K two
// passes of the three). (Without EARLY, topk_select5, the default select
// until 2026-12-02, the same indices; in blocks of 512 threads it was
// slower: bench/results/2026-12-02-h200-k/tsel/call2.)
extern "C" __global__ void __launch_bounds__(TOPK_SELECT_THREADS) topk_select5e(const TopKParams p) { tk_select5<TOPK_SELECT_THREADS, true>(p); }

