package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/cublaslt"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The compressor's projection GEMM (mla.BF16GEMMBackend): bf16 operands,
// float32 output. Four implementations, all enqueued on the backend's
// stream, so the GEMM is captured into graphs and ordered with the side
// stream's fork like the chain's GEMMs:
//   - the sm_90a warpgroup-MMA kernel of kernels/cuda/gemm_bf16_wgmma.cu
//     (bf16wgmma.go) where cudatune.Knobs.BF16WGMMAMaxRows or the
//     architecture description's BF16.WGMMA.Use choose it and K % 64 == 0
//     (by default no shape until the device has measured it);
//   - the tensor-core weight-streaming kernel of kernels/cuda/gemm_bf16_mma.cu
//     (sm_80+) up to cudatune.Knobs.BF16MMAMaxRows rows, where N % 16 == 0
//     and K % 64 == 0 (on the H200 no rows: cuBLASLt was measured faster
//     at every decode shape, cudatune's SM90);
//   - cuBLASLt (the handle the FP8 GEMM uses) for every other shape it has
//     an algorithm for;
//   - the tensor-core kernel again where cuBLASLt is absent or refuses;
//   - the simple kernel of kernels/cuda/gemm_bf16.cu for the rest, and
//     everything when neither of the others can run.

// bf16GEMMPath chooses the implementation (tests force one through
// export_test.go; production always uses bf16GEMMAuto).
type bf16GEMMPath int

const (
	bf16GEMMAuto     bf16GEMMPath = iota // the tensor-core kernel at small M, cuBLASLt where it has an algorithm, else the tensor-core kernel where it runs, else the simple kernel
	bf16GEMMOwn                          // the simple kernel for every shape
	bf16GEMMCuBLASLt                     // cuBLASLt only: a shape it refuses is an error
	bf16GEMMMMA                          // the tensor-core kernel only: a shape it cannot run is an error
	bf16GEMMWGMMA                        // the sm_90a wgmma kernel only: a shape it cannot run is an error
)

// bf16GEMMState is the projection GEMM's kernels, loaded at first use, and
// the tensor-core kernel's split-K workspace.
type bf16GEMMState struct {
	once             sync.Once
	err              error
	mod              *driver.Module
	fn               *driver.Function
	mmaMod           *driver.Module // nil where the device has no bf16 MMA (mmaErr says so)
	mmaFn, mmaReduce *driver.Function
	mmaKernel        bf16MMAKernel // which kernel mmaFn is (cudatune.Knobs.BF16MMADepth)
	mmaErr           error
	// parts are the split-K workspaces (bf16MMAPartBytes of float32
	// partials each) of the main stream, the side stream (Side) and the
	// third (Aux): a GEMM on each may be in flight at once.
	parts [streamSlots]driver.DevicePtr
	// counters are the finishing ring kernels' arrival counters
	// (bf16MMACounters int32 each, zero between launches), one set a
	// stream like parts.
	counters            [streamSlots]driver.DevicePtr
	path                bf16GEMMPath
	own, mma, cublasRun atomic.Int64
	// wg is the sm_90a wgmma kernel (bf16wgmma.go), loaded by InitBF16GEMM
	// where Knobs.BF16WGMMAMaxRows or the architecture choose it.
	wg    bf16WGMMAState
	wgRun atomic.Int64
}

// bf16GEMMWarps is gemm_bf16_f32's warps a block (abi.h's BF16_GEMM_WARPS).
const bf16GEMMWarps = abi.BF16GEMMWarps

