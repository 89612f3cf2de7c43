package cuda

import _ "embed"

//go:embed exp32.cuh
var exp32Source string

//go:embed compress.cu
var compressSource string

//go:embed indexer.cu
var indexerSource string

// CompressSource returns the compilable source of the compressor's module
// (DESIGN.md section 8) and the indexer's (section 9): compress.cu, which
// includes prologue.cu's helpers (with PROLOGUE_HELPERS_ONLY: none of its
// kernels, whose behaviour stays theirs alone) and exp32.cuh, then
// indexer.cu under a #line directive so that NVRTC's messages name the
// file and its own line numbers. Compile it with Headers.
func CompressSource() string {
	return compressSource + "\n#line 1 \"indexer.cu\"\n" + indexerSource
}
