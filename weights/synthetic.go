package weights

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// TinyConfig is a small but valid DSv4 config for tests: hidden 256,
// q_lora_rank 256, 2 heads, 3 layers with compress ratios 0, 4 and 128 and
// one MTP layer (ratio 0). Everything else (head_dim 512, RoPE, YaRN) is
// V4-Flash's. dsv4.Config.Validate accepts it as is: validation only
// requires positive sizes, so no test-only relaxation exists.
func TinyConfig() dsv4.Config {
	c := dsv4.Flash()
	c.Name = "DeepSeek-V4-Tiny"
	c.HiddenSize = 256
	c.NumLayers = 3
	c.NumHeads = 2
	c.QLoraRank = 256
	c.NumMTPLayers = 1
	c.CompressRatios = []int{0, 4, 128, 0}
	return c
}

// ScaleFormat is how a synthetic checkpoint stores FP8 block scales.
type ScaleFormat int

const (
	ScaleF32  ScaleFormat = iota // F32 scales amax/448 per block
	ScaleE8M0                    // F8_E8M0 exponent bytes (power-of-two scales, as DeepSeek's release)
)

func (f ScaleFormat) String() string {
	switch f {
	case ScaleF32:
		return "f32"
	case ScaleE8M0:
		return "e8m0"
	}
	return fmt.Sprintf("ScaleFormat(%d)", int(f))
}

// ParseScaleFormat is the inverse of ScaleFormat.String.
func ParseScaleFormat(s string) (ScaleFormat, error) {
	switch s {
	case "f32":
		return ScaleF32, nil
	case "e8m0":
		return ScaleE8M0, nil
	}
	return 0, fmt.Errorf("weights: scale format %q: want f32 or e8m0", s)
}

// SyntheticOptions shapes what WriteSynthetic writes.
type SyntheticOptions struct {
	// Layers lists the layers to write; nil writes every layer, MTP layers
	// included. The index lists only these, so loading another fails.
	Layers      []int
	ScaleFormat ScaleFormat
	Naming      Naming
	// LayersPerShard groups layers into shard files; 0 means 2.
	LayersPerShard int
}

// SyntheticLayer generates layer i's weights as WriteSynthetic writes them
// (all heads), deterministically from seed, the layer index and the
// tensor: the same whatever other layers are generated, in whatever order,
// on however many threads. Magnitudes are a trained layer's: FP8 weights
// dequantize to about N(0, 1/in_features) with one block scale per 128x128
// block (amax/448, or the UE8M0 power of two above it); norm weights about
// 1 +- 0.1 (bf16); compressor wkv/wgate N(0, 1/hidden) in bf16; ape
// N(0, 0.02^2) in float32. A ratio-4 layer also gets its indexer (Indexer:
// wq_b like the other FP8 weights, weights_proj like the compressor's bf16
// projections, and its own compressor at width index_head_dim).
func SyntheticLayer(cfg *dsv4.Config, seed uint64, i int, format ScaleFormat) (*Layer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("weights: config: %w", err)
	}
	if format != ScaleF32 && format != ScaleE8M0 {
		return nil, fmt.Errorf("weights: unknown scale format %d", int(format))
	}
	ratio, err := cfg.CompressRatio(i)
	if err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	if ratio != 0 && ratio != 4 && ratio != 128 {
		return nil, fmt.Errorf("weights: layer %d: compress_ratio %d: only 0, 4 and 128 are supported", i, ratio)
	}
	g := gen{seed: seed, layer: i}
	l := &Layer{
		Index:         i,
		CompressRatio: ratio,
		WQA:           g.fp8(modWQA, cfg.QLoraRank, cfg.HiddenSize, format),
		WKV:           g.fp8(modWKV, LatentDim, cfg.HiddenSize, format),
		WQB:           g.fp8(modWQB, cfg.NumHeads*LatentDim, cfg.QLoraRank, format),
		QNorm:         g.norm(modQNorm, cfg.QLoraRank),
		KVNorm:        g.norm(modKVNorm, LatentDim),
	}
	if ratio != 0 {
		l.Compressor = g.compressor(mainCompressor, ratio, LatentDim, cfg.HiddenSize)
	}
	if ratio == 4 {
		n := cfg.IndexNHeads * cfg.IndexHeadDim
		l.Indexer = &IndexerWeights{
			Heads: cfg.IndexNHeads, HeadDim: cfg.IndexHeadDim,
			WQB:         g.fp8(modIdxWQB, n, cfg.QLoraRank, format),
			WeightsProj: g.bf16(modIdxProj, cfg.IndexNHeads, cfg.HiddenSize),
			Compressor:  *g.compressor(indexerCompressor, 4, cfg.IndexHeadDim, cfg.HiddenSize),
		}
	}
	return l, nil
}

