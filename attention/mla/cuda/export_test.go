package cuda

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// PathFor is the backend's choice of kernels for a launch (knobs with their
// defaults applied).
func PathFor(k cudatune.Knobs, l mla.Launch, heads int, q mla.QFormat) abi.Path {
	return pathFor(k.Defaults(), l, heads, q)
}

// CompileWithTestKernels compiles prologue.cu (with its headers) followed by a
// test-only source (its kernels may use the production helpers) with the
// backend's options, and loads the module.
func (b *Backend) CompileWithTestKernels(file, src string) (*driver.Module, error) {
	full := kernels.PrologueSource() + "\n#line 1 " + strconv.Quote(file) + "\n" + src
	return b.ctx.CompileModule(full, file, b.options(prologueProgram))
}

// CompileWithChainKernels compiles the chain's program (chain.cu) followed
// by a test-only source that may use its helpers, with the options the
// backend compiles chain.cu with, and loads the module.
func (b *Backend) CompileWithChainKernels(file, src string) (*driver.Module, error) {
	full := kernels.ChainSource() + "\n#line 1 " + strconv.Quote(file) + "\n" + src
	return b.ctx.CompileModule(full, file, b.options(chainProgram))
}

// CompileWithCompressKernels compiles the compressor's program
// (kernels/cuda.CompressSource: compress.cu with prologue.cu's helpers and
// exp32.cuh, then indexer.cu) followed by a test-only source that may use its helpers,
// and loads the module.
func (b *Backend) CompileWithCompressKernels(file, src string) (*driver.Module, error) {
	full := kernels.CompressSource() + "\n#line 1 " + strconv.Quote(file) + "\n" + src
	return b.ctx.CompileModule(full, file, b.options(compressProgram))
}

// PackCompressJobs is the job list CompressEntries uploads: int32 {index,
// cand, page, offset} per job, then every job's candidate codes.
func PackCompressJobs(jobs []CompressJob) []byte {
	n := 0
	for _, j := range jobs {
		n += len(j.Candidates)
	}
	return packJobs(jobs, n)
}

// SetBF16GEMMPath forces the projection GEMM's implementation: "own" (the
// simple kernel for every shape), "mma" (the tensor-core kernel only; a
// shape it cannot run is an error), "wgmma" (the sm_90a kernel, loaded
// now, after InitBF16GEMM; a shape it cannot run is an error), "cublaslt" (cuBLASLt only; a shape it
// refuses is an error) or "auto" (the default). Not safe while GEMMs run.
func (b *Backend) SetBF16GEMMPath(path string) {
	switch path {
	case "own":
		b.bf16.path = bf16GEMMOwn
	case "mma":
		b.bf16.path = bf16GEMMMMA
	case "cublaslt":
		b.bf16.path = bf16GEMMCuBLASLt
	case "wgmma":
		_ = b.loadBF16WGMMA() // BF16WGMMAError says why not
		b.bf16.path = bf16GEMMWGMMA
	case "auto":
		b.bf16.path = bf16GEMMAuto
	default:
		panic("SetBF16GEMMPath: unknown path " + path)
	}
}

// SetCuBLASLtAnyK sends every FP8 GEMM shape cuBLASLt accepts to it,
// those whose weight-scale rows cublasLtScaleRowsOK refuses too.
func (b *Backend) SetCuBLASLtAnyK(any bool) { b.gemm.ltAnyK = any }

// CuBLASLtScaleRowsOK is cublasLtScaleRowsOK.
func CuBLASLtScaleRowsOK(k int) bool { return cublasLtScaleRowsOK(k) }

// SetCuBLASLtOneWorkspace puts every cuBLASLt matmul on the handle's first
// workspace whatever its stream (true), as before each stream had its own,
// or restores the per-stream workspaces (false). Not safe while GEMMs run.
func (b *Backend) SetCuBLASLtOneWorkspace(one bool) { b.gemm.ltOneWorkspace = one }

// BF16MMAKernelName is the tensor-core bf16 kernel the backend launches
// (Knobs.BF16MMADepth), after InitBF16GEMM.
func (b *Backend) BF16MMAKernelName() string { return b.bf16.mmaKernel.name }

