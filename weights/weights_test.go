package weights

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// oddConfig has sizes that are not multiples of 128 (scale grids with a
// partial last block) and 3 heads.
func oddConfig() dsv4.Config {
	c := TinyConfig()
	c.Name = "odd"
	c.HiddenSize = 320
	c.QLoraRank = 192
	c.NumHeads = 3
	c.NumLayers = 2
	c.CompressRatios = []int{128, 4, 0}
	c.IndexNHeads = 3
	c.IndexTopK = 7
	return c
}

func testSeed(t testing.TB) uint64 {
	seed := uint64(0x5eed0000) + uint64(len(t.Name()))*7919
	t.Logf("seed %#x", seed)
	return seed
}

// write writes a synthetic checkpoint and returns its directory.
func write(t testing.TB, cfg dsv4.Config, seed uint64, opts SyntheticOptions) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, WriteSynthetic(dir, &cfg, seed, opts))
	return dir
}

func TestRoundTrip(t *testing.T) {
	tiny, odd := TinyConfig(), oddConfig()
	for _, c := range []struct {
		cfg    dsv4.Config
		format ScaleFormat
		naming Naming
	}{
		{tiny, ScaleF32, NamingDeepSeek},
		{tiny, ScaleE8M0, NamingDeepSeek},
		{odd, ScaleF32, NamingDeepSeek},
		{odd, ScaleE8M0, NamingVLLM},
		{tiny, ScaleE8M0, NamingHF},
		{tiny, ScaleF32, NamingHFV3},
	} {
		cfg := c.cfg
		t.Run(fmt.Sprintf("%s/%v/%v", cfg.Name, c.format, c.naming), func(t *testing.T) {
			seed := testSeed(t)
			dir := write(t, cfg, seed, SyntheticOptions{ScaleFormat: c.format, Naming: c.naming, LayersPerShard: 1})
			ck, err := Load(dir, nil, LoadOptions{MTP: true})
			require.NoError(t, err)
			require.Equal(t, cfg, ck.Config, "config.json round trip")
			require.Equal(t, HeadRange{0, cfg.NumHeads}, ck.Heads)
			require.Len(t, ck.Layers, cfg.NumAttentionLayers())
			for i, got := range ck.Layers {
				want, err := SyntheticLayer(&cfg, seed, i, c.format)
				require.NoError(t, err)
				require.Equal(t, want, got, "layer %d", i)
				require.Same(t, got, ck.Layer(i))
				ratio, _ := cfg.CompressRatio(i)
				require.Equal(t, ratio != 0, got.Compressor != nil)
				require.Equal(t, ratio == 4, got.Indexer != nil, "layer %d (ratio %d): the indexer is a ratio-4 layer's", i, ratio)
				if x := got.Indexer; x != nil {
					require.Equal(t, cfg.IndexNHeads*cfg.IndexHeadDim, x.WQB.N)
					require.Equal(t, []int{cfg.IndexNHeads, cfg.HiddenSize}, []int{x.WeightsProj.N, x.WeightsProj.K})
					require.Equal(t, []int{4, 2, 128}, []int{x.Compressor.Ratio, x.Compressor.Coff, x.Compressor.Dim})
				}
			}
			require.Nil(t, ck.Layer(cfg.NumAttentionLayers()))
		})
	}
}

