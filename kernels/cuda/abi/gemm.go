package abi

import "fmt"

// Fields of FP8GEMMParams, the FP8 block-scaled GEMM kernels' launch
// parameters (kernels/cuda/gemm_fp8.cu: gemm_fp8_mt<T>).
const (
	FP8GEMMW FieldID = iota
	FP8GEMMWScale
	FP8GEMMX
	FP8GEMMXScale
	FP8GEMMY
	FP8GEMMPart
	FP8GEMMM
	FP8GEMMN
	FP8GEMMK
	FP8GEMMXScaleStride
	FP8GEMMYStride
	FP8GEMMKBPerSplit
	numFP8GEMMFields
)

// FP8GEMMParams is the struct the weight-streaming FP8 GEMM kernels take by
// value: Y [m][n] = X [m][k] . W [n][k]^T with the block scales.
var FP8GEMMParams = &Struct{
	Name:   "FP8GEMMParams",
	Doc:    "Launch parameters of the FP8 block-scaled GEMM kernels gemm_fp8_mt<T> (mla.GEMMArgs), passed by value.",
	Fields: fp8GEMMFields[:],
}

var fp8GEMMFields = [numFP8GEMMFields]Field{
	FP8GEMMW:            {"w", Ptr, "const u8*", "[n][k] e4m3 weight"},
	FP8GEMMWScale:       {"ws", Ptr, "const float*", "[n/128][k/128] weight block scales"},
	FP8GEMMX:            {"x", Ptr, "const u8*", "[m][k] e4m3 activation"},
	FP8GEMMXScale:       {"xs", Ptr, "const float*", "[k/128][xs_stride] activation block scales"},
	FP8GEMMY:            {"y", Ptr, "u8*", "bf16 output, row r at y + 2*r*y_stride (splits == 1)"},
	FP8GEMMPart:         {"part", Ptr, "float*", "float32 partials [split][m][n], or null with one split"},
	FP8GEMMM:            {"m", I32, "", ""},
	FP8GEMMN:            {"n", I32, "", "a multiple of FP8_GEMM_ROW_TILE"},
	FP8GEMMK:            {"k", I32, "", "a multiple of 128"},
	FP8GEMMXScaleStride: {"xs_stride", I32, "", "values between K blocks of xs"},
	FP8GEMMYStride:      {"y_stride", I32, "", "bf16 values between rows of y"},
	FP8GEMMKBPerSplit:   {"kb_per_split", I32, "", "128-wide K blocks of one split (grid z)"},
}

// Fields of SplitKParams, the split-K reductions' launch parameters.
const (
	SplitKPart FieldID = iota
	SplitKY
	SplitKM
	SplitKN
	SplitKYStride
	SplitKSplits
	numSplitKFields
)

// SplitKParams is the struct the split-K reductions (gemm_fp8_reduce,
// gemm_bf16_mma_reduce: common.cuh's splitk_reduce) take by value.
var SplitKParams = &Struct{
	Name:   "SplitKParams",
	Doc:    "Launch parameters of the split-K reductions gemm_fp8_reduce (bf16 out) and gemm_bf16_mma_reduce (float32 out), passed by value.",
	Fields: splitKFields[:],
}

var splitKFields = [numSplitKFields]Field{
	SplitKPart:    {"part", Ptr, "const float*", "float32 partials [splits][m][n]"},
	SplitKY:       {"y", Ptr, "void*", "the output: bf16 (gemm_fp8_reduce) or float32 (gemm_bf16_mma_reduce)"},
	SplitKM:       {"m", I32, "", ""},
	SplitKN:       {"n", I32, "", "a multiple of 4"},
	SplitKYStride: {"y_stride", I32, "", "values between rows of y"},
	SplitKSplits:  {"splits", I32, "", ""},
}