// The tensor-core kernel's shape (kernels/cuda/abi, abi.h's BF16_MMA_*)
// and the backend's choices for it.
const (
	bf16MMARows   = abi.BF16MMARows   // outputs (W rows) a block owns
	bf16MMATokens = abi.BF16MMATokens // X rows a block owns
	bf16MMAStage  = abi.BF16MMAStage  // k a pipeline stage; K must be a multiple
	bf16MMAPad    = abi.BF16MMAPad    // bf16 past each shared X row

	// bf16MMASharedBytes caps the block's dynamic shared memory (its X
	// chunk) at what a launch gets without opting in.
	bf16MMASharedBytes = 48 << 10
	// bf16MMAPartBytes is a split-K workspace, allocated with the kernels
	// so that a graph capture never allocates. GEMMs on one stream take
	// turns with it: the next kernel writes partials only after its
	// programmatic-dependent-launch wait, when the reduction before is done.
	bf16MMAPartBytes = 8 << 20
	// bf16MMACounters is the finishing kernels' counters a stream: one an
	// (output block, token chunk) of a split GEMM, whose grid the planner
	// keeps within the resident blocks (far fewer).
	bf16MMACounters = 4096
)

// bf16MMAKernel is one of the tensor-core kernels of gemm_bf16_mma.cu: the
// stages of W a lane keeps in flight and the blocks its launch bounds
// keep resident a multiprocessor (the most the planner puts on one).
type bf16MMAKernel struct {
	name            string
	depth, resident int
	finish          bool // finishes a split K in its last block (cudatune.Knobs.BF16MMAReduce 2)
	warpRows        int  // W rows a warp (cudatune.Knobs.BF16MMAWarpRows): 64 / warpRows warps a block
}

// bf16MMAKernels are the tensor-core kernels by cudatune.Knobs.BF16MMADepth.
// and cudatune.Knobs.BF16MMAReduce.
// cudatune.Knobs.BF16MMAReduce and cudatune.Knobs.BF16MMAWarpRows.
var bf16MMAKernels = []bf16MMAKernel{
	{"gemm_bf16_mma", 2, 4, false, 16},
	{"gemm_bf16_mma_d2f", 2, 4, true, 16}, // the ring kernel at gemm_bf16_mma's depth
	{"gemm_bf16_mma_d4", 4, 3, false, 16},
	{"gemm_bf16_mma_d8", 8, 2, false, 16},
	{"gemm_bf16_mma_d4f", 4, 3, true, 16},
	{"gemm_bf16_mma_d8f", 8, 2, true, 16},
	{"gemm_bf16_mma_d4w", 4, 4, false, 32},
	{"gemm_bf16_mma_d4wf", 4, 4, true, 32},
}

// bf16MMAKernelOf is the kernel of a depth, a reduction (1: the separate
// launch, 2: in the kernel) and the W rows a warp, or an error naming the
// knobs.
func bf16MMAKernelOf(depth, reduce, warpRows int) (bf16MMAKernel, error) {
	if reduce != 1 && reduce != 2 {
		return bf16MMAKernel{}, fmt.Errorf("cuda: Knobs.BF16MMAReduce = %d: 1 (gemm_bf16_mma_reduce) or 2 (in the kernel)", reduce)
	}
	for _, k := range bf16MMAKernels {
		if k.depth == depth && k.finish == (reduce == 2) && k.warpRows == warpRows {
			return k, nil
		}
	}
	var have []string
	for _, k := range bf16MMAKernels {
		have = append(have, fmt.Sprintf("(%d, %d, %d)", k.depth, map[bool]int{false: 1, true: 2}[k.finish], k.warpRows))
	}
	return bf16MMAKernel{}, fmt.Errorf("cuda: Knobs.BF16MMADepth = %d, BF16MMAReduce = %d, BF16MMAWarpRows = %d: the tensor-core bf16 kernels are %s",
		depth, reduce, warpRows, strings.Join(have, ", "))
}

// bf16MMAPlan is the tensor-core kernel's launch shape for one GEMM.
type bf16MMAPlan struct {
	tiles, chunks  int // grid x (blocks of 64 outputs) and z (chunks of 64 tokens)
	splits, kSplit int // grid y: splits of K, kSplit each (the last may be shorter)
	kChunk, shared int // k of X staged in shared memory at a time, and its bytes
}