// TestRawBytes checks the loader against the shard's bytes decoded
// independently of the writer: e4m3 data as stored, e8m0 bytes as
// 2^(e-127) via math.Ldexp, F32 scales as stored, bf16 norms widened.
func TestRawBytes(t *testing.T) {
	cfg := TinyConfig()
	for _, format := range []ScaleFormat{ScaleF32, ScaleE8M0} {
		t.Run(format.String(), func(t *testing.T) {
			dir := write(t, cfg, testSeed(t), SyntheticOptions{ScaleFormat: format, LayersPerShard: 4})
			ck, err := Load(dir, nil, LoadOptions{Layers: []int{1}})
			require.NoError(t, err)
			l := ck.Layers[0]
			data, err := os.ReadFile(filepath.Join(dir, "model-00001-of-00001.safetensors"))
			require.NoError(t, err)
			ts, _, err := safetensors.Read(data)
			require.NoError(t, err)
			byName := map[string]safetensors.Tensor{}
			for _, x := range ts {
				byName[x.Name] = x
			}
			wqb := byName["layers.1.attn.wq_b.weight"]
			require.Equal(t, "F8_E4M3", wqb.DType)
			require.Equal(t, wqb.Data, l.WQB.Data)
			sc := byName["layers.1.attn.wq_b.scale"]
			require.Equal(t, []int{8, 2}, sc.Shape)
			for x, v := range l.WQB.Scale {
				var want float32
				if format == ScaleE8M0 {
					require.Equal(t, "F8_E8M0", sc.DType)
					want = float32(math.Ldexp(1, int(sc.Data[x])-127))
				} else {
					require.Equal(t, "F32", sc.DType)
					want = math.Float32frombits(binary.LittleEndian.Uint32(sc.Data[4*x:]))
				}
				require.Equal(t, want, v, "scale %d", x)
			}
			qn := byName["layers.1.attn.q_norm.weight"]
			require.Equal(t, "BF16", qn.DType)
			for x, v := range l.QNorm {
				require.Equal(t, math.Float32frombits(uint32(binary.LittleEndian.Uint16(qn.Data[2*x:]))<<16), v)
			}
			ape := byName["layers.1.attn.compressor.ape"]
			require.Equal(t, []int{4, 1024}, ape.Shape)
			require.Equal(t, numerics.F32Bytes(l.Compressor.APE), ape.Data)
			require.Equal(t, 2, l.Compressor.Coff)
			require.Equal(t, 1024, l.Compressor.WKV.N)
			wg := byName["layers.1.attn.compressor.wgate.weight"]
			require.Equal(t, "BF16", wg.DType)
			require.Equal(t, binary.LittleEndian.Uint16(wg.Data[2*777:]), l.Compressor.WGate.Data[777])
			require.Contains(t, byName, "layers.1.attn.attn_sink")

			// The indexer, in DeepSeek's published names and layout.
			x := l.Indexer
			require.NotNil(t, x)
			iq := byName["layers.1.attn.indexer.wq_b.weight"]
			require.Equal(t, "F8_E4M3", iq.DType)
			require.Equal(t, []int{64 * 128, 256}, iq.Shape)
			require.Equal(t, iq.Data, x.WQB.Data)
			is := byName["layers.1.attn.indexer.wq_b.scale"]
			require.Equal(t, []int{64, 2}, is.Shape)
			for k, v := range x.WQB.Scale {
				var want float32
				if format == ScaleE8M0 {
					require.Equal(t, "F8_E8M0", is.DType)
					want = float32(math.Ldexp(1, int(is.Data[k])-127))
				} else {
					want = math.Float32frombits(binary.LittleEndian.Uint32(is.Data[4*k:]))
				}
				require.Equal(t, want, v, "indexer wq_b scale %d", k)
			}
			wp := byName["layers.1.attn.indexer.weights_proj.weight"]
			require.Equal(t, "BF16", wp.DType)
			require.Equal(t, []int{64, 256}, wp.Shape)
			for k, u := range x.WeightsProj.Data {
				require.Equal(t, binary.LittleEndian.Uint16(wp.Data[2*k:]), u, "weights_proj %d", k)
			}
			for _, name := range []string{"wkv", "wgate"} {
				w := byName["layers.1.attn.indexer.compressor."+name+".weight"]
				require.Equal(t, "BF16", w.DType)
				require.Equal(t, []int{2 * 128, 256}, w.Shape, name)
			}
			require.Equal(t, binary.LittleEndian.Uint16(byName["layers.1.attn.indexer.compressor.wkv.weight"].Data[2*300:]), x.Compressor.WKV.Data[300])
			ia := byName["layers.1.attn.indexer.compressor.ape"]
			require.Equal(t, "F32", ia.DType)
			require.Equal(t, []int{4, 256}, ia.Shape)
			require.Equal(t, numerics.F32Bytes(x.Compressor.APE), ia.Data)
			in := byName["layers.1.attn.indexer.compressor.norm.weight"]
			require.Equal(t, "BF16", in.DType)
			require.Equal(t, []int{128}, in.Shape)
			for k, v := range x.Compressor.Norm {
				require.Equal(t, math.Float32frombits(uint32(binary.LittleEndian.Uint16(in.Data[2*k:]))<<16), v)
			}
			// Only the ratio-4 layer has one.
			for name := range byName {
				require.False(t, strings.Contains(name, "indexer") && !strings.HasPrefix(name, "layers.1."), "%s: only layer 1 is ratio 4", name)
			}
		})
	}
}

// stdOf returns the mean and standard deviation of f(0..n-1).
func stdOf(n int, f func(int) float32) (mean, std float64) {
	var s, s2 float64
	for i := range n {
		v := float64(f(i))
		s += v
		s2 += v * v
	}
	mean = s / float64(n)
	return mean, math.Sqrt(s2/float64(n) - mean*mean)
}

func TestSyntheticMagnitudes(t *testing.T) {
	cfg := TinyConfig()
	for _, format := range []ScaleFormat{ScaleF32, ScaleE8M0} {
		l, err := SyntheticLayer(&cfg, testSeed(t), 1, format)
		require.NoError(t, err)
		for _, w := range []*FP8Matrix{&l.WQA, &l.WKV, &l.WQB, &l.Indexer.WQB} {
			_, std := stdOf(w.N*w.K, func(x int) float32 { return w.Dequant(x/w.K, x%w.K) })
			require.InEpsilon(t, 1/math.Sqrt(float64(w.K)), std, 0.05, "%v %dx%d", format, w.N, w.K)
			for _, s := range w.Scale {
				require.Greater(t, s, float32(0))
				if format == ScaleE8M0 {
					_, ok := e8m0Exponent(s)
					require.True(t, ok, "%v is a power of two", s)
				}
			}
		}
		mean, std := stdOf(len(l.QNorm), func(x int) float32 { return l.QNorm[x] })
		require.InDelta(t, 1, mean, 0.03)
		require.InDelta(t, 0.1, std, 0.02)
		_, std = stdOf(len(l.Compressor.APE), func(x int) float32 { return l.Compressor.APE[x] })
		require.InEpsilon(t, 0.02, std, 0.1)
		wkv := &l.Compressor.WKV
		_, std = stdOf(len(wkv.Data), func(x int) float32 { return wkv.At(x/wkv.K, x%wkv.K) })
		require.InEpsilon(t, 1/math.Sqrt(float64(cfg.HiddenSize)), std, 0.05)
		// The indexer's bf16 weights and its compressor look the same.
		for _, m := range []*BF16Matrix{&l.Indexer.WeightsProj, &l.Indexer.Compressor.WKV, &l.Indexer.Compressor.WGate} {
			_, std = stdOf(len(m.Data), func(x int) float32 { return m.At(x/m.K, x%m.K) })
			require.InEpsilon(t, 1/math.Sqrt(float64(cfg.HiddenSize)), std, 0.1, "%dx%d", m.N, m.K)
		}
		_, std = stdOf(len(l.Indexer.Compressor.APE), func(x int) float32 { return l.Indexer.Compressor.APE[x] })
		require.InEpsilon(t, 0.02, std, 0.15)
		mean, _ = stdOf(len(l.Indexer.Compressor.Norm), func(x int) float32 { return l.Indexer.Compressor.Norm[x] })
		require.InDelta(t, 1, mean, 0.05)
		// Its own streams: not a copy of the main compressor's rows.
		require.NotEqual(t, l.Compressor.WKV.Data[:256*256], l.Indexer.Compressor.WKV.Data)
	}
	// An F32 block scale is amax/448: some element of each block encodes
	// to +-448 (0x7E/0xFE).
	l, err := SyntheticLayer(&cfg, 1, 0, ScaleF32)
	require.NoError(t, err)
	w := l.WQA
	for br := range w.ScaleRows() {
		for bc := range w.ScaleCols() {
			hit := false
			for r := br * 128; r < min(br*128+128, w.N); r++ {
				for c := bc * 128; c < min(bc*128+128, w.K); c++ {
					hit = hit || w.Data[r*w.K+c]&0x7F == 0x7E
				}
			}
			require.True(t, hit, "block (%d,%d)", br, bc)
		}
	}
}