// Fields of BF16GEMMParams, gemm_bf16_f32's launch parameters.
const (
	BF16GEMMW FieldID = iota
	BF16GEMMX
	BF16GEMMY
	BF16GEMMM
	BF16GEMMN
	BF16GEMMK
	BF16GEMMXStride
	BF16GEMMYStride
	numBF16GEMMFields
)

// BF16GEMMParams is the struct gemm_bf16_f32 (kernels/cuda/gemm_bf16.cu)
// takes by value.
var BF16GEMMParams = &Struct{
	Name:   "BF16GEMMParams",
	Doc:    "Launch parameters of the bf16 GEMM gemm_bf16_f32 (mla.BF16GEMMArgs), passed by value.",
	Fields: bf16GEMMFields[:],
}

var bf16GEMMFields = [numBF16GEMMFields]Field{
	BF16GEMMW:       {"w", Ptr, "const u16*", "[n][k] bf16 weight"},
	BF16GEMMX:       {"x", Ptr, "const u16*", "bf16 rows, row r at x + r*x_stride (offset applied)"},
	BF16GEMMY:       {"y", Ptr, "float*", "float32 rows, row r at y + r*y_stride (offset applied)"},
	BF16GEMMM:       {"m", I32, "", ""},
	BF16GEMMN:       {"n", I32, "", ""},
	BF16GEMMK:       {"k", I32, "", ""},
	BF16GEMMXStride: {"x_stride", I32, "", "values between rows of x"},
	BF16GEMMYStride: {"y_stride", I32, "", "values between rows of y"},
}

// Fields of BF16MMAParams, gemm_bf16_mma's launch parameters.
const (
	BF16MMAW FieldID = iota
	BF16MMAX
	BF16MMAOut
	BF16MMAM
	BF16MMAN
	BF16MMAK
	BF16MMAXStride
	BF16MMAOutStride
	BF16MMAKSplit
	BF16MMAKChunk
	BF16MMAY
	BF16MMACounters
	BF16MMAYStride
	numBF16MMAFields
)

// BF16MMAParams is the struct gemm_bf16_mma (kernels/cuda/gemm_bf16_mma.cu)
// takes by value.
var BF16MMAParams = &Struct{
	Name:   "BF16MMAParams",
	Doc:    "Launch parameters of the tensor-core bf16 GEMM gemm_bf16_mma (mla.BF16GEMMArgs), passed by value.",
	Fields: bf16MMAFields[:],
}

var bf16MMAFields = [numBF16MMAFields]Field{
	BF16MMAW:         {"w", Ptr, "const u16*", "[n][k] bf16 weight"},
	BF16MMAX:         {"x", Ptr, "const u16*", "bf16 rows, row r at x + r*x_stride (offset applied)"},
	BF16MMAOut:       {"out", Ptr, "float*", "row r of split z at out + (z*m + r)*out_stride: Y, or the partials"},
	BF16MMAM:         {"m", I32, "", ""},
	BF16MMAN:         {"n", I32, "", ""},
	BF16MMAK:         {"k", I32, "", "a multiple of BF16_MMA_STAGE"},
	BF16MMAXStride:   {"x_stride", I32, "", "values between rows of x"},
	BF16MMAOutStride: {"out_stride", I32, "", "values between rows of out: Y's stride, or n for the partials"},
	BF16MMAKSplit:    {"k_split", I32, "", "k of one split (grid y), a multiple of BF16_MMA_STAGE"},
	BF16MMAKChunk:    {"k_chunk", I32, "", "k of X staged in shared memory at a time, a multiple of BF16_MMA_STAGE"},
	BF16MMAY:         {"y", Ptr, "float*", "Y, row r at y + r*y_stride: where a kernel finishing its split K in its last block writes"},
	BF16MMACounters:  {"counters", Ptr, "int*", "one per (output block, token chunk), zero between launches: the finishing kernels' arrivals"},
	BF16MMAYStride:   {"y_stride", I32, "", "values between rows of y"},
}