// WriteSynthetic writes a synthetic checkpoint of cfg into dir (created if
// needed): config.json, model.safetensors.index.json and shards
// model-0000k-of-0000n.safetensors of opts.LayersPerShard layers each, in the
// layout Load reads, the tensors named per opts.Naming. Each layer's
// tensors are SyntheticLayer's; a per-layer attn_sink tensor, which Load
// never reads, is written too, as real shards hold more than the loader
// wants. Files are written atomically (temporary name, then rename); the
// index and config.json come last.
func WriteSynthetic(dir string, cfg *dsv4.Config, seed uint64, opts SyntheticOptions) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("weights: config: %w", err)
	}
	if opts.Naming < NamingDeepSeek || opts.Naming > NamingHFV3 {
		return fmt.Errorf("weights: unknown naming %d", int(opts.Naming))
	}
	layers := opts.Layers
	if layers == nil {
		for i := range cfg.NumAttentionLayers() {
			layers = append(layers, i)
		}
	}
	layers = slices.Clone(layers)
	sort.Ints(layers)
	for k, i := range layers {
		if i < 0 || i >= cfg.NumAttentionLayers() {
			return fmt.Errorf("weights: layer %d out of range [0, %d)", i, cfg.NumAttentionLayers())
		}
		if k > 0 && layers[k-1] == i {
			return fmt.Errorf("weights: layer %d listed twice", i)
		}
	}
	if len(layers) == 0 {
		return fmt.Errorf("weights: no layers to write")
	}
	per := opts.LayersPerShard
	if per <= 0 {
		per = 2
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	nShards := (len(layers) + per - 1) / per
	weightMap := map[string]string{}
	total := 0
	for s := range nShards {
		file := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, nShards)
		var tensors []safetensors.Tensor
		for _, i := range layers[s*per : min((s+1)*per, len(layers))] {
			l, err := SyntheticLayer(cfg, seed, i, opts.ScaleFormat)
			if err != nil {
				return err
			}
			ts, err := layerTensors(cfg, l, opts.Naming, opts.ScaleFormat, seed)
			if err != nil {
				return err
			}
			tensors = append(tensors, ts...)
		}
		for _, t := range tensors {
			weightMap[t.Name] = file
			total += len(t.Data)
		}
		meta := map[string]string{"format": "pt", "generator": "dsv4mla/prologue weights.WriteSynthetic", "seed": fmt.Sprint(seed)}
		if err := safetensors.WriteFile(filepath.Join(dir, file), tensors, meta); err != nil {
			return fmt.Errorf("weights: %s: %w", file, err)
		}
	}
	index, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": total},
		"weight_map": weightMap,
	}, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, IndexFile), index); err != nil {
		return err
	}
	conf, err := ConfigJSON(cfg)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, ConfigFile), conf)
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}

// ConfigJSON renders cfg as a HuggingFace config.json that dsv4.Parse reads
// back to the same Config (plus the architecture keys a DeepSeek-V4 release
// carries, which the parser ignores).
func ConfigJSON(cfg *dsv4.Config) ([]byte, error) {
	rs := cfg.RopeScaling
	m := map[string]any{
		"architectures":            []string{"DeepseekV4ForCausalLM"},
		"model_type":               "deepseek_v4",
		"hidden_size":              cfg.HiddenSize,
		"num_hidden_layers":        cfg.NumLayers,
		"num_attention_heads":      cfg.NumHeads,
		"num_key_value_heads":      cfg.NumKVHeads,
		"q_lora_rank":              cfg.QLoraRank,
		"kv_lora_rank":             cfg.KVLoraRank,
		"head_dim":                 cfg.HeadDim,
		"qk_rope_head_dim":         cfg.QKRopeHeadDim,
		"rms_norm_eps":             cfg.RMSNormEps,
		"rope_theta":               cfg.RopeTheta,
		"compress_rope_theta":      cfg.CompressRopeTheta,
		"max_position_embeddings":  cfg.MaxPositionEmbeddings,
		"num_nextn_predict_layers": cfg.NumMTPLayers,
		"compress_ratios":          cfg.CompressRatios,
		"rope_scaling": map[string]any{
			"type":                             rs.Type,
			"factor":                           rs.Factor,
			"original_max_position_embeddings": rs.OriginalMaxPositionEmbeddings,
			"beta_fast":                        rs.BetaFast,
			"beta_slow":                        rs.BetaSlow,
			"mscale":                           rs.MScale,
			"mscale_all_dim":                   rs.MScaleAllDim,
		},
		"quantization_config": map[string]any{
			"quant_method":      cfg.Quant.Method,
			"fmt":               cfg.Quant.Fmt,
			"scale_fmt":         cfg.Quant.ScaleFmt,
			"activation_scheme": cfg.Quant.ActivationScheme,
			"weight_block_size": []int{cfg.Quant.BlockRows, cfg.Quant.BlockCols},
		},
	}
	if cfg.IndexNHeads != 0 || cfg.IndexHeadDim != 0 || cfg.IndexTopK != 0 {
		m["index_n_heads"] = cfg.IndexNHeads
		m["index_head_dim"] = cfg.IndexHeadDim
		m["index_topk"] = cfg.IndexTopK
	}
	if cfg.Name != "" {
		m["_name_or_path"] = cfg.Name
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("weights: config.json: %w", err)
	}
	return append(out, '\n'), nil
}

