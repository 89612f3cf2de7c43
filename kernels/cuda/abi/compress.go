package abi

// Fields of CompressParams, compress_entries' launch parameters
// (kernels/cuda/compress.cu).
const (
	CompressNewK FieldID = iota
	CompressNewG
	CompressStateK
	CompressStateG
	CompressCands
	CompressJobs
	CompressNorm
	CompressRope
	CompressPool
	CompressPageBytes
	CompressNewRows
	CompressStateRows
	CompressNumCands
	CompressNumJobs
	CompressRatio
	CompressWidth
	CompressRopePositions
	CompressPageSize
	CompressNumPages
	CompressEps
	numCompressFields
)

// CompressParams is the struct compress_entries takes by value.
var CompressParams = &Struct{
	Name:   "CompressParams",
	Doc:    "Launch parameters of compress_entries (attention/mla/cuda: CompressLayer and its job list), passed by value.",
	Fields: compressFields[:],
}

var compressFields = [numCompressFields]Field{
	CompressNewK:          {"new_k", Ptr, "const float*", "the launch's projection rows, width values each"},
	CompressNewG:          {"new_g", Ptr, "const float*", ""},
	CompressStateK:        {"state_k", Ptr, "const float*", "rows kept from earlier iterations"},
	CompressStateG:        {"state_g", Ptr, "const float*", ""},
	CompressCands:         {"cands", Ptr, "const int*", "candidate codes: >= 0 a new row, < 0 state row ~code"},
	CompressJobs:          {"jobs", Ptr, "const int4*", "{index, cand, page, off} per entry"},
	CompressNorm:          {"norm", Ptr, "const float*", "the compressor's RMSNorm weight [HEAD_DIM]"},
	CompressRope:          {"rope", Ptr, "const float*", "[rope_positions][ROPE_DIM]{cos, sin}"},
	CompressPool:          {"pool", Ptr, "u8*", "fp8_ue8m0 pool pages"},
	CompressPageBytes:     {"page_bytes", U64, "", ""},
	CompressNewRows:       {"new_rows", I32, "", ""},
	CompressStateRows:     {"state_rows", I32, "", ""},
	CompressNumCands:      {"num_cands", I32, "", ""},
	CompressNumJobs:       {"njobs", I32, "", ""},
	CompressRatio:         {"ratio", I32, "", "4 or 128"},
	CompressWidth:         {"width", I32, "", "values a projection row: coff*HEAD_DIM"},
	CompressRopePositions: {"rope_positions", I32, "", ""},
	CompressPageSize:      {"page_size", I32, "", ""},
	CompressNumPages:      {"num_pages", I32, "", ""},
	CompressEps:           {"eps", F32, "", "rms_norm_eps"},
}

// Fields of IndexerQueryParams, indexer_query's parameters beside the Q
// prologue's Params (kernels/cuda/indexer.cu).
const (
	IQWOut FieldID = iota
	IQWStride
	IQHScale
	IQWScale
	IQFP8
	numIQFields
)

// IndexerQueryParams is the struct indexer_query takes by value after its
// Params.
var IndexerQueryParams = &Struct{
	Name:   "IndexerQueryParams",
	Doc:    "indexer_query's own launch parameters (mla.IndexerQueryArgs), passed by value after the Q prologue's Params.",
	Fields: iqFields[:],
}

var iqFields = [numIQFields]Field{
	IQWOut:    {"w_out", Ptr, "void*", "[rows][INDEXER_HEADS] head weights: bf16 (fp8 = 0) or float32 (fp8 = 1)"},
	IQWStride: {"w_stride", I32, "", "values between tokens of the weights_proj output (Params.weight)"},
	IQHScale:  {"hscale", F32, "", "fl32(128^-0.5) (numerics.HadamardScale)"},
	IQWScale:  {"wscale", F32, "", "the head weights' scale (mla.IndexerWeightScale)"},
	IQFP8:     {"fp8", I32, "", "mla.IndexerQueryFormat: 0 MXFP4, 1 FP8"},
}

// Fields of CompressStepParams, compress_step's launch parameters.
const (
	CStepKG FieldID = iota
	CStepAPE
	CStepRing
	CStepPlan
	CStepScratch
	CStepKGRows
	CStepKGStride
	CStepRingRows
	CStepSlots
	CStepMaxSeqs
	CStepMaxJobs
	CStepRatio
	CStepWidth
	CStepDim
	CStepRopePositions
	CStepPageSize
	CStepNumPages
	CStepJobBlocks
	numCStepFields
)

