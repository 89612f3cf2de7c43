package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLayerSeries(t *testing.T) {
	rep, err := readReport("testdata/bench-go.json")
	require.NoError(t, err)
	peers := &peerReport{}
	data, err := os.ReadFile("testdata/bench-peers.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, peers))

	ss := layerSeries(rep, peers, "flash")
	by := map[string]series{}
	for _, s := range ss {
		by[s.Label] = s
		for i := 1; i < len(s.Points); i++ {
			assert.LessOrEqual(t, s.Points[i-1].Tokens, s.Points[i].Tokens, "%s sorted by tokens", s.Label)
		}
	}
	ours := by["ours, graph, generation MTP 3, fp8 Q"]
	assert.Equal(t, []point{{4, 2.9}, {32, 3.8}, {128, 6.5}}, ours.Points)
	assert.Equal(t, []point{{128, 8.0}}, by["ours, graph, generation MTP 3, bf16 Q"].Points)
	assert.Equal(t, []point{{4096, 150}}, by["ours, graph, context, fp8 Q"].Points)
	assert.Equal(t, []point{{4, 6.1}, {32, 7.0}, {128, 9.9}}, by["ours, one layer alone (cold L2), generation MTP 3, fp8 Q"].Points)
	// The peer's failed entry (null) is left out, not drawn as zero.
	assert.Equal(t, []point{{32, 11.6}, {128, 37.2}}, by["PyTorch, torch.compile in one graph, generation MTP 3, fp8 Q"].Points)
	sg := by["SGLang fused_q_norm_rope + fused_k_norm_rope_flashmla (quoted)"]
	assert.Equal(t, quoted, sg.Kind)
	require.Len(t, sg.Points, 1)
	assert.InDelta(t, 315.0/43, sg.Points[0].Us, 1e-9)
	cp := by["copy of the layer's bytes (fp8 Q)"]
	assert.Equal(t, ceiling, cp.Kind)
	require.Len(t, cp.Points, 4, "one point per token count")
	// 128 tokens of Flash: KV 128*1864 + Q 128*(64*1536+256) bytes at 4300 GB/s.
	assert.InDelta(t, float64(128*1864+128*(64*1536+256))/4300/1e3, cp.Points[2].Us, 1e-3)

	for _, s := range layerSeries(rep, nil, "pro") {
		assert.NotContains(t, s.Label, "PyTorch")
		assert.NotContains(t, s.Label, "one layer alone (cold L2), context")
	}
}

func TestKernelSeries(t *testing.T) {
	rep, err := readReport("testdata/bench-go.json")
	require.NoError(t, err)
	by := map[string]series{}
	for _, s := range kernelSeries(rep, nil, "flash") {
		by[s.Label] = s
	}
	assert.Equal(t, []point{{4, 3.1}, {32, 4.2}, {128, 9.7}, {4096, 160}}, by["ours Q, fp8, cold"].Points)
	require.Contains(t, by, "vLLM KV-norm kernel KV (quoted)")
	assert.Equal(t, []point{{128, 2.6}, {16384, 16.9}, {65536, 53}}, by["vLLM KV-norm kernel KV (quoted)"].Points)
	require.Contains(t, by, "copy of the KV bytes (fp8_ue8m0)")
}

// TestEngineSeries: bench/engines.py's measured figures replace the quoted
// ones for the model they cover, shape by shape; a failed shape (no time) is
// left out, and a model without any keeps the quotes.
func TestEngineSeries(t *testing.T) {
	rep, err := readReport("testdata/bench-go.json")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "engines.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"timings": [
		{"engine": "SGLang fused_q_norm_rope + fused_k_norm_rope_flashmla", "model": "flash", "phase": "generation",
		 "batch": 32, "mtp": 3, "tokens": 128, "us_per_layer": 6.5, "kv_us_per_layer": 1.25, "q_us_per_layer": 5.5,
		 "back_to_back_us_per_layer": 6.25},
		{"engine": "vLLM x", "model": "flash", "phase": "context", "batch": 2, "mtp": 0, "tokens": 4096,
		 "us_per_layer": 120.5, "kv_norm_us_per_layer": 9.5, "fused_us_per_layer": 110.5},
		{"engine": "vLLM x", "model": "flash", "phase": "generation", "batch": 8, "mtp": 3, "tokens": 32,
		 "errors": {"shape": "RuntimeError: boom"}}
	]}`), 0o644))
	engines, err := readEngines(path)
	require.NoError(t, err)
	require.Len(t, engines, 3)
	peers := &peerReport{Engines: engines}

	layer := map[string]series{}
	for _, s := range layerSeries(rep, peers, "flash") {
		layer[s.Label] = s
		assert.NotContains(t, s.Label, "quoted", "measured figures replace the quotes")
	}
	assert.Equal(t, []point{{128, 6.5}}, layer["SGLang, same call, graph, generation MTP 3, bf16 Q"].Points)
	assert.Equal(t, []point{{4096, 120.5}}, layer["vLLM, same call, graph, context, bf16 Q"].Points)
	assert.NotContains(t, layer, "vLLM, same call, graph, generation MTP 3, bf16 Q", "the failed shape is not drawn")

	kernels := map[string]series{}
	for _, s := range kernelSeries(rep, peers, "flash") {
		kernels[s.Label] = s
		assert.NotContains(t, s.Label, "quoted")
		assert.NotContains(t, s.Label, "back_to_back")
	}
	assert.Equal(t, []point{{128, 1.25}}, kernels["SGLang kv, same call, many-layer graph"].Points)
	assert.Equal(t, []point{{4096, 110.5}}, kernels["vLLM fused, same call, many-layer graph"].Points)

	var quotedPro int
	for _, s := range layerSeries(rep, peers, "pro") {
		if strings.Contains(s.Label, "(quoted)") {
			quotedPro++
		}
	}
	assert.Positive(t, quotedPro, "a model the engines did not cover keeps the quotes")

	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"timings": [{"tokens": "many"}]}`), 0o644))
	_, err = readEngines(bad)
	assert.ErrorContains(t, err, "tokens")
}

