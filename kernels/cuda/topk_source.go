package cuda

import _ "embed"

//go:embed topk.cu
var topkSource string

// TopK kernels the host loads from TopKSource.
const (
	TopKScoreKernel     = "topk_score"
	TopKScoreMMAKernel  = "topk_score_mma"
	TopKScoreMMA4Kernel = "topk_score_mma4"
	// TopKScoreMMA4PKernel, TopKScoreMMA4QKernel, TopKScoreMMA4TKernel,
	// TopKScoreMMA4UKernel, TopKScoreMMA4VKernel and TopKScoreMMA4WKernel need
	// abi.TopKScore4PShared bytes of dynamic shared memory;
	// TopKScoreMMA4XKernel (blocks of abi.TopKScore4XThreads)
	// abi.TopKScore4XShared.
	TopKScoreMMA4PKernel = "topk_score_mma4p"
	TopKScoreMMA4QKernel = "topk_score_mma4q"
	TopKScoreMMA4TKernel = "topk_score_mma4t"
	TopKScoreMMA4UKernel = "topk_score_mma4u"
	TopKScoreMMA4VKernel = "topk_score_mma4v"
	TopKScoreMMA4WKernel = "topk_score_mma4w"
	TopKScoreMMA4XKernel = "topk_score_mma4x"
	TopKSelectKernel     = "topk_select"
	// TopKSelect2Kernel takes the row's keys in dynamic shared memory
	// where they fit.
	TopKSelect2Kernel = "topk_select2"
	// TopKSelect3Kernel is topk_select2 with a sampled candidate sweep for
	// the rows whose keys do not fit.
	TopKSelect3Kernel = "topk_select3"
	// TopKSelect4Kernel is topk_select3 with a row's fixed cost cut.
	TopKSelect4Kernel = "topk_select4"
	// TopKSelect4NKernel is topk_select4 in blocks of
	// abi.TopKSelect4NThreads.
	TopKSelect4NKernel = "topk_select4n"
	// TopKSelect5Kernel is topk_select4 with three radix passes (11, 11
	// and 10 bits) where a row's keys fit shared memory.
	TopKSelect5Kernel = "topk_select5"
	// TopKSelect5NKernel is topk_select5 in blocks of
	// abi.TopKSelect4NThreads.
	TopKSelect5NKernel = "topk_select5n"
	// TopKSelect6Kernel is topk_select5 with a short row's keys in
	// registers.
	TopKSelect6Kernel = "topk_select6"
)

// TopKSource returns the compilable source of the indexer's top-k module
// (DESIGN.md section 9, "Selection"): topk.cu, which includes common.cuh
// (compile it with Headers).
func TopKSource() string { return topkSource }