func TestSyntheticDeterminism(t *testing.T) {
	cfg := oddConfig()
	a, err := SyntheticLayer(&cfg, 7, 1, ScaleE8M0)
	require.NoError(t, err)
	prev := runtime.GOMAXPROCS(1)
	b, err := SyntheticLayer(&cfg, 7, 1, ScaleE8M0)
	runtime.GOMAXPROCS(prev)
	require.NoError(t, err)
	require.Equal(t, a, b, "independent of the thread count")
	c, err := SyntheticLayer(&cfg, 8, 1, ScaleE8M0)
	require.NoError(t, err)
	require.NotEqual(t, a.WQB.Data, c.WQB.Data, "the seed matters")
	require.NotEqual(t, a.WQA.Data[:100], a.WKV.Data[:100], "tensors have their own streams")

	// Writing a subset of the layers gives the same layer bytes.
	all := write(t, cfg, 7, SyntheticOptions{})
	one := write(t, cfg, 7, SyntheticOptions{Layers: []int{1}})
	x, err := Load(all, nil, LoadOptions{Layers: []int{1}})
	require.NoError(t, err)
	y, err := Load(one, nil, LoadOptions{Layers: []int{1}})
	require.NoError(t, err)
	require.Equal(t, x, y)
}

func TestHeadRange(t *testing.T) {
	cfg := oddConfig() // 3 heads, q_lora 192: wq_b is [1536, 192], scales [12, 2]
	seed := testSeed(t)
	dir := write(t, cfg, seed, SyntheticOptions{ScaleFormat: ScaleF32})
	full, err := SyntheticLayer(&cfg, seed, 0, ScaleF32)
	require.NoError(t, err)
	for _, r := range []HeadRange{{0, 1}, {1, 2}, {2, 3}, {1, 3}, {0, 3}} {
		ck, err := Load(dir, nil, LoadOptions{Layers: []int{0}, Heads: r})
		require.NoError(t, err, "%v", r)
		require.Equal(t, r, ck.Heads)
		w := ck.Layers[0].WQB
		require.Equal(t, r.Len()*512, w.N)
		require.Equal(t, 192, w.K)
		require.Equal(t, full.WQB.Data[r.Begin*512*192:r.End*512*192], w.Data, "%v", r)
		require.Equal(t, full.WQB.Scale[r.Begin*4*2:r.End*4*2], w.Scale, "%v", r)
		require.Equal(t, full.WQA, ck.Layers[0].WQA, "wq_a is not head-sharded")
	}
	// The indexer is replicated: a rank of one head still loads all of it.
	fullIdx, err := SyntheticLayer(&cfg, seed, 1, ScaleF32)
	require.NoError(t, err)
	ck, err := Load(dir, nil, LoadOptions{Layers: []int{1}, Heads: HeadRange{2, 3}})
	require.NoError(t, err)
	require.Equal(t, fullIdx.Indexer, ck.Layers[0].Indexer, "the indexer is not head-sharded")
	require.Equal(t, 3*128, ck.Layers[0].Indexer.WQB.N)
	for _, r := range []HeadRange{{-1, 1}, {1, 1}, {2, 1}, {0, 4}, {3, 4}} {
		ck, err := Load(dir, nil, LoadOptions{Heads: r})
		require.ErrorContains(t, err, fmt.Sprintf("head range [%d, %d)", r.Begin, r.End))
		require.Nil(t, ck)
	}
}

func TestOnlyAskedLayersAreRead(t *testing.T) {
	cfg := TinyConfig()
	seed := testSeed(t)
	dir := write(t, cfg, seed, SyntheticOptions{LayersPerShard: 1})
	// Layer 0's shard is garbage, layer 2's is gone: layers 1 and 3 load.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model-00001-of-00004.safetensors"), []byte("garbage"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "model-00003-of-00004.safetensors")))
	ck, err := Load(dir, nil, LoadOptions{Layers: []int{1, 3}})
	require.NoError(t, err)
	for _, l := range ck.Layers {
		want, err := SyntheticLayer(&cfg, seed, l.Index, ScaleF32)
		require.NoError(t, err)
		require.Equal(t, want, l)
	}
	// The default (all main layers) meets both.
	_, err = Load(dir, nil, LoadOptions{})
	require.ErrorContains(t, err, "model-00001-of-00004.safetensors")
}

