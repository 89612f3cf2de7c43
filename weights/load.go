package weights

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/dsv4mla/prologue/internal/regularfile"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// Safetensors dtype names the loader accepts.
const (
	dtE4M3 = "F8_E4M3"
	dtE8M0 = "F8_E8M0"
	dtF32  = "F32"
	dtBF16 = "BF16"
)

// LoadOptions selects what Load reads.
type LoadOptions struct {
	// Layers lists the layer indices to load, in [0, NumAttentionLayers());
	// MTP layers follow the main ones. Nil loads every main layer.
	Layers []int
	// MTP adds the MTP layers (indices NumLayers.. NumAttentionLayers()-1)
	// to Layers.
	MTP bool
	// Heads is the tensor-parallel rank's head range: only its rows of wq_b
	// (and their scale rows) are read. The zero value loads all heads.
	Heads HeadRange
}

// TensorError is a refused tensor: missing, malformed, of the wrong dtype or
// shape, or unreadable. Tensor is its name as the checkpoint spells it
// (DeepSeek's spelling when no spelling is present); File is the shard file,
// relative to the checkpoint directory, or the index file when the index does
// not list the tensor.
type TensorError struct {
	Tensor string
	File   string
	Err    error
}

func (e *TensorError) Error() string {
	return fmt.Sprintf("weights: tensor %q (%s): %v", e.Tensor, e.File, e.Err)
}

func (e *TensorError) Unwrap() error { return e.Err }

// Load reads the attention weights of the layers opts asks for from the
// checkpoint directory dir (config.json, model.safetensors.index.json and its
// shards; DESIGN.md section 7). cfg nil reads dir's config.json; a given cfg
// is validated and must agree with dir's config.json where there is one
// (CheckConfig), and is used without one.
//
// Per layer it reads wq_a, wkv, wq_b (F8_E4M3 with F32 or F8_E8M0 block
// scales; e8m0 bytes widened exactly to 2^(e-127), byte 0xFF (NaN) refused,
// float32 scales must be finite and positive), q_norm and kv_norm (BF16,
// or F32, widened exactly), and for compress ratios 4 and 128 the compressor:
// wkv and wgate (BF16, kept as bits), ape (F32, or BF16 widened) and
// norm.weight (BF16, or F32), and for compress ratio 4 the lightning
// indexer (Layer.Indexer): indexer.wq_b (as wq_b, all index_n_heads heads
// whatever the head range), indexer.weights_proj (BF16) and the indexer's
// compressor (as the main one, index_head_dim wide). names.go lists the
// accepted spellings.
//
// Every value is checked for what it holds: a NaN or infinite float32 or
// bf16 value, an e4m3 NaN byte (0x7F, 0xFF) or a block scale that is not
// finite and positive is a *TensorError naming the tensor, its file and
// the first bad element's index, wrapping ErrNonFinite or ErrBadScale.
// Every file is checked to be a regular file before it is opened (a FIFO
// would block the read; ErrNotRegular); a symbolic link is followed wherever
// it points, inside the directory or not (a HuggingFace hub snapshot links
// into ../../blobs/), as long as it ends at a regular file.
//
// Only the selected layers' tensors are touched: other shards are never
// opened, and of each shard only the header and the bytes of those tensors
// are read (wq_b: only the head range's rows). Every dtype and shape is
// checked against the config before anything is allocated or read. Any
// problem returns a nil Checkpoint and an error; a tensor's problem is a
// *TensorError naming it and its file.
func Load(dir string, cfg *dsv4.Config, opts LoadOptions) (*Checkpoint, error) {
	var c dsv4.Config
	if cfg == nil {
		var err error
		if c, err = readConfig(dir); err != nil {
			return nil, err
		}
	} else {
		c = *cfg
		c.CompressRatios = slices.Clone(cfg.CompressRatios)
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("weights: config: %w", err)
		}
		// config.json, where there is one, is the checkpoint's truth.
		if _, err := os.Lstat(filepath.Join(dir, ConfigFile)); !errors.Is(err, os.ErrNotExist) {
			if err := CheckConfig(dir, c); err != nil {
				return nil, err
			}
		}
	}
	heads, err := opts.Heads.resolve(c.NumHeads)
	if err != nil {
		return nil, err
	}
	layers, err := opts.layerList(&c)
	if err != nil {
		return nil, err
	}
	index, err := ReadIndex(dir)
	if err != nil {
		return nil, err
	}

	l := &loader{dir: dir, cfg: &c, index: index, shards: map[string]*shard{}}
	defer l.close()

	// Plan: resolve every name and check every header, dtype and shape
	// before a data byte is read.
	var plans []*layerPlan
	for _, i := range layers {
		p, err := l.planLayer(i, heads)
		if err != nil {
			return nil, err
		}
		plans = append(plans, p)
	}
	var jobs []*job
	for _, p := range plans {
		jobs = append(jobs, p.jobs()...)
	}
	// Read: each job fills its own buffer, in file order.
	sort.SliceStable(jobs, func(a, b int) bool {
		if jobs[a].file != jobs[b].file {
			return jobs[a].file < jobs[b].file
		}
		return jobs[a].info.Begin < jobs[b].info.Begin
	})
	var g errgroup.Group
	g.SetLimit(readParallel)
	for _, j := range jobs {
		g.Go(j.read)
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	// Decode.
	ck := &Checkpoint{Config: c, Heads: heads}
	for _, p := range plans {
		layer, err := p.decode()
		if err != nil {
			return nil, err
		}
		ck.Layers = append(ck.Layers, layer)
	}
	return ck, nil
}

