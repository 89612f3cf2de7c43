package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/dsv4mla/prologue/attention/mla"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/cublaslt"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The compressor's projection GEMM (mla.BF16GEMMBackend): bf16 operands,
// float32 output. cuBLASLt (the handle the FP8 GEMM uses) runs every shape
// it has an algorithm for; the simple kernel of kernels/cuda/gemm_bf16.cu
// runs the rest, and everything when cuBLASLt is absent. Both enqueue on
// the backend's stream, so the GEMM is captured into graphs and ordered
// with the side stream's fork like the chain's GEMMs.

// bf16GEMMPath chooses the implementation (tests force one through
// export_test.go; production always uses bf16GEMMAuto).
type bf16GEMMPath int

const (
	bf16GEMMAuto     bf16GEMMPath = iota // cuBLASLt where it has an algorithm, else the kernel
	bf16GEMMOwn                          // the kernel for every shape
	bf16GEMMCuBLASLt                     // cuBLASLt only: a shape it refuses is an error
)

// bf16GEMMState is the projection GEMM's kernel, loaded at first use.
type bf16GEMMState struct {
	once           sync.Once
	err            error
	mod            *driver.Module
	fn             *driver.Function
	path           bf16GEMMPath
	own, cublasRun atomic.Int64
}

// bf16GEMMWarps is BF16_GEMM_WARPS of gemm_bf16.cu: warps a block.
const bf16GEMMWarps = 8

// InitBF16GEMM compiles the projection GEMM's kernel and opens cuBLASLt
// (unless Options.NoCuBLASLt); BF16GEMM calls it on first use. Call it, or
// PrepareBF16GEMM for each shape, before capturing a CUDA graph that
// contains the GEMM: a capture may not load modules or allocate.
func (b *Backend) InitBF16GEMM() error {
	g := &b.bf16
	g.once.Do(func() { g.err = b.initBF16GEMM() })
	return g.err
}

func (b *Backend) initBF16GEMM() error {
	g := &b.bf16
	compiled, err := driver.CompileDetailed(kernels.BF16GEMMSource(), "gemm_bf16.cu",
		driver.CompileOptions{Arch: b.ctx.Props().Arch(), NoFMAD: true})
	if err != nil {
		return fmt.Errorf("cuda: bf16 GEMM kernel: %w", err)
	}
	if g.mod, err = b.ctx.LoadModule(compiled.Cubin); err != nil {
		return err
	}
	if g.fn, err = g.mod.Function("gemm_bf16_f32"); err != nil {
		return err
	}
	b.openCuBLASLt()
	return nil
}

// PrepareBF16GEMM readies a projection GEMM of rows x n outputs from k
// inputs (strides in elements) for a graph capture: the kernel loaded and
// cuBLASLt's answer for the shape planned and cached. It returns nil
// whichever implementation will run (cuBLASLt's refusal is an answer);
// a failure to set up, or a shape cuBLASLt cannot even be asked about, is
// an error.
func (b *Backend) PrepareBF16GEMM(rows, n, k, xStride, yStride int) error {
	if err := b.InitBF16GEMM(); err != nil {
		return err
	}
	if rows == 0 || b.gemm.lt == nil {
		return nil
	}
	err := b.gemm.lt.SupportedBF16(cublaslt.BF16Shape{M: rows, N: n, K: k, XStride: xStride, YStride: yStride})
	if le := (*cublaslt.Error)(nil); err != nil && !errors.As(err, &le) {
		return fmt.Errorf("cuda: preparing the bf16 GEMM: %w", err)
	}
	return nil
}

// CuBLASLtSupportsBF16 reports whether cuBLASLt runs the projection GEMM
// of that shape: nil, or why not (absent, or the library's refusal: the
// kernel runs it). It prepares the shape's plan like PrepareBF16GEMM.
func (b *Backend) CuBLASLtSupportsBF16(rows, n, k, xStride, yStride int) error {
	if err := b.InitBF16GEMM(); err != nil {
		return err
	}
	if b.gemm.lt == nil {
		return b.gemm.ltErr
	}
	return b.gemm.lt.SupportedBF16(cublaslt.BF16Shape{M: rows, N: n, K: k, XStride: xStride, YStride: yStride})
}

// BF16GEMMCounts reports how many projection GEMMs each implementation ran.
func (b *Backend) BF16GEMMCounts() (own, cublasLt int64) {
	return b.bf16.own.Load(), b.bf16.cublasRun.Load()
}

// BF16GEMM implements mla.BF16GEMMBackend: Y = X . W^T on the backend's
// stream, float32 out. A refused call enqueues nothing.
func (b *Backend) BF16GEMM(ctx context.Context, a *mla.BF16GEMMArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if a.Rows == 0 {
		return nil
	}
	x, err := span(a.X, a.XOffset, 2*((a.Rows-1)*a.XStride+a.K))
	if err != nil {
		return err
	}
	w, err := span(a.W, 0, 2*a.N*a.K)
	if err != nil {
		return err
	}
	y, err := span(a.Y, a.YOffset, 4*((a.Rows-1)*a.YStride+a.N))
	if err != nil {
		return err
	}
	if err := b.InitBF16GEMM(); err != nil {
		return err
	}
	g := &b.bf16
	shape := cublaslt.BF16Shape{M: a.Rows, N: a.N, K: a.K, XStride: a.XStride, YStride: a.YStride}
	useLt := false
	switch g.path {
	case bf16GEMMAuto:
		useLt = b.gemm.lt != nil && b.gemm.lt.SupportedBF16(shape) == nil
	case bf16GEMMCuBLASLt:
		if b.gemm.lt == nil {
			return fmt.Errorf("cuda: bf16 GEMM forced to cuBLASLt: %w", b.gemm.ltErr)
		}
		if err := b.gemm.lt.SupportedBF16(shape); err != nil {
			return err
		}
		useLt = true
	}
	if useLt {
		g.cublasRun.Add(1)
		return b.gemm.lt.MatmulBF16(&cublaslt.BF16Matmul{BF16Shape: shape, W: w, X: x, Y: y}, b.stream)
	}
	warps := int64(a.Rows) * int64(a.N/8)
	blocks := (warps + bf16GEMMWarps - 1) / bf16GEMMWarps
	if blocks > math.MaxInt32 {
		return fmt.Errorf("cuda: bf16 GEMM of %d rows x %d outputs needs %d blocks, more than a grid holds", a.Rows, a.N, blocks)
	}
	g.own.Add(1)
	return b.launch(g.fn, driver.Dim3{uint32(blocks), 1, 1}, driver.Dim3{32 * bf16GEMMWarps, 1, 1},
		w, x, y, int32(a.Rows), int32(a.N), int32(a.K), int32(a.XStride), int32(a.YStride))
}

var _ mla.BF16GEMMBackend = (*Backend)(nil)
