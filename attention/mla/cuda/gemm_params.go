package cuda

import (
	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The GEMM kernels' parameters, packed field by field into the structs of
// kernels/cuda/abi (abi.h), so that the host and the kernels agree on
// every field by name; TestGEMMParamsPacking checks each against the
// values it came from.

// fp8GEMMOperands are one own-kernel FP8 GEMM's device addresses and shape
// (mla.GEMMArgs resolved): Y [m][n] = X [m][k] . W [n][k]^T.
type fp8GEMMOperands struct {
	w, ws, x, xs, y            driver.DevicePtr
	m, n, k, xsStride, yStride int
}

// fp8GEMMParams packs gemm_fp8_mt<T>'s FP8GEMMParams for plan p and, with
// more than one split (part, the workspace, non-zero), gemm_fp8_reduce's
// SplitKParams; reduce is nil with one split.
func fp8GEMMParams(op fp8GEMMOperands, p ownGEMMPlan, part driver.DevicePtr) (gemm, reduce []byte, err error) {
	g := abi.FP8GEMMParams.Pack()
	g.Ptr(abi.FP8GEMMW, uint64(op.w))
	g.Ptr(abi.FP8GEMMWScale, uint64(op.ws))
	g.Ptr(abi.FP8GEMMX, uint64(op.x))
	g.Ptr(abi.FP8GEMMXScale, uint64(op.xs))
	g.Ptr(abi.FP8GEMMY, uint64(op.y))
	g.Ptr(abi.FP8GEMMPart, uint64(part))
	g.I32(abi.FP8GEMMM, int32(op.m))
	g.I32(abi.FP8GEMMN, int32(op.n))
	g.I32(abi.FP8GEMMK, int32(op.k))
	g.I32(abi.FP8GEMMXScaleStride, int32(op.xsStride))
	g.I32(abi.FP8GEMMYStride, int32(op.yStride))
	g.I32(abi.FP8GEMMKBPerSplit, int32(p.kbPerSplit))
	if gemm, err = g.Bytes(); err != nil || p.splits == 1 {
		return gemm, nil, err
	}
	reduce, err = splitKParams(part, op.y, op.m, op.n, op.yStride, p.splits)
	return gemm, reduce, err
}

// splitKParams packs a split-K reduction's SplitKParams: the float32
// partials part [splits][m][n] summed into y (row stride yStride).
func splitKParams(part, y driver.DevicePtr, m, n, yStride, splits int) ([]byte, error) {
	r := abi.SplitKParams.Pack()
	r.Ptr(abi.SplitKPart, uint64(part))
	r.Ptr(abi.SplitKY, uint64(y))
	r.I32(abi.SplitKM, int32(m))
	r.I32(abi.SplitKN, int32(n))
	r.I32(abi.SplitKYStride, int32(yStride))
	r.I32(abi.SplitKSplits, int32(splits))
	return r.Bytes()
}

// splitKGrid is a split-K reduction's grid: a thread per 4 of the m x n
// outputs, abi.SplitKThreads a block.
func splitKGrid(m, n int) driver.Dim3 {
	threads := m * n / 4
	return driver.Dim3{uint32((threads + abi.SplitKThreads - 1) / abi.SplitKThreads), 1, 1}
}

// bf16Operands are a bf16 GEMM's device addresses (mla.BF16GEMMArgs'
// buffers at their offsets).
type bf16Operands struct {
	x, w, y driver.DevicePtr
}

// bf16GEMMParams packs gemm_bf16_f32's BF16GEMMParams.
func bf16GEMMParams(op bf16Operands, a *mla.BF16GEMMArgs) ([]byte, error) {
	p := abi.BF16GEMMParams.Pack()
	p.Ptr(abi.BF16GEMMW, uint64(op.w))
	p.Ptr(abi.BF16GEMMX, uint64(op.x))
	p.Ptr(abi.BF16GEMMY, uint64(op.y))
	p.I32(abi.BF16GEMMM, int32(a.Rows))
	p.I32(abi.BF16GEMMN, int32(a.N))
	p.I32(abi.BF16GEMMK, int32(a.K))
	p.I32(abi.BF16GEMMXStride, int32(a.XStride))
	p.I32(abi.BF16GEMMYStride, int32(a.YStride))
	return p.Bytes()
}

// bf16MMAParams packs gemm_bf16_mma's BF16MMAParams for plan p and, with
// more than one split, gemm_bf16_mma_reduce's SplitKParams (the kernel
// then writes its partials into part, row stride N); reduce is nil with
// one split, when the kernel writes Y itself. Y and the counters are the
// finishing kernels' (gemm_bf16_mma_d4f, _d8f: the last block of a split
// GEMM writes Y), the others ignore them.
func bf16MMAParams(op bf16Operands, a *mla.BF16GEMMArgs, p bf16MMAPlan, part, counters driver.DevicePtr) (mma, reduce []byte, err error) {
	out, outStride := op.y, a.YStride
	if p.splits > 1 {
		out, outStride = part, a.N
	}
	g := abi.BF16MMAParams.Pack()
	g.Ptr(abi.BF16MMAW, uint64(op.w))
	g.Ptr(abi.BF16MMAX, uint64(op.x))
	g.Ptr(abi.BF16MMAOut, uint64(out))
	g.I32(abi.BF16MMAM, int32(a.Rows))
	g.I32(abi.BF16MMAN, int32(a.N))
	g.I32(abi.BF16MMAK, int32(a.K))
	g.I32(abi.BF16MMAXStride, int32(a.XStride))
	g.I32(abi.BF16MMAOutStride, int32(outStride))
	g.I32(abi.BF16MMAKSplit, int32(p.kSplit))
	g.I32(abi.BF16MMAKChunk, int32(p.kChunk))
	g.Ptr(abi.BF16MMAY, uint64(op.y))
	g.Ptr(abi.BF16MMACounters, uint64(counters))
	g.I32(abi.BF16MMAYStride, int32(a.YStride))
	if mma, err = g.Bytes(); err != nil || p.splits == 1 {
		return mma, nil, err
	}
	reduce, err = splitKParams(part, op.y, a.Rows, a.N, a.YStride, p.splits)
	return mma, reduce, err
}
