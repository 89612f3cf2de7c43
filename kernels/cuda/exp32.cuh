// exp32.cuh: the project's canonical float32 exponential (DESIGN.md section 8),
// a line-by-line port of numerics.Exp32 (numerics/exp32.go). Every float32
// operation is an explicitly rounded intrinsic (no FMA contraction), the
// constants are the Go file's bit patterns, and 2^k is built from its bits,
// so the result is bit-identical to the Go function for every input.
// Self-contained: no typedefs or other includes needed. NVRTC has no
// include path here: it is one of the in-memory headers every program is
// compiled with (kernels/cuda.Headers); compress.cu includes it.
#ifndef EXP32_CUH
#define EXP32_CUH

// 2^k for k in [-126, 127], from its bits (numerics.exp32Pow2).
__device__ __forceinline__ float exp32_pow2(int k) { return __int_as_float((k + 127) << 23); }

__device__ __forceinline__ float exp32(float x) {
    if (x != x) return x;                                 // NaN keeps its bits (IEEE compare: no fast-math)
    if (x > __uint_as_float(0x42B17217u)) return __uint_as_float(0x7F800000u); // +Inf
    if (x < -104.0f) return 0.0f;                         // Exp32UnderflowBelow
    const float shift = __uint_as_float(0x4B400000u);     // 1.5 * 2^23
    float t = __fmul_rn(x, __uint_as_float(0x3FB8AA3Bu)); // x * log2(e)
    float j = __fadd_rn(t, shift);
    float kf = __fsub_rn(j, shift);                       // t rounded to an integer, ties to even
    int k = (int)kf;                                      // in [-150, 128], exact
    float hi = __fmul_rn(kf, __uint_as_float(0x3F317200u)); // k * ln2Hi, exact
    float rh = __fsub_rn(x, hi);                            // exact
    float lo = __fmul_rn(kf, __uint_as_float(0x35BFBE8Eu)); // k * ln2Lo
    float r = __fsub_rn(rh, lo);

    float p = __uint_as_float(0x39500D01u);                          // 1/7!
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3AB60B61u));    // 1/6!
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3C088889u));    // 1/5!
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3D2AAAABu));    // 1/4!
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3E2AAAABu));    // 1/3!
    p = __fadd_rn(__fmul_rn(p, r), __uint_as_float(0x3F000000u));    // 1/2!
    float r2 = __fmul_rn(r, r);
    float q = __fmul_rn(p, r2);
    float s = __fadd_rn(q, r);
    float y = __fadd_rn(s, 1.0f);

    int k1 = k >> 1;  // floor(k/2): arithmetic shift of a signed int
    int k2 = k - k1;
    y = __fmul_rn(y, exp32_pow2(k1));  // exact
    y = __fmul_rn(y, exp32_pow2(k2));  // rounds once (subnormal results)
    return y;
}

#endif  // EXP32_CUH
