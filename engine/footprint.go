package engine

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// FallbackMemoryLimit is the MemoryLimit of a zero Config on a backend
// that cannot say how much memory it has (not an mla.MemoryReporter, or
// one whose FreeMemory fails): 32 GiB.
const FallbackMemoryLimit = 32 << 30

// ErrMemoryLimit: the buffers of a Config would pass its MemoryLimit. New
// returns it inside a *ConfigError before allocating anything.
var ErrMemoryLimit = errors.New("more memory than MemoryLimit")

// Footprint is what New allocates for a Config, in bytes, by buffer: on
// the backend (device memory, or host memory for cpu) and the host copies
// the engine keeps.
type Footprint struct {
	Pools       int64 // Layers KV cache pools of Cache.PoolBytes()
	Inputs      int64 // fused A and Q input buffers: MaxTokens rows
	QOutput     int64 // Q output buffer: MaxTokens rows of QFormat
	RopeTables  int64 // one table per RoPE kind the layers use, RopePositions rows, on the backend and on the host (plus the upload copy)
	Metadata    int64 // the fixed-address metadata buffer: MaxSeqs block-table rows
	Weights     int64 // kv_a_layernorm weights, on the backend and on the host
	Chain       int64 // Input = hidden: the hidden-state input and the quantized activations (MaxTokens rows)
	ChainWeight int64 // Input = hidden: every layer's [wq_a; wkv], wq_b (the head range's rows), their scales and q_norm
	Bookkeeping int64 // the page free list
	Compressed  int64 // Compressor: each compressed layer's pool of its ratio's pages
	StateBound  int64 // Compressor: each compressed layer's ring of states, Compressor.MaxSequences slots and one per chunk a batch can move
	Indexer     int64 // Compressor with the indexer (Config.IndexerEnabled): each ratio-4 layer's key cache, Compressor.Ratio4Pages pages of 64 68-byte entries
	IdxStates   int64 // the indexer's compressor states in each ratio-4 layer, at the compressor's slots
	CompWeights int64 // Compressor with Input = hidden: each compressed layer's wkv, wgate (bf16) and ape
	CompBuffers int64 // Compressor: the projection rows (MaxTokens rows of the widest layer's projection GEMM, the indexer's projections included), the plans, the norm weights, the compressed block tables (MaxSeqs rows, and their host mirror)
	IdxWeights  int64 // the indexer with Input = hidden: each ratio-4 layer's indexer wq_b (and scales), weights_proj, compressor wkv, wgate (rows of the layer's projection weight, one buffer with the compressor's), ape and norm
	IdxBuffers  int64 // the indexer with Input = hidden: its wq_b output, the query and the head weights (MaxTokens rows)
	IdxTopK     int64 // the indexer's top-k selection: its plan, its scratch (Compressor.IndexerTopKScratch keys) and each ratio-4 layer's [MaxTokens][index_topk] int32 indices
}

// Total is the sum of every buffer, saturating at math.MaxInt64.
func (f Footprint) Total() int64 {
	var t int64
	for _, b := range f.parts() {
		t = addSat(t, b.bytes)
	}
	return t
}

type footprintPart struct {
	name, field string
	bytes       int64
}

func (f Footprint) parts() []footprintPart {
	return []footprintPart{
		{"KV cache pools", "Cache.NumPages", f.Pools},
		{"input buffers", "MaxTokens", f.Inputs},
		{"Q output", "MaxTokens", f.QOutput},
		{"RoPE tables", "RopePositions", f.RopeTables},
		{"metadata", "MaxSeqs", f.Metadata},
		{"weights", "Layers", f.Weights},
		{"chain buffers", "MaxTokens", f.Chain},
		{"checkpoint weights", "Layers", f.ChainWeight},
		{"page bookkeeping", "Cache.NumPages", f.Bookkeeping},
		{"compressed pools", "Compressor.Ratio4Pages", f.Compressed},
		{"compressor states", "Compressor.MaxSequences", f.StateBound},
		{"indexer caches", "Compressor.Ratio4Pages", f.Indexer},
		{"indexer states", "Compressor.MaxSequences", f.IdxStates},
		{"indexer weights", "Layers", f.IdxWeights},
		{"indexer buffers", "MaxTokens", f.IdxBuffers},
		{"indexer top-k", "Compressor.IndexerTopKScratch", f.IdxTopK},
		{"compressor weights", "Layers", f.CompWeights},
		{"compressor buffers", "MaxTokens", f.CompBuffers},
	}
}

// String lists the buffers, largest first.
func (f Footprint) String() string {
	var ps []footprintPart
	for _, p := range f.parts() {
		if p.bytes > 0 {
			ps = append(ps, p)
		}
	}
	var out []string
	for len(ps) > 0 {
		i := largestPart(ps)
		out = append(out, ps[i].name+" "+FormatBytes(ps[i].bytes))
		ps = append(ps[:i], ps[i+1:]...)
	}
	return strings.Join(out, ", ")
}

func largestPart(ps []footprintPart) int {
	best := 0
	for i, p := range ps {
		if p.bytes > ps[best].bytes {
			best = i
		}
	}
	return best
}

// largest returns the Config field that drives the largest buffer and a
// description of that buffer.
func (f Footprint) largest() (field, what string) {
	ps := f.parts()
	p := ps[largestPart(ps)]
	return p.field, fmt.Sprintf("the %s, %s", p.name, FormatBytes(p.bytes))
}