// layerTensors serializes a layer under the naming's spellings.
func layerTensors(cfg *dsv4.Config, l *Layer, naming Naming, format ScaleFormat, seed uint64) ([]safetensors.Tensor, error) {
	i := l.Index
	var ts []safetensors.Tensor
	addFP8 := func(m module, w *FP8Matrix) error {
		ts = append(ts, safetensors.Tensor{Name: naming.name(cfg, i, m, false), DType: dtE4M3, Shape: []int{w.N, w.K}, Data: w.Data})
		s := safetensors.Tensor{Name: naming.name(cfg, i, m, true), Shape: []int{w.ScaleRows(), w.ScaleCols()}}
		if format == ScaleE8M0 {
			s.DType = dtE8M0
			s.Data = make([]byte, len(w.Scale))
			for x, v := range w.Scale {
				e, ok := e8m0Exponent(v)
				if !ok {
					return fmt.Errorf("weights: layer %d %s: scale %v is not a power of two e8m0 can hold", i, m.key, v)
				}
				s.Data[x] = e
			}
		} else {
			s.DType, s.Data = dtF32, numerics.F32Bytes(w.Scale)
		}
		ts = append(ts, s)
		return nil
	}
	bf16 := func(m module, v []float32) {
		b := make([]byte, 2*len(v))
		for x, f := range v {
			binary.LittleEndian.PutUint16(b[2*x:], numerics.BF16FromF32(f))
		}
		ts = append(ts, safetensors.Tensor{Name: naming.name(cfg, i, m, false), DType: dtBF16, Shape: []int{len(v)}, Data: b})
	}
	bf16Matrix := func(m module, w *BF16Matrix) {
		b := make([]byte, 2*len(w.Data))
		for x, u := range w.Data {
			binary.LittleEndian.PutUint16(b[2*x:], u)
		}
		ts = append(ts, safetensors.Tensor{Name: naming.name(cfg, i, m, false), DType: dtBF16, Shape: []int{w.N, w.K}, Data: b})
	}
	for _, f := range []struct {
		m module
		w *FP8Matrix
	}{{modWQA, &l.WQA}, {modWKV, &l.WKV}, {modWQB, &l.WQB}} {
		if err := addFP8(f.m, f.w); err != nil {
			return nil, err
		}
	}
	bf16(modQNorm, l.QNorm)
	bf16(modKVNorm, l.KVNorm)
	compressor := func(mods compressorModules, c *Compressor) {
		bf16Matrix(mods.wkv, &c.WKV)
		bf16Matrix(mods.wgate, &c.WGate)
		ts = append(ts, safetensors.Tensor{Name: naming.name(cfg, i, mods.ape, false), DType: dtF32,
			Shape: []int{c.Ratio, c.Coff * c.Dim}, Data: numerics.F32Bytes(c.APE)})
		bf16(mods.norm, c.Norm)
	}
	if c := l.Compressor; c != nil {
		compressor(mainCompressor, c)
	}
	if x := l.Indexer; x != nil {
		if err := addFP8(modIdxWQB, &x.WQB); err != nil {
			return nil, err
		}
		bf16Matrix(modIdxProj, &x.WeightsProj)
		compressor(indexerCompressor, &x.Compressor)
	}
	// A tensor the loader never reads.
	sinkPrefix := naming.name(cfg, i, module{key: "attn_sink", hf: "sinks", v3: "sinks", param: true}, false)
	g := gen{seed: seed, layer: i}
	ts = append(ts, safetensors.Tensor{Name: sinkPrefix, DType: dtF32, Shape: []int{cfg.NumHeads},
		Data: numerics.F32Bytes(g.f32(module{key: "attn_sink"}, cfg.NumHeads, 1))})
	return ts, nil
}

// e8m0Exponent returns e with 2^(e-127) == v exactly, if there is one.
func e8m0Exponent(v float32) (uint8, bool) {
	bits := math.Float32bits(v)
	if exp := bits >> 23; bits&0x7FFFFF == 0 && exp >= 1 && exp <= 254 {
		return uint8(exp), true
	}
	if v == numerics.UE8M0Scale(0) {
		return 0, true
	}
	return 0, false
}

// gen draws one layer's synthetic tensors. Each tensor (and each 128-row
// block of a large one) has its own stream, seeded from the seed, the layer
// and the tensor's DeepSeek name, so output never depends on what else is
// generated or on the thread count.
type gen struct {
	seed  uint64
	layer int
}