// BF16MMAPlanOf is the tensor-core bf16 kernel's launch shape for a GEMM
// on this backend: grid x, y, z and the dynamic shared bytes.
func (b *Backend) BF16MMAPlanOf(rows, n, k int) (tiles, splits, chunks, shared int) {
	p := b.bf16MMAPlan(rows, n, k)
	return p.tiles, p.splits, p.chunks, p.shared
}

// BF16WGMMAPlanOf is the sm_90a bf16 kernel's plan for a GEMM on this
// backend, in words (token tile, grid, splits, finish, ring).
func (b *Backend) BF16WGMMAPlanOf(rows, n, k int) string {
	p, err := b.bf16WGMMAPlan(rows, n, k)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%s grid %d tiles %d chunks %d splits %d (kb %d) finish %d stages %d smem %d l2pf %v",
		abi.BF16WGMMAKernel(p.bn), p.grid, p.tiles, p.chunks, p.splits, p.kbPerSplit, p.finish, p.stages, p.smem, p.l2Prefetch)
}

// BF16WGMMASplitKey is the sm_90a bf16 kernel's token tile and split of
// K for a GEMM (plans with the same key add the same partials in the same
// order, whatever their finish).
func (b *Backend) BF16WGMMASplitKey(rows, n, k int) string {
	p, err := b.bf16WGMMAPlan(rows, n, k)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("bn %d splits %d kb %d", p.bn, p.splits, p.kbPerSplit)
}

// BF16WGMMAClusters is the architecture's BF16.WGMMA.MaxClusters on this
// backend (after the kernel loaded).
func (b *Backend) BF16WGMMAClusters() []int { return b.arch.BF16.WGMMA.MaxClusters }

// KernelSharedBytes is a loaded prologue kernel's static shared memory.
func (b *Backend) KernelSharedBytes(name string) (int, error) {
	return b.fns[name].Attribute(driver.FuncSharedSizeBytes)
}

// SetTopKScore picks the top-k kernels: a score kernel, "dp4a"
// (topk_score), "mma4x" (topk_score_mma4x) or "default" (mma4x),
// optionally followed by "+" and a select kernel: "select4n", "select4ns"
// (topk_select4n with 40 KiB of shared memory: a 64K context's rows take
// its candidate sweep), "select4ng" (without shared memory: its rows read
// their keys from global memory), "select5e", "select5es" (likewise);
// without one, the default select.
func (b *Backend) SetTopKScore(kernel string) {
	score, sel, _ := strings.Cut(kernel, "+")
	switch score {
	case "default", "mma4x":
		b.topk.kernel = topkScoreMMA4X
	case "dp4a":
		b.topk.kernel = topkScoreDP4A
	default:
		panic("cuda: SetTopKScore(" + kernel + ")")
	}
	switch sel {
	case "":
		b.topk.sel = topkSelectDefault
	case "select4n":
		b.topk.sel = topkSelect4N
	case "select4ns":
		b.topk.sel = topkSelect4NSmall
	case "select4ng":
		b.topk.sel = topkSelect4NGlobal
	case "select5e":
		b.topk.sel = topkSelect5E
	case "select5es":
		b.topk.sel = topkSelect5ESmall
	default:
		panic("cuda: SetTopKScore(" + kernel + ")")
	}
}

// TopKKernelResources describes a top-k score kernel's (and the select
// kernel's) registers, spilled local memory and static shared memory a
// thread or block, as the loaded module reports them.
func (b *Backend) TopKKernelResources(kernel string) string {
	if err := b.LoadTopK(); err != nil {
		return err.Error()
	}
	fn := map[string]*driver.Function{"dp4a": b.topk.score, "mma4x": b.topk.mma4x,
		"select4n": b.topk.select4n, "select5e": b.topk.select5e}[kernel]
	if fn == nil {
		return "no such kernel"
	}
	var v [4]int
	for i, a := range []driver.FuncAttribute{driver.FuncNumRegs, driver.FuncLocalSizeBytes, driver.FuncSharedSizeBytes, driver.FuncMaxDynamicSharedSizeBytes} {
		var err error
		if v[i], err = fn.Attribute(a); err != nil {
			return err.Error()
		}
	}
	res := fmt.Sprintf("%s: %d registers, %d bytes local (spills), %d bytes static shared, %d dynamic allowed", fn.Name, v[0], v[1], v[2], v[3])
	return res
}

