package cuda

import (
	"context"
	"strconv"

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

// CompileWithTestKernels compiles abi.h and prologue.cu followed by a
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
// (kernels/cuda.CompressSource: abi.h, prologue.cu's helpers, exp32.cuh and
// compress.cu) followed by a test-only source that may use its helpers,
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
// shape it cannot run is an error), "cublaslt" (cuBLASLt only; a shape it
// refuses is an error) or "auto" (the default). Not safe while GEMMs run.
func (b *Backend) SetBF16GEMMPath(path string) {
	switch path {
	case "own":
		b.bf16.path = bf16GEMMOwn
	case "mma":
		b.bf16.path = bf16GEMMMMA
	case "cublaslt":
		b.bf16.path = bf16GEMMCuBLASLt
	case "auto":
		b.bf16.path = bf16GEMMAuto
	default:
		panic("SetBF16GEMMPath: unknown path " + path)
	}
}

// KernelSharedBytes is a loaded prologue kernel's static shared memory.
func (b *Backend) KernelSharedBytes(name string) (int, error) {
	return b.fns[name].Attribute(driver.FuncSharedSizeBytes)
}

// SetTopKScore picks the top-k score kernel: "dp4a" (topk_score), "mma"
// (topk_score_mma), "mma4" (topk_score_mma4) or "default".
func (b *Backend) SetTopKScore(kernel string) {
	switch kernel {
	case "default":
		b.topk.kernel = topkScoreDefault
	case "dp4a":
		b.topk.kernel = topkScoreDP4A
	case "mma":
		b.topk.kernel = topkScoreMMA
	case "mma4":
		b.topk.kernel = topkScoreMMA4
	default:
		panic("cuda: SetTopKScore(" + kernel + ")")
	}
}

// TopKStage runs the selection's score kernel or its select kernel alone.
func (b *Backend) TopKStage(ctx context.Context, a *mla.TopKArgs, score bool) error {
	return b.indexerTopK(ctx, a, score, !score)
}
