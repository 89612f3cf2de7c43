package cuda

import _ "embed"

//go:embed topk.cu
var topkSource string

// TopK kernels the host loads from TopKSource.
const (
	TopKScoreKernel     = "topk_score"
	TopKScoreMMAKernel  = "topk_score_mma"
	TopKScoreMMA4Kernel = "topk_score_mma4"
	TopKSelectKernel    = "topk_select"
)

// TopKSource returns the compilable source of the indexer's top-k module
// (DESIGN.md section 9, "Selection"): topk.cu, which includes common.cuh
// (compile it with Headers).
func TopKSource() string { return topkSource }
