// Package cuda holds the CUDA C++ sources of the project's kernels, embedded
// so that a backend can compile them with NVRTC at run time, and (in its
// subpackages) the host/device contract (abi: the Go table from which
// go generate writes abi.h, which common.cuh includes; Headers hands both
// to NVRTC as in-memory includes of every program) and the
// purego bindings of the CUDA libraries (driver: the CUDA driver API and
// NVRTC). The Go code that launches the kernels lives beside the other
// backends, in attention/mla/cuda.
package cuda