func (g gen) stream(m module, block int) rng {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", g.layer, m.key, block)
	return rng{state: splitmix(g.seed ^ h.Sum64())}
}

// fp8 quantizes N(0, 1/k) values block by block, block rows in parallel.
func (g gen) fp8(m module, n, k int, format ScaleFormat) FP8Matrix {
	w := FP8Matrix{N: n, K: k, Data: make([]byte, n*k)}
	w.Scale = make([]float32, w.ScaleRows()*w.ScaleCols())
	sigma := float32(1 / math.Sqrt(float64(k)))
	sc := w.ScaleCols()
	parallelFor(w.ScaleRows(), func(br int) {
		r := g.stream(m, br)
		row0, row1 := br*128, min(br*128+128, n)
		vals := make([]float32, (row1-row0)*k)
		for x := range vals {
			vals[x] = float32(r.gauss() * sigma)
		}
		for bc := range sc {
			col0, col1 := bc*128, min(bc*128+128, k)
			var amax float32
			for rr := row0; rr < row1; rr++ {
				amax = max(amax, numerics.GroupAbsMax(vals[(rr-row0)*k+col0:(rr-row0)*k+col1]))
			}
			var scale, inv float32
			if format == ScaleE8M0 {
				var e uint8
				e, inv = numerics.UE8M0(amax)
				scale = numerics.UE8M0Scale(e)
			} else {
				scale = float32(max(amax, numerics.UE8M0Floor) / numerics.E4M3Max)
				inv = float32(1 / scale)
			}
			w.Scale[br*sc+bc] = scale
			for rr := row0; rr < row1; rr++ {
				for c := col0; c < col1; c++ {
					if format == ScaleE8M0 {
						w.Data[rr*k+c] = numerics.E4M3FromF32(float32(vals[(rr-row0)*k+c] * inv))
					} else {
						w.Data[rr*k+c] = numerics.E4M3FromF32(float32(vals[(rr-row0)*k+c] / scale))
					}
				}
			}
		}
	})
	return w
}

// norm draws bf16 values 1 + 0.1 N(0, 1), returned widened.
func (g gen) norm(m module, n int) []float32 {
	r := g.stream(m, 0)
	out := make([]float32, n)
	for x := range out {
		out[x] = numerics.RoundBF16(float32(1 + float32(0.1*r.gauss())))
	}
	return out
}

// bf16 draws an [n][k] bf16 matrix of N(0, 1/k) values.
func (g gen) bf16(m module, n, k int) BF16Matrix {
	w := BF16Matrix{N: n, K: k, Data: make([]uint16, n*k)}
	sigma := float32(1 / math.Sqrt(float64(k)))
	parallelFor((n+127)/128, func(br int) {
		r := g.stream(m, br)
		for x := br * 128 * k; x < min(br*128+128, n)*k; x++ {
			w.Data[x] = numerics.BF16FromF32(float32(r.gauss() * sigma))
		}
	})
	return w
}

// compressor draws one compressor's weights at entry width dim.
func (g gen) compressor(mods compressorModules, ratio, dim, hidden int) *Compressor {
	coff := 1
	if ratio == 4 {
		coff = 2
	}
	return &Compressor{
		Ratio: ratio, Coff: coff, Dim: dim,
		WKV:   g.bf16(mods.wkv, coff*dim, hidden),
		WGate: g.bf16(mods.wgate, coff*dim, hidden),
		APE:   g.f32(mods.ape, ratio*coff*dim, 0.02),
		Norm:  g.norm(mods.norm, dim),
	}
}

// f32 draws n float32 values N(0, sigma^2).
func (g gen) f32(m module, n int, sigma float32) []float32 {
	r := g.stream(m, 0)
	out := make([]float32, n)
	for x := range out {
		out[x] = float32(r.gauss() * sigma)
	}
	return out
}

// parallelFor runs f(0..n-1) on up to GOMAXPROCS goroutines.
func parallelFor(n int, f func(int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// rng is splitmix64: tiny, fast and well mixed, plenty for test weights.
type rng struct{ state uint64 }

func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}

func (r *rng) next() uint64 {
	r.state += 0x9E3779B97F4A7C15
	return splitmix(r.state)
}

// gauss approximates N(0, 1) by the sum of four 16-bit uniforms (Irwin-Hall),
// centred and scaled: one draw per value, bounded tails (|g| < 3.47).
func (r *rng) gauss() float32 {
	x := r.next()
	s := x&0xFFFF + x>>16&0xFFFF + x>>32&0xFFFF + x>>48
	// mean 4*65535/2; std sqrt(4*(65536^2-1)/12)
	return float32(float32(float64(s)-131070) / 37837.23)
}