// FormatBytes prints a byte count in binary units: 512 B, 1.5 KiB, 2.0 GiB.
func FormatBytes(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n), 0
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	for v >= 1024 && unit < len(units)-1 {
		v /= 1024
		unit++
	}
	return fmt.Sprintf("%.1f %s", v, units[unit])
}

func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Footprint returns what New would allocate for c, with the defaults filled
// in; it allocates nothing. It fails on the same bad fields as New, except
// that it does not compare the total with MemoryLimit.
func (c Config) Footprint() (Footprint, error) {
	r, err := c.resolve(false)
	if err != nil {
		return Footprint{}, err
	}
	return r.footprint()
}

// Resolve returns c with every default filled in, or the first field New
// would refuse (a *ConfigError), MemoryLimit included. It allocates
// nothing, so a front end can check a configuration before committing to it.
func (c Config) Resolve() (Config, error) { return c.resolve(true) }

// footprint computes the buffers' sizes of a resolved config. Every factor
// is bounded by resolve, and the products saturate, so nothing overflows.
func (c Config) footprint() (Footprint, error) {
	var f Footprint
	layers := int64(c.Layers)
	// The cache model's buffers, row by row.
	layout := c.cacheLayout()
	for i, s := range layout {
		b := layout.Footprint(i)
		switch partOf(s) {
		case partSWA:
			f.Pools = addSat(f.Pools, b)
		case partCompressed:
			f.Compressed = addSat(f.Compressed, b)
		case partIndexer:
			f.Indexer = addSat(f.Indexer, b)
		case partIndexerState:
			f.IdxStates = addSat(f.IdxStates, b)
		default:
			f.StateBound = addSat(f.StateBound, b)
		}
	}
	tokens, heads := int64(c.MaxTokens), int64(c.Model.NumHeads)
	f.Inputs = tokens*int64(c.fusedRowElems())*2 + tokens*heads*numerics.HeadDim*2
	f.QOutput = tokens * heads * numerics.HeadDim * int64(c.QFormat.ElemBytes())
	kinds := map[any]bool{}
	for l := range c.Layers {
		k, err := c.Model.LayerRope(l)
		if err != nil {
			return f, &ConfigError{Field: "Model", Err: fmt.Errorf("layer %d: %w", l, err)}
		}
		kinds[k] = true
	}
	f.RopeTables = 3 * int64(len(kinds)) * int64(c.RopePositions) * numerics.RopeDim * 4
	mb, err := mla.MetadataLayout(c.MaxSeqs, c.pageStride())
	if err != nil {
		return f, &ConfigError{Field: "MaxSeqs", Err: err}
	}
	f.Metadata = int64(mb.Size)
	f.Weights = 2 * layers * numerics.HeadDim * 4
	f.Bookkeeping = int64(c.Cache.NumPages) * 4
	if c.Compresses() {
		mostJobs := 0
		for _, r := range c.compressedRatios() {
			jobs := mla.MaxCompressJobs(r, c.MaxSeqs, c.MaxTokens)
			f.CompBuffers = addSat(f.CompBuffers, int64(align16(mla.CompressPlanBytes(c.MaxSeqs, jobs))))
			mostJobs = max(mostJobs, jobs)
		}
		f.CompBuffers = addSat(f.CompBuffers, int64(mla.CompressScratchBytes(mostJobs)))
		if c.IndexerEnabled() {
			f.CompBuffers = addSat(f.CompBuffers, int64(mla.CompressScratchBytes(mla.MaxCompressJobs(kvcache.DSv4IndexerRatio, c.MaxSeqs, c.MaxTokens))))
		}
		f.CompBuffers = addSat(f.CompBuffers, tokens*int64(c.projRowElems())*4)
		f.CompBuffers = addSat(f.CompBuffers, 2*int64(c.compTableBytes())) // on the backend and its host mirror
		for l := range c.Layers {
			r, _ := c.Model.CompressRatio(l)
			if compressor.Overlap(r) == 0 {
				continue
			}
			f.CompBuffers = addSat(f.CompBuffers, numerics.HeadDim*4)
			if c.Input == InputHidden {
				out := int64(compressor.Overlap(r) * compressor.Dim)
				f.CompWeights = addSat(f.CompWeights, 2*out*int64(c.Model.HiddenSize)*2+int64(r)*out*4)
			}
		}
	}
	if c.Input == InputHidden {
		hidden, q := int64(c.Model.HiddenSize), int64(c.Model.QLoraRank)
		// The hidden rows (bf16), act_quant's and q_norm's e4m3 values and
		// float32 block scales.
		f.Chain = tokens*hidden*2 + tokens*hidden + tokens*hidden/32 + tokens*q + tokens*q/32
		fused := int64(c.fusedRowElems())
		wqb := int64(c.heads()) * numerics.HeadDim
		perLayer := fused*hidden + (fused+127)/128*((hidden+127)/128)*4 +
			wqb*q + (wqb+127)/128*((q+127)/128)*4 + q*4
		f.ChainWeight = mulSat(layers, perLayer)
	}
	if c.indexerRunning() {
		f.IdxBuffers = indexerBufferBytes(tokens, c.Compressor.IndexerQueryFormat)
		f.IdxTopK = c.topkBytes()
		for l := range c.Layers {
			if r, _ := c.Model.CompressRatio(l); r == kvcache.DSv4IndexerRatio {
				f.IdxWeights = addSat(f.IdxWeights, indexerWeightBytes(int64(c.Model.HiddenSize), int64(c.Model.QLoraRank)))
			}
		}
	}
	return f, nil
}
