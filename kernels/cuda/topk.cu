// The lightning indexer's top-k selection (DESIGN.md section 9,
// "Selection"), bit-identical to attention/mla/cpu's IndexerTopK:
//
//   topk_score   grid (rows, tile blocks): block (r, x) scores the tiles
//                x, x + gridDim.y, ... of row r's visible entries, one
//                entry a thread, and writes each score's key
//                (mla.TopKKey) to the row's keys in the scratch space.
//   topk_score_mma  topk_score with the block dots on the int8 tensor
//                cores: the same keys.
//   topk_select  grid (rows): block r finds the threshold key by a radix
//                select over row r's keys (4 passes of 8 bits from the
//                top), then writes the entries above it and the first
//                ones equal to it in ascending index order.
//
// The score is exact by construction: e2m1 values doubled are small
// integers, so a 32-value block's dot product is an exact int32 (dp4a);
// scaling it by its two power-of-two scales rounds once to float32 (as
// the host does in float64), and the four block partials, relu, the head
// weight and the head sum follow in the fixed order with _rn intrinsics
// (compiled with --fmad=false as well). A row that sees at most top_k
// entries selects them all: neither kernel reads its keys or the cache.
// Both kernels read the plan as mla.ResolveTopKRow and mla.TopKPage do.

__device__ __forceinline__ void tk_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void tk_pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

// One row's place in the plan (mla.TopKRow).
struct TkRow {
    int valid, seq, visible;
    long long keys;
};

