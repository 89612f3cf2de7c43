// Package cudatune holds the CUDA backend's launch-shape knobs: the
// streaming pipeline's warps and depths, the grid cap, the direct path's
// thresholds (one per Q format) and block shape, separate KV and Q launches
// and the compiler's resource report. The defaults (the zero Knobs) are the shapes measured
// best on the H200; the module's tests vary them to run the kernels through
// unusual shapes, and cmd/bench to measure alternatives. Being internal,
// they stay out of the backend's public Options.
package cudatune