// TopKStage runs the selection's score kernel or its select kernel alone.
func (b *Backend) TopKStage(ctx context.Context, a *mla.TopKArgs, score bool) error {
	return b.indexerTopK(ctx, a, score, !score)
}

// RewriteGEMM is the f16-conversion rewrite of the FP8 GEMM kernel
// (5fe1622..508f76b, merged in 9842e64, backed out in be55dcc: it failed
// the tiny model's chain verify through CUDA graphs), launched as 508f76b's
// gemm.go launched it, so that TestCUDAGEMMChainReplay can run the design
// that failed beside the current one. Its source is
// testdata/gemm_fp8_f16_rewrite_508f76b.cu, unchanged.
type RewriteGEMM struct {
	b            *Backend
	mod          *driver.Module
	fn, reduce   *driver.Function
	smem         int
	OneWorkspace bool // every split-K GEMM takes the main stream's workspace, as 508f76b's single one
	NoPDL        bool // launch the GEMM and its reduction without programmatic dependent launch
}

// rewriteBlockRows and rewriteBlockTokens are the rewrite's tile
// (GEMM_ROWS, GEMM_MT): a block computes 256 rows of W for 64 tokens.
const (
	rewriteBlockRows   = 256
	rewriteBlockTokens = 64
)

// rewriteStages is 508f76b's gemmStages: the deepest weight ring (2 to 4
// K blocks) whose shared memory fits maxShared bytes, with that size.
func rewriteStages(maxShared int) (stages, bytes int) {
	size := func(s int) int { return 8*s*4096 + 2*rewriteBlockTokens*272 + 2*rewriteBlockTokens*4 }
	for s := 4; s >= 2; s-- {
		if size(s) <= maxShared {
			return s, size(s)
		}
	}
	return 0, size(2)
}

// rewritePlan is 508f76b's planOwnGEMM: token chunks x 256-row blocks x
// splits of K, split where waves of blocks x K blocks a split (plus one
// for the reduction) is shorter than unsplit.
func rewritePlan(m, n, k, sms, partBytes int) (chunks, rowBlocks, splits, kbPerSplit int) {
	kbn := k / 128
	chunks, rowBlocks, splits, kbPerSplit = (m+rewriteBlockTokens-1)/rewriteBlockTokens, (n+rewriteBlockRows-1)/rewriteBlockRows, 1, kbn
	blocks := chunks * rowBlocks
	waves := func(b int) int { return (b + sms - 1) / sms }
	best := waves(blocks) * kbn
	maxSplits := min(kbn, max(1, k/(4*m)), max(1, partBytes/(4*m*n)))
	for s := 2; s <= maxSplits; s++ {
		kbp := (kbn + s - 1) / s
		sp := (kbn + kbp - 1) / kbp
		if cost := waves(blocks*sp)*kbp + 1; cost < best {
			best, splits, kbPerSplit = cost, sp, kbp
		}
	}
	return chunks, rowBlocks, splits, kbPerSplit
}

// LoadRewriteGEMM compiles the rewrite (src: its source) for the device.
func (b *Backend) LoadRewriteGEMM(src string) (*RewriteGEMM, error) {
	if err := b.InitGEMM(); err != nil {
		return nil, err
	}
	p := b.ctx.Props()
	if p.Major*10+p.Minor < 89 {
		return nil, fmt.Errorf("the rewrite needs compute capability 8.9 (e4m3 to f16 conversion), the device is %d.%d", p.Major, p.Minor)
	}
	stages, smem := rewriteStages(p.MaxSharedBytesOptin)
	if stages == 0 {
		return nil, fmt.Errorf("the rewrite needs %d bytes of shared memory a block, the device allows %d", smem, p.MaxSharedBytesOptin)
	}
	opts := b.options(fp8GEMMProgram)
	opts.Defines = map[string]string{"GEMM_STAGES": strconv.Itoa(stages)}
	mod, err := b.ctx.CompileModule(src, "gemm_fp8_f16_rewrite_508f76b.cu", opts)
	if err != nil {
		return nil, err
	}
	r := &RewriteGEMM{b: b, mod: mod, smem: smem}
	if r.fn, err = mod.Function("gemm_fp8"); err == nil {
		if r.reduce, err = mod.Function("gemm_fp8_reduce"); err == nil {
			err = r.fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, smem)
		}
	}
	if err != nil {
		return nil, errors.Join(err, mod.Unload())
	}
	return r, nil
}