func TestLayerSelection(t *testing.T) {
	cfg := TinyConfig()
	dir := write(t, cfg, testSeed(t), SyntheticOptions{})
	ck, err := Load(dir, &cfg, LoadOptions{})
	require.NoError(t, err)
	require.Equal(t, []int{0, 1, 2}, layerIndices(ck))
	ck, err = Load(dir, &cfg, LoadOptions{Layers: []int{2, 0}, MTP: true})
	require.NoError(t, err)
	require.Equal(t, []int{0, 2, 3}, layerIndices(ck))
	ck, err = Load(dir, &cfg, LoadOptions{Layers: []int{3}, MTP: true})
	require.NoError(t, err)
	require.Equal(t, []int{3}, layerIndices(ck))
	require.Equal(t, 0, ck.Layers[0].CompressRatio)

	bad := cfg
	bad.CompressRatios = []int{0, 4, 64, 0}
	for _, c := range []struct {
		cfg  *dsv4.Config
		opts LoadOptions
		want string
	}{
		{&cfg, LoadOptions{Layers: []int{4}}, "layer 4 out of range [0, 4)"},
		{&cfg, LoadOptions{Layers: []int{-1}}, "layer -1 out of range"},
		{&cfg, LoadOptions{Layers: []int{1, 1}}, "layer 1 asked for twice"},
		{&cfg, LoadOptions{Layers: []int{}}, "no layers"},
		{&bad, LoadOptions{Layers: []int{2}}, "config.json disagrees with the model config given (given vs config.json): dsv4: configs disagree on compress_ratios[2] (64 vs 128)"},
		{&dsv4.Config{}, LoadOptions{}, "hidden_size"},
	} {
		ck, err := Load(dir, c.cfg, c.opts)
		require.ErrorContains(t, err, c.want)
		require.Nil(t, ck)
	}
	// Without a config.json the given config is all there is.
	require.NoError(t, os.Remove(filepath.Join(dir, ConfigFile)))
	_, err = Load(dir, &bad, LoadOptions{Layers: []int{2}})
	require.ErrorContains(t, err, "compress_ratio 64: only 0, 4 and 128 are supported")
	ck, err = Load(dir, &cfg, LoadOptions{Layers: []int{2}})
	require.NoError(t, err)
	require.Equal(t, []int{2}, layerIndices(ck))
}

func layerIndices(ck *Checkpoint) []int {
	var out []int
	for _, l := range ck.Layers {
		out = append(out, l.Index)
	}
	return out
}

// rewriteShard rewrites the shard holding tensor name, letting edit change
// its tensor list.
func rewriteShard(t *testing.T, dir, name string, edit func([]safetensors.Tensor) []safetensors.Tensor) string {
	t.Helper()
	file := readIndexMap(t, dir)[name]
	path := filepath.Join(dir, file)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	ts, meta, err := safetensors.Read(data)
	require.NoError(t, err)
	for k := range ts {
		ts[k].Data = slices.Clone(ts[k].Data)
	}
	require.NoError(t, safetensors.WriteFile(path, edit(ts), meta))
	return file
}

func editTensor(name string, f func(*safetensors.Tensor)) func([]safetensors.Tensor) []safetensors.Tensor {
	return func(ts []safetensors.Tensor) []safetensors.Tensor {
		for k := range ts {
			if ts[k].Name == name {
				f(&ts[k])
			}
		}
		return ts
	}
}

func readIndexMap(t *testing.T, dir string) map[string]string {
	t.Helper()
	x, err := ReadIndex(dir)
	require.NoError(t, err)
	return x.WeightMap
}

func writeIndexMap(t *testing.T, dir string, m map[string]string) {
	t.Helper()
	data, err := json.Marshal(map[string]any{"weight_map": m})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), data, 0o644))
}

// rewriteHeader replaces the JSON header of a shard, keeping its data.
func rewriteHeader(t *testing.T, dir, file string, edit func(map[string]map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, file)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	hl := binary.LittleEndian.Uint64(data)
	var h map[string]map[string]any
	require.NoError(t, json.Unmarshal(data[8:8+hl], &h))
	edit(h)
	hj, err := json.Marshal(h)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, binary.Write(&out, binary.LittleEndian, uint64(len(hj))))
	out.Write(hj)
	out.Write(data[8+hl:])
	require.NoError(t, os.WriteFile(path, out.Bytes(), 0o644))
}