func TestReportWritesPlots(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	require.NoError(t, reportMain([]string{"--go", "testdata/bench-go.json", "--peers", "testdata/bench-peers.json", "--out-dir", dir}, &out, &errOut))
	want := []string{"bench-layer-flash", "bench-kernels-flash", "bench-layer-pro"}
	for _, w := range want {
		assert.Contains(t, out.String(), filepath.Join(dir, w+".png"))
		f, err := os.Open(filepath.Join(dir, w+".png"))
		require.NoError(t, err)
		img, err := png.Decode(f)
		f.Close()
		require.NoError(t, err, w)
		assert.Greater(t, img.Bounds().Dx(), 500)
		svg, err := os.ReadFile(filepath.Join(dir, w+".svg"))
		require.NoError(t, err)
		assert.True(t, strings.Contains(string(svg), "<svg"), "%s.svg is an SVG", w)
		assert.Contains(t, string(svg), "quoted", "the quoted peers are labelled")
	}
	// Pro has no single launches in the fixture: no kernel plot.
	_, err := os.Stat(filepath.Join(dir, "bench-kernels-pro.png"))
	assert.True(t, os.IsNotExist(err))
	assert.Contains(t, out.String(), quotedSource)
}

func TestReportErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.json")
	require.NoError(t, os.WriteFile(empty, []byte(`{"device":"x","copy_gbps":1}`), 0o644))
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"results": [`), 0o644))
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--go", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"--go", bad}, "bad.json"},
		{[]string{"--go", empty}, "no single launches and no layer graphs to plot, and no chain"},
		{[]string{"--go", "testdata/bench-go.json", "--peers", bad, "--out-dir", dir}, "bad.json"},
	} {
		err := reportMain(c.args, &bytes.Buffer{}, &bytes.Buffer{})
		require.Error(t, err, c.args)
		assert.Contains(t, err.Error(), c.err)
	}
}
