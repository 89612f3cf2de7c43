package cuda

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/dsv4mla/prologue/attention/mla"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/cublaslt"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The chain's FP8 block-scaled GEMM (mla.ChainBackend.GEMM) has two
// implementations: the weight-streaming kernel of kernels/cuda/gemm_fp8.cu
// for small batches (cuBLASLt refuses M = 1 and 2 and is far from the
// weight-bandwidth floor below a few hundred rows), and cuBLASLt above
// Options.GEMMOwnMaxM rows. Both are compiled or loaded at the first GEMM
// (or InitGEMM); without cuBLASLt the kernel runs every batch.

// ownGEMMDefault is the default choice of the own kernel over cuBLASLt for
// an M x N x K GEMM, from the H200's graph-timed, L2-flushed measurements
// (TestGEMMTimes): the own kernel up to 8 rows (V4-Flash wq_b at 8 rows
// 18.3 us against cuBLASLt's 17.4, V4-Pro's 40.1 against 46.7), and up to
// 64 rows for the narrow fused [wq_a; wkv] (V4-Flash at 32 rows 10.6 us
// against 14.0; at 128 rows 15.9 against 14.9); cuBLASLt above.
func ownGEMMDefault(m, n int) bool { return m <= 8 || (n <= 4096 && m <= 64) }

// gemmPartBytes is the split-K workspace: float32 partials of every split.
const gemmPartBytes = 32 << 20

// gemmState is the backend's GEMM machinery, set up once.
type gemmState struct {
	once           sync.Once
	err            error
	mod            *driver.Module
	kernel, reduce *driver.Function
	smemBytes      int // the kernel's dynamic shared memory
	part           driver.DevicePtr
	lt             *cublaslt.Handle
	ltErr          error // why cuBLASLt is not used (absent, or Options.NoCuBLASLt)
	own, cublasRun atomic.Int64
}

// InitGEMM compiles the GEMM kernels, allocates the split-K workspace and
// opens cuBLASLt (unless Options.NoCuBLASLt); GEMM calls it on first use.
// Call it, and run each GEMM shape once, before capturing a CUDA graph that
// contains GEMMs: a capture may not allocate.
func (b *Backend) InitGEMM() error {
	g := &b.gemm
	g.once.Do(func() { g.err = b.initGEMM() })
	return g.err
}

func (b *Backend) initGEMM() error {
	g := &b.gemm
	p := b.ctx.Props()
	if p.Major*10+p.Minor < 89 {
		return fmt.Errorf("cuda: the FP8 GEMM kernel needs compute capability 8.9 or newer (e4m3 to f16 conversion), the device is %d.%d", p.Major, p.Minor)
	}
	stages, smem := gemmStages(p.MaxSharedBytesOptin)
	if stages == 0 {
		return fmt.Errorf("cuda: the FP8 GEMM kernel needs %d bytes of shared memory per block, the device allows %d", smem, p.MaxSharedBytesOptin)
	}
	compiled, err := driver.CompileDetailed(kernels.GEMMSource(), "gemm_fp8.cu", driver.CompileOptions{
		Arch: p.Arch(), Defines: map[string]string{"GEMM_STAGES": strconv.Itoa(stages)}})
	if err != nil {
		return err
	}
	if g.mod, err = b.ctx.LoadModule(compiled.Cubin); err != nil {
		return err
	}
	for _, f := range []struct {
		dst  **driver.Function
		name string
	}{{&g.kernel, "gemm_fp8"}, {&g.reduce, "gemm_fp8_reduce"}} {
		if *f.dst, err = g.mod.Function(f.name); err != nil {
			return err
		}
	}
	if err = g.kernel.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, smem); err != nil {
		return err
	}
	g.smemBytes = smem
	if g.part, err = b.ctx.Alloc(gemmPartBytes); err != nil {
		return err
	}
	if b.opts.NoCuBLASLt {
		g.ltErr = errors.New("cuda: Options.NoCuBLASLt is set")
	} else if g.lt, g.ltErr = cublaslt.New(b.ctx); g.ltErr != nil {
		b.log.Info().Err(g.ltErr).Msg("cuBLASLt unavailable: the GEMM kernel runs every batch")
	} else {
		b.log.Debug().Int("version", g.lt.Version()).Str("path", g.lt.Path()).Msg("cuBLASLt loaded")
	}
	return nil
}

