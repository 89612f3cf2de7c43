package abi

import (
	"fmt"
	"math"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// Fields of Params, the prologue kernels' launch parameters.
const (
	ParamIn FieldID = iota
	ParamOut
	ParamWeight
	ParamRope
	ParamCuQ
	ParamCached
	ParamKVLen
	ParamBlockTables
	ParamSched
	ParamHdr
	ParamInStride
	ParamRowBegin
	ParamRows
	ParamValidRows
	ParamSeqBegin
	ParamNumSeqs
	ParamSeqLen
	ParamSeqLenLog2
	ParamHeads
	ParamRopePositions
	ParamPageStride
	ParamPageSizeLog2
	ParamPageBytes
	ParamNumPages
	ParamScale
	ParamQDeq
	ParamKVDeq
	ParamQScaling
	ParamOScale
	ParamEps
	ParamWriteSched
	ParamFromHdr
	numParamFields
)

// Params is the struct every KV, Q and fused layer kernel takes by value
// (a fused layer kernel takes two: the KV part's and the Q part's).
var Params = &Struct{
	Name:   "Params",
	Doc:    "Launch parameters of the KV, Q and fused layer kernels, passed by value.",
	Fields: paramFields[:],
}

// paramFields is an array indexed by the Param* ids, so that a field and
// its id cannot drift apart.
var paramFields = [numParamFields]Field{
	ParamIn:            {"in", Ptr, "const u8*", "KV: latent base (offset applied); Q: QIn"},
	ParamOut:           {"out", Ptr, "u8*", "KV: cache pool; Q: QOut"},
	ParamWeight:        {"weight", Ptr, "const float*", "KV: kv_a_layernorm weight; Q: null"},
	ParamRope:          {"rope", Ptr, "const float*", "[positions][32]{cos, sin}"},
	ParamCuQ:           {"cu_q", Ptr, "const int*", "metadata arrays (int32)"},
	ParamCached:        {"cached", Ptr, "const int*", ""},
	ParamKVLen:         {"kv_len", Ptr, "const int*", ""},
	ParamBlockTables:   {"block_tables", Ptr, "const int*", "[seqs][page_stride]"},
	ParamSched:         {"sched", Ptr, "u8*", "scheduler region, or null"},
	ParamHdr:           {"hdr", Ptr, "const int*", "metadata header (HDR_* indices), read when from_hdr"},
	ParamInStride:      {"in_stride", U64, "", "bytes between consecutive input rows"},
	ParamRowBegin:      {"row_begin", I32, "", "first token row of the launch"},
	ParamRows:          {"rows", I32, "", "rows covered, padding included"},
	ParamValidRows:     {"valid_rows", I32, "", "rows [0, valid_rows) of the launch are real"},
	ParamSeqBegin:      {"seq_begin", I32, "", "batch index of the launch's first sequence"},
	ParamNumSeqs:       {"num_seqs", I32, "", ""},
	ParamSeqLen:        {"seq_len", I32, "", "generation: uniform query length; 0 for context"},
	ParamSeqLenLog2:    {"seq_len_log2", I32, "", "log2(seq_len) when a power of two, else -1"},
	ParamHeads:         {"heads", I32, "", ""},
	ParamRopePositions: {"rope_positions", I32, "", "rows of the RoPE table"},
	ParamPageStride:    {"page_stride", I32, "", "block-table row stride in entries"},
	ParamPageSizeLog2:  {"page_size_log2", I32, "", ""},
	ParamPageBytes:     {"page_bytes", I32, "", ""},
	ParamNumPages:      {"num_pages", I32, "", ""},
	ParamScale:         {"scale", F32, "", "KV: kv_scale (fp8_pertensor); Q: q_scale (fp8)"},
	ParamQDeq:          {"q_deq", F32, "", "FMHA scheduler inputs"},
	ParamKVDeq:         {"kv_deq", F32, "", ""},
	ParamQScaling:      {"q_scaling", F32, "", ""},
	ParamOScale:        {"o_scale", F32, "", ""},
	ParamEps:           {"eps", F32, "", "rms_norm_eps of both RMSNorms"},
	ParamWriteSched:    {"write_sched", I32, "", "1: this launch writes the scheduler region"},
	ParamFromHdr:       {"from_hdr", I32, "", "1: valid_rows, num_seqs, seq_len come from hdr"},
}

// FormatConst is the C name of a cache format's id: FMT_FP8_UE8M0, ...
func FormatConst(f kvcache.Format) string { return "FMT_" + strings.ToUpper(f.String()) }

// QFormatConst is the C name of a Q format's id: QFMT_FP8, QFMT_BF16.
func QFormatConst(q mla.QFormat) string { return "QFMT_" + strings.ToUpper(q.String()) }

// The compressor step's launch shapes: a compress_step block has
// CompressStepThreads threads, split into candidate groups (4 for a ratio-4
// entry's 4 or 8 candidates, 16 for a ratio-128 entry's 128) of
// CompressStepThreads / groups channels each, so an entry's 512 channels
// spread over 8 blocks (ratio 4) or 32 (ratio 128); compress_step_finish
// runs CompressFinishWarps entries a block; a store block writes
// CompressStoreRows kept rows at a time.
const (
	CompressStepThreads   = 256
	CompressStepGroups4   = 4
	CompressStepGroups128 = 16
	CompressFinishWarps   = 8
	CompressStoreRows     = 8
)

// IndexerQueryWarps is the warps of an indexer_query block;
// IndexerQueryRows the (token, head) rows of one token a warp carries at
// once (their loads, shuffles and stores interleaved: one row at a time
// left a warp a single 256-byte load and a chain of dependent shuffles in
// flight). It divides mla.IndexerHeads. IndexerQueryWideRows is the rows
// an indexer_query_wide (and indexer_query_stream) warp carries, four
// lanes a row.
const (
	IndexerQueryWarps    = 8
	IndexerQueryRows     = 4
	IndexerQueryWideRows = 8
)

// IndexerQueryLaneWarps is the warps of an indexer_query_lane block (one
// lane a (token, head) row, 32 rows of one token a warp, each warp its
// own two shared-memory buffers); IndexerQueryLaneBlocksPerSM the blocks a
// multiprocessor its __launch_bounds__ promises (registers for the row's
// 128 values a lane, and the grid the host launches: one wave).
const (
	IndexerQueryLaneWarps       = 2
	IndexerQueryLaneBlocksPerSM = 6
)

// IndexerStepThreads is an indexer_step block (the indexer compressor's
// step in one kernel): one thread per channel of the indexer's pooled row
// (mla.IndexerDim), one entry a block at a time.
const IndexerStepThreads = 128

// CompressKernels are the kernels the CUDA backend loads by name from the
// compressor's module (compress.cu and indexer.cu, kernels/cuda.CompressSource).
var CompressKernels = []string{"compress_entries", "compress_step", "compress_step_finish", "indexer_step_finish", "indexer_step",
	"indexer_query", "indexer_query_early", "indexer_query_lean", "indexer_query_wide",
	"indexer_query_stream", "indexer_query_lane", "indexer_query_tok"}

// CompressStepTilesDim is the blocks (channel tiles) of one entry of a
// ratio whose pooled rows have dim channels (512, or 128 for the indexer).
func CompressStepTilesDim(ratio, dim int) int {
	groups := CompressStepGroups4
	if ratio != 4 {
		groups = CompressStepGroups128
	}
	return dim / (CompressStepThreads / groups)
}

// CompressStepTiles is the blocks (channel tiles) of one entry of a ratio.
func CompressStepTiles(ratio int) int {
	groups := CompressStepGroups4
	if ratio != 4 {
		groups = CompressStepGroups128
	}
	return 512 / (CompressStepThreads / groups)
}

// The streaming pipeline's shared memory (kernels/cuda/prologue.cu): each
// warp of a block has a ring of slots, KVSlotBytes a slot for a KV warp (a
// latent row and its RoPE row) and QSlotBytes for a Q warp (one (token,
// head) row), and a Q warp has one more region, QStageBytes, where a bf16
// output row is staged so that each of its global stores writes 512
// contiguous bytes.
const (
	KVSlotBytes = 2*numerics.HeadDim + 4*numerics.RopeDim
	QSlotBytes  = 2 * numerics.HeadDim
	QStageBytes = 2 * numerics.HeadDim
)

// StreamingSharedBytes is the static shared memory a block of the streaming
// KV and Q kernels takes with warps warps and ring depths kvDepth and
// qDepth (a fused layer kernel takes the larger).
func StreamingSharedBytes(warps, kvDepth, qDepth int) (kv, q int) {
	return warps * kvDepth * KVSlotBytes, warps * (qDepth*QSlotBytes + QStageBytes)
}

// Constants are the integer constants of the prologue kernels, each taken
// from the Go package that defines it.
func Constants() []ConstGroup {
	var fmts, qfmts []Const
	for _, f := range kvcache.Formats() {
		fmts = append(fmts, Const{FormatConst(f), int(f), "kvcache.Format " + f.String()})
	}
	for _, q := range mla.QFormats() {
		qfmts = append(qfmts, Const{QFormatConst(q), int(q), "mla.QFormat " + q.String()})
	}
	return []ConstGroup{
		{"Cache formats (kvcache.Format).", fmts},
		{"Q buffer formats (mla.QFormat).", qfmts},
		{"Metadata header fields, int32 each (mla.Hdr*).", []Const{
			{"HDR_NUM_SEQS", mla.HdrNumSeqs, ""},
			{"HDR_NUM_CTX", mla.HdrNumCtx, ""},
			{"HDR_NUM_GEN", mla.HdrNumGen, ""},
			{"HDR_CTX_TOKENS", mla.HdrCtxTokens, ""},
			{"HDR_GEN_TOKENS", mla.HdrGenTokens, ""},
			{"HDR_TOKENS", mla.HdrTokens, ""},
			{"HDR_PADDED_TOKENS", mla.HdrPaddedTokens, ""},
			{"HDR_GEN_SEQ_LEN", mla.HdrGenSeqLen, ""},
			{"HDR_MAX_PAGES", mla.HdrMaxPages, ""},
			{"HDR_FIELDS", mla.NumHdrFields, ""},
		}},
		{"Scheduler region, 32-bit word indices (mla.Sched*).", []Const{
			{"SCHED_TILE_COUNTER", mla.SchedTileCounter, "uint32"},
			{"SCHED_BMM1", mla.SchedBMM1, "float32 x2"},
			{"SCHED_BMM2", mla.SchedBMM2, "float32"},
		}},
		{"Compressor step plan, int32 word indices (mla.CompressPlan*).", []Const{
			{"CPLAN_HDR_SEQS", mla.CompressPlanHdrSeqs, "header: the sequences"},
			{"CPLAN_HDR_JOBS", mla.CompressPlanHdrJobs, "header: the entries to emit"},
			{"CPLAN_HDR_WORDS", mla.CompressPlanHdrWords, ""},
			{"CPLAN_SEQ_ROW", mla.CompressPlanSeqRow, "first KG row"},
			{"CPLAN_SEQ_ROWS", mla.CompressPlanSeqRows, ""},
			{"CPLAN_SEQ_START", mla.CompressPlanSeqStart, "position of the first row"},
			{"CPLAN_SEQ_FROM", mla.CompressPlanSeqFrom, "ring slot read"},
			{"CPLAN_SEQ_TO", mla.CompressPlanSeqTo, "ring slot written"},
			{"CPLAN_SEQ_WORDS", mla.CompressPlanSeqWords, ""},
			{"CPLAN_JOB_INDEX", mla.CompressPlanJobIndex, "entry index"},
			{"CPLAN_JOB_SEQ", mla.CompressPlanJobSeq, "plan sequence"},
			{"CPLAN_JOB_PAGE", mla.CompressPlanJobPage, ""},
			{"CPLAN_JOB_OFFSET", mla.CompressPlanJobOffset, ""},
			{"CPLAN_JOB_WORDS", mla.CompressPlanJobWords, ""},
		}},
		{"Compressor step launch shapes (attention/mla/cuda: CompressStep).", []Const{
			{"CSTEP_THREADS", CompressStepThreads, "threads of one compress_step block"},
			{"CSTEP_GROUPS_R4", CompressStepGroups4, "candidate groups of a ratio-4 entry's block"},
			{"CSTEP_GROUPS_R128", CompressStepGroups128, "candidate groups of a ratio-128 entry's block"},
			{"CFIN_WARPS", CompressFinishWarps, "warps of a compress_step_finish block, one entry each"},
			{"CSTEP_STORE_ROWS", CompressStoreRows, "kept rows a compress_step store block writes at a time"},
		}},
		{"The lightning indexer (mla.Indexer*, numerics.MXFP4*; attention/mla/cuda: IndexerQuery, CompressStep).", []Const{
			{"INDEXER_HEADS", mla.IndexerHeads, "index_n_heads"},
			{"INDEXER_DIM", mla.IndexerDim, "index_head_dim: 64 nope, then 64 rope"},
			{"MXFP4_BLOCK", numerics.MXFP4Block, "values per MXFP4 scale byte"},
			{"MXFP4_ROW_BYTES", numerics.MXFP4RowBytes, "one 128-value row: 64 nibble bytes, then 4 scale bytes"},
			{"MXFP4_FLOOR_BITS", int(math.Float32bits(numerics.MXFP4Floor)), "float32 bits of the amax floor 6*2^-126"},
			{"MXFP4_INV6_BITS", int(math.Float32bits(numerics.MXFP4InvSix)), "float32 bits of fl32(1/6)"},
			{"F32_NAN_BITS", numerics.F32NaN, "the float32 NaN a float32 output holds (the fp8 query's head weights)"},
			{"ENTRY_KV", int(mla.EntryKV), "mla.CompressEntry: the main compressor"},
			{"ENTRY_INDEXER", int(mla.EntryIndexer), "mla.CompressEntry: the indexer's compressor"},
			{"IQ_WARPS", IndexerQueryWarps, "warps of an indexer_query block"},
			{"IQ_ROWS", IndexerQueryRows, "(token, head) rows of one token an indexer_query warp carries at once"},
			{"IQ_WIDE_ROWS", IndexerQueryWideRows, "(token, head) rows of one token an indexer_query_wide warp carries, four lanes a row"},
			{"IQL_WARPS", IndexerQueryLaneWarps, "warps of an indexer_query_lane block, one lane a row"},
			{"IQL_BLOCKS_PER_SM", IndexerQueryLaneBlocksPerSM, "indexer_query_lane's __launch_bounds__ minimum of blocks a multiprocessor"},
			{"IKEY_THREADS", IndexerStepThreads, "threads of an indexer_step block, one per channel"},
		}},
		{"Streaming pipeline shared memory (StreamingSharedBytes).", []Const{
			{"KV_SLOT_BYTES", KVSlotBytes, "a KV warp's ring slot: the latent row, then its RoPE row"},
			{"Q_SLOT_BYTES", QSlotBytes, "a Q warp's ring slot: one (token, head) row"},
			{"Q_STAGE_BYTES", QStageBytes, "a Q warp's staging region for a bf16 output row"},
		}},
		{"Row dimensions (numerics).", []Const{
			{"HEAD_DIM", numerics.HeadDim, "values per latent or per-head Q row"},
			{"NOPE_DIM", numerics.NopeDim, ""},
			{"ROPE_DIM", numerics.RopeDim, ""},
			{"GROUP_SIZE", numerics.GroupSize, "nope values per UE8M0 exponent"},
		}},
		{"Cache layouts (kvcache).", []Const{
			{"UE8M0_VALUE_BYTES", kvcache.UE8M0ValueBytes, "fp8_ue8m0: values-region stride of a token"},
			{"UE8M0_SCALE_BYTES", kvcache.UE8M0ScaleBytes, "fp8_ue8m0: scales-region stride of a token"},
			{"UE8M0_ROPE_OFFSET", kvcache.UE8M0RopeOffset, "fp8_ue8m0: bf16 rope values inside the values region"},
			{"BF16_TOKEN_BYTES", kvcache.FormatBF16.BytesPerToken(), ""},
			{"FP8_PERTENSOR_TOKEN_BYTES", kvcache.FormatFP8PerTensor.BytesPerToken(), ""},
		}},
	}
}

// KernelKind says what a kernel does.
type KernelKind uint8

const (
	// KindKV is a KV kernel: one cache format.
	KindKV KernelKind = iota + 1
	// KindQ is a Q kernel: one Q format.
	KindQ
	// KindLayer is a fused layer kernel: one (cache format, Q format) pair.
	KindLayer
)

// Path is how a kernel walks its work rows (latent rows, (token, head) Q
// rows). Both paths produce the same bytes: they share the per-row code.
type Path uint8

const (
	// Streaming: a grid capped at a few blocks a multiprocessor whose warps
	// stream contiguous row ranges through a cp.async ring in shared
	// memory (large batches: close to copy bandwidth).
	Streaming Path = iota
	// Direct: one warp per row, the grid covers every row, the row loaded
	// straight into registers, no shared memory, and everything the
	// previous grid cannot have written (metadata, RoPE rows, the weight)
	// read before the programmatic-dependent-launch wait (small batches:
	// latency).
	Direct
)

// Paths lists both paths.
func Paths() []Path { return []Path{Streaming, Direct} }

func (p Path) String() string {
	switch p {
	case Streaming:
		return "streaming"
	case Direct:
		return "direct"
	}
	return fmt.Sprintf("Path(%d)", uint8(p))
}

// suffix is what a path adds to a kernel's name.
func (p Path) suffix() (string, error) {
	switch p {
	case Streaming:
		return "", nil
	case Direct:
		return "_direct", nil
	}
	return "", fmt.Errorf("abi: no kernel path %v", p)
}

// Kernel is one extern "C" kernel of prologue.cu.
type Kernel struct {
	Name    string
	Kind    KernelKind
	Path    Path
	Format  kvcache.Format // KindKV, KindLayer
	QFormat mla.QFormat    // KindQ, KindLayer
}

// KVKernel is the name of the KV kernel of a cache format on a path.
func KVKernel(f kvcache.Format, p Path) (string, error) {
	if !f.Valid() {
		return "", fmt.Errorf("abi: no KV kernel for cache format %v", f)
	}
	s, err := p.suffix()
	if err != nil {
		return "", err
	}
	return "kv_" + f.String() + s, nil
}

// QKernel is the name of the Q kernel of a Q format on a path.
func QKernel(q mla.QFormat, p Path) (string, error) {
	if q != mla.QFP8 && q != mla.QBF16 {
		return "", fmt.Errorf("abi: no Q kernel for Q format %v", q)
	}
	s, err := p.suffix()
	if err != nil {
		return "", err
	}
	return "q_" + q.String() + s, nil
}

// LayerKernel is the name of the fused layer kernel of a (cache format, Q
// format) pair on a path.
func LayerKernel(f kvcache.Format, q mla.QFormat, p Path) (string, error) {
	if _, err := KVKernel(f, p); err != nil {
		return "", err
	}
	if _, err := QKernel(q, p); err != nil {
		return "", err
	}
	s, _ := p.suffix()
	return "layer_" + f.String() + "_q" + q.String() + s, nil
}

// Kernels lists every kernel the CUDA backend loads from prologue.cu: on
// each path, a KV kernel per cache format, a Q kernel per Q format and a
// fused layer kernel per pair.
func Kernels() []Kernel {
	var ks []Kernel
	for _, p := range Paths() {
		for _, f := range kvcache.Formats() {
			n, _ := KVKernel(f, p)
			ks = append(ks, Kernel{Name: n, Kind: KindKV, Path: p, Format: f})
		}
		for _, q := range mla.QFormats() {
			n, _ := QKernel(q, p)
			ks = append(ks, Kernel{Name: n, Kind: KindQ, Path: p, QFormat: q})
		}
		for _, f := range kvcache.Formats() {
			for _, q := range mla.QFormats() {
				n, _ := LayerKernel(f, q, p)
				ks = append(ks, Kernel{Name: n, Kind: KindLayer, Path: p, Format: f, QFormat: q})
			}
		}
	}
	return ks
}