// readParallel bounds concurrent tensor reads: enough to keep a fast disk
// busy, few enough not to thrash a slow one.
const readParallel = 4

func (o LoadOptions) layerList(c *dsv4.Config) ([]int, error) {
	var layers []int
	if o.Layers == nil {
		for i := range c.NumLayers {
			layers = append(layers, i)
		}
	} else {
		seen := map[int]bool{}
		for _, i := range o.Layers {
			if i < 0 || i >= c.NumAttentionLayers() {
				return nil, fmt.Errorf("weights: layer %d out of range [0, %d) (%d layers + %d MTP layers)", i, c.NumAttentionLayers(), c.NumLayers, c.NumMTPLayers)
			}
			if seen[i] {
				return nil, fmt.Errorf("weights: layer %d asked for twice", i)
			}
			seen[i] = true
			layers = append(layers, i)
		}
	}
	if o.MTP {
		for i := c.NumLayers; i < c.NumAttentionLayers(); i++ {
			if !slices.Contains(layers, i) {
				layers = append(layers, i)
			}
		}
	}
	if len(layers) == 0 {
		return nil, errors.New("weights: no layers to load")
	}
	sort.Ints(layers)
	for _, i := range layers {
		r, err := c.CompressRatio(i)
		if err != nil {
			return nil, fmt.Errorf("weights: %w", err)
		}
		if r != 0 && r != 4 && r != 128 {
			return nil, fmt.Errorf("weights: layer %d: compress_ratio %d: only 0, 4 and 128 are supported", i, r)
		}
	}
	return layers, nil
}

// shard is one opened shard file and its parsed header.
type shard struct {
	f      *os.File
	header *safetensors.Header
}

type loader struct {
	dir    string
	cfg    *dsv4.Config
	index  *Index
	shards map[string]*shard
}

func (l *loader) close() {
	for _, s := range l.shards {
		s.f.Close()
	}
}

// shard opens a file the first time a tensor in it is needed.
func (l *loader) shard(file, tensor string) (*shard, error) {
	if s, ok := l.shards[file]; ok {
		return s, nil
	}
	fail := func(err error) (*shard, error) { return nil, &TensorError{Tensor: tensor, File: file, Err: err} }
	f, st, err := regularfile.Open(filepath.Join(l.dir, file))
	if err != nil {
		return fail(fmt.Errorf("the index names this shard but it cannot be opened: %w", err))
	}
	h, err := safetensors.ParseHeader(f, st.Size())
	if err != nil {
		f.Close()
		return fail(fmt.Errorf("its shard is refused: %w", err))
	}
	s := &shard{f: f, header: h}
	l.shards[file] = s
	return s, nil
}

// job reads one tensor (or a row range of it) into buf.
type job struct {
	tensor, file string
	info         safetensors.TensorInfo
	f            *os.File
	row0, row1   int
	buf          []byte
}

func (j *job) read() error {
	buf := make([]byte, j.info.RowBytes()*int64(j.row1-j.row0))
	if err := j.info.ReadRows(j.f, buf, j.row0, j.row1); err != nil {
		return &TensorError{Tensor: j.tensor, File: j.file, Err: err}
	}
	j.buf = buf
	return nil
}

func (j *job) fail(format string, args ...any) error {
	return &TensorError{Tensor: j.tensor, File: j.file, Err: fmt.Errorf(format, args...)}
}

