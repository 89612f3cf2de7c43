package mla

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/numerics"
)

// The lightning indexer's prologue on the backend (DESIGN.md section 9), in
// the ratio-4 layers: its query and head weights (IndexerQuerier, one launch
// per phase like the Q prologue, after the indexer's wq_b GEMM and its
// weights_proj GEMM), and its key cache, which is a compressor step
// (CompressStepper) with Entry = EntryIndexer: section 8's ratio-4 pooling at
// width 128, then RMSNorm, RoPE at 4i, Hadamard and MXFP4 into 68-byte
// entries.

// Indexer dimensions (DSV4's index_n_heads and index_head_dim).
const (
	IndexerHeads = 64
	IndexerDim   = numerics.HadamardDim // 64 nope values, then 64 rope values
	// IndexerEntryBytes is one MXFP4 row (a query head's or a cache
	// entry's): 64 bytes of nibbles, then 4 UE8M0 scale bytes.
	IndexerEntryBytes = numerics.MXFP4RowBytes
)

// IndexerWeightScale is c = fl32(128^-0.5 * 64^-0.5) of the head weights:
// 2^-6.5 rounded once, which is numerics.HadamardScale / 8 exactly.
var IndexerWeightScale = numerics.HadamardScale / 8

// CompressEntry says what a compressor step pools and how it stores an
// entry. The zero value is the main KV compressor's.
type CompressEntry uint8

const (
	// EntryKV is the main compressor (section 8): rows of 512 channels per
	// window half, 584-byte fp8_ue8m0 entries.
	EntryKV CompressEntry = iota
	// EntryIndexer is the indexer's compressor (section 9, ratio 4 only):
	// rows of 128 channels per half; the entry is RMSNorm (W = 128), RoPE
	// of dims [64, 128) at position 4i, Hadamard(128) and MXFP4: 68 bytes
	// at in-page offset off*68 of a page of PageSize entries.
	EntryIndexer
)

func (e CompressEntry) String() string {
	switch e {
	case EntryKV:
		return "kv"
	case EntryIndexer:
		return "indexer"
	}
	return fmt.Sprintf("CompressEntry(%d)", uint8(e))
}

// Dim is the channels of one pooled row: 512 or 128 (0 for an unknown
// entry kind).
func (e CompressEntry) Dim() int {
	switch e {
	case EntryKV:
		return numerics.HeadDim
	case EntryIndexer:
		return IndexerDim
	}
	return 0
}

// IndexerPageBytes is the size of an indexer cache page of pageSize
// entries: entry off at byte off*IndexerEntryBytes.
func IndexerPageBytes(pageSize int) int { return pageSize * IndexerEntryBytes }

// IndexerQueryFormat is how the indexer query and its head weights are
// stored (DESIGN.md section 9). The zero value is the default, MXFP4.
type IndexerQueryFormat uint8

const (
	// IndexerQueryMXFP4 (the default, the reference's numerics): each
	// head's row is 68 bytes of MXFP4 (numerics.QuantizeMXFP4), the head
	// weights bf16 [rows][64]. The top-k selection (TopKSelector) reads
	// this format only.
	IndexerQueryMXFP4 IndexerQueryFormat = iota
	// IndexerQueryFP8 (what vLLM and SGLang hand DeepGEMM's
	// fp8_mqa_logits): each head's row is 128 e4m3 bytes with one UE8M0
	// power-of-two scale per (token, head) (section 4.5's rule over the
	// row's 128 values), and the scale folded into the head weights,
	// float32 [rows][64]: fl(fl(bf16(W) * IndexerWeightScale) * scale).
	IndexerQueryFP8
)

func (f IndexerQueryFormat) String() string {
	switch f {
	case IndexerQueryMXFP4:
		return "mxfp4"
	case IndexerQueryFP8:
		return "fp8"
	}
	return fmt.Sprintf("IndexerQueryFormat(%d)", uint8(f))
}

// ParseIndexerQueryFormat is the inverse of String.
func ParseIndexerQueryFormat(s string) (IndexerQueryFormat, error) {
	switch s {
	case "mxfp4":
		return IndexerQueryMXFP4, nil
	case "fp8":
		return IndexerQueryFP8, nil
	}
	return 0, fmt.Errorf("%w: indexer query format %q: want mxfp4 or fp8", ErrIndexerArgs, s)
}

// RowBytes is one (token, head) row of the query buffer: 68 (MXFP4) or
// 128 (FP8); 0 for an unknown format.
func (f IndexerQueryFormat) RowBytes() int {
	switch f {
	case IndexerQueryMXFP4:
		return IndexerEntryBytes
	case IndexerQueryFP8:
		return IndexerDim
	}
	return 0
}

// WeightBytes is one (token, head) head weight: 2 (bf16, MXFP4) or 4
// (float32 with the query's scale folded in, FP8); 0 for an unknown
// format.
func (f IndexerQueryFormat) WeightBytes() int {
	switch f {
	case IndexerQueryMXFP4:
		return 2
	case IndexerQueryFP8:
		return 4
	}
	return 0
}