// closeGEMM releases what InitGEMM made.
func (b *Backend) closeGEMM() error {
	g := &b.gemm
	var errs []error
	if g.lt != nil {
		errs = append(errs, g.lt.Close())
		g.lt = nil
	}
	if g.part != 0 {
		errs = append(errs, b.ctx.Free(g.part))
		g.part = 0
	}
	if g.mod != nil {
		errs = append(errs, g.mod.Unload())
		g.mod = nil
	}
	return errors.Join(errs...)
}

// GEMMCounts reports how many GEMMs each implementation ran.
func (b *Backend) GEMMCounts() (own, cublasLt int64) {
	return b.gemm.own.Load(), b.gemm.cublasRun.Load()
}

// CuBLASLtError is why cuBLASLt is not in use (nil when it is), after InitGEMM.
func (b *Backend) CuBLASLtError() error { return b.gemm.ltErr }

// CuBLASLtSupports reports whether cuBLASLt has an algorithm for the GEMM
// Y [m][n] (row stride yStride) = X [m][k] . W [n][k]^T: nil, or why not
// (absent, or the library's refusal). It prepares the shape's plan, so a
// later capture of that GEMM only enqueues.
func (b *Backend) CuBLASLtSupports(m, n, k, yStride int) error {
	if err := b.InitGEMM(); err != nil {
		return err
	}
	if b.gemm.lt == nil {
		return b.gemm.ltErr
	}
	return b.gemm.lt.Supported(cublaslt.Shape{M: m, N: n, K: k, YStride: yStride})
}

// The own kernel's tile (kernels/cuda/gemm_fp8.cu): a block computes
// gemmBlockRows rows of W for gemmBlockTokens tokens.
const (
	gemmBlockRows   = 256 // GEMM_ROWS
	gemmBlockTokens = 64  // GEMM_MT
)

// gemmStages is the deepest weight ring (GEMM_STAGES, 2 to 4 K blocks) whose
// shared memory fits maxShared bytes, with that size; 0 when none fits.
func gemmStages(maxShared int) (stages, bytes int) {
	size := func(s int) int {
		// weight ring + two f16 token tiles + two rows of token scales
		return 8*s*4096 + 2*gemmBlockTokens*272 + 2*gemmBlockTokens*4
	}
	for s := 4; s >= 2; s-- {
		if size(s) <= maxShared {
			return s, size(s)
		}
	}
	return 0, size(2)
}

// ownGEMMPlan is the launch shape of the own kernel for one GEMM.
type ownGEMMPlan struct {
	chunks, rowBlocks, splits, kbPerSplit int
}

// planOwnGEMM splits K when that shortens the GEMM: a block (one per SM: it
// takes most of the shared memory) streams kbPerSplit K blocks of its rows,
// so the time goes as waves of blocks x kbPerSplit, plus about one K block
// for the reduction of the partials. Narrow N (the fused [wq_a; wkv]) at
// small M splits until the grid covers the device; wide N (wq_b) already
// does and runs unsplit. The float32 partials stay within the workspace and
// no larger than the weight.
func planOwnGEMM(m, n, k, sms, partBytes int) ownGEMMPlan {
	kbn := k / 128
	p := ownGEMMPlan{
		chunks:     (m + gemmBlockTokens - 1) / gemmBlockTokens,
		rowBlocks:  (n + gemmBlockRows - 1) / gemmBlockRows,
		splits:     1,
		kbPerSplit: kbn,
	}
	blocks := p.chunks * p.rowBlocks
	waves := func(b int) int { return (b + sms - 1) / sms }
	best := waves(blocks) * kbn
	maxSplits := min(kbn, max(1, k/(4*m)), max(1, partBytes/(4*m*n)))
	for s := 2; s <= maxSplits; s++ {
		kbp := (kbn + s - 1) / s
		sp := (kbn + kbp - 1) / kbp
		if cost := waves(blocks*sp)*kbp + 1; cost < best {
			best, p.splits, p.kbPerSplit = cost, sp, kbp
		}
	}
	return p
}

