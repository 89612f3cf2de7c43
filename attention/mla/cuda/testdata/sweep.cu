// Test-only kernels of the exhaustive conversion tests (cuda_test.go). They
// are compiled after abi.h and prologue.cu, so they run the production
// conversion helpers (e4m3x2, bf16x2_rn) themselves; the backend never loads
// them.

// out[i] = e4m3(bits = base + i) for n inputs, n even.
extern "C" __global__ void e4m3_sweep(u8* out, u32 base, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    u32 stride = gridDim.x * blockDim.x;
    for (; 2 * i < n; i += stride) {
        u32 a = base + 2 * i;
        u32 r = e4m3x2(__uint_as_float(a + 1), __uint_as_float(a));
        reinterpret_cast<u16*>(out)[i] = (u16)r;
    }
}

// out[i] = bf16 bits of (base + i) for n inputs, n even.
extern "C" __global__ void bf16_sweep(u16* out, u32 base, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    u32 stride = gridDim.x * blockDim.x;
    for (; 2 * i < n; i += stride) {
        u32 a = base + 2 * i;
        reinterpret_cast<u32*>(out)[i] = bf16x2_rn(__uint_as_float(a), __uint_as_float(a + 1));
    }
}
