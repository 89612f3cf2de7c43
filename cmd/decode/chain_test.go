package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/weights"
)

// tinyCheckpoint writes a synthetic checkpoint of the tiny test model.
func tinyCheckpoint(t *testing.T, seed uint64) string {
	t.Helper()
	m, err := dsv4.Load("testdata/tiny_config.json")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, weights.WriteSynthetic(dir, &m, seed, weights.SyntheticOptions{ScaleFormat: weights.ScaleE8M0}))
	return dir
}

// The hidden-state chain from a checkpoint gives the bytes of the chain on
// synthetic weights of the same seed (the generator the writer uses), and
// --verify passes on both; the projected path still runs.
func TestChainInputs(t *testing.T) {
	dir := tinyCheckpoint(t, 7)
	report := func(args ...string) replay.Report {
		code, out, errOut := tiny(t, append([]string{"--trace", "testdata/small.jsonl", "--json", "--verify"}, args...)...)
		require.Equal(t, exitOK, code, errOut)
		var rep replay.Report
		require.NoError(t, json.Unmarshal([]byte(out), &rep))
		require.Equal(t, 5, rep.Summary.Verified)
		return rep
	}
	rep := report("--checkpoint", dir)
	require.Equal(t, "hidden", rep.Input)
	require.Equal(t, dir, rep.Checkpoint)
	require.Equal(t, "projected", report("--input", "projected").Input)

	dumps := map[string]string{}
	for _, args := range [][]string{{"--checkpoint", dir}, {"--weight-seed", "7"}} {
		d := t.TempDir()
		code, _, errOut := tiny(t, append([]string{"--trace", "testdata/small.jsonl", "--dump", d, "--dump-iters", "all", "--summary-only"}, args...)...)
		require.Equal(t, exitOK, code, errOut)
		dumps[args[0]] = d
	}
	entries, err := os.ReadDir(dumps["--checkpoint"])
	require.NoError(t, err)
	require.Len(t, entries, 5*2) // 5 iterations, the default 2 layers
	for _, e := range entries {
		a, err := os.ReadFile(filepath.Join(dumps["--checkpoint"], e.Name()))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(dumps["--weight-seed"], e.Name()))
		require.NoError(t, err)
		ta, _, err := safetensors.Read(a)
		require.NoError(t, err)
		tb, _, err := safetensors.Read(b)
		require.NoError(t, err)
		require.Equal(t, len(ta), len(tb))
		for i := range ta {
			require.Equal(t, ta[i].Data, tb[i].Data, "%s: %s differs between the checkpoint and the in-memory synthetic weights", e.Name(), ta[i].Name)
		}
	}
}

// --dump adds the chain's tensors (README: cmd/decode dump tensors).
func TestChainDump(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := tiny(t, "--trace", "testdata/small.jsonl", "--dump", dir, "--dump-iters", "1", "--dump-layers", "0", "--summary-only", "--heads", "1:2")
	require.Equal(t, exitOK, code, errOut)
	data, err := os.ReadFile(filepath.Join(dir, "iter00001_layer00.safetensors"))
	require.NoError(t, err)
	tensors, meta, err := safetensors.Read(data)
	require.NoError(t, err)
	require.Equal(t, "hidden", meta["input"])
	require.Equal(t, "1", meta["head_begin"])
	require.Equal(t, "2", meta["head_end"])
	shapes, dtypes := map[string][]int{}, map[string]string{}
	for _, tn := range tensors {
		shapes[tn.Name], dtypes[tn.Name] = tn.Shape, tn.DType
	}
	// Iteration 1 is 60 context + 4 generation tokens; hidden 256,
	// q_lora_rank 128, one head of the two.
	for name, want := range map[string][]int{
		"hidden": {64, 256}, "hidden_fp8": {64, 256}, "hidden_scale": {2, 64},
		"fused_a": {64, 128 + 512}, "q_norm_fp8": {64, 128}, "q_norm_scale": {1, 64},
		"q_in": {64, 1, 512}, "q_out": {64, 1, 512}, "latent": {64, 512},
	} {
		require.Equal(t, want, shapes[name], name)
	}
	require.Equal(t, "F8_E4M3", dtypes["q_norm_fp8"])
	require.Equal(t, "F32", dtypes["hidden_scale"])
}

func TestChainUsageErrors(t *testing.T) {
	dir := tinyCheckpoint(t, 1)
	// A checkpoint whose config.json differs from --model in its RoPE and
	// norm constants only: --model's would be taken silently.
	m, err := dsv4.Load("testdata/tiny_config.json")
	require.NoError(t, err)
	m.RopeTheta, m.RMSNormEps = 50000, 1e-5
	other := t.TempDir()
	require.NoError(t, weights.WriteSynthetic(other, &m, 1, weights.SyntheticOptions{Layers: []int{0, 1}}))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--input", "tokens"}, exitUsage, `unknown input mode "tokens"`},
		{[]string{"--heads", "2"}, exitUsage, `--heads "2": want h0:h1`},
		{[]string{"--heads", "1:1"}, exitUsage, `--heads "1:1"`},
		{[]string{"--heads", "0:3"}, exitUsage, "--heads: engine: Config.HeadEnd: HeadBegin, HeadEnd = 0, 3: want 0 <= HeadBegin < HeadEnd <= 2 heads"},
		{[]string{"--heads", "0:65", "--model", "flash"}, exitUsage, "--heads: engine: Config.HeadEnd: HeadBegin, HeadEnd = 0, 65: want 0 <= HeadBegin < HeadEnd <= 64 heads"},
		{[]string{"--heads", "2:3"}, exitUsage, "--heads: engine: Config.HeadBegin: HeadBegin, HeadEnd = 2, 3"},
		{[]string{"--checkpoint", dir, "--weight-seed", "7"}, exitUsage, "--weight-seed does nothing with --checkpoint"},
		{[]string{"--checkpoint", dir, "--input", "projected"}, exitUsage, "needs --input hidden"},
		{[]string{"--checkpoint", dir, "--model", "flash"}, exitUsage, "--model flash, --checkpoint " + dir + ": weights: " + filepath.Join(dir, "config.json") + " disagrees with the model config given (given vs config.json): dsv4: configs disagree on hidden_size (4096 vs 256)"},
		{[]string{"--checkpoint", other}, exitUsage, "configs disagree on rms_norm_eps (1e-06 vs 1e-05), rope_theta (10000 vs 50000)"},
		{[]string{"--checkpoint", filepath.Join(dir, "nope")}, exitError, "nope/config.json: no such file"},
	} {
		code, _, errOut := tiny(t, append([]string{"--trace", "testdata/small.jsonl"}, c.args...)...)
		require.Equal(t, c.code, code, "%v: %s", c.args, errOut)
		require.True(t, strings.Contains(errOut, c.want), "%v: %s", c.args, errOut)
	}
}