__device__ __forceinline__ TkRow tk_resolve(const TopKParams& p, int r) {
    TkRow t = {0, 0, 0, 0};
    int ns = p.plan[TOPK_PLAN_HDR_SEQS];
    if (ns < 0 || ns > p.max_seqs) ns = 0;
    const int* seqs = p.plan + TOPK_PLAN_HDR_WORDS;
    int lo = 0, hi = ns;
    while (lo < hi) {
        int m = (lo + hi) >> 1;
        if (seqs[m * TOPK_SEQ_WORDS + TOPK_SEQ_ROW] <= r) lo = m + 1;
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
    tk_pdl_wait();
    tk_pdl_trigger();
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

// The decoded word w (0..7) of block b of a row as topk_score_mma
// orders a block's 32 values: word w holds the even (w even) or odd
// elements of raw nibble word 4b + w/2. Query and key use the same order,
// so the MMA's k index pairs the same elements.
__device__ __forceinline__ u32 tk_word(u32 raw, int w) {
    return tk_nib4((raw >> ((w & 1) * 4)) & 0x0F0F0F0Fu);
}

// D = A . B over one 32-value block: 16 heads x 8 entries, exact int32.
__device__ __forceinline__ void tk_mma(int d[4], const uint4 a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

#define TK_TW 17 // floats a row of a warp's term buffer (16 heads, padded)

// tk_scale_fast is tk_scale for x in [-149, 104], given mb, the bits of
// M = 1.5 * 2^(x+23) (exponent field x+150, mantissa 0x400000): the bits
// mb + d are the float M + d * 2^x exactly (|d| <= 4608 stays inside the
// mantissa), and subtracting M, in the same binade, is exact too, so the
// result is d * 2^x, which tk_scale rounds to itself (a multiple of 2^-149
// below 2^117). Two integer adds and one float add instead of a
// conversion (a quarter-rate instruction) and a multiply.
__device__ __forceinline__ float tk_scale_fast(int d, u32 mb) {
    return __fsub_rn(__uint_as_float(mb + (u32)d), __uint_as_float(mb));
}

// topk_score_mma is topk_score with the block dot products on the int8
// tensor cores (mma.sync m16n8k32: 16 heads x 8 entries x one block), the
// same keys out. A warp takes 32 entries of the tile; for each group of
// 16 heads it scales and sums each (head, entry)'s four block partials in
// order, and each lane then adds its entry's 16 terms to its running sum
// in ascending h. A warp whose entries' scales keep every x = eq + ek -
// 256 of the row in [-149, 104] (every practical case) scales by
// tk_scale_fast, others by tk_scale.
extern "C" __global__ void __launch_bounds__(TOPK_SCORE_THREADS) topk_score_mma(const TopKParams p) {
    __shared__ uint4 qf[16 * 32];     // A fragments: (head group, block) x lane
    __shared__ u32 qbase[INDEXER_HEADS * 4]; // query scale byte << 23, per (head, block)
    __shared__ int qmn[4], qmx[4];    // the row's least and largest query scale byte per block
    __shared__ float qw[INDEXER_HEADS];    // head weights
    __shared__ u32 ks[TOPK_SCORE_THREADS * TK_KW];
    __shared__ float terms[TOPK_SCORE_THREADS / 32][32 * TK_TW];
    tk_pdl_wait();
    tk_pdl_trigger();
    const int r = blockIdx.x;
    if (r >= p.rows) return;
    const TkRow t = tk_resolve(p, r);
    if (!t.valid || t.visible <= p.top_k) return;
    const int n = t.visible;
    const int ntiles = (n + TOPK_SCORE_THREADS - 1) / TOPK_SCORE_THREADS;
    if ((int)blockIdx.y >= ntiles) return;
    const int* table = p.plan + TOPK_PLAN_HDR_WORDS + p.max_seqs * TOPK_SEQ_WORDS + (long long)t.seq * p.page_stride;
    const u8* qrow = p.q + (size_t)r * (INDEXER_HEADS * MXFP4_ROW_BYTES);
    if (threadIdx.x < 4) {
        qmn[threadIdx.x] = 255;
        qmx[threadIdx.x] = 0;
    }
    for (int i = threadIdx.x; i < 16 * 32; i += TOPK_SCORE_THREADS) {
        const int hg = i >> 7, b = (i >> 5) & 3, ln = i & 31, g = ln >> 2, tig = ln & 3;
        const u8* h0 = qrow + (hg * 16 + g) * MXFP4_ROW_BYTES + 16 * b;
        const u8* h1 = h0 + 8 * MXFP4_ROW_BYTES;
        uint4 a;
        a.x = tk_word(*(const u32*)(h0 + 4 * (tig >> 1)), tig);
        a.y = tk_word(*(const u32*)(h1 + 4 * (tig >> 1)), tig);
        a.z = tk_word(*(const u32*)(h0 + 4 * (2 + (tig >> 1))), tig);
        a.w = tk_word(*(const u32*)(h1 + 4 * (2 + (tig >> 1))), tig);
        qf[i] = a;
    }
    for (int i = threadIdx.x; i < INDEXER_HEADS; i += TOPK_SCORE_THREADS) qw[i] = __uint_as_float((u32)p.w[(size_t)r * INDEXER_HEADS + i] << 16);
    __syncthreads(); // qmn, qmx initialized
    for (int i = threadIdx.x; i < INDEXER_HEADS * 4; i += TOPK_SCORE_THREADS) {
        const int e = qrow[(i >> 2) * MXFP4_ROW_BYTES + 64 + (i & 3)];
        qbase[i] = (u32)e << 23;
        atomicMin(&qmn[i & 3], e);
        atomicMax(&qmx[i & 3], e);
    }
    u32* keys = p.scratch + t.keys;
    const size_t page_bytes = (size_t)p.page_size * MXFP4_ROW_BYTES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    float* tw = terms[warp];
    for (int tile = blockIdx.y; tile < ntiles; tile += gridDim.y) {
        const int s0 = tile * TOPK_SCORE_THREADS;
        const int cnt = min(TOPK_SCORE_THREADS, n - s0);
        __syncthreads(); // the previous tile's entries are read (and, first, the query is in place)
        for (int i = threadIdx.x; i < TOPK_SCORE_THREADS * TK_KW; i += TOPK_SCORE_THREADS) {
            int e = i / TK_KW, wd = i - e * TK_KW;
            int s = s0 + e;
            u32 v = 0;
            if (e < cnt) {
                int pg = tk_page(p, table, s);
                if (pg >= 0) v = *(const u32*)(p.cache + (size_t)pg * page_bytes + (size_t)(s % p.page_size) * MXFP4_ROW_BYTES + 4 * wd);
            }
            ks[i] = v;
        }
        __syncthreads();
        if (warp * 32 >= cnt) continue; // warp-uniform; the next barrier is the next tile's
        const u32* wk = ks + warp * 32 * TK_KW;
        // B fragments (entry nt*8 + g) and, for the entries 2*tig and
        // 2*tig + 1 of each n-tile this lane's D elements hold, the key
        // half of tk_scale_fast's mb per block: (ek - 106) << 23 | 0x400000.
        u32 bf[4][4][2], kb[4][2][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const u32* kw = wk + (nt * 8 + g) * TK_KW;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                bf[nt][b][0] = tk_word(kw[4 * b + (tig >> 1)], tig);
                bf[nt][b][1] = tk_word(kw[4 * b + 2 + (tig >> 1)], tig);
            }
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const u32 sc = wk[(nt * 8 + 2 * tig + c) * TK_KW + 16];
#pragma unroll
                for (int b = 0; b < 4; b++) kb[nt][c][b] = ((((sc >> (8 * b)) & 0xFFu) - 106u) << 23) | 0x400000u;
            }
        }
        bool ok = warp * 32 + lane >= cnt; // an entry past the tile's does not count
        {
            const u32 sc = wk[lane * TK_KW + 16];
            bool in = true;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int ke = (int)((sc >> (8 * b)) & 0xFFu);
                in = in && ke + qmn[b] >= 107 && ke + qmx[b] <= 360;
            }
            ok = ok || in;
        }
        const bool fast = __all_sync(0xFFFFFFFFu, ok);
        float run = 0.f;
        for (int hg = 0; hg < 4; hg++) {
            u32 qb[2][4];
#pragma unroll
            for (int b = 0; b < 4; b++) {
                qb[0][b] = qbase[(hg * 16 + g) * 4 + b];
                qb[1][b] = qbase[(hg * 16 + g + 8) * 4 + b];
            }
            const float wa = qw[hg * 16 + g], wb = qw[hg * 16 + g + 8];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                int d[4][4];
#pragma unroll
                for (int b = 0; b < 4; b++) tk_mma(d[b], qf[(hg * 4 + b) * 32 + lane], bf[nt][b][0], bf[nt][b][1]);
#pragma unroll
                for (int i = 0; i < 4; i++) { // D element i: head g (+8 for i >= 2), entry 2*tig + (i & 1)
                    float dot = 0.f;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        const u32 qv = qb[i >> 1][b], kv = kb[nt][i & 1][b];
                        const float pb = fast ? tk_scale_fast(d[b][i], qv + kv)
                                              : tk_scale(d[b][i], (int)(qv >> 23) + ((int)kv >> 23) - 150);
                        dot = b == 0 ? pb : __fadd_rn(dot, pb);
                    }
                    const float rl = dot > 0.f ? dot : 0.f;
                    tw[(nt * 8 + 2 * tig + (i & 1)) * TK_TW + g + (i >= 2 ? 8 : 0)] = __fmul_rn(i < 2 ? wa : wb, rl);
                }
            }
            __syncwarp();
#pragma unroll
            for (int j = 0; j < 16; j++) run = __fadd_rn(run, tw[lane * TK_TW + j]);
            __syncwarp();
        }
        const int e = warp * 32 + lane, s = s0 + e;
        if (e < cnt) keys[s] = tk_page(p, table, s) >= 0 ? tk_key(run) : 0u;
    }
}

