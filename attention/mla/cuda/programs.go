package cuda

import (
	"strconv"

	"github.com/dsv4mla/prologue/internal/cudatune"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// program is one NVRTC compilation unit of the backend: its file name, its
// source and the options it is compiled with. The loaders and
// TestProgramsCompile (which compiles each to PTX wherever NVRTC loads, a
// GPU or not) read the same table, so a kernel that stops compiling is
// caught on the build machine, not first on the device.
type program struct {
	file string
	src  func() string
	opts func(arch string, k cudatune.Knobs) driver.CompileOptions
}

var (
	prologueProgram = program{"prologue.cu", kernels.PrologueSource, func(arch string, k cudatune.Knobs) driver.CompileOptions {
		// The pipeline shape is compiled in.
		return driver.CompileOptions{Arch: arch, Defines: map[string]string{
			"PIPE_WARPS":        strconv.Itoa(k.Warps),
			"KV_DEPTH":          strconv.Itoa(k.KVDepth),
			"Q_DEPTH":           strconv.Itoa(k.QDepth),
			"Q_CHUNK":           strconv.Itoa(k.QChunk),
			"DIRECT_WARPS":      strconv.Itoa(k.DirectWarps),
			"DIRECT_QROWS":      strconv.Itoa(k.DirectQRows),
			"DIRECT_MIN_BLOCKS": strconv.Itoa(k.DirectMinBlocks),
		}}
	}}
	chainProgram    = program{"chain.cu", kernels.ChainSource, archOnly(false)}
	compressProgram = program{"compress.cu", kernels.CompressSource, archOnly(true)}
	topkProgram     = program{"topk.cu", kernels.TopKSource, archOnly(true)}
	fp8GEMMProgram  = program{"gemm_fp8.cu", kernels.GEMMSource, archOnly(false)}
	bf16GEMMProgram = program{"gemm_bf16.cu", kernels.BF16GEMMSource, archOnly(true)}
	bf16MMAProgram  = program{"gemm_bf16_mma.cu", kernels.BF16MMAGEMMSource, archOnly(true)}
	// The wgmma GEMM is built for sm_90a whatever sm_90 device loads it:
	// warpgroup MMA and setmaxnreg exist only in the arch-specific target.
	wgmmaGEMMProgram = program{"gemm_fp8_wgmma.cu", kernels.WGMMAGEMMSource, func(string, cudatune.Knobs) driver.CompileOptions {
		return driver.CompileOptions{Arch: wgmmaArch}
	}}

	bf16WGMMAProgram = program{"gemm_bf16_wgmma.cu", kernels.BF16WGMMAGEMMSource, func(string, cudatune.Knobs) driver.CompileOptions {
		return driver.CompileOptions{Arch: wgmmaArch}
	}}

	programs = []program{prologueProgram, chainProgram, compressProgram, topkProgram, fp8GEMMProgram, bf16GEMMProgram, bf16MMAProgram, wgmmaGEMMProgram, bf16WGMMAProgram}
)

// archOnly is the options of a program that compiles nothing in but the
// architecture; noFMAD where its arithmetic must round each step
// (section 4's bit-exact chains spelled without explicit _rn intrinsics).
func archOnly(noFMAD bool) func(string, cudatune.Knobs) driver.CompileOptions {
	return func(arch string, _ cudatune.Knobs) driver.CompileOptions {
		return driver.CompileOptions{Arch: arch, NoFMAD: noFMAD}
	}
}

// options is p's NVRTC options for an architecture and knobs, with the
// in-memory headers every program includes (kernels/cuda.Headers).
func (p program) options(arch string, k cudatune.Knobs) driver.CompileOptions {
	o := p.opts(arch, k)
	o.Headers = kernels.Headers()
	return o
}

// load compiles (or fetches from the cache) and loads p for this backend's
// device.
func (b *Backend) load(p program) (*driver.Module, error) {
	return b.loadModule(p.src(), p.file, b.options(p))
}

// options is p's NVRTC options for this backend's device and knobs.
func (b *Backend) options(p program) driver.CompileOptions {
	return p.options(b.ctx.Props().Arch(), b.knobs)
}

// compileModule is load through the context's CompileModule, which also
// recompiles once when a cached image fails to load (the GEMMs' modules
// have always loaded that way).
func (b *Backend) compileModule(p program) (*driver.Module, error) {
	return b.ctx.CompileModule(p.src(), p.file, b.options(p))
}