// planBF16MMA splits K until the grid has about perSM blocks a
// multiprocessor (but no more than resident a multiprocessor, what the
// kernel holds at once: a second wave would double the time), as long as
// every split keeps a stage, the partials fit the workspace and stay
// within half the weight's bytes and, with maxSplits > 0, there are at
// most maxSplits; a split's X is staged in as few equal chunks as the
// shared memory cap allows.
func planBF16MMA(perSM, resident, maxSplits, m, n, k, sms, partBytes int) bf16MMAPlan {
	p := bf16MMAPlan{tiles: (n + bf16MMARows - 1) / bf16MMARows, chunks: (m + bf16MMATokens - 1) / bf16MMATokens}
	stages := k / bf16MMAStage
	splits := 1
	blocks := p.tiles * p.chunks
	if want := perSM * sms; blocks < want {
		splits = (want + blocks - 1) / blocks
	}
	if most := resident * sms / blocks; splits > most {
		splits = most
	}
	if maxSplits > 0 {
		splits = min(splits, maxSplits)
	}
	splits = max(1, min(splits, stages, partBytes/4/m/n, k/(4*m)))
	per := (stages + splits - 1) / splits
	p.kSplit = per * bf16MMAStage
	p.splits = (stages + per - 1) / per
	tokens := (min(m, bf16MMATokens) + 7) &^ 7
	most := (bf16MMASharedBytes/(2*tokens) - bf16MMAPad) / bf16MMAStage // stages of X the cap holds
	pieces := (per + most - 1) / most                                   // X chunks a split, equal but for the last
	p.kChunk = (per + pieces - 1) / pieces * bf16MMAStage
	p.shared = 2 * tokens * (p.kChunk + bf16MMAPad)
	return p
}

// InitBF16GEMM compiles the projection GEMM's kernels, allocates the
// tensor-core kernel's split-K workspace and opens cuBLASLt (unless
// Options.NoCuBLASLt); BF16GEMM calls it on first use. Call it, or
// PrepareBF16GEMM for each shape, before capturing a CUDA graph that
// contains the GEMM: a capture may not load modules or allocate.
func (b *Backend) InitBF16GEMM() error {
	g := &b.bf16
	g.once.Do(func() { g.err = b.initBF16GEMM() })
	return g.err
}

func (b *Backend) initBF16GEMM() error {
	g := &b.bf16
	var err error
	if g.mod, err = b.compileModule(bf16GEMMProgram); err != nil {
		return fmt.Errorf("cuda: bf16 GEMM kernel: %w", err)
	}
	if g.fn, err = g.mod.Function("gemm_bf16_f32"); err != nil {
		return err
	}
	if err := b.initBF16MMA(); err != nil {
		return err
	}
	if b.bf16WGMMAWanted() {
		// A device, driver or table without it leaves the other paths.
		if err := b.loadBF16WGMMA(); err != nil && !errors.Is(err, ErrBF16WGMMAUnavailable) {
			return err
		}
	}
	b.openCuBLASLt()
	return nil
}

