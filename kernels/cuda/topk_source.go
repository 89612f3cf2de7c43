package cuda

import _ "embed"

//go:embed topk.cu
var topkSource string

// TopK kernels the host loads from TopKSource.
const (
	TopKScoreKernel = "topk_score"
	// TopKScoreMMA4XKernel (blocks of abi.TopKScore4XThreads) needs
	// abi.TopKScore4XShared bytes of dynamic shared memory.
	TopKScoreMMA4XKernel = "topk_score_mma4x"
	// TopKSelect4NKernel is the radix select (four passes of 8 bits) in
	// blocks of abi.TopKSelect4NThreads, the row's keys in dynamic shared
	// memory where they fit.
	TopKSelect4NKernel = "topk_select4n"
	// TopKSelect5EKernel: up to three radix passes (11, 11 and 10 bits)
	// where a row's keys fit shared memory, ending at the first pass whose
	// bin's keys are all taken, in blocks of abi.TopKSelectThreads.
	TopKSelect5EKernel = "topk_select5e"
)

// TopKSource returns the compilable source of the indexer's top-k module
// (DESIGN.md section 9, "Selection"): topk.cu, which includes common.cuh
// (compile it with Headers).
func TopKSource() string { return topkSource }