// Fields of QuantParams, the chain's act_quant and norm_quant launch
// parameters (kernels/cuda/chain.cu).
const (
	QuantX FieldID = iota
	QuantXStride
	QuantWeight
	QuantOut
	QuantScale
	QuantRows
	QuantK
	QuantScaleStride
	QuantEps
	numQuantFields
)

// QuantParams is the struct act_quant and norm_quant take by value.
var QuantParams = &Struct{
	Name:   "QuantParams",
	Doc:    "Launch parameters of the chain's act_quant and norm_quant (mla.ActQuantArgs, mla.NormQuantArgs), passed by value.",
	Fields: quantFields[:],
}

var quantFields = [numQuantFields]Field{
	QuantX:           {"x", Ptr, "const u8*", "the first bf16 row (offset applied)"},
	QuantXStride:     {"x_stride", U64, "", "bytes between rows of x"},
	QuantWeight:      {"weight", Ptr, "const float*", "norm_quant: the RMSNorm weight [k]; act_quant: null"},
	QuantOut:         {"out", Ptr, "u8*", "[rows][k] e4m3"},
	QuantScale:       {"scale", Ptr, "float*", "[k/128][scale_stride] float32 block scales"},
	QuantRows:        {"rows", I32, "", ""},
	QuantK:           {"k", I32, "", "a multiple of 128"},
	QuantScaleStride: {"scale_stride", I32, "", "values between K blocks of scale"},
	QuantEps:         {"eps", F32, "", "norm_quant: rms_norm_eps; act_quant: 0"},
}

// The FP8 GEMM kernels' shape (kernels/cuda/gemm_fp8.cu): a block of
// FP8GEMMWarps warps owns FP8GEMMRowTile rows of W, 16 a warp (one row of
// weight scale blocks), and one chunk of a token tile.
const (
	FP8GEMMWarps   = 8
	FP8GEMMRowTile = 16 * FP8GEMMWarps
)

// FP8GEMMTile is one instance of the FP8 GEMM kernel: its token chunk and
// the blocks a multiprocessor its launch bounds ask for.
type FP8GEMMTile struct {
	Tokens, MinBlocks int
}

// FP8GEMMTiles are the FP8 GEMM kernels gemm_fp8.cu instantiates
// (FP8_GEMM_KERNELS in abi.h), smallest first; an architecture's
// cudatune.FP8GEMMArch.TokenTiles choose among them.
func FP8GEMMTiles() []FP8GEMMTile {
	return []FP8GEMMTile{{Tokens: 64, MinBlocks: 2}, {Tokens: 128, MinBlocks: 1}}
}

// FP8GEMMKernel is the name of the FP8 GEMM kernel of a token tile.
func FP8GEMMKernel(tokens int) string { return fmt.Sprintf("gemm_fp8_mt%d", tokens) }

// The bf16 GEMMs' shapes: gemm_bf16_f32 runs BF16GEMMWarps warps a block,
// one (row, 8 outputs) each; a gemm_bf16_mma block of BF16MMAWarps warps
// owns BF16MMARows outputs (16 a warp) and BF16MMATokens tokens, streams K
// in stages of BF16MMAStage and pads each shared X row by BF16MMAPad bf16.
const (
	BF16GEMMWarps = 8
	BF16MMAWarps  = 4
	BF16MMARows   = 16 * BF16MMAWarps
	BF16MMATokens = 64
	BF16MMAStage  = 64
	BF16MMAPad    = 32
)

// SplitKThreads is the block the host launches a split-K reduction with
// (one thread per 4 outputs; the kernels take any block size).
const SplitKThreads = 256

// ChainWarps is the most warps an act_quant or norm_quant block has.
const ChainWarps = 8