// initBF16MMA compiles the tensor-core kernel and allocates its workspace
// where the device has bf16 MMA (sm_80+); elsewhere it records why not.
func (b *Backend) initBF16MMA() error {
	g := &b.bf16
	p := b.ctx.Props()
	if p.Major < 8 {
		g.mmaErr = fmt.Errorf("cuda: the tensor-core bf16 GEMM needs compute capability 8.0 or newer, the device is %d.%d", p.Major, p.Minor)
		b.workspaceSettled.Add(int64(len(g.parts)) * (bf16MMAPartBytes + 4*bf16MMACounters)) // never to be allocated
		return nil
	}
	var err error
	if g.mmaMod, err = b.compileModule(bf16MMAProgram); err != nil {
		return fmt.Errorf("cuda: tensor-core bf16 GEMM kernel: %w", err)
	}
	if g.mmaKernel, err = bf16MMAKernelOf(b.knobs.BF16MMADepth, b.knobs.BF16MMAReduce, b.knobs.BF16MMAWarpRows); err != nil {
		return err
	}
	if g.mmaFn, err = g.mmaMod.Function(g.mmaKernel.name); err != nil {
		return err
	}
	if g.mmaReduce, err = g.mmaMod.Function("gemm_bf16_mma_reduce"); err != nil {
		return err
	}
	for i := range g.parts {
		if g.parts[i], err = b.ctx.Alloc(bf16MMAPartBytes); err != nil {
			return err
		}
		if g.counters[i], err = b.ctx.Alloc(4 * bf16MMACounters); err != nil {
			return err
		}
		if err := b.ctx.Memset8(g.counters[i], 0, 4*bf16MMACounters); err != nil {
			return err
		}
		b.workspaceSettled.Add(bf16MMAPartBytes + 4*bf16MMACounters)
	}
	return nil
}

