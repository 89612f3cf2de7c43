package weights

import (
	"fmt"

	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// LatentDim is the width of the KV latent row and of one Q head (head_dim).
const LatentDim = 512

// FP8Matrix is one FP8 weight of the checkpoint on the host: Data is [N][K]
// e4m3 row-major; Scale is [ceil(N/128)][ceil(K/128)] float32 row-major, one
// scale per 128x128 block (a checkpoint's e8m0 exponent bytes are widened
// exactly: 2^(e-127)).
type FP8Matrix struct {
	N, K  int
	Data  []byte
	Scale []float32
}

// ScaleRows and ScaleCols are the scale grid's dimensions.
func (m *FP8Matrix) ScaleRows() int { return (m.N + 127) / 128 }
func (m *FP8Matrix) ScaleCols() int { return (m.K + 127) / 128 }

// Dequant returns element (n, k) as float32: e4m3 value times its block's
// scale, one rounding. For tests and inspection, not for hot paths.
func (m *FP8Matrix) Dequant(n, k int) float32 {
	return float32(numerics.F32FromE4M3(m.Data[n*m.K+k]) * m.Scale[(n/128)*m.ScaleCols()+k/128])
}

// BF16Matrix is a bf16 weight kept as stored: Data is [N][K] row-major bf16
// bit patterns (numerics.F32FromBF16 widens one exactly). Keeping the bits
// halves host memory against float32 and loses nothing.
type BF16Matrix struct {
	N, K int
	Data []uint16
}

// At returns element (n, k) widened exactly to float32.
func (m *BF16Matrix) At(n, k int) float32 { return numerics.F32FromBF16(m.Data[n*m.K+k]) }

// Compressor holds the KV compressor weights of one ratio-4 or ratio-128
// layer (DESIGN.md section 8), or of a ratio-4 layer's indexer (section 9:
// the same compressor at width 128). Coff is 2 for ratio 4 (overlapping
// windows: rows [0, Dim) are the "A" half, [Dim, 2*Dim) the "B" half) and 1
// for 128. Dim is the width of an emitted entry: 512 (head_dim) for the
// main compressor, index_head_dim (128) for the indexer's.
type Compressor struct {
	Ratio, Coff int
	Dim         int
	WKV         BF16Matrix // [Coff*Dim][hidden]
	WGate       BF16Matrix // [Coff*Dim][hidden]
	APE         []float32  // [Ratio][Coff*Dim], added to the gate logits of position t at row t mod Ratio
	Norm        []float32  // [Dim], RMSNorm weight of an emitted entry, widened exactly from bf16
}

// IndexerWeights holds the lightning indexer's weights of one ratio-4
// layer (DESIGN.md section 9; checkpoint names layers.{i}.attn.indexer.*).
// The indexer's heads are not sharded by the head range: every
// tensor-parallel rank holds all of them (replicated, like wkv). The
// indexer's query, head-weight and key-cache code (its CPU reference and
// kernels) and the engine read them from Layer.Indexer.
type IndexerWeights struct {
	Heads, HeadDim int        // index_n_heads (64) and index_head_dim (128)
	WQB            FP8Matrix  // wq_b: [Heads*HeadDim][q_lora_rank] e4m3, 128x128 block scales; reads section 7's q_norm activation
	WeightsProj    BF16Matrix // weights_proj: [Heads][hidden] bf16, the per-head weights from the hidden rows
	Compressor     Compressor // compressor.{wkv,wgate,ape,norm}: Ratio 4, Coff 2, Dim HeadDim
}

// Layer holds the attention weights the prologue chain reads for one layer
// (DESIGN.md section 7). WQB holds only the rows of the checkpoint's head
// range: head h of the range is rows [(h-H0)*512, (h-H0+1)*512).
type Layer struct {
	Index         int // layer index in [0, cfg.NumAttentionLayers()); MTP layers follow the main ones
	CompressRatio int
	WQA           FP8Matrix       // [q_lora_rank][hidden]
	WKV           FP8Matrix       // [512][hidden]
	WQB           FP8Matrix       // [(H1-H0)*512][q_lora_rank]
	QNorm         []float32       // [q_lora_rank], widened exactly from bf16
	KVNorm        []float32       // [512], widened exactly from bf16
	Compressor    *Compressor     // nil for compress ratio 0
	Indexer       *IndexerWeights // the lightning indexer's weights; nil unless compress ratio is 4
}

// FusedA returns the fused A projection [wq_a; wkv]: [q_lora_rank+512][hidden]
// with the scale grids stacked, the operand of section 7's step 2. It copies.
// The grids only stack when q_lora_rank is a multiple of 128 (true of every
// published config); otherwise a 128-row block would straddle the two.
func (l *Layer) FusedA() (FP8Matrix, error) {
	if l.WQA.N%128 != 0 {
		return FP8Matrix{}, fmt.Errorf("weights: layer %d: q_lora_rank %d is not a multiple of 128, wq_a and wkv scale blocks cannot be stacked", l.Index, l.WQA.N)
	}
	if l.WQA.K != l.WKV.K {
		return FP8Matrix{}, fmt.Errorf("weights: layer %d: wq_a has %d columns, wkv %d", l.Index, l.WQA.K, l.WKV.K)
	}
	return FP8Matrix{
		N:     l.WQA.N + l.WKV.N,
		K:     l.WQA.K,
		Data:  append(append(make([]byte, 0, len(l.WQA.Data)+len(l.WKV.Data)), l.WQA.Data...), l.WKV.Data...),
		Scale: append(append(make([]float32, 0, len(l.WQA.Scale)+len(l.WKV.Scale)), l.WQA.Scale...), l.WKV.Scale...),
	}, nil
}

// HeadRange is a half-open range [Begin, End) of query heads, the slice of
// wq_b one tensor-parallel rank holds. The zero value means all heads.
type HeadRange struct{ Begin, End int }

// Len is the number of heads in the range.
func (r HeadRange) Len() int { return r.End - r.Begin }

// resolve turns the zero value into all heads and checks the range.
func (r HeadRange) resolve(heads int) (HeadRange, error) {
	if r == (HeadRange{}) {
		return HeadRange{0, heads}, nil
	}
	if r.Begin < 0 || r.End <= r.Begin || r.End > heads {
		return HeadRange{}, fmt.Errorf("weights: head range [%d, %d) is not a non-empty range inside [0, %d) (num_attention_heads)", r.Begin, r.End, heads)
	}
	return r, nil
}

// Checkpoint is the attention weights of the layers loaded, in ascending
// layer order.
type Checkpoint struct {
	Config dsv4.Config
	Heads  HeadRange // the resolved head range wq_b was cut to
	Layers []*Layer
}

// Layer returns the weights of layer i, or nil when it was not loaded.
func (c *Checkpoint) Layer(i int) *Layer {
	for _, l := range c.Layers {
		if l.Index == i {
			return l
		}
	}
	return nil
}
