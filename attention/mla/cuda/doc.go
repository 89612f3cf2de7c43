// Package cuda is the CUDA backend of the MLA prologue: the kernels in
// kernels/cuda/prologue.cu (embedded, compiled by NVRTC for the device at
// first use after the generated kernels/cuda/abi.h, and cached on disk) and
// the Go side that launches them. It implements mla.Backend and passes the
// same conformance suite as the CPU backend, byte for byte.
//
// The launch parameters are packed with the table of kernels/cuda/abi, the
// one source of the Params struct, the ids and layout constants and the
// kernel names both sides use.
//
// RunLayer issues each launch (one per phase) as one fused grid: its first
// blocks run the KV pipeline, the rest the Q pipeline, side by side (they
// touch disjoint memory). All driver work goes through one driver.Context,
// whose goroutine is locked to its OS thread; launches go out on one stream
// in issue order, so the launches of a layer and the layers of an iteration
// run in that order. With programmatic dependent launch (the default) a
// grid starts while the previous one drains, and waits for its memory
// (griddepcontrol.wait) before reading anything.
//
// Options hold what a user chooses (device, logger, PDL); the launch-shape
// knobs the tests and cmd/bench vary live in internal/cudatune (NewTuned).
package cuda