// dim is one expected dimension, with the config expression it comes from.
type dim struct {
	n    int
	expr string
}

// want locates tensor m (values or scales) of layer i, checks its dtype and
// shape, and returns the job reading rows [row0, row1) of it (row1 < 0: all).
func (l *loader) want(i int, m module, scale bool, dtypes []string, shape []dim, row0, row1 int) (*job, error) {
	cands := m.candidates(l.cfg, i, scale)
	var found []string
	for _, n := range cands {
		if _, ok := l.index.WeightMap[n]; ok {
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		return nil, &TensorError{Tensor: cands[0], File: IndexFile,
			Err: fmt.Errorf("layer %d: missing: the index lists none of its %d accepted spellings (DeepSeek, vLLM, HF; see weights/names.go)", i, len(cands))}
	case 1:
	default:
		return nil, &TensorError{Tensor: found[0], File: IndexFile,
			Err: fmt.Errorf("layer %d: ambiguous: the index also lists %q for the same tensor", i, found[1])}
	}
	name, file := found[0], l.index.WeightMap[found[0]]
	s, err := l.shard(file, name)
	if err != nil {
		return nil, err
	}
	j := &job{tensor: name, file: file, f: s.f}
	info, ok := s.header.Tensors[name]
	if !ok {
		return nil, j.fail("the index places it in this shard, but the shard's header does not list it")
	}
	j.info = info
	if !slices.Contains(dtypes, info.DType) {
		return nil, j.fail("dtype %s, want %s", info.DType, strings.Join(dtypes, " or "))
	}
	wantShape := make([]int, len(shape))
	exprs := make([]string, len(shape))
	for k, d := range shape {
		wantShape[k], exprs[k] = d.n, d.expr
	}
	if !slices.Equal(info.Shape, wantShape) {
		return nil, j.fail("shape %v, want %v = [%s] from the config", info.Shape, wantShape, strings.Join(exprs, ", "))
	}
	if row1 < 0 {
		row0, row1 = 0, wantShape[0]
	}
	j.row0, j.row1 = row0, row1
	return j, nil
}

// layerPlan holds one layer's jobs between planning and decoding.
type layerPlan struct {
	index, ratio  int
	hidden, qLora int
	heads         HeadRange
	wqa, wkv, wqb [2]*job // values, scales
	qNorm, kvNorm *job
	comp          *compPlan // nil for ratio 0
	idx           *indexerPlan
}

// compPlan is one compressor's jobs: the main one's or the indexer's.
type compPlan struct {
	ratio, coff, dim      int
	wkv, wgate, ape, norm *job
}

// indexerPlan is the lightning indexer's jobs (ratio-4 layers).
type indexerPlan struct {
	heads, headDim int
	wqb            [2]*job
	proj           *job
	comp           *compPlan
}

func (p *layerPlan) jobs() []*job {
	out := []*job{p.wqa[0], p.wqa[1], p.wkv[0], p.wkv[1], p.wqb[0], p.wqb[1], p.qNorm, p.kvNorm}
	if c := p.comp; c != nil {
		out = append(out, c.wkv, c.wgate, c.ape, c.norm)
	}
	if x := p.idx; x != nil {
		out = append(out, x.wqb[0], x.wqb[1], x.proj, x.comp.wkv, x.comp.wgate, x.comp.ape, x.comp.norm)
	}
	return out
}

func ceil128(n int) int { return (n + 127) / 128 }

func (l *loader) planLayer(i int, heads HeadRange) (*layerPlan, error) {
	c := l.cfg
	ratio, _ := c.CompressRatio(i) // checked by layerList
	p := &layerPlan{index: i, ratio: ratio, hidden: c.HiddenSize, qLora: c.QLoraRank, heads: heads}
	hid := dim{c.HiddenSize, "hidden_size"}
	hidS := dim{ceil128(c.HiddenSize), "ceil(hidden_size/128)"}
	q := dim{c.QLoraRank, "q_lora_rank"}
	qS := dim{ceil128(c.QLoraRank), "ceil(q_lora_rank/128)"}
	lat := dim{LatentDim, "head_dim"}
	latS := dim{LatentDim / 128, "head_dim/128"}
	qb := dim{c.NumHeads * LatentDim, "num_attention_heads*head_dim"}
	qbS := dim{c.NumHeads * LatentDim / 128, "num_attention_heads*head_dim/128"}
	fp8 := []string{dtE4M3}
	scales := []string{dtF32, dtE8M0}
	norms := []string{dtBF16, dtF32}

	var err error
	step := func(dst **job, m module, scale bool, dts []string, shape []dim, r0, r1 int) {
		if err == nil {
			*dst, err = l.want(i, m, scale, dts, shape, r0, r1)
		}
	}
	compressor := func(mods compressorModules, ratio, width int, widthExpr string) *compPlan {
		cp := &compPlan{ratio: ratio, coff: 1, dim: width}
		if ratio == 4 {
			cp.coff = 2
		}
		cw := dim{cp.coff * width, fmt.Sprintf("%d*%s (coff %d for ratio %d)", cp.coff, widthExpr, cp.coff, ratio)}
		step(&cp.wkv, mods.wkv, false, []string{dtBF16}, []dim{cw, hid}, 0, -1)
		step(&cp.wgate, mods.wgate, false, []string{dtBF16}, []dim{cw, hid}, 0, -1)
		step(&cp.ape, mods.ape, false, []string{dtF32, dtBF16}, []dim{{ratio, "compress_ratio"}, cw}, 0, -1)
		step(&cp.norm, mods.norm, false, norms, []dim{{width, widthExpr}}, 0, -1)
		return cp
	}
	step(&p.wqa[0], modWQA, false, fp8, []dim{q, hid}, 0, -1)
	step(&p.wqa[1], modWQA, true, scales, []dim{qS, hidS}, 0, -1)
	step(&p.wkv[0], modWKV, false, fp8, []dim{lat, hid}, 0, -1)
	step(&p.wkv[1], modWKV, true, scales, []dim{latS, hidS}, 0, -1)
	// 512-row heads are whole 128-row scale blocks: head h's scale rows are
	// [4h, 4h+4).
	step(&p.wqb[0], modWQB, false, fp8, []dim{qb, q}, heads.Begin*LatentDim, heads.End*LatentDim)
	step(&p.wqb[1], modWQB, true, scales, []dim{qbS, qS}, heads.Begin*LatentDim/128, heads.End*LatentDim/128)
	step(&p.qNorm, modQNorm, false, norms, []dim{q}, 0, -1)
	step(&p.kvNorm, modKVNorm, false, norms, []dim{lat}, 0, -1)
	if ratio != 0 {
		p.comp = compressor(mainCompressor, ratio, LatentDim, "head_dim")
	}
	if ratio == 4 {
		// Replicated: every rank reads all the indexer's heads.
		x := &indexerPlan{heads: c.IndexNHeads, headDim: c.IndexHeadDim}
		iq := dim{c.IndexNHeads * c.IndexHeadDim, "index_n_heads*index_head_dim"}
		iqS := dim{ceil128(c.IndexNHeads * c.IndexHeadDim), "ceil(index_n_heads*index_head_dim/128)"}
		step(&x.wqb[0], modIdxWQB, false, fp8, []dim{iq, q}, 0, -1)
		step(&x.wqb[1], modIdxWQB, true, scales, []dim{iqS, qS}, 0, -1)
		step(&x.proj, modIdxProj, false, []string{dtBF16}, []dim{{c.IndexNHeads, "index_n_heads"}, hid}, 0, -1)
		x.comp = compressor(indexerCompressor, 4, c.IndexHeadDim, "index_head_dim")
		p.idx = x
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (p *layerPlan) decode() (*Layer, error) {
	l := &Layer{Index: p.index, CompressRatio: p.ratio}
	var err error
	l.WQA, err = fp8Matrix(p.wqa, p.qLora, p.hidden)
	if err != nil {
		return nil, err
	}
	l.WKV, err = fp8Matrix(p.wkv, LatentDim, p.hidden)
	if err != nil {
		return nil, err
	}
	l.WQB, err = fp8Matrix(p.wqb, p.heads.Len()*LatentDim, p.qLora)
	if err != nil {
		return nil, err
	}
	if l.QNorm, err = floats(p.qNorm); err != nil {
		return nil, err
	}
	if l.KVNorm, err = floats(p.kvNorm); err != nil {
		return nil, err
	}
	if p.comp != nil {
		if l.Compressor, err = p.comp.decode(p.hidden); err != nil {
			return nil, err
		}
	}
	if x := p.idx; x != nil {
		ix := &IndexerWeights{Heads: x.heads, HeadDim: x.headDim}
		if ix.WQB, err = fp8Matrix(x.wqb, x.heads*x.headDim, p.qLora); err != nil {
			return nil, err
		}
		if ix.WeightsProj, err = bf16Matrix(x.proj, x.heads, p.hidden); err != nil {
			return nil, err
		}
		cp, err := x.comp.decode(p.hidden)
		if err != nil {
			return nil, err
		}
		ix.Compressor = *cp
		l.Indexer = ix
	}
	return l, nil
}

func (c *compPlan) decode(hidden int) (*Compressor, error) {
	cp := &Compressor{Ratio: c.ratio, Coff: c.coff, Dim: c.dim}
	var err error
	if cp.WKV, err = bf16Matrix(c.wkv, c.coff*c.dim, hidden); err != nil {
		return nil, err
	}
	if cp.WGate, err = bf16Matrix(c.wgate, c.coff*c.dim, hidden); err != nil {
		return nil, err
	}
	if cp.APE, err = floats(c.ape); err != nil {
		return nil, err
	}
	if cp.Norm, err = floats(c.norm); err != nil {
		return nil, err
	}
	return cp, nil
}

// element names element x of the rows job j read, by its flat index in
// the whole tensor and, for a matrix, its (row, column).
func (j *job) element(x int) string {
	rowLen := 1
	for _, d := range j.info.Shape[1:] {
		rowLen *= d
	}
	flat := j.row0*rowLen + x
	if len(j.info.Shape) == 2 {
		return fmt.Sprintf("element %d (row %d, column %d)", flat, flat/rowLen, flat%rowLen)
	}
	return fmt.Sprintf("element %d", flat)
}

func (j *job) bad(x int, value any, sentinel error) error {
	return &TensorError{Tensor: j.tensor, File: j.file, Err: fmt.Errorf("%s is %v: %w", j.element(x), value, sentinel)}
}

// fp8Matrix assembles values and scales. An e4m3 NaN byte is refused; the
// scales are widened exactly and must be finite and positive.
func fp8Matrix(j [2]*job, n, k int) (FP8Matrix, error) {
	vals, sc := j[0], j[1]
	if x, ok := firstE4M3NaN(vals.buf); ok {
		return FP8Matrix{}, vals.bad(x, fmt.Sprintf("the e4m3 NaN byte %#02x", vals.buf[x]), ErrNonFinite)
	}
	m := FP8Matrix{N: n, K: k, Data: vals.buf, Scale: make([]float32, ceil128(n)*ceil128(k))}
	switch sc.info.DType {
	case dtE8M0:
		for x, e := range sc.buf {
			if e == 0xFF {
				return FP8Matrix{}, sc.bad(x, "the e8m0 NaN byte 0xFF", ErrBadScale)
			}
			m.Scale[x] = numerics.UE8M0Scale(e)
		}
	case dtF32:
		for x := range m.Scale {
			v := math.Float32frombits(binary.LittleEndian.Uint32(sc.buf[4*x:]))
			if !(v > 0) || math.IsInf(float64(v), 0) {
				return FP8Matrix{}, sc.bad(x, v, ErrBadScale)
			}
			m.Scale[x] = v
		}
	}
	return m, nil
}

// floats widens a BF16 or F32 tensor exactly; NaN and infinities are
// refused.
func floats(j *job) ([]float32, error) {
	var out []float32
	switch j.info.DType {
	case dtBF16:
		out = make([]float32, len(j.buf)/2)
		for x := range out {
			out[x] = numerics.F32FromBF16(binary.LittleEndian.Uint16(j.buf[2*x:]))
		}
	case dtF32:
		out = make([]float32, len(j.buf)/4)
		for x := range out {
			out[x] = math.Float32frombits(binary.LittleEndian.Uint32(j.buf[4*x:]))
		}
	default:
		return nil, j.fail("dtype %s cannot be widened to float32", j.info.DType)
	}
	if x, v, ok := firstNonFinite(out); ok {
		return nil, j.bad(x, v, ErrNonFinite)
	}
	return out, nil
}

// bf16Matrix keeps a BF16 tensor's bits; NaN and infinities are refused.
func bf16Matrix(j *job, n, k int) (BF16Matrix, error) {
	out := make([]uint16, len(j.buf)/2)
	for x := range out {
		out[x] = binary.LittleEndian.Uint16(j.buf[2*x:])
	}
	if x, ok := firstNonFiniteBF16(out); ok {
		return BF16Matrix{}, j.bad(x, numerics.F32FromBF16(out[x]), ErrNonFinite)
	}
	return BF16Matrix{N: n, K: k, Data: out}, nil
}
