package cuda

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/cublaslt"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The chain's FP8 block-scaled GEMM (mla.ChainBackend.GEMM) has three
// implementations: the weight-streaming kernel of kernels/cuda/gemm_fp8.cu
// for small batches (cuBLASLt refuses M = 1 and 2 and is far from the
// weight-bandwidth floor below a few hundred rows), cuBLASLt above
// Options.GEMMOwnMaxM rows, by default the choice measured per shape in the
// device's architecture description (cudatune.Arch's FP8.Own), and on
// compute capability 9.0 the wgmma kernel of gemm_fp8_wgmma.cu
// (gemm_wgmma.go) where FP8.WGMMA.Use chooses it or Options.GEMMWGMMA
// forces it. They are compiled or loaded at the first GEMM (or InitGEMM);
// without cuBLASLt the kernel runs every batch.
//
// (A rewrite of the kernel that converts each operand to f16 once and runs
// f16 MMAs, 5fe1622..508f76b, measured 2-4x faster from 32 rows up but
// failed the chain's verify on the tiny model through CUDA graphs; it was
// merged in 9842e64 and backed out in be55dcc; no branch keeps it, its
// kernel is testdata/gemm_fp8_f16_rewrite_508f76b.cu. The failure and
// what it can and cannot have been: docs/gemm-rewrite-failure.md;
// TestCUDAGEMMChainReplay is the check a kernel like it must pass first.)

// gemmPartBytes is a split-K workspace: float32 partials of every split.
// Each stream has its own (streamSlot): GEMMs on one stream take turns with
// it (a kernel writes partials only after its programmatic-dependent-launch
// wait, when the reduction before it is done), but a GEMM on the side
// stream may run while one on the main stream does.
const gemmPartBytes = 32 << 20

// gemmState is the backend's GEMM machinery, set up once.
type gemmState struct {
	once           sync.Once
	err            error
	mod            *driver.Module
	byTile         map[int]*driver.Function // the own kernel per token tile (cudatune.FP8GEMMArch.TokenTiles)
	reduce         *driver.Function
	parts          [streamSlots]driver.DevicePtr // the split-K workspaces of the main, the side and the third stream
	ltOnce         sync.Once
	lt             *cublaslt.Handle // shared with the bf16 GEMM (bf16gemm.go)
	ltErr          error            // why cuBLASLt is not used (absent, or Options.NoCuBLASLt)
	own, cublasRun atomic.Int64
	// The sm_90a wgmma kernel (gemm_wgmma.go), loaded by loadWGMMA; wg is
	// nil where it is not (wgErr says why).
	wgOnce   sync.Once
	wg       *wgmmaState
	wgErr    error
	wgmmaRun atomic.Int64
	// ltOneWorkspace puts every cuBLASLt matmul on the handle's first
	// workspace, as before each stream had its own: only tests set it
	// (SetCuBLASLtOneWorkspace), to show what the second one prevents.
	ltOneWorkspace bool
	// ltAnyK sends every shape cuBLASLt accepts to it, those
	// cublasLtScaleRowsOK refuses too: only tests set it
	// (SetCuBLASLtAnyK), to map where cuBLASLt goes wrong.
	ltAnyK bool
}

// cublasLtScaleRowsOK reports whether cuBLASLt computes FP8 GEMMs of K
// correctly: its block-scaled kernel (algorithm 66, tile 20, cuBLASLt 13
// on the H200) wrote wrong columns at K = 256 (weight-scale rows of two
// float32, 8 bytes) for N = 8192 at M = 16 and 32 (2026-12-02,
// TestCUDAGEMMStreams, every split-K choice: it split nothing), the tiny
// model's indexer wq_b; TestCUDACuBLASLtScaleRows maps the shapes. Every
// DSv4 GEMM has K >= 1024 (scale rows of 32 bytes and more).
func cublasLtScaleRowsOK(k int) bool { return (k/128*4)%16 == 0 }

// InitGEMM compiles the GEMM kernels, allocates the split-K workspaces (one a stream) and
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
		return fmt.Errorf("cuda: the FP8 GEMM kernel needs compute capability 8.9 or newer (e4m3 MMA), the device is %d.%d", p.Major, p.Minor)
	}
	var err error
	if g.mod, err = b.compileModule(fp8GEMMProgram); err != nil {
		return err
	}
	g.byTile = map[int]*driver.Function{}
	for _, mt := range b.arch.FP8.TokenTiles {
		if g.byTile[mt], err = g.mod.Function(fmt.Sprintf("gemm_fp8_mt%d", mt)); err != nil {
			return err
		}
	}
	if g.reduce, err = g.mod.Function("gemm_fp8_reduce"); err != nil {
		return err
	}
	for i := range g.parts {
		if g.parts[i], err = b.ctx.Alloc(gemmPartBytes); err != nil {
			return err
		}
		b.workspaceSettled.Add(gemmPartBytes)
	}
	b.openCuBLASLt()
	// The wgmma kernel where it is forced (an error if it cannot run) or
	// chosen for some shape (without it, the other two run those).
	if b.opts.GEMMWGMMA {
		return b.loadWGMMA()
	}
	if len(b.arch.FP8.WGMMA.Use) > 0 {
		if err := b.loadWGMMA(); err != nil {
			b.log.Info().Err(err).Msg("the wgmma GEMM is not used")
		}
	}
	return nil
}

