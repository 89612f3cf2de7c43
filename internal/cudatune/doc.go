// Package cudatune holds the CUDA backend's launch-shape knobs (the
// streaming pipeline's warps and depths, the grid cap, the direct path's
// thresholds, one per Q format, and block shape, separate KV and Q launches,
// the compiler's resource report) and Arch, the one description of a GPU
// architecture the backend's launch choices read: its resources, the GEMM
// kernels' tiles, the GEMM choices measured per shape and the knobs'
// defaults, each with the measurement that chose it. The defaults (the zero
// Knobs) are the shapes measured best on the H200 (SM90.Knobs); the
// module's tests vary them to run the kernels through unusual shapes, and
// cmd/bench to measure alternatives. Being internal, they stay out of the
// backend's public Options.
package cudatune
