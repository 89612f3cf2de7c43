package cuda

import (
	"strconv"

	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// CompileWithTestKernels compiles abi.h and prologue.cu followed by a
// test-only source (its kernels may use the production helpers) with the
// backend's options, and loads the module.
func (b *Backend) CompileWithTestKernels(file, src string) (*driver.Module, error) {
	full := kernels.PrologueSource() + "\n#line 1 " + strconv.Quote(file) + "\n" + src
	return b.ctx.CompileModule(full, file, b.compileOptions())
}