// Close unloads the rewrite's module.
func (r *RewriteGEMM) Close() error { return r.mod.Unload() }

// GEMM runs a on the rewrite, on the backend's stream (as Backend.GEMM's
// own-kernel path: same spans, N and K multiples of 128).
func (r *RewriteGEMM) GEMM(ctx context.Context, a *mla.GEMMArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return err
	}
	m, n, k := a.X.Rows, a.W.N, a.W.K
	if n%128 != 0 || m == 0 {
		return fmt.Errorf("rewrite GEMM: m = %d, n = %d", m, n)
	}
	var w, ws, x, xs, y driver.DevicePtr
	var err error
	for _, s := range []struct {
		dst       *driver.DevicePtr
		buf       mla.Buffer
		off, size int
	}{
		{&w, a.W.Data, 0, n * k}, {&ws, a.W.Scale, 0, 4 * (n / 128) * (k / 128)}, {&x, a.X.Data, 0, m * k},
		{&xs, a.X.Scale, 0, 4 * ((k/128-1)*a.X.ScaleStride + m)}, {&y, a.Y, a.YOffset, 2 * ((m-1)*a.YStride + n)},
	} {
		if *s.dst, err = span(s.buf, s.off, s.size); err != nil {
			return err
		}
	}
	b := r.b
	chunks, rowBlocks, splits, kbp := rewritePlan(m, n, k, b.ctx.Props().SMCount, gemmPartBytes)
	var part driver.DevicePtr
	if splits > 1 {
		part = b.gemm.parts[b.streamSlot()]
		if r.OneWorkspace {
			part = b.gemm.parts[0]
		}
	}
	block := driver.Dim3{256, 1, 1}
	launch := b.launchShared
	if r.NoPDL {
		launch = func(fn *driver.Function, grid, block driver.Dim3, shared int, args ...any) error {
			return b.ctx.Launch(fn, grid, block, uint32(shared), b.stream, args...)
		}
	}
	return b.ctx.Do(func() error {
		if err := launch(r.fn, driver.Dim3{uint32(chunks), uint32(rowBlocks), uint32(splits)}, block, r.smem,
			w, ws, x, xs, y, part, int32(m), int32(n), int32(k), int32(a.X.ScaleStride), int32(a.YStride), int32(kbp)); err != nil {
			return err
		}
		if splits == 1 {
			return nil
		}
		threads := m * n / 4
		return launch(r.reduce, driver.Dim3{uint32((threads + 255) / 256), 1, 1}, block, 0,
			part, y, int32(m), int32(n), int32(a.YStride), int32(splits))
	})
}

// CoherentLoads is the rewrite's source with its __ldg reads (of X, its
// scales, the weight scales and the split-K partials) through L2
// (ld.global.cg) instead of the read-only path: TestCUDAGEMMChainReplay's
// "-coherent-loads" variant.
func CoherentLoads(src string) string {
	return coherentLoadDefs + strings.ReplaceAll(src, "__ldg(", "ld_coherent(")
}

const coherentLoadDefs = `
__device__ __forceinline__ uint4 ld_coherent(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float4 ld_coherent(const float4* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float ld_coherent(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
`

// WGMMAGEMM is GEMM on the wgmma kernel whatever the options and the
// architecture's rules choose (loaded on first use; ErrWGMMAUnavailable
// where it cannot run), so a test runs it beside the other implementations
// on one backend's buffers.
func (b *Backend) WGMMAGEMM(ctx context.Context, a *mla.GEMMArgs) error {
	if err := b.InitGEMM(); err != nil {
		return err
	}
	if err := b.loadWGMMA(); err != nil {
		return err
	}
	return b.gemmOn(ctx, a, true)
}

// LoadWGMMA loads the wgmma kernel (InitGEMM first), or says why it
// cannot run here (ErrWGMMAUnavailable).
func (b *Backend) LoadWGMMA() error {
	if err := b.InitGEMM(); err != nil {
		return err
	}
	return b.loadWGMMA()
}

// SkipCompileUnderRace is skipCompileUnderRace for the external tests.
var SkipCompileUnderRace = skipCompileUnderRace