func TestRefusals(t *testing.T) {
	const shard2 = "model-00002-of-00002.safetensors" // layers 2 and 3
	const l1shard = "model-00001-of-00002.safetensors"
	cases := []struct {
		name   string
		format ScaleFormat
		edit   func(t *testing.T, dir string)
		tensor string // "" when the error is not about one tensor
		file   string
		want   string
	}{
		{name: "missing tensor", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			delete(m, "layers.1.attn.wq_a.weight")
			writeIndexMap(t, dir, m)
		}, tensor: "layers.1.attn.wq_a.weight", file: IndexFile, want: "missing"},
		{name: "missing compressor tensor", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			delete(m, "layers.2.attn.compressor.ape")
			writeIndexMap(t, dir, m)
		}, tensor: "layers.2.attn.compressor.ape", file: IndexFile, want: "missing"},
		{name: "missing indexer tensor", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			delete(m, "layers.1.attn.indexer.weights_proj.weight")
			writeIndexMap(t, dir, m)
		}, tensor: "layers.1.attn.indexer.weights_proj.weight", file: IndexFile, want: "missing"},
		{name: "missing indexer compressor norm", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			delete(m, "layers.1.attn.indexer.compressor.norm.weight")
			writeIndexMap(t, dir, m)
		}, tensor: "layers.1.attn.indexer.compressor.norm.weight", file: IndexFile, want: "missing"},
		{name: "missing indexer scale", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			delete(m, "layers.1.attn.indexer.wq_b.scale")
			writeIndexMap(t, dir, m)
		}, tensor: "layers.1.attn.indexer.wq_b.scale", file: IndexFile, want: "missing"},
		{name: "indexer wq_b heads", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.indexer.wq_b.weight", editTensor("layers.1.attn.indexer.wq_b.weight", func(x *safetensors.Tensor) { x.Shape = []int{32 * 128, 512} }))
		}, tensor: "layers.1.attn.indexer.wq_b.weight", file: l1shard, want: "shape [4096 512], want [8192 256] = [index_n_heads*index_head_dim, q_lora_rank]"},
		{name: "indexer weights_proj shape", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.indexer.weights_proj.weight", editTensor("layers.1.attn.indexer.weights_proj.weight", func(x *safetensors.Tensor) { x.Shape = []int{128, 128} }))
		}, tensor: "layers.1.attn.indexer.weights_proj.weight", file: l1shard, want: "shape [128 128], want [64 256] = [index_n_heads, hidden_size]"},
		{name: "indexer compressor width", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.indexer.compressor.wkv.weight", editTensor("layers.1.attn.indexer.compressor.wkv.weight", func(x *safetensors.Tensor) { x.Shape = []int{128, 512} }))
		}, tensor: "layers.1.attn.indexer.compressor.wkv.weight", file: l1shard, want: "want [256 256] = [2*index_head_dim (coff 2 for ratio 4), hidden_size]"},
		{name: "indexer ape shape", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.indexer.compressor.ape", editTensor("layers.1.attn.indexer.compressor.ape", func(x *safetensors.Tensor) { x.Shape = []int{4, 1024}; x.Data = make([]byte, 4*1024*4) }))
		}, tensor: "layers.1.attn.indexer.compressor.ape", file: l1shard, want: "shape [4 1024], want [4 256]"},
		{name: "indexer weights_proj dtype", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.indexer.weights_proj.weight", editTensor("layers.1.attn.indexer.weights_proj.weight", func(x *safetensors.Tensor) { x.DType = "F16" }))
		}, tensor: "layers.1.attn.indexer.weights_proj.weight", file: l1shard, want: "dtype F16, want BF16"},
		{name: "missing scale", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			delete(m, "layers.0.attn.wkv.scale")
			writeIndexMap(t, dir, m)
		}, tensor: "layers.0.attn.wkv.scale", file: IndexFile, want: "missing"},
		{name: "ambiguous spelling", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			m["model.layers.1.self_attn.q_a_proj.weight"] = l1shard
			writeIndexMap(t, dir, m)
		}, tensor: "layers.1.attn.wq_a.weight", file: IndexFile, want: "ambiguous"},
		{name: "index points at a missing file", edit: func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, shard2)))
		}, tensor: "layers.2.attn.wq_a.weight", file: shard2, want: "cannot be opened"},
		{name: "shard header lacks the tensor", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.kv_norm.weight", editTensor("layers.1.attn.kv_norm.weight", func(x *safetensors.Tensor) { x.Name = "layers.1.attn.kv_norm.w" }))
		}, tensor: "layers.1.attn.kv_norm.weight", file: l1shard, want: "header does not list it"},
		{name: "truncated shard", edit: func(t *testing.T, dir string) {
			path := filepath.Join(dir, shard2)
			st, err := os.Stat(path)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(path, st.Size()-100))
		}, tensor: "layers.2.attn.wq_a.weight", file: shard2, want: "reach past"},
		{name: "wrong weight dtype", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.wq_b.weight", editTensor("layers.1.attn.wq_b.weight", func(x *safetensors.Tensor) { x.DType = "I8" }))
		}, tensor: "layers.1.attn.wq_b.weight", file: l1shard, want: "dtype I8, want F8_E4M3"},
		{name: "wrong norm dtype", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.0.attn.q_norm.weight", editTensor("layers.0.attn.q_norm.weight", func(x *safetensors.Tensor) { x.DType = "F16" }))
		}, tensor: "layers.0.attn.q_norm.weight", file: l1shard, want: "dtype F16, want BF16 or F32"},
		{name: "wrong compressor dtype", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.2.attn.compressor.wkv.weight", editTensor("layers.2.attn.compressor.wkv.weight", func(x *safetensors.Tensor) { x.DType = "F16" }))
		}, tensor: "layers.2.attn.compressor.wkv.weight", file: shard2, want: "dtype F16, want BF16"},
		{name: "wrong scale dtype", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.0.attn.wq_a.scale", editTensor("layers.0.attn.wq_a.scale", func(x *safetensors.Tensor) { x.DType = "I32" }))
		}, tensor: "layers.0.attn.wq_a.scale", file: l1shard, want: "dtype I32, want F32 or F8_E8M0"},
		{name: "weight shape", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.wkv.weight", editTensor("layers.1.attn.wkv.weight", func(x *safetensors.Tensor) { x.Shape = []int{256, 512} }))
		}, tensor: "layers.1.attn.wkv.weight", file: l1shard, want: "shape [256 512], want [512 256] = [head_dim, hidden_size]"},
		{name: "scale shape", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.wq_b.scale", editTensor("layers.1.attn.wq_b.scale", func(x *safetensors.Tensor) {
				x.Shape = []int{8, 3}
				x.Data = append(x.Data, make([]byte, 8*4)...)
			}))
		}, tensor: "layers.1.attn.wq_b.scale", file: l1shard, want: "shape [8 3], want [8 2]"},
		{name: "ape shape", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.2.attn.compressor.ape", editTensor("layers.2.attn.compressor.ape", func(x *safetensors.Tensor) { x.Shape = []int{64, 1024} }))
		}, tensor: "layers.2.attn.compressor.ape", file: shard2, want: "want [128 512]"},
		{name: "compressor coff", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.compressor.wgate.weight", editTensor("layers.1.attn.compressor.wgate.weight", func(x *safetensors.Tensor) { x.Shape = []int{512, 512} }))
		}, tensor: "layers.1.attn.compressor.wgate.weight", file: l1shard, want: "coff 2 for ratio 4"},
		{name: "header offsets overlap", edit: func(t *testing.T, dir string) {
			rewriteHeader(t, dir, l1shard, func(h map[string]map[string]any) {
				off := h["layers.0.attn.wq_a.weight"]["data_offsets"].([]any)
				h["layers.0.attn.kv_norm.weight"]["data_offsets"] = []any{off[0], off[0].(float64) + 1024}
			})
		}, tensor: "layers.0.attn.wq_a.weight", file: l1shard, want: "overlap"},
		{name: "header offsets size lie", edit: func(t *testing.T, dir string) {
			rewriteHeader(t, dir, l1shard, func(h map[string]map[string]any) {
				off := h["layers.1.attn.wq_a.scale"]["data_offsets"].([]any)
				h["layers.1.attn.wq_a.scale"]["data_offsets"] = []any{off[0], off[1].(float64) - 4}
			})
		}, tensor: "layers.0.attn.wq_a.weight", file: l1shard, want: "the shape needs 16"},
		{name: "header offsets past the end", edit: func(t *testing.T, dir string) {
			rewriteHeader(t, dir, shard2, func(h map[string]map[string]any) {
				h["layers.2.attn.kv_norm.weight"]["data_offsets"] = []any{1e9, 1e9 + 1024}
			})
		}, tensor: "layers.2.attn.wq_a.weight", file: shard2, want: "reach past"},
		{name: "e8m0 NaN scale", format: ScaleE8M0, edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.wkv.scale", editTensor("layers.1.attn.wkv.scale", func(x *safetensors.Tensor) { x.Data[5] = 0xFF }))
		}, tensor: "layers.1.attn.wkv.scale", file: l1shard, want: "element 5 (row 2, column 1) is the e8m0 NaN byte 0xFF"},
		{name: "f32 NaN scale", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.1.attn.wq_b.scale", editTensor("layers.1.attn.wq_b.scale", func(x *safetensors.Tensor) {
				binary.LittleEndian.PutUint32(x.Data[4*3:], math.Float32bits(float32(math.NaN())))
			}))
		}, tensor: "layers.1.attn.wq_b.scale", file: l1shard, want: "element 3 (row 1, column 1) is NaN"},
		{name: "f32 negative scale", edit: func(t *testing.T, dir string) {
			rewriteShard(t, dir, "layers.0.attn.wq_a.scale", editTensor("layers.0.attn.wq_a.scale", func(x *safetensors.Tensor) {
				binary.LittleEndian.PutUint32(x.Data[0:], math.Float32bits(-1))
			}))
		}, tensor: "layers.0.attn.wq_a.scale", file: l1shard, want: "element 0 (row 0, column 0) is -1"},
		{name: "index not JSON", edit: func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), []byte("{"), 0o644))
		}, want: "index is not a JSON object"},
		{name: "index file outside the directory", edit: func(t *testing.T, dir string) {
			m := readIndexMap(t, dir)
			m["layers.0.attn.wq_a.weight"] = "../elsewhere.safetensors"
			writeIndexMap(t, dir, m)
		}, want: `"../elsewhere.safetensors": not a file name inside`},
		{name: "no index", edit: func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, IndexFile)))
		}, want: "no model.safetensors.index.json"},
		{name: "bad config.json", edit: func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{}`), 0o644))
		}, want: `config field "hidden_size": missing`},
	}
	cfg := TinyConfig()
	seed := testSeed(t)
	templates := map[ScaleFormat]string{}
	for _, f := range []ScaleFormat{ScaleF32, ScaleE8M0} {
		templates[f] = write(t, cfg, seed, SyntheticOptions{ScaleFormat: f})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyCheckpoint(t, templates[c.format])
			c.edit(t, dir)
			ck, err := Load(dir, nil, LoadOptions{MTP: true})
			require.Nil(t, ck)
			require.ErrorContains(t, err, c.want)
			var te *TensorError
			if c.tensor == "" {
				require.False(t, errors.As(err, &te), "%v", err)
				return
			}
			require.True(t, errors.As(err, &te), "%v", err)
			require.Equal(t, c.file, te.File)
			require.Equal(t, c.tensor, te.Tensor)
			require.Contains(t, err.Error(), c.tensor)
			require.Contains(t, err.Error(), c.file)
		})
	}
}

func TestSingleFileCheckpoint(t *testing.T) {
	cfg := TinyConfig()
	seed := testSeed(t)
	dir := write(t, cfg, seed, SyntheticOptions{LayersPerShard: 10})
	require.NoError(t, os.Remove(filepath.Join(dir, IndexFile)))
	require.NoError(t, os.Rename(filepath.Join(dir, "model-00001-of-00001.safetensors"), filepath.Join(dir, SingleFile)))
	ck, err := Load(dir, nil, LoadOptions{Layers: []int{2}})
	require.NoError(t, err)
	want, err := SyntheticLayer(&cfg, seed, 2, ScaleF32)
	require.NoError(t, err)
	require.Equal(t, want, ck.Layers[0])
}

func TestFusedA(t *testing.T) {
	cfg := TinyConfig()
	l, err := SyntheticLayer(&cfg, testSeed(t), 0, ScaleE8M0)
	require.NoError(t, err)
	f, err := l.FusedA()
	require.NoError(t, err)
	require.Equal(t, 256+512, f.N)
	require.Equal(t, 256, f.K)
	for _, rc := range [][2]int{{0, 0}, {255, 255}, {256, 0}, {300, 131}, {767, 255}} {
		var want float32
		if rc[0] < 256 {
			want = l.WQA.Dequant(rc[0], rc[1])
		} else {
			want = l.WKV.Dequant(rc[0]-256, rc[1])
		}
		require.Equal(t, want, f.Dequant(rc[0], rc[1]), "%v", rc)
	}
	odd := oddConfig()
	l, err = SyntheticLayer(&odd, 1, 0, ScaleF32)
	require.NoError(t, err)
	_, err = l.FusedA()
	require.ErrorContains(t, err, "q_lora_rank 192 is not a multiple of 128")
}

func TestConfigJSON(t *testing.T) {
	for _, c := range []dsv4.Config{dsv4.Flash(), dsv4.Pro(), TinyConfig(), oddConfig()} {
		data, err := ConfigJSON(&c)
		require.NoError(t, err)
		got, err := dsv4.Parse(data)
		require.NoError(t, err)
		require.Equal(t, c, got)
	}
}

func TestNaming(t *testing.T) {
	cfg := TinyConfig()
	for _, c := range []struct {
		n     Naming
		layer int
		m     module
		scale bool
		want  string
	}{
		{NamingDeepSeek, 1, modWQA, true, "layers.1.attn.wq_a.scale"},
		{NamingDeepSeek, 3, modWQB, false, "mtp.0.attn.wq_b.weight"},
		{NamingVLLM, 2, modWKV, true, "model.layers.2.attn.wkv.weight_scale_inv"},
		{NamingHF, 1, modQNorm, false, "model.layers.1.self_attn.q_a_norm.weight"},
		{NamingHF, 1, modKVNorm, false, "model.layers.1.self_attn.kv_norm.weight"},
		{NamingHF, 2, modCompAPE, false, "model.layers.2.self_attn.compressor.position_bias"},
		{NamingHFV3, 0, modWKV, false, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"},
		{NamingHFV3, 0, modKVNorm, false, "model.layers.0.self_attn.kv_a_layernorm.weight"},
		{NamingHFV3, 1, modCompNorm, false, "model.layers.1.self_attn.compressor.kv_norm.weight"},
		{NamingDeepSeek, 1, modIdxWQB, true, "layers.1.attn.indexer.wq_b.scale"},
		{NamingDeepSeek, 1, modIdxCompAPE, false, "layers.1.attn.indexer.compressor.ape"},
		{NamingVLLM, 1, modIdxProj, false, "model.layers.1.attn.indexer.weights_proj.weight"},
		{NamingHF, 1, modIdxWQB, true, "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight_scale_inv"},
		{NamingHF, 1, modIdxProj, false, "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight"},
		{NamingHF, 1, modIdxCompWGate, false, "model.layers.1.self_attn.compressor.indexer.gate_proj.weight"},
		{NamingHF, 1, modIdxCompAPE, false, "model.layers.1.self_attn.compressor.indexer.position_bias"},
		{NamingHFV3, 1, modIdxCompNorm, false, "model.layers.1.self_attn.compressor.indexer.kv_norm.weight"},
	} {
		got := c.n.name(&cfg, c.layer, c.m, c.scale)
		require.Equal(t, c.want, got)
		require.Contains(t, c.m.candidates(&cfg, c.layer, c.scale), got, "the loader accepts what the writer writes")
		n, err := ParseNaming(c.n.String())
		require.NoError(t, err)
		require.Equal(t, c.n, n)
	}
	_, err := ParseNaming("gguf")
	require.ErrorContains(t, err, "gguf")
	all := []module{modWQA, modWKV, modWQB, modQNorm, modKVNorm, modCompWKV, modCompWGate, modCompAPE, modCompNorm,
		modIdxWQB, modIdxProj, modIdxCompWKV, modIdxCompWGate, modIdxCompAPE, modIdxCompNorm}
	owner := map[string]string{}
	for _, m := range all {
		for _, scale := range []bool{false, true} {
			for _, c := range m.candidates(&cfg, 1, scale) {
				require.NotContains(t, owner, c, "%s is a spelling of both %s and %s", c, owner[c], m.key)
				owner[c] = m.key
			}
		}
	}
	for _, m := range all {
		cands := m.candidates(&cfg, 1, false)
		require.Equal(t, len(cands), len(uniq(cands)), "%s: no spelling twice", m.key)
		require.True(t, strings.HasPrefix(cands[0], "layers.1.attn."+m.key))
	}
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

func TestParseIndex(t *testing.T) {
	x, err := ParseIndex([]byte(`{"metadata":{"total_size":3},"weight_map":{"a":"s1.safetensors","b":"sub/s2.safetensors","c":"s1.safetensors"}}`))
	require.NoError(t, err)
	require.Equal(t, []string{"s1.safetensors", "sub/s2.safetensors"}, x.Files())
	for _, c := range []struct{ in, want string }{
		{`null`, "not a JSON object"},
		{`[]`, "not a JSON object"},
		{`{}`, `no "weight_map"`},
		{`{"weight_map":[]}`, "not a JSON object"},
		{`{"weight_map":{"a":1}}`, `weight_map["a"]: the file must be a string`},
		{`{"weight_map":{"":"x"}}`, "empty tensor name"},
		{`{"weight_map":{"a":"/abs"}}`, "not a file name inside"},
		{`{"weight_map":{"a":""}}`, "not a file name inside"},
		{`{"weight_map":{"a":"x","a":"y"}}`, `lists tensor "a" twice`},
		// Two weight_maps: encoding/json would keep the second silently.
		{`{"weight_map":{"a":"x"},"metadata":{},"weight_map":{"b":"y"}}`, `has the key "weight_map" twice`},
		{`{"weight_map":{"a":"x"},"weight_map":{"a":"x"}}`, `has the key "weight_map" twice`},
		{`{"metadata":{},"weight_map":{"a":"x"},"metadata":{}}`, `has the key "metadata" twice`},
	} {
		_, err := ParseIndex([]byte(c.in))
		require.ErrorContains(t, err, c.want, c.in)
	}
}

func FuzzParseIndex(f *testing.F) {
	f.Add([]byte(`{"metadata":{"total_size":3},"weight_map":{"a":"s1.safetensors","b":"sub/s2.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"a":"../x"}}`))
	f.Add([]byte(`{"weight_map":{"a":"x","a":"x"}}`))
	f.Add([]byte(`{"weight_map":{"a":"x"},"weight_map":{"b":"y"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := ParseIndex(data)
		if err != nil {
			require.Nil(t, x)
			return
		}
		// What is accepted has one weight_map, the one encoding/json sees.
		var top map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(data, &top))
		var plain map[string]string
		require.NoError(t, json.Unmarshal(top["weight_map"], &plain))
		require.Equal(t, plain, x.WeightMap)
		for name, file := range x.WeightMap {
			require.NotEmpty(t, name)
			require.True(t, filepath.IsLocal(file), "%q", file)
		}
	})
}

// TestFullFlashLayers writes and loads two full-size V4-Flash layers (a
// ratio-4 and a ratio-128 one, about 70 MB), as the GPU runs use them.
func TestFullFlashLayers(t *testing.T) {
	if testing.Short() || race.Enabled {
		t.Skip("writes ~70 MB (-race: the tiny configs run the same code; .ci/run's non-race step runs it)")
	}
	cfg := dsv4.Flash()
	seed := testSeed(t)
	dir := write(t, cfg, seed, SyntheticOptions{Layers: []int{2, 3}, ScaleFormat: ScaleE8M0})
	ck, err := Load(dir, nil, LoadOptions{Layers: []int{2, 3}, Heads: HeadRange{8, 16}})
	require.NoError(t, err)
	l := ck.Layers[0]
	require.Equal(t, [2]int{1024, 4096}, [2]int{l.WQA.N, l.WQA.K})
	require.Equal(t, [2]int{512, 4096}, [2]int{l.WKV.N, l.WKV.K})
	require.Equal(t, [2]int{8 * 512, 1024}, [2]int{l.WQB.N, l.WQB.K})
	require.Len(t, l.WQB.Scale, 8*4*8)
	require.Equal(t, 2, l.Compressor.Coff)
	require.Equal(t, 1, ck.Layers[1].Compressor.Coff)
	require.Len(t, ck.Layers[1].Compressor.APE, 128*512)
	// V4-Flash's indexer, whole on a rank of 8 heads.
	x := l.Indexer
	require.NotNil(t, x)
	require.Equal(t, [2]int{64 * 128, 1024}, [2]int{x.WQB.N, x.WQB.K})
	require.Len(t, x.WQB.Scale, 64*8)
	require.Equal(t, [2]int{64, 4096}, [2]int{x.WeightsProj.N, x.WeightsProj.K})
	require.Equal(t, [2]int{256, 4096}, [2]int{x.Compressor.WKV.N, x.Compressor.WKV.K})
	require.Len(t, x.Compressor.APE, 4*256)
	require.Len(t, x.Compressor.Norm, 128)
	require.Nil(t, ck.Layers[1].Indexer)
	_, err = Load(dir, nil, LoadOptions{Layers: []int{4}})
	require.ErrorContains(t, err, "layers.4.attn.wq_a.weight")
}

func BenchmarkLoad(b *testing.B) {
	cfg := TinyConfig()
	dir := write(b, cfg, 1, SyntheticOptions{ScaleFormat: ScaleE8M0})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load(dir, nil, LoadOptions{MTP: true}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSyntheticLayer(b *testing.B) {
	cfg := dsv4.Flash()
	for b.Loop() {
		if _, err := SyntheticLayer(&cfg, 1, 2, ScaleE8M0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMixedSpellings renames single tensors to other accepted spellings
// (other prefixes, .weight_scale, V3 names) in the shard and the index.
func TestMixedSpellings(t *testing.T) {
	cfg := TinyConfig()
	seed := testSeed(t)
	dir := write(t, cfg, seed, SyntheticOptions{ScaleFormat: ScaleE8M0})
	renames := map[string]string{
		"layers.1.attn.wq_a.scale":             "model.layers.1.attn.wq_a.weight_scale",
		"layers.1.attn.kv_norm.weight":         "layers.1.self_attn.kv_a_layernorm.weight",
		"layers.1.attn.wkv.weight":             "model.layers.1.self_attn.kv_proj.weight",
		"layers.1.attn.compressor.norm.weight": "model.layers.1.self_attn.compressor.kv_norm.weight",
		"mtp.0.attn.wq_b.weight":               "model.layers.3.self_attn.q_b_proj.weight",
	}
	m := readIndexMap(t, dir)
	for from, to := range renames {
		rewriteShard(t, dir, from, editTensor(from, func(x *safetensors.Tensor) { x.Name = to }))
		m[to] = m[from]
		delete(m, from)
	}
	writeIndexMap(t, dir, m)
	ck, err := Load(dir, nil, LoadOptions{Layers: []int{1, 3}})
	require.NoError(t, err)
	for _, l := range ck.Layers {
		want, err := SyntheticLayer(&cfg, seed, l.Index, ScaleE8M0)
		require.NoError(t, err)
		require.Equal(t, want, l)
	}
}

// V4-Flash-0731 ships three MTP layers (mtp.0..2, each ratio 0, listed in
// compress_ratios): its config.json loads and so do all three layers, under
// DeepSeek's mtp.{j} names; any number of MTP layers does.
func TestMTPLayers(t *testing.T) {
	for _, n := range []int{0, 1, 3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			cfg := TinyConfig()
			cfg.NumMTPLayers = n
			cfg.CompressRatios = append(cfg.CompressRatios[:3:3], make([]int, n)...)
			seed := testSeed(t)
			dir := write(t, cfg, seed, SyntheticOptions{})
			m := readIndexMap(t, dir)
			for j := range n {
				require.Contains(t, m, fmt.Sprintf("mtp.%d.attn.wq_b.weight", j))
			}
			require.NotContains(t, m, fmt.Sprintf("mtp.%d.attn.wq_b.weight", n))
			ck, err := Load(dir, nil, LoadOptions{MTP: true})
			require.NoError(t, err)
			require.Equal(t, n, ck.Config.NumMTPLayers)
			require.Len(t, ck.Layers, 3+n)
			for _, l := range ck.Layers[3:] {
				want, err := SyntheticLayer(&cfg, seed, l.Index, ScaleF32)
				require.NoError(t, err)
				require.Equal(t, want, l)
				require.Nil(t, l.Compressor)
				require.Nil(t, l.Indexer)
			}
		})
	}
}
