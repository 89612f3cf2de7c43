package cuda

import (
	_ "embed"

	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

//go:generate go run ./abi/gen -o abi.h

//go:embed abi.h
var abiHeader string

//go:embed common.cuh
var commonHeader string

//go:embed sm90.cuh
var sm90Header string

//go:embed prologue.cu
var prologueSource string

// ABIHeader returns abi.h, the host/device contract generated from the Go
// table in kernels/cuda/abi (go generate ./kernels/cuda).
func ABIHeader() string { return abiHeader }

// CommonHeader returns common.cuh, the device helpers every program shares
// (it includes abi.h).
func CommonHeader() string { return commonHeader }

// Headers are the in-memory include files every program of this folder is
// compiled with (driver.CompileOptions.Headers; NVRTC has no include path
// here): abi.h, common.cuh, exp32.cuh, sm90.cuh (the Hopper TMA, mbarrier
// and wgmma helpers of the warpgroup-MMA GEMMs) and prologue.cu (whose
// helpers the compressor's program includes). Each call returns a new slice.
func Headers() []driver.Header {
	return []driver.Header{
		{Name: "abi.h", Source: abiHeader},
		{Name: "common.cuh", Source: commonHeader},
		{Name: "exp32.cuh", Source: exp32Source},
		{Name: "sm90.cuh", Source: sm90Header},
		{Name: "prologue.cu", Source: prologueSource},
	}
}

// PrologueFile returns prologue.cu as written.
func PrologueFile() string { return prologueSource }

// PrologueSource returns the compilable source of the prologue kernels (KV
// and Q norm/RoPE/quantize/store and the fused layer grids): prologue.cu,
// which includes common.cuh (compile it with Headers).
func PrologueSource() string { return prologueSource }
