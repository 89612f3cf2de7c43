// common.cuh: the device-side helpers every kernel program shares, each
// defined once, and abi.h (the typedefs, the constants and the parameter
// structs generated from kernels/cuda/abi). NVRTC has no include path to
// this folder: the host hands this file, abi.h and the other shared files
// to every compilation as in-memory headers (kernels/cuda.Headers), and
// each .cu starts with #include "common.cuh".
//
// The rules of the bit-exact kernels hold here too: every float operation
// an explicit _rn intrinsic or a hardware conversion with a stated
// rounding, no reliance on -ftz.
#ifndef DSV4_PROLOGUE_COMMON_CUH
#define DSV4_PROLOGUE_COMMON_CUH

#include "abi.h"

#define FULL 0xffffffffu

// Programmatic dependent launch: wait for the previous grid's memory before
// reading inputs it may have produced, and let the next grid start launching
// (its own wait still waits for this grid to finish). Both are no-ops
// without PDL.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

// A bf16 in the low 16 bits of h, widened exactly.
__device__ __forceinline__ float bf16_to_f32(u32 h) { return __uint_as_float(h << 16); }

// Two float32 rounded to bf16 (nearest even; every NaN becomes the
// canonical 0x7fff, as numerics.BF16FromF32 does) and packed, lo in the low
// half: the hardware conversion, one instruction for both.
__device__ __forceinline__ u32 bf16x2_rn(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Round a and b to bf16 in place (widened back exactly).
__device__ __forceinline__ void round2(float& a, float& b) {
    u32 r = bf16x2_rn(a, b);
    a = __uint_as_float(r << 16);
    b = __uint_as_float(r & 0xffff0000u);
}

// Two float32 to two e4m3 with the hardware conversion: hi goes to the upper byte.
__device__ __forceinline__ u32 e4m3x2(float hi, float lo) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float pow2i(int k) {
    // 2^k exactly for k in [-149, 127].
    if (k >= -126) return __uint_as_float((u32)(k + 127) << 23);
    return __uint_as_float(1u << (k + 149));
}

// The UE8M0 exponent byte of a group whose max |value| (NaN ignored) is a:
// the biased exponent of t = fl(max(a, 1e-4)/448), plus one when t's
// mantissa is non-zero, at most 254 (DESIGN.md section 4.5). Read from a's
// bits without the division (448 = 1.75 * 2^8): a's biased exponent - 8,
// plus one when its mantissa exceeds 1.75's (0x600000); +Inf gives the cap
// 254, which no finite a reaches. numerics.UE8M0ExponentBits, checked
// against the division on every float32 (TestUE8M0ExponentBitsExhaustive).
__device__ __forceinline__ int ue8m0_exp(float a) {
    const u32 b = __float_as_uint(fmaxf(a, 1e-4f));
    if (b >= 0x7f800000u) return 254;
    return (int)(b >> 23) - 8 + ((b & 0x7fffffu) > 0x600000u ? 1 : 0);
}

// 16 bytes of weights, read once: no L1 allocation, prefetch the next 256
// bytes to L2 (the GEMMs' weight streams).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Reads of what an earlier kernel of the stream wrote (activations, GEMM
// outputs, split-K partials, compressor states), after pdl_wait. Not the
// read-only path (ld.global.nc: what __ldg and loads through
// const __restrict__ pointers compile to): the PTX ISA allows it only for
// data that stays the same while the kernel runs, and under programmatic
// dependent launch a kernel runs before the grid it waits for has finished
// writing. The backed-out f16 GEMM rewrite failed graph replays exactly so
// and passed with these loads (docs/gemm-rewrite-failure.md). Plain
// coherent loads (L1 may keep them for the block's other warps), volatile
// so the compiler keeps them after the wait.
__device__ __forceinline__ uint4 ld_dep_v4(const void* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float4 ld_dep_f4(const float* p) {
    float4 v;
    asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float ld_dep_f32(const float* p) {
    float v;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// s + v lane by lane, each add rounded to nearest: one step of a split-K
// finish, which adds the splits' partials in split order.
__device__ __forceinline__ float4 add4_rn(float4 s, float4 v) {
    return make_float4(__fadd_rn(s.x, v.x), __fadd_rn(s.y, v.y), __fadd_rn(s.z, v.z), __fadd_rn(s.w, v.w));
}

// Four float32 as four bf16 (bf16x2_rn) at dst, or as themselves: the
// split-K reduction's two outputs.
__device__ __forceinline__ void splitk_store4(u16* dst, float4 s) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(bf16x2_rn(s.x, s.y), bf16x2_rn(s.z, s.w));
}
__device__ __forceinline__ void splitk_store4(float* dst, float4 s) { *reinterpret_cast<float4*>(dst) = s; }

// The split-K finish of every GEMM with float32 partials part[z][m][n]:
// Y[r][c..c+3] = part[0][r][c..] + part[1][r][c..] + ..., the splits added
// in order (the same bits on every run), then stored as OUT (u16: bf16,
// nearest even; float: unrounded). One thread per 4 outputs (n % 4 == 0),
// y row r at y + r * y_stride. The launch's fields are abi.h's SplitKParams.
//
// Indices are 64-bit: the thread index runs to m * n / 4 and the partials'
// offsets to splits * m * n, which the kernel cannot bound (the host's
// workspace sizes keep them small today, but a 32-bit product would wrap
// silently, not fail). The division costs one 64-bit divide a thread, and
// split-K runs only where M is small. EARLY_TRIGGER lets the next kernel
// launch right after the wait instead of at the end.
template <typename OUT, bool EARLY_TRIGGER = false>
__device__ __forceinline__ void splitk_reduce(const SplitKParams& p) {
    const float* __restrict__ part = p.part;
    OUT* __restrict__ y = static_cast<OUT*>(p.y);
    const int m = p.m, n = p.n, y_stride = p.y_stride, splits = p.splits;
    pdl_wait();
    if (EARLY_TRIGGER) pdl_trigger();  // the next kernel launched now (it waits for this one's end)
    const int per_row = n >> 2;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)m * per_row) {
        const int r = (int)(i / per_row), c = (int)(i - (long long)r * per_row) * 4;
        float4 s = ld_dep_f4(part + (size_t)r * n + c);
        // Eight splits' loads in flight at once, then their adds in split
        // order: a load-add loop waits on L2 once a split (the loads are
        // volatile, so they stay in program order behind each add).
        for (int z0 = 1; z0 < splits; z0 += 8) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (z0 + u < splits) v[u] = ld_dep_f4(part + ((size_t)(z0 + u) * m + r) * n + c);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                if (z0 + u < splits) s = add4_rn(s, v[u]);
            }
        }
        splitk_store4(y + (size_t)r * y_stride + c, s);
    }
    if (!EARLY_TRIGGER) pdl_trigger();
}

#endif  // DSV4_PROLOGUE_COMMON_CUH
