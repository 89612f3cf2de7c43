package cuda

import (
	_ "embed"
	"strconv"
)

//go:generate go run ./abi/gen -o abi.h

//go:embed abi.h
var abiHeader string

//go:embed prologue.cu
var prologueSource string

// ABIHeader returns abi.h, the host/device contract generated from the Go
// table in kernels/cuda/abi (go generate ./kernels/cuda).
func ABIHeader() string { return abiHeader }

// WithABI returns a kernel source preceded by abi.h, ready for NVRTC (which
// has no include path to this folder). A #line directive makes NVRTC's
// messages name the source file and its own line numbers.
func WithABI(file, src string) string {
	return abiHeader + "#line 1 " + strconv.Quote(file) + "\n" + src
}

// PrologueFile returns prologue.cu as written, without the header.
func PrologueFile() string { return prologueSource }

// PrologueSource returns the compilable source of the prologue kernels (KV
// and Q norm/RoPE/quantize/store and the fused layer grids): abi.h, then
// prologue.cu.
func PrologueSource() string { return WithABI("prologue.cu", prologueSource) }
