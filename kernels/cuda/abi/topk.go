package abi

import "github.com/dsv4mla/prologue/attention/mla"

// Fields of TopKParams, the indexer top-k kernels' launch parameters
// (kernels/cuda/topk.cu).
const (
	TopKQ FieldID = iota
	TopKW
	TopKCache
	TopKPlan
	TopKScratch
	TopKOut
	TopKRows
	TopKTopK
	TopKMaxSeqs
	TopKPageStride
	TopKPageSize
	TopKNumPages
	TopKScratchEntries
	numTopKFields
)

// TopKParams is the struct topk_score and topk_select take by value.
var TopKParams = &Struct{
	Name:   "TopKParams",
	Doc:    "Launch parameters of the indexer top-k kernels (mla.TopKArgs), passed by value.",
	Fields: topkFields[:],
}

var topkFields = [numTopKFields]Field{
	TopKQ:              {"q", Ptr, "const u8*", "[rows][INDEXER_HEADS][MXFP4_ROW_BYTES] MXFP4 query rows"},
	TopKW:              {"w", Ptr, "const u16*", "[rows][INDEXER_HEADS] bf16 head weights"},
	TopKCache:          {"cache", Ptr, "const u8*", "num_pages pages of page_size MXFP4 entries"},
	TopKPlan:           {"plan", Ptr, "const int*", "the encoded plan (TOPK_PLAN_* words), offset applied"},
	TopKScratch:        {"scratch", Ptr, "u32*", "scratch_entries keys of the rows' scores"},
	TopKOut:            {"out", Ptr, "int*", "[rows][top_k] selected entry indices"},
	TopKRows:           {"rows", I32, "", "query rows of q, w and out"},
	TopKTopK:           {"top_k", I32, "", "index_topk"},
	TopKMaxSeqs:        {"max_seqs", I32, "", "plan capacity: sequences"},
	TopKPageStride:     {"page_stride", I32, "", "plan capacity: block-table entries a sequence"},
	TopKPageSize:       {"page_size", I32, "", "entries a cache page"},
	TopKNumPages:       {"num_pages", I32, "", ""},
	TopKScratchEntries: {"scratch_entries", I32, "", ""},
}

// Launch shapes of the top-k kernels: a topk_score block scores
// TopKScoreThreads entries of one row at a time (a thread each), a
// topk_score_mma4x block TopKScore4XThreads entries (32 a warp) of
// TopKScore4Rows consecutive rows at a time, a topk_select block selects
// one row.
const (
	TopKScoreThreads  = 256
	TopKScore4Rows    = 4
	TopKSelectThreads = 1024
	// TopKSelect4NThreads is topk_select4n's block: several short rows a
	// multiprocessor.
	TopKSelect4NThreads = 256
	// TopKScore4XThreads is topk_score_mma4x's block: TopKScore4Rows rows
	// and TopKScore4XThreads entries a tile, 32 a warp, two blocks a
	// multiprocessor.
	TopKScore4XThreads = 256
	// TopKScore4XShared is topk_score_mma4x's dynamic shared memory (two
	// blocks a multiprocessor): the query's B fragments and C words
	// (32768 + 4224 bytes), the head weights with the exact path's products
	// (4 rows of 34 x 16 bytes), two buffers of 32 entries a warp, the
	// query's base bytes.
	TopKScore4XShared = 32768 + 4224 + TopKScore4Rows*34*16 + TopKScore4XThreads/32*2*32*mla.IndexerEntryBytes + TopKScore4Rows*mla.IndexerHeads
)

// topkConstants are the top-k kernels' constants, each from the Go package
// that defines it.
func topkConstants() []ConstGroup {
	return []ConstGroup{
		{"Indexer top-k (mla.TopK*; the row sizes are the indexer's above).", []Const{
			{"MAX_TOPK_POSITIONS", mla.MaxTopKPositions, "max_position_embeddings"},
			{"TOPK_PLAN_HDR_SEQS", mla.TopKPlanHdrSeqs, "header: the sequences"},
			{"TOPK_PLAN_HDR_WORDS", mla.TopKPlanHdrWords, ""},
			{"TOPK_SEQ_ROW", mla.TopKPlanSeqRow, "first query row"},
			{"TOPK_SEQ_ROWS", mla.TopKPlanSeqRows, ""},
			{"TOPK_SEQ_START", mla.TopKPlanSeqStart, "position of the first row"},
			{"TOPK_SEQ_SCRATCH", mla.TopKPlanSeqScratch, "scratch entry of the first row's keys"},
			{"TOPK_SEQ_STRIDE", mla.TopKPlanSeqStride, "scratch entries between rows"},
			{"TOPK_SEQ_WORDS", mla.TopKPlanSeqWords, ""},
			{"TOPK_SCORE_THREADS", TopKScoreThreads, "threads of a topk_score block, one entry each"},
			{"TOPK_SCORE4_ROWS", TopKScore4Rows, "rows of a topk_score_mma4x block: the mma's four column pairs"},
			{"TOPK_SELECT_THREADS", TopKSelectThreads, "threads of a topk_select block, one row"},
			{"TOPK_SELECT4N_THREADS", TopKSelect4NThreads, "threads of a topk_select4n block, one row"},
			{"TOPK_SCORE4X_THREADS", TopKScore4XThreads, "threads of a topk_score_mma4x block, 32 entries a warp"},
			{"TOPK_SCORE4X_SHARED", TopKScore4XShared, "dynamic shared memory of a topk_score_mma4x block, bytes"},
		}},
	}
}