// CompressStepParams is the struct compress_step takes by value.
var CompressStepParams = &Struct{
	Name:   "CompressStepParams",
	Doc:    "Launch parameters of compress_step (mla.CompressStepArgs), passed by value.",
	Fields: cstepFields[:],
}

var cstepFields = [numCStepFields]Field{
	CStepKG:            {"kg", Ptr, "const float*", "kg_rows rows of K then G (2*width values), kg_stride apart"},
	CStepAPE:           {"ape", Ptr, "const float*", "[ratio][width] added to G, or null"},
	CStepRing:          {"ring", Ptr, "float*", "[slots][ring_rows][2][width] kept rows"},
	CStepPlan:          {"plan", Ptr, "const int*", "the plan (CPLAN_* words), offset applied"},
	CStepScratch:       {"scratch", Ptr, "float*", "[max_jobs][dim] pooled values"},
	CStepKGRows:        {"kg_rows", I32, "", ""},
	CStepKGStride:      {"kg_stride", I32, "", "floats from one kg row to the next, >= 2*width (mla.CompressStepArgs.KGRowStride)"},
	CStepRingRows:      {"ring_rows", I32, "", ""},
	CStepSlots:         {"slots", I32, "", ""},
	CStepMaxSeqs:       {"max_seqs", I32, "", "plan capacity: sequences"},
	CStepMaxJobs:       {"max_jobs", I32, "", "plan capacity: entries"},
	CStepRatio:         {"ratio", I32, "", "4 or 128"},
	CStepWidth:         {"width", I32, "", "coff*dim"},
	CStepDim:           {"dim", I32, "", "channels of an entry: HEAD_DIM, or INDEXER_DIM"},
	CStepRopePositions: {"rope_positions", I32, "", ""},
	CStepPageSize:      {"page_size", I32, "", ""},
	CStepNumPages:      {"num_pages", I32, "", ""},
	CStepJobBlocks:     {"job_blocks", I32, "", "blocks [0, job_blocks) pool entries, the rest store rows"},
}

// Fields of CompressFinishParams, the launch parameters of
// compress_step_finish and indexer_step_finish.
const (
	CFinScratch FieldID = iota
	CFinPlan
	CFinNorm
	CFinRope
	CFinPool
	CFinPageBytes
	CFinMaxSeqs
	CFinMaxJobs
	CFinKGRows
	CFinSlots
	CFinRatio
	CFinRopePositions
	CFinPageSize
	CFinNumPages
	CFinEps
	CFinHScale
	numCFinFields
)

// CompressFinishParams is the struct compress_step_finish
// (kernels/cuda/compress.cu) and indexer_step_finish (indexer.cu) take by
// value, and indexer_step after its CompressStepParams (scratch unused):
// one launch's fields serve any of them.
var CompressFinishParams = &Struct{
	Name:   "CompressFinishParams",
	Doc:    "Launch parameters of compress_step_finish, indexer_step_finish and indexer_step (after CompressStepParams) (mla.CompressStepArgs), passed by value.",
	Fields: cfinFields[:],
}

var cfinFields = [numCFinFields]Field{
	CFinScratch:       {"scratch", Ptr, "const float*", "[max_jobs][dim] pooled values (compress_step's)"},
	CFinPlan:          {"plan", Ptr, "const int*", "the plan (CPLAN_* words), offset applied"},
	CFinNorm:          {"norm", Ptr, "const float*", "the compressor's RMSNorm weight [dim]"},
	CFinRope:          {"rope", Ptr, "const float*", "[rope_positions][ROPE_DIM]{cos, sin}"},
	CFinPool:          {"pool", Ptr, "u8*", "the entries' pool pages"},
	CFinPageBytes:     {"page_bytes", U64, "", "bytes of a pool page (indexer_step_finish: page_size*MXFP4_ROW_BYTES)"},
	CFinMaxSeqs:       {"max_seqs", I32, "", ""},
	CFinMaxJobs:       {"max_jobs", I32, "", ""},
	CFinKGRows:        {"kg_rows", I32, "", "compress_step's, for the same job checks"},
	CFinSlots:         {"slots", I32, "", ""},
	CFinRatio:         {"ratio", I32, "", ""},
	CFinRopePositions: {"rope_positions", I32, "", ""},
	CFinPageSize:      {"page_size", I32, "", ""},
	CFinNumPages:      {"num_pages", I32, "", ""},
	CFinEps:           {"eps", F32, "", "rms_norm_eps"},
	CFinHScale:        {"hscale", F32, "", "indexer_step_finish: fl32(128^-0.5) (numerics.HadamardScale)"},
}
