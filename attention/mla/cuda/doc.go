// Package cuda is the CUDA backend of the MLA prologue: the kernels in
// prologue.cu and the chain's act_quant and norm_quant in chain.cu
// (embedded, compiled by NVRTC for the device at first use and cached on
// disk) and the Go side that launches them. It implements
// mla.Backend and passes the same conformance suite as the CPU backend,
// byte for byte.
//
// All driver work goes through one driver.Context, whose goroutine is locked
// to its OS thread; launches are issued on one stream in order, so the KV and
// Q kernels of a layer, and the layers of an iteration, run in issue order.
package cuda