// bf16MMASupports reports whether the tensor-core kernel runs a GEMM of
// rows x n outputs from k inputs: nil, or why not.
func (g *bf16GEMMState) bf16MMASupports(rows, n, k int) error {
	switch {
	case g.mmaFn == nil:
		return g.mmaErr
	case n%16 != 0:
		return fmt.Errorf("cuda: the tensor-core bf16 GEMM needs N a multiple of 16, N = %d", n)
	case k%bf16MMAStage != 0:
		return fmt.Errorf("cuda: the tensor-core bf16 GEMM needs K a multiple of %d, K = %d", bf16MMAStage, k)
	case (rows+bf16MMATokens-1)/bf16MMATokens > 65535:
		return fmt.Errorf("cuda: the tensor-core bf16 GEMM runs at most %d rows, Rows = %d", 65535*bf16MMATokens, rows)
	}
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

// BF16MMAError is why the tensor-core bf16 GEMM kernel is not in use (nil
// when it is), after InitBF16GEMM.
func (b *Backend) BF16MMAError() error { return b.bf16.mmaErr }

// BF16GEMMCounts reports how many projection GEMMs each implementation ran:
// the simple kernel, the tensor-core kernel and cuBLASLt.
func (b *Backend) BF16GEMMCounts() (own, mma, cublasLt int64) {
	return b.bf16.own.Load(), b.bf16.mma.Load(), b.bf16.cublasRun.Load()
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
	xn, wn, yn := a.Extents() // Validate bounded them
	x, err := span(a.X, a.XOffset, int(xn))
	if err != nil {
		return err
	}
	w, err := span(a.W, 0, int(wn))
	if err != nil {
		return err
	}
	y, err := span(a.Y, a.YOffset, int(yn))
	if err != nil {
		return err
	}
	if err := b.InitBF16GEMM(); err != nil {
		return err
	}
	g := &b.bf16
	shape := cublaslt.BF16Shape{M: a.Rows, N: a.N, K: a.K, XStride: a.XStride, YStride: a.YStride}
	useLt, useMMA, useWG := false, false, false
	switch g.path {
	case bf16GEMMAuto:
		if b.bf16WGMMAChosen(a.Rows, a.N) && b.bf16WGMMASupports(a.Rows, a.N, a.K) == nil {
			useWG = true
			break
		}
		mmaOK := g.bf16MMASupports(a.Rows, a.N, a.K) == nil
		useMMA = a.Rows <= b.knobs.BF16MMAMaxRows && mmaOK
		useLt = !useMMA && b.gemm.lt != nil && b.gemm.lt.SupportedBF16(shape) == nil
		// Where cuBLASLt is absent or refuses, the tensor-core kernel
		// rather than the simple one, whatever the rows.
		useMMA = useMMA || !useLt && mmaOK
	case bf16GEMMCuBLASLt:
		if b.gemm.lt == nil {
			return fmt.Errorf("cuda: bf16 GEMM forced to cuBLASLt: %w", b.gemm.ltErr)
		}
		if err := b.gemm.lt.SupportedBF16(shape); err != nil {
			return err
		}
		useLt = true
	case bf16GEMMMMA:
		if err := g.bf16MMASupports(a.Rows, a.N, a.K); err != nil {
			return fmt.Errorf("cuda: bf16 GEMM forced to the tensor-core kernel: %w", err)
		}
		useMMA = true
	case bf16GEMMWGMMA:
		if err := b.bf16WGMMASupports(a.Rows, a.N, a.K); err != nil {
			return fmt.Errorf("cuda: bf16 GEMM forced to the wgmma kernel: %w", err)
		}
		useWG = true
	}
	if useWG {
		return b.bf16WGMMA(bf16Operands{x: x, w: w, y: y}, a)
	}
	if useMMA {
		g.mma.Add(1)
		return b.bf16MMA(bf16Operands{x: x, w: w, y: y}, a)
	}
	if useLt {
		g.cublasRun.Add(1)
		return b.gemm.lt.MatmulBF16(&cublaslt.BF16Matmul{BF16Shape: shape, W: w, X: x, Y: y, Workspace: b.ltWorkspace()}, b.stream)
	}
	warps := int64(a.Rows) * int64(a.N/8)
	blocks := (warps + bf16GEMMWarps - 1) / bf16GEMMWarps
	if blocks > math.MaxInt32 {
		return fmt.Errorf("cuda: bf16 GEMM of %d rows x %d outputs needs %d blocks, more than a grid holds", a.Rows, a.N, blocks)
	}
	params, err := bf16GEMMParams(bf16Operands{x: x, w: w, y: y}, a)
	if err != nil {
		return err
	}
	g.own.Add(1)
	return b.launch(g.fn, driver.Dim3{uint32(blocks), 1, 1}, driver.Dim3{32 * bf16GEMMWarps, 1, 1}, driver.Bytes(params))
}

// bf16MMAPlan is the tensor-core kernel's plan for a GEMM on this backend:
// its kernel (Knobs.BF16MMADepth), the split target (Knobs.BF16MMABlocksPerSM,
// else the architecture's) and the device's multiprocessors.
func (b *Backend) bf16MMAPlan(rows, n, k int) bf16MMAPlan {
	perSM := b.knobs.BF16MMABlocksPerSM
	if perSM <= 0 {
		perSM = b.arch.BF16.SplitBlocksPerSM
	}
	return planBF16MMA(perSM, b.bf16.mmaKernel.resident, b.knobs.BF16MMAMaxSplits, rows, n, k, b.arch.SMs, bf16MMAPartBytes)
}

// bf16MMA enqueues the tensor-core kernel and, with several splits of K,
// the reduction of their partials into Y.
func (b *Backend) bf16MMA(op bf16Operands, a *mla.BF16GEMMArgs) error {
	g := &b.bf16
	p := b.bf16MMAPlan(a.Rows, a.N, a.K)
	slot := b.streamSlot()
	params, reduce, err := bf16MMAParams(op, a, p, g.parts[slot], g.counters[slot])
	if err != nil {
		return err
	}
	grid := driver.Dim3{uint32(p.tiles), uint32(p.splits), uint32(p.chunks)}
	return b.ctx.Do(func() error {
		threads := uint32(bf16MMARows / g.mmaKernel.warpRows * 32)
		if err := b.launchShared(g.mmaFn, grid, driver.Dim3{threads, 1, 1}, p.shared, driver.Bytes(params)); err != nil {
			return err
		}
		if reduce == nil || g.mmaKernel.finish {
			return nil
		}
		return b.launch(g.mmaReduce, splitKGrid(a.Rows, a.N), driver.Dim3{abi.SplitKThreads, 1, 1}, driver.Bytes(reduce))
	})
}

var _ mla.BF16GEMMBackend = (*Backend)(nil)
