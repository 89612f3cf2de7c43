// Test-only kernels for exp32 (kernels/cuda/exp32.cuh), compiled after the
// compressor's program so that they run the production function.

// splitmix64's finalizer of (input bits, result bits): the per-input term
// of a chunk's hash. The host (compress_test.go) computes the same terms;
// a chunk's hash is their sum mod 2^64, so the order of the additions (the
// atomics') does not matter.
__device__ __forceinline__ u64 exp32_term(u32 in, u32 out) {
    u64 z = ((u64)in << 32) | out;
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// hashes[ch] += the terms of inputs base + ch*chunk + i, i in [0, chunk),
// for ch in [0, nchunks) (bit patterns wrap at 2^32); hashes starts zeroed.
extern "C" __global__ void exp32_hash(u64* hashes, u32 base, u32 chunk, u32 nchunks) {
    for (u32 ch = blockIdx.x; ch < nchunks; ch += gridDim.x) {
        const u32 first = base + ch * chunk;
        u64 h = 0;
        for (u32 i = threadIdx.x; i < chunk; i += blockDim.x) {
            const u32 bits = first + i;
            h += exp32_term(bits, __float_as_uint(exp32(__uint_as_float(bits))));
        }
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) h += __shfl_xor_sync(FULL, h, d);
        if ((threadIdx.x & 31) == 0) atomicAdd(hashes + ch, h);
    }
}

// out[i] = the bits of exp32 of the input base + i, i in [0, n).
extern "C" __global__ void exp32_values(u32* out, u32 base, u32 n) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = __float_as_uint(exp32(__uint_as_float(base + i)));
}