// openCuBLASLt opens the cuBLASLt handle the FP8 and bf16 GEMMs share,
// once (unless Options.NoCuBLASLt); g.ltErr says why there is none.
func (b *Backend) openCuBLASLt() {
	g := &b.gemm
	g.ltOnce.Do(func() {
		if b.opts.NoCuBLASLt {
			g.ltErr = errors.New("cuda: Options.NoCuBLASLt is set")
			return
		}
		// Allocated, or never to be: either way no longer kept back.
		defer b.workspaceSettled.Add(cublaslt.Workspaces * cublaslt.WorkspaceBytes)
		mask, restrict := b.knobs.CuBLASLtSplitK.ReductionMask()
		if g.lt, g.ltErr = cublaslt.New(b.ctx, cublaslt.Config{RestrictReductions: restrict, ReductionMask: mask,
			FP8Heuristic: max(b.knobs.CuBLASLtFP8Heuristic-1, 0), BF16Heuristic: max(b.knobs.CuBLASLtBF16Heuristic-1, 0)}); g.ltErr != nil {
			b.log.Info().Err(g.ltErr).Msg("cuBLASLt unavailable: the own GEMM kernels run every batch")
		} else {
			b.log.Debug().Int("version", g.lt.Version()).Str("path", g.lt.Path()).Msg("cuBLASLt loaded")
		}
	})
}

// ltWorkspace is the cuBLASLt workspace of the stream launches go to now:
// matmuls on the main and the side stream may run at once, and one
// workspace under two split-K kernels corrupts both and can hang them.
func (b *Backend) ltWorkspace() int {
	if b.gemm.ltOneWorkspace {
		return 0
	}
	return b.streamSlot()
}

