// Package cudatune holds the CUDA backend's launch-shape knobs: the
// pipeline's warps and depths, the grid cap, separate KV and Q launches and
// the compiler's resource report. The defaults (the zero Knobs) are the
// shapes measured best on the H200; the module's tests vary them to run the
// kernels through unusual shapes, and cmd/bench to measure alternatives.
// Being internal, they stay out of the backend's public Options.
package cudatune

// Knobs are passed to cuda.NewTuned; zero fields take the defaults.
type Knobs struct {
	// Warps is the number of warps per block (0: 8); each warp streams a
	// contiguous range of rows.
	Warps int
	// KVDepth and QDepth are the rows each warp keeps in flight (0: 4).
	KVDepth, QDepth int
	// BlocksPerSM caps the grid at BlocksPerSM blocks per multiprocessor
	// (0: 4); smaller batches get one warp per row.
	BlocksPerSM int
	// MaxBlocks, when set, caps the grid instead (tests use it to make a
	// few warps stream long ranges).
	MaxBlocks int
	// SeparateLaunches makes RunLayer issue the KV and Q kernels as two
	// launches instead of one fused layer launch.
	SeparateLaunches bool
	// Verbose keeps ptxas's resource report (registers, spills) in
	// CompileLog, compiling without the cache.
	Verbose bool
}

// Defaults returns k with every zero shape field set to its default.
func (k Knobs) Defaults() Knobs {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&k.Warps, 8)
	def(&k.KVDepth, 4)
	def(&k.QDepth, 4)
	def(&k.BlocksPerSM, 4)
	return k
}