// gemmConstants are the GEMM and chain kernels' shape constants.
func gemmConstants() []ConstGroup {
	return []ConstGroup{
		{"GEMM and chain kernel shapes (kernels/cuda/abi: FP8GEMM*, BF16GEMM*, BF16MMA*, ChainWarps).", []Const{
			{"FP8_GEMM_WARPS", FP8GEMMWarps, "warps of a gemm_fp8_mt<T> block"},
			{"FP8_GEMM_ROW_TILE", FP8GEMMRowTile, "W rows (outputs) a gemm_fp8_mt<T> block owns, 16 a warp"},
			{"BF16_GEMM_WARPS", BF16GEMMWarps, "warps of a gemm_bf16_f32 block"},
			{"BF16_MMA_WARPS", BF16MMAWarps, "warps of a gemm_bf16_mma block"},
			{"BF16_MMA_ROWS", BF16MMARows, "W rows (outputs) a gemm_bf16_mma block owns, 16 a warp"},
			{"BF16_MMA_TOKENS", BF16MMATokens, "X rows (tokens) a gemm_bf16_mma block owns"},
			{"BF16_MMA_STAGE", BF16MMAStage, "k a gemm_bf16_mma pipeline stage"},
			{"BF16_MMA_PAD", BF16MMAPad, "bf16 past each shared X row of gemm_bf16_mma"},
			{"CHAIN_WARPS", ChainWarps, "the most warps of an act_quant or norm_quant block"},
		}},
		bf16WGMMAConstants(),
	}
}

// fp8GEMMKernelsMacro is abi.h's list of the FP8 GEMM instances: gemm_fp8.cu
// expands it with its kernel-defining macro.
func fp8GEMMKernelsMacro() string {
	s := "// The FP8 GEMM kernels (abi.FP8GEMMTiles): X(name, token tile, min blocks a multiprocessor).\n#define FP8_GEMM_KERNELS(X)"
	for _, t := range FP8GEMMTiles() {
		s += fmt.Sprintf(" X(%s, %d, %d)", FP8GEMMKernel(t.Tokens), t.Tokens, t.MinBlocks)
	}
	return s + "\n\n"
}

// Fields of BF16WGMMAParams, gemm_bf16_wgmma_bn<T>'s launch parameters
// (after its two tensor maps, which are parameters of their own: the copy
// engine reads each from the kernel's parameter space).
const (
	BF16WGMMAY FieldID = iota
	BF16WGMMAPart
	BF16WGMMACounters
	BF16WGMMAM
	BF16WGMMAN
	BF16WGMMAK
	BF16WGMMAYStride
	BF16WGMMAKBPerSplit
	BF16WGMMASplits
	BF16WGMMAChunks
	BF16WGMMAStages
	BF16WGMMASmemBytes
	BF16WGMMAFinish
	BF16WGMMAL2Prefetch
	numBF16WGMMAFields
)

// BF16WGMMAParams is the struct gemm_bf16_wgmma_bn<T>
// (kernels/cuda/gemm_bf16_wgmma.cu) takes by value.
var BF16WGMMAParams = &Struct{
	Name:   "BF16WGMMAParams",
	Doc:    "Launch parameters of the sm_90a bf16 GEMM gemm_bf16_wgmma_bn<T> (mla.BF16GEMMArgs; W and X come as tensor maps), passed by value.",
	Fields: bf16WGMMAFields[:],
}