// IndexerQueryArgs are one ratio-4 layer's indexer query and head-weight
// inputs and outputs. Row t of every token-indexed buffer is token t of the
// batch; positions come from Meta as for the Q prologue.
//
//	Q:  [rows][64][128] bf16, token t at QOffset + t*QStride*2 bytes (the
//	    indexer's wq_b GEMM output, or a slice of a fused [wq_b; indexer
//	    wq_b] output: QStride >= 64*128).
//	W:  [rows][64] float32, token t at WOffset + t*WStride*4 bytes: the
//	    weights_proj GEMM's unrounded float32 output (BF16GEMMArgs' Y,
//	    possibly a column slice of a wider GEMM).
//
// For each real token t at position pos and head h, with y the 128 bf16
// values Hadamard(RoPE(Q[t][h])) (RoPE on dims [64, 128) with the table's
// row pos, section 4.4's rounding):
//   - Format MXFP4: QOut[t][h] is y's 68-byte MXFP4 row, and WOut[t][h] =
//     bf16(fl(bf16(W[t][h]) * IndexerWeightScale)).
//   - Format FP8: with e the UE8M0 exponent of y's 128 values
//     (numerics.UE8M0 of their absolute maximum, NaN ignored), QOut[t][h]
//     is the 128 bytes e4m3(fl(y_i * 2^(127-e))), value i at byte i, and
//     WOut[t][h] the float32 fl(fl(bf16(W[t][h]) * IndexerWeightScale) *
//     2^(e-127)).
//
// Padding rows, and tokens whose position is outside the table, are written
// as zeros in both.
type IndexerQueryArgs struct {
	Format IndexerQueryFormat

	Q       Buffer
	QOffset int // bytes, a multiple of 16
	QStride int // elements between tokens, >= 64*128 and a multiple of 8
	W       Buffer
	WOffset int // bytes, a multiple of 16
	WStride int // elements between tokens, >= 64 and a multiple of 4

	QOut Buffer // [rows][64][Format.RowBytes()] bytes
	WOut Buffer // [rows][64] bf16 (MXFP4) or float32 (FP8)

	Rope          Buffer // [RopePositions][32]{cos, sin} float32: the layer's table
	RopePositions int
	Meta          *MetadataBuffers
}

// Sentinel errors of IndexerQueryArgs.Validate.
var (
	ErrIndexerArgs = errors.New("mla: bad indexer query arguments")
)

// Validate checks what every backend relies on before a launch over rows
// token rows, naming the field at fault.
func (a *IndexerQueryArgs) Validate(rows int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrIndexerArgs, fmt.Sprintf(format, args...))
	}
	switch {
	case a.Format.RowBytes() == 0:
		return bad("Format = %v, want mxfp4 or fp8", a.Format)
	case rows < 0 || rows > math.MaxInt32/IndexerHeads:
		return bad("%d rows out of range", rows)
	case a.QOffset < 0 || a.QOffset%16 != 0:
		return bad("QOffset = %d bytes, must be >= 0 and a multiple of 16", a.QOffset)
	case a.QStride < IndexerHeads*IndexerDim || a.QStride%8 != 0:
		return bad("QStride = %d elements, must be >= %d and a multiple of 8", a.QStride, IndexerHeads*IndexerDim)
	case a.WOffset < 0 || a.WOffset%16 != 0:
		return bad("WOffset = %d bytes, must be >= 0 and a multiple of 16", a.WOffset)
	case a.WStride < IndexerHeads || a.WStride%4 != 0:
		return bad("WStride = %d elements, must be >= %d and a multiple of 4", a.WStride, IndexerHeads)
	case a.RopePositions <= 0 || a.RopePositions > math.MaxInt32:
		return bad("RopePositions = %d out of range [1, %d]", a.RopePositions, math.MaxInt32)
	case a.Meta == nil:
		return bad("Meta is nil")
	}
	if rows == 0 {
		return nil
	}
	need := []struct {
		name string
		buf  Buffer
		n    int64
	}{
		{"Q", a.Q, int64(a.QOffset) + 2*(int64(rows-1)*int64(a.QStride)+IndexerHeads*IndexerDim)},
		{"W", a.W, int64(a.WOffset) + 4*(int64(rows-1)*int64(a.WStride)+IndexerHeads)},
		{"QOut", a.QOut, int64(rows) * IndexerHeads * int64(a.Format.RowBytes())},
		{"WOut", a.WOut, int64(rows) * IndexerHeads * int64(a.Format.WeightBytes())},
		{"Rope", a.Rope, int64(a.RopePositions) * numerics.RopeDim * 4},
	}
	for _, n := range need {
		if n.buf == nil {
			return bad("%s is nil", n.name)
		}
		if int64(n.buf.Len()) < n.n {
			return bad("%s holds %d bytes, %d rows need %d", n.name, n.buf.Len(), rows, n.n)
		}
	}
	return nil
}

// IndexerQuerier is implemented by backends that run the indexer's query
// prologue: one call per launch of the layer (Plan), in stream order with
// the layer's other work. A launch's padding rows are written as zeros.
type IndexerQuerier interface {
	IndexerQuery(ctx context.Context, l Launch, a *IndexerQueryArgs) error
}

// RunIndexerQuery validates a and issues the indexer query of every launch.
func RunIndexerQuery(ctx context.Context, b IndexerQuerier, launches []Launch, a *IndexerQueryArgs) error {
	if len(launches) == 0 {
		return errors.New("mla: no launches")
	}
	last := launches[len(launches)-1]
	if err := a.Validate(last.RowBegin + last.Rows); err != nil {
		return err
	}
	for _, l := range launches {
		if err := b.IndexerQuery(ctx, l, a); err != nil {
			return fmt.Errorf("mla: indexer query launch (%v): %w", l, err)
		}
	}
	return nil
}
