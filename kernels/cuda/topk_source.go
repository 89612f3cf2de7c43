package cuda

import _ "embed"

//go:embed topk.cu
var topkSource string

// TopK kernels the host loads from TopKSource.
const (
	TopKScoreKernel     = "topk_score"
	TopKScoreMMAKernel  = "topk_score_mma"
	TopKScoreMMA4Kernel = "topk_score_mma4"
	// TopKScoreMMA4PKernel and TopKScoreMMA4QKernel need
	// abi.TopKScore4PShared bytes of dynamic shared memory.
	TopKScoreMMA4PKernel = "topk_score_mma4p"
	TopKScoreMMA4QKernel = "topk_score_mma4q"
	TopKSelectKernel     = "topk_select"
	// TopKSelect2Kernel takes the row's keys in dynamic shared memory
	// where they fit.
	TopKSelect2Kernel = "topk_select2"
	// TopKSelect3Kernel is topk_select2 with a sampled candidate sweep for
	// the rows whose keys do not fit.
	TopKSelect3Kernel = "topk_select3"
	// TopKSelect4Kernel and TopKSelect5Kernel are topk_select3 with a
	// row's fixed cost cut (two barriers a radix pass, and one);
	// TopKSelect6Kernel is TopKSelect5Kernel in blocks of
	// abi.TopKSelectSmallThreads.
	TopKSelect4Kernel = "topk_select4"
	TopKSelect5Kernel = "topk_select5"
	TopKSelect6Kernel = "topk_select6"
)

// TopKSource returns the compilable source of the indexer's top-k module
// (DESIGN.md section 9, "Selection"): topk.cu, which includes common.cuh
// (compile it with Headers).
func TopKSource() string { return topkSource }