// GEMM implements mla.ChainBackend: Y = X . W^T with the FP8 block scales,
// bf16 out, on the backend's stream. N and K must be multiples of 128.
func (b *Backend) GEMM(ctx context.Context, a *mla.GEMMArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	if a.W.N%128 != 0 {
		return fmt.Errorf("cuda: GEMMArgs.W.N = %d must be a multiple of 128", a.W.N)
	}
	m, n, k := a.X.Rows, a.W.N, a.W.K
	if m == 0 {
		return nil
	}
	if err := b.InitGEMM(); err != nil {
		return err
	}
	var w, ws, x, xs, y driver.DevicePtr
	var err error
	if w, err = span(a.W.Data, 0, n*k); err != nil {
		return err
	}
	if ws, err = span(a.W.Scale, 0, 4*(n/128)*(k/128)); err != nil {
		return err
	}
	if x, err = span(a.X.Data, 0, m*k); err != nil {
		return err
	}
	if xs, err = span(a.X.Scale, 0, 4*((k/128-1)*a.X.ScaleStride+m)); err != nil {
		return err
	}
	if y, err = span(a.Y, a.YOffset, 2*((m-1)*a.YStride+n)); err != nil {
		return err
	}
	g := &b.gemm
	own := ownGEMMDefault(m, n)
	if b.opts.GEMMOwnMaxM != 0 {
		own = m <= b.opts.GEMMOwnMaxM
	}
	// cuBLASLt's VEC128_32F scales have no stride: only an unpadded scale
	// layout can go to it.
	if g.lt != nil && !own && a.X.ScaleStride == m {
		shape := cublaslt.Shape{M: m, N: n, K: k, YStride: a.YStride}
		if err := g.lt.Supported(shape); err == nil {
			g.cublasRun.Add(1)
			return g.lt.Matmul(&cublaslt.FP8Matmul{Shape: shape, W: w, WScale: ws, X: x, XScale: xs, Y: y}, b.stream)
		}
	}
	g.own.Add(1)
	return b.ownGEMM(w, ws, x, xs, y, m, n, k, a.X.ScaleStride, a.YStride)
}

func (b *Backend) ownGEMM(w, ws, x, xs, y driver.DevicePtr, m, n, k, xsStride, yStride int) error {
	g := &b.gemm
	p := planOwnGEMM(m, n, k, b.ctx.Props().SMCount, gemmPartBytes)
	var part driver.DevicePtr
	if p.splits > 1 {
		part = g.part
	}
	grid := driver.Dim3{uint32(p.chunks), uint32(p.rowBlocks), uint32(p.splits)}
	block := driver.Dim3{256, 1, 1}
	return b.ctx.Do(func() error {
		if err := b.launchShared(g.kernel, grid, block, g.smemBytes, w, ws, x, xs, y, part,
			int32(m), int32(n), int32(k), int32(xsStride), int32(yStride), int32(p.kbPerSplit)); err != nil {
			return err
		}
		if p.splits == 1 {
			return nil
		}
		threads := m * n / 4
		return b.launch(g.reduce, driver.Dim3{uint32((threads + 255) / 256), 1, 1}, block,
			part, y, int32(m), int32(n), int32(yStride), int32(p.splits))
	})
}