// closeGEMM releases what InitGEMM made.
func (b *Backend) closeGEMM() error {
	g := &b.gemm
	var errs []error
	if g.lt != nil {
		errs = append(errs, g.lt.Close())
		g.lt = nil
	}
	for i, p := range g.parts {
		if p != 0 {
			errs = append(errs, b.ctx.Free(p))
			g.parts[i] = 0
		}
	}
	if g.mod != nil {
		errs = append(errs, g.mod.Unload())
		g.mod = nil
	}
	if g.wg != nil {
		errs = append(errs, g.wg.mod.Unload(), g.wg.free(b.ctx))
		g.wg = nil
	}
	errs = append(errs, b.bf16.wg.free(b.ctx))
	if m := b.bf16.mod; m != nil {
		errs = append(errs, m.Unload())
		b.bf16.mod = nil
	}
	if m := b.bf16.mmaMod; m != nil {
		errs = append(errs, m.Unload())
		b.bf16.mmaMod = nil
	}
	for i, p := range b.bf16.parts {
		if p != 0 {
			errs = append(errs, b.ctx.Free(p))
			b.bf16.parts[i] = 0
		}
	}
	for i, p := range b.bf16.counters {
		if p != 0 {
			errs = append(errs, b.ctx.Free(p))
			b.bf16.counters[i] = 0
		}
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

// CuBLASLtAlgorithm describes the algorithm cuBLASLt's heuristic chose
// for an FP8 GEMM of the shape (under cudatune.Knobs.CuBLASLtSplitK), or
// why there is none.
func (b *Backend) CuBLASLtAlgorithm(m, n, k, yStride int) (cublaslt.Algorithm, error) {
	if err := b.InitGEMM(); err != nil {
		return cublaslt.Algorithm{}, err
	}
	if b.gemm.lt == nil {
		return cublaslt.Algorithm{}, b.gemm.ltErr
	}
	return b.gemm.lt.FP8Algorithm(cublaslt.Shape{M: m, N: n, K: k, YStride: yStride})
}

// ownGEMMPlan is the launch shape of the own kernel for one GEMM.
type ownGEMMPlan struct {
	mt, chunks, splits, kbPerSplit int
}

// planOwnGEMM picks the token tile (the smallest of a.TokenTiles, or a
// larger one when M exceeds the one below it and wide N already fills the
// device with it) and the split of K: with the smallest tile, narrow N
// (the fused [wq_a; wkv]) splits K until the grid has about
// a.SplitBlocksPerSM blocks an SM, as long as the float32 partials stay
// within the workspace and no larger than the weight.
func planOwnGEMM(a cudatune.FP8GEMMArch, m, n, k, sms, partBytes int) ownGEMMPlan {
	kbn, tiles := k/128, n/a.RowTile
	p := ownGEMMPlan{mt: a.TokenTiles[0], splits: 1}
	for i := 1; i < len(a.TokenTiles); i++ {
		t := a.TokenTiles[i]
		if m > a.TokenTiles[i-1] && tiles*((m+t-1)/t) >= sms {
			p.mt = t
		}
	}
	p.chunks = (m + p.mt - 1) / p.mt
	blocks := p.chunks * tiles
	if want := a.SplitBlocksPerSM * sms; p.mt == a.TokenTiles[0] && blocks < sms {
		s := (want + blocks - 1) / blocks
		s = min(s, kbn, max(1, k/(4*m)), max(1, partBytes/(4*m*n)))
		p.splits = max(1, s)
	}
	p.kbPerSplit = (kbn + p.splits - 1) / p.splits
	p.splits = (kbn + p.kbPerSplit - 1) / p.kbPerSplit
	return p
}

// GEMM implements mla.ChainBackend: Y = X . W^T with the FP8 block scales,
// bf16 out, on the backend's stream. N and K must be multiples of 128.
func (b *Backend) GEMM(ctx context.Context, a *mla.GEMMArgs) error { return b.gemmOn(ctx, a, false) }

// gemmOn is GEMM; wgmma runs it on the wgmma kernel whatever the choice
// (loaded by the caller).
func (b *Backend) gemmOn(ctx context.Context, a *mla.GEMMArgs, wgmma bool) error {
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
	if wgmma && g.wg == nil {
		return fmt.Errorf("cuda: the wgmma GEMM is not loaded: %w", g.wgErr)
	}
	if kern := b.arch.FP8.WGMMA.KernelFor(m, n); wgmma || g.wg != nil && (b.opts.GEMMWGMMA || kern != 0) {
		if kern == 0 {
			kern = cudatune.WGMMAWide
		}
		if b.knobs.WGMMAKernel != 0 {
			kern = b.knobs.WGMMAKernel
		}
		return b.wgmmaGEMM(kern, w, ws, x, xs, y, m, n, k, a.X.ScaleStride, a.YStride)
	}
	own := b.arch.FP8.OwnKernel(m, n)
	if b.opts.GEMMOwnMaxM != 0 {
		own = m <= b.opts.GEMMOwnMaxM
	}
	// cuBLASLt's VEC128_32F scales have no stride: only an unpadded scale
	// layout can go to it.
	if g.lt != nil && !own && a.X.ScaleStride == m && (cublasLtScaleRowsOK(k) || g.ltAnyK) {
		shape := cublaslt.Shape{M: m, N: n, K: k, YStride: a.YStride}
		if err := g.lt.Supported(shape); err == nil {
			g.cublasRun.Add(1)
			return g.lt.Matmul(&cublaslt.FP8Matmul{Shape: shape, W: w, WScale: ws, X: x, XScale: xs, Y: y, Workspace: b.ltWorkspace()}, b.stream)
		}
	}
	g.own.Add(1)
	return b.ownGEMM(fp8GEMMOperands{w: w, ws: ws, x: x, xs: xs, y: y, m: m, n: n, k: k, xsStride: a.X.ScaleStride, yStride: a.YStride})
}

func (b *Backend) ownGEMM(op fp8GEMMOperands) error {
	g := &b.gemm
	p := planOwnGEMM(b.arch.FP8, op.m, op.n, op.k, b.arch.SMs, gemmPartBytes)
	fn := g.byTile[p.mt]
	var part driver.DevicePtr
	if p.splits > 1 {
		part = g.parts[b.streamSlot()]
	}
	params, reduce, err := fp8GEMMParams(op, p, part)
	if err != nil {
		return err
	}
	grid := driver.Dim3{uint32(p.chunks), uint32(op.n / b.arch.FP8.RowTile), uint32(p.splits)}
	return b.ctx.Do(func() error {
		if err := b.launch(fn, grid, driver.Dim3{32 * abi.FP8GEMMWarps, 1, 1}, driver.Bytes(params)); err != nil {
			return err
		}
		if reduce == nil {
			return nil
		}
		return b.launch(g.reduce, splitKGrid(op.m, op.n), driver.Dim3{abi.SplitKThreads, 1, 1}, driver.Bytes(reduce))
	})
}
