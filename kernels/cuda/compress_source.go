package cuda

import _ "embed"

//go:embed exp32.cuh
var exp32Source string

//go:embed compress.cu
var compressSource string

//go:embed indexer.cu
var indexerSource string

// CompressSource returns the compilable source of the compressor's module
// (DESIGN.md section 8) and the indexer's (section 9): abi.h, prologue.cu's
// helpers (with PROLOGUE_HELPERS_ONLY: none of its kernels, whose behaviour
// stays theirs alone), exp32.cuh, compress.cu and indexer.cu, each under a
// #line directive so that
// NVRTC's messages name the file and its own line numbers.
func CompressSource() string {
	return "#define PROLOGUE_HELPERS_ONLY\n" + PrologueSource() +
		"\n#line 1 \"exp32.cuh\"\n" + exp32Source +
		"\n#line 1 \"compress.cu\"\n" + compressSource +
		"\n#line 1 \"indexer.cu\"\n" + indexerSource
}
