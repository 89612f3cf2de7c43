// Command gen writes kernels/cuda/abi.h from the Go table in
// kernels/cuda/abi. Run it through go generate ./kernels/cuda.
package main