var bf16WGMMAFields = [numBF16WGMMAFields]Field{
	BF16WGMMAY:          {"y", Ptr, "float*", "Y, row r at y + r*y_stride (offset applied)"},
	BF16WGMMAPart:       {"part", Ptr, "float*", "float32 partials [splits][m][n] (FINISH_REDUCE, FINISH_LAST with splits > 1), else null"},
	BF16WGMMACounters:   {"counters", Ptr, "int*", "FINISH_LAST: one a (W tile, token chunk), zero between launches"},
	BF16WGMMAM:          {"m", I32, "", ""},
	BF16WGMMAN:          {"n", I32, "", "a multiple of 8"},
	BF16WGMMAK:          {"k", I32, "", "a multiple of BF16_WGMMA_STAGE_K"},
	BF16WGMMAYStride:    {"y_stride", I32, "", "values between rows of y"},
	BF16WGMMAKBPerSplit: {"kb_per_split", I32, "", "K blocks (stages) of one split"},
	BF16WGMMASplits:     {"splits", I32, "", ""},
	BF16WGMMAChunks:     {"chunks", I32, "", "token chunks of the tile BN"},
	BF16WGMMAStages:     {"stages", I32, "", "the shared-memory ring's stages"},
	BF16WGMMASmemBytes:  {"smem_bytes", I32, "", "the dynamic shared memory launched with (the kernel checks its layout fits)"},
	BF16WGMMAFinish:     {"finish", I32, "", "how a split K is finished: BF16_WGMMA_FINISH_*"},
	BF16WGMMAL2Prefetch: {"l2_prefetch", I32, "", "non-zero: the producer asks for its first unit's W past the ring into L2 at the start"},
}

// The sm_90a bf16 GEMM's shape (kernels/cuda/gemm_bf16_wgmma.cu): two
// consumer warpgroups of 64 W rows each and a producer warpgroup, a stage
// of 64 k (one 128-byte swizzle row of bf16), and the ways a split K is
// finished.
const (
	BF16WGMMARowTile = 128
	BF16WGMMAThreads = 128 * (BF16WGMMARowTile/64 + 1)
	BF16WGMMAStageK  = 64

	BF16WGMMAFinishReduce  = 1 // partials, then gemm_bf16_mma_reduce
	BF16WGMMAFinishLast    = 2 // partials, added by the unit's last block
	BF16WGMMAFinishCluster = 3 // clusters of the splits, partial tiles in distributed shared memory
)

// BF16WGMMATokenTiles are the token tiles (wgmma's N) gemm_bf16_wgmma.cu
// instantiates, one kernel each (BF16_WGMMA_KERNELS in abi.h), smallest
// first.
func BF16WGMMATokenTiles() []int { return []int{8, 16, 32, 64, 128} }

// BF16WGMMAKernel is the name of the sm_90a bf16 GEMM kernel of a token
// tile.
func BF16WGMMAKernel(bn int) string { return fmt.Sprintf("gemm_bf16_wgmma_bn%d", bn) }

// bf16WGMMAConstants are the sm_90a bf16 GEMM's shape constants.
func bf16WGMMAConstants() ConstGroup {
	return ConstGroup{"The sm_90a bf16 GEMM (kernels/cuda/abi: BF16WGMMA*).", []Const{
		{"BF16_WGMMA_ROW_TILE", BF16WGMMARowTile, "W rows (outputs) a gemm_bf16_wgmma unit owns, 64 a consumer warpgroup"},
		{"BF16_WGMMA_THREADS", BF16WGMMAThreads, "threads of a block: the consumer warpgroups, then the producer's"},
		{"BF16_WGMMA_STAGE_K", BF16WGMMAStageK, "k a ring stage (128 bytes a row)"},
		{"BF16_WGMMA_FINISH_REDUCE", BF16WGMMAFinishReduce, "split K: partials, then gemm_bf16_mma_reduce"},
		{"BF16_WGMMA_FINISH_LAST", BF16WGMMAFinishLast, "split K: partials, added by the unit's last block"},
		{"BF16_WGMMA_FINISH_CLUSTER", BF16WGMMAFinishCluster, "split K: clusters of the splits, through distributed shared memory"},
	}}
}

// bf16WGMMAKernelsMacro is abi.h's list of the sm_90a bf16 GEMM instances.
func bf16WGMMAKernelsMacro() string {
	s := "// The sm_90a bf16 GEMM kernels (abi.BF16WGMMATokenTiles): X(name, token tile).\n#define BF16_WGMMA_KERNELS(X)"
	for _, bn := range BF16WGMMATokenTiles() {
		s += fmt.Sprintf(" X(%s, %d)", BF16WGMMAKernel(bn), bn)
	}
	return s + "\n\n"
}
