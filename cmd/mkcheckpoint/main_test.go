package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/weights"
)

func TestRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	var out, errb bytes.Buffer
	code := run([]string{"--model", "tiny", "--layers", "1-3", "--seed", "9", "--out", dir, "--scale-format", "f32", "--naming", "hf"}, &out, &errb)
	require.Equal(t, exitOK, code, errb.String())
	require.Contains(t, out.String(), "3 layers, seed 9, f32 scales, hf names")
	ck, err := weights.Load(dir, nil, weights.LoadOptions{Layers: []int{1, 2, 3}})
	require.NoError(t, err)
	cfg := weights.TinyConfig()
	for _, l := range ck.Layers {
		want, err := weights.SyntheticLayer(&cfg, 9, l.Index, weights.ScaleF32)
		require.NoError(t, err)
		require.Equal(t, want, l)
	}
	require.NotNil(t, ck.Layer(1).Indexer, "layer 1 is ratio 4")
}

// The release's names, the indexer's included.
func TestDeepSeekLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	var out, errb bytes.Buffer
	require.Equal(t, exitOK, run([]string{"--model", "tiny", "--out", dir}, &out, &errb), errb.String())
	x, err := weights.ReadIndex(dir)
	require.NoError(t, err)
	for _, name := range []string{
		"layers.1.attn.indexer.wq_b.weight", "layers.1.attn.indexer.wq_b.scale",
		"layers.1.attn.indexer.weights_proj.weight",
		"layers.1.attn.indexer.compressor.wkv.weight", "layers.1.attn.indexer.compressor.wgate.weight",
		"layers.1.attn.indexer.compressor.ape", "layers.1.attn.indexer.compressor.norm.weight",
		"mtp.0.attn.wq_a.weight",
	} {
		require.Contains(t, x.WeightMap, name)
	}
	for name := range x.WeightMap {
		require.False(t, strings.Contains(name, "indexer") && !strings.HasPrefix(name, "layers.1."), "%s: only layer 1 is ratio 4", name)
	}
}

func TestUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "tiny"}, "--out is required"},
		{[]string{"--model", "huge", "--out", "x"}, `--model "huge"`},
		{[]string{"--layers", "0,0", "--out", "x"}, "layer 0 listed twice"},
		{[]string{"--layers", "2-1", "--out", "x"}, `"2-1" is not a range`},
		{[]string{"--layers", "4", "--out", "x"}, "layer 4 out of range [0, 4)"},
		{[]string{"--layers", "x", "--out", "x"}, `"x" is not a layer index`},
		{[]string{"--scale-format", "f16", "--out", "x"}, `scale format "f16"`},
		{[]string{"--naming", "gguf", "--out", "x"}, `naming "gguf"`},
		{[]string{"--layers-per-shard", "0", "--out", "x"}, "--layers-per-shard 0"},
		{[]string{"--out", "x", "extra"}, "unexpected arguments"},
	} {
		var out, errb bytes.Buffer
		require.Equal(t, exitUsage, run(c.args, &out, &errb), "%v", c.args)
		require.Contains(t, errb.String(), c.want, "%v", c.args)
	}
}

func TestParseLayers(t *testing.T) {
	got, err := parseLayers("0,2-4, 43", 44)
	require.NoError(t, err)
	require.Equal(t, []int{0, 2, 3, 4, 43}, got)
	got, err = parseLayers("all", 44)
	require.NoError(t, err)
	require.Nil(t, got)
}
