// Test-only kernel of TestCUDAUE8M0ExponentExhaustive (ue8m0_test.go). It is
// compiled twice, after prologue.cu (the KV cache's fp8_ue8m0 groups) and
// after chain.cu (act_quant's blocks), so that it runs each module's own
// ue8m0_exp; the backend never loads it.

// out[i] = ue8m0_exp(bits = base + i) for n inputs.
extern "C" __global__ void ue8m0_exp_sweep(u8* out, u32 base, u32 n) {
    const u32 stride = gridDim.x * blockDim.x;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (u8)ue8m0_exp(__uint_as_float(base + i));
}
