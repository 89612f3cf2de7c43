// Device-side input generation for the benchmark: random inputs of many
// gigabytes would take minutes to make on the host.
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 mix(u64 x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (u32)x;
}

// bf16 values in about +-4 * 2^e, with e fixed per row of row_elems values
// (|e| <= 8), so row norms and group maxima vary; always finite.
extern "C" __global__ void fill_bf16(unsigned short* p, u64 n, u32 seed, u32 row_elems) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u32 h = mix(i * 0x9e3779b97f4a7c15ull + seed);
        int e = (int)(mix((i / row_elems) + ((u64)seed << 32)) % 17u) - 8;
        float v = ((float)(h & 0xffffu) / 32768.f - 1.f) * 4.f * __uint_as_float((u32)(127 + e) << 23);
        p[i] = (unsigned short)(__float_as_uint(v) >> 16);
    }
}

// float32 values in [lo, hi).
extern "C" __global__ void fill_f32(float* p, u64 n, u32 seed, float lo, float hi) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u32 h = mix(i * 0x9e3779b97f4a7c15ull + seed);
        p[i] = lo + (hi - lo) * ((float)(h >> 8) / 16777216.f);
    }
}

// e4m3 bytes of moderate magnitude (biased exponents 4..11: about 2^-3 to
// 30) with random sign and mantissa, never NaN: synthetic FP8 weights.
extern "C" __global__ void fill_e4m3(unsigned char* p, u64 n, u32 seed) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u32 h = mix(i * 0x9e3779b97f4a7c15ull + seed);
        p[i] = (unsigned char)((h & 0x80u) | (0x20u + ((h >> 8) & 0x3fu)));
    }
}

// The copy baseline: 16-byte streaming loads and stores, four in flight per
// thread, grid-stride.
extern "C" __global__ void copy16(uint4* dst, const uint4* src, u64 n16) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(src + i + k * stride));
#pragma unroll
        for (int k = 0; k < 4; k++)
            asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst + i + k * stride), "r"(v[k].x), "r"(v[k].y), "r"(v[k].z), "r"(v[k].w) : "memory");
    }
    for (; i < n16; i += stride) {
        uint4 v;
        asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src + i));
        asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst + i), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
    }
}

// A copy with the KV kernel's read pattern: 1024 bytes out of each
// src_stride-byte row (the latent slice of the fused A output), written
// densely. The ceiling for a strided read.
extern "C" __global__ void copy_rows(uint4* dst, const unsigned char* src, u64 rows, u64 src_stride) {
    const u64 n16 = rows * 64;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n16; i += (u64)gridDim.x * blockDim.x) {
        const uint4* s = reinterpret_cast<const uint4*>(src + (i >> 6) * src_stride) + (i & 63);
        uint4 v;
        asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(s));
        asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst + i), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
    }
}

// One layer of the dependent-chain floor (chainfloor.go): the least a
// prologue layer in a many-layer graph can do. Every warp waits for the
// previous grid (programmatic dependent launch), then reads its 1 KiB row
// (32 bytes a lane, cached in L2 only) and writes out_bytes of it (1024, or
// 512 as the FP8 Q row: the two halves' XOR), nothing computed. With
// prefetch set, lane 0 first asks L2 to fetch the row, as the prologue's
// direct path does before its wait (prologue.cu prefetch_l2).
extern "C" __global__ void chain_rows(const unsigned char* src, unsigned char* dst, int rows, int out_bytes, int prefetch) {
    asm volatile("griddepcontrol.launch_dependents;");
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (prefetch && lane == 0 && row < rows)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], 1024;" ::"l"(src + (u64)row * 1024) : "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (row >= rows) return;
    const unsigned char* s = src + (u64)row * 1024 + lane * 32;
    const uint4 a = __ldcg(reinterpret_cast<const uint4*>(s));
    const uint4 b = __ldcg(reinterpret_cast<const uint4*>(s + 16));
    if (out_bytes == 1024) {
        uint4* d = reinterpret_cast<uint4*>(dst + (u64)row * 1024 + lane * 32);
        d[0] = a;
        d[1] = b;
    } else {
        *reinterpret_cast<uint4*>(dst + (u64)row * 512 + lane * 16) = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
    }
}