// Block-wide exclusive prefix sum of v over TOPK_SELECT_THREADS threads;
// *total receives the sum. Every thread must call it.
__device__ __forceinline__ int tk_scan(int v, int* warp_sums, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xFFFFFFFFu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < TOPK_SELECT_THREADS / 32 ? warp_sums[lane] : 0;
        int wx = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xFFFFFFFFu, wx, o);
            if (lane >= o) wx += y;
        }
        warp_sums[lane] = wx - w; // exclusive, per warp
        if (lane == 31) warp_sums[32] = wx;
    }
    __syncthreads();
    int r = warp_sums[warp] + x - v;
    *total = warp_sums[32];
    __syncthreads(); // warp_sums is reused by the next call
    return r;
}

extern "C" __global__ void __launch_bounds__(TOPK_SELECT_THREADS) topk_select(const TopKParams p) {
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_remain;
    __shared__ int warp_sums[33];
    tk_pdl_wait();
    tk_pdl_trigger();
    const int r = blockIdx.x;
    if (r >= p.rows) return;
    int* out = p.out + (size_t)r * p.top_k;
    const TkRow t = tk_resolve(p, r);
    const int n = t.valid ? t.visible : 0;
    if (n <= p.top_k) {
        for (int i = threadIdx.x; i < p.top_k; i += TOPK_SELECT_THREADS) out[i] = i < n ? i : -1;
        return;
    }
    const u32* keys = p.scratch + t.keys;
    u32 prefix = 0u, mask = 0u, remain = (u32)p.top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += TOPK_SELECT_THREADS) hist[i] = 0u;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += TOPK_SELECT_THREADS) {
            u32 k = keys[i];
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 0xFFu], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l holds bins 255-8l down to 248-8l; the first lane whose
            // running count from the top reaches remain holds the bin.
            const int lane = threadIdx.x;
            u32 c[8], sum = 0u;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                c[j] = hist[255 - (lane * 8 + j)];
                sum += c[j];
            }
            u32 incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                u32 y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
                if (lane >= o) incl += y;
            }
            unsigned ballot = __ballot_sync(0xFFFFFFFFu, incl >= remain);
            int first = __ffs(ballot) - 1;
            if (lane == first) {
                u32 acc = incl - sum;
                int j = 0;
                for (; j < 7 && acc + c[j] < remain; j++) acc += c[j];
                s_prefix = prefix | ((u32)(255 - (lane * 8 + j)) << shift);
                s_remain = remain - acc;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        remain = s_remain;
        mask |= 0xFFu << shift;
        __syncthreads(); // s_prefix and hist are rewritten by the next pass
    }
    // prefix is the threshold key; remain of the keys equal to it are taken,
    // the lowest indices first, with every key above it.
    int placed = 0;
    int eq_left = (int)remain;
    for (int base = 0; base < n && placed < p.top_k; base += TOPK_SELECT_THREADS) {
        const int i = base + threadIdx.x;
        const u32 k = i < n ? keys[i] : 0u;
        const int gt = i < n && k > prefix, eq = i < n && k == prefix;
        int eq_total, take_total;
        const int eq_rank = tk_scan(eq, warp_sums, &eq_total);
        const int take = gt || (eq && eq_rank < eq_left);
        const int pos = tk_scan(take, warp_sums, &take_total);
        if (take) out[placed + pos] = i;
        placed += take_total;
        eq_left -= min(eq_total, eq_left);
    }
}
