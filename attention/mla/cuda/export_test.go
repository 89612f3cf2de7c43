package cuda

import (
	"strconv"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// PathFor is the backend's choice of kernels for a launch (knobs with their
// defaults applied).
func PathFor(k cudatune.Knobs, l mla.Launch, heads int) abi.Path {
	return pathFor(k.Defaults(), l, heads)
}

// CompileWithTestKernels compiles abi.h and prologue.cu followed by a
// test-only source (its kernels may use the production helpers) with the
// backend's options, and loads the module.
func (b *Backend) CompileWithTestKernels(file, src string) (*driver.Module, error) {
	full := kernels.PrologueSource() + "\n#line 1 " + strconv.Quote(file) + "\n" + src
	return b.ctx.CompileModule(full, file, b.compileOptions())
}
