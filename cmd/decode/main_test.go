package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/internal/safetensors"
)

// tiny runs the command with the 2-head test model on the cpu backend.
func tiny(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	// A small pool: allocating and clearing the default one is slow under
	// the race detector.
	base := []string{"--model", "testdata/tiny_config.json", "--backend", "cpu", "--log-level", "warn", "--pages", "64"}
	code = run(context.Background(), append(base, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestSmallTraceText(t *testing.T) {
	code, out, errOut := tiny(t, "--trace", "testdata/small.jsonl", "--layers", "0", "--verify")
	require.Equal(t, exitOK, code, errOut)
	lines := strings.Split(out, "\n")
	require.Contains(t, lines[0], "iter    0 line    2 context    ctx   120 tok/ 2 seq")
	require.Contains(t, lines[1], "iter    1 line    3 mixed      ctx    60 tok/ 1 seq  gen    4 tok/ 1 seq mtp 3  launches ctx_kv=4 ctx_q=4 gen_kv=4 gen_q=4")
	require.Contains(t, out, "replayed testdata/small.jsonl: 5 lines, 5 iterations (1 context, 2 generation, 2 mixed)")
	require.Contains(t, out, "tiny-dsv4, 4 layers, 2 heads, fp8_ue8m0 cache (64 pages of 64 tokens)")
	require.Contains(t, out, "tokens:   context 185, generation 28, total 213")
	require.Contains(t, out, "verify:   5 iterations byte-identical")
	require.Contains(t, out, "BenchmarkDecode/model=tiny-dsv4/backend=cpu/format=fp8_ue8m0/layers=4/batch=all-")
}

func TestJSONReport(t *testing.T) {
	code, out, errOut := tiny(t, "--trace", "testdata/small.jsonl", "--json", "--cache-format", "bf16", "--q-format", "bf16", "--page-size", "16", "--pages", "40", "--graph")
	require.Equal(t, exitOK, code, errOut)
	var rep replay.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, "bf16", rep.CacheFormat)
	require.Equal(t, "bf16", rep.QFormat)
	require.True(t, rep.UseGraphs)
	require.Len(t, rep.Iterations, 5)
	for _, ir := range rep.Iterations {
		// The cpu backend captures no graphs: nothing is padded.
		require.Equal(t, ir.ContextTokens+ir.GenerationTokens, ir.Rows, "the cpu backend runs eagerly, unpadded")
	}
	require.Equal(t, 40, rep.Iterations[4].FreePages)
	require.Equal(t, 4*2, rep.Summary.Launches.GenerationKV, "4 iterations with generation, 2 layers")
}

func TestDump(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := tiny(t, "--trace", "testdata/small.jsonl", "--dump", dir, "--dump-iters", "1,3-4", "--dump-layers", "1", "--summary-only")
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "iter ")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"iter00001_layer01.safetensors", "iter00003_layer01.safetensors", "iter00004_layer01.safetensors"}, names)
	data, err := os.ReadFile(filepath.Join(dir, names[0]))
	require.NoError(t, err)
	tensors, meta, err := safetensors.Read(data)
	require.NoError(t, err)
	require.Equal(t, "fp8_ue8m0", meta["cache_format"])
	require.Equal(t, "64", meta["page_size"])
	require.Equal(t, "yarn", meta["rope_kind"], "layer 1 has compress ratio 4")
	require.Equal(t, "3", meta["trace_line"])
	shapes := map[string][]int{}
	for _, tn := range tensors {
		shapes[tn.Name] = tn.Shape
	}
	require.Equal(t, []int{64, 512}, shapes["latent"])
	require.Equal(t, []int{64, 2, 512}, shapes["q_out"])
	require.Equal(t, []int{2, 3}, shapes["block_tables"])
}

// Bad input: one error naming the trace line, exit status 1.
func TestBadTraces(t *testing.T) {
	for _, c := range []struct {
		name  string
		trace string
		args  []string
		want  string
	}{
		{"malformed line", "{\"context\":[{\"seq\":1,\"tokens\":4}]}\n{\"context\":[{\"seq\":2,\"tokens\":4}]\n", nil,
			"trace line 2: malformed JSON"},
		{"unknown sequence", "{\"context\":[{\"seq\":1,\"tokens\":4}]}\n{\"generation\":{\"mtp\":1,\"seqs\":[1,9]}}\n", nil,
			"trace line 2: engine: Begin: metadata: request 1 (seq 9): generation needs a cached sequence: unknown sequence"},
		{"finished sequence", "{\"context\":[{\"seq\":1,\"tokens\":4}],\"finish\":[1]}\n{\"generation\":{\"mtp\":1,\"seqs\":[1]}}\n", nil,
			"trace line 2: engine: Begin: metadata: request 0 (seq 1): lookup: kvcache: finished sequence 1"},
		{"finish of an unknown sequence", "{\"context\":[{\"seq\":1,\"tokens\":4}]}\n{\"finish\":[1,5]}\n", nil,
			"trace line 2: finish[1]: kvcache: unknown sequence 5"},
		{"batch beyond the pool", "{\"context\":[{\"seq\":1,\"tokens\":40}]}\n{\"context\":[{\"seq\":2,\"tokens\":40}]}\n", []string{"--page-size", "16", "--pages", "4"},
			"trace line 2: engine: Begin: kvcache: cache full: need 3 pages, 1 free of 4"},
		{"prompt past the RoPE table", "{\"context\":[{\"seq\":1,\"tokens\":40}]}\n{\"context\":[{\"seq\":1,\"tokens\":40}]}\n", []string{"--rope-positions", "64"},
			"trace line 2: engine: Begin: metadata: request 0 (seq 1): kv_len = 80 (cached 40 + q_len 40) exceeds MaxPositions = 64"},
		{"batch beyond --max-tokens", "{\"context\":[{\"seq\":1,\"tokens\":40}]}\n", []string{"--max-tokens", "16"},
			"trace line 1: engine: batch exceeds the engine's capacity: Begin: batch of 40 tokens, more than MaxTokens = 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.jsonl")
			require.NoError(t, os.WriteFile(path, []byte(c.trace), 0o644))
			code, _, errOut := tiny(t, append([]string{"--trace", path}, c.args...)...)
			require.Equal(t, exitError, code, errOut)
			require.Contains(t, errOut, c.want)
		})
	}
}

func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--model", "gpt"}, `--model "gpt": not flash, pro or a config.json file`},
		{[]string{"--model", "missing.json"}, `--model "missing.json"`},
		{[]string{"--cache-format", "fp4"}, `unknown format "fp4"`},
		{[]string{"--q-format", "int8"}, `unknown Q format "int8"`},
		{[]string{"--dump-iters", "3-1"}, `--dump-iters "3-1": range "3-1"`},
		{[]string{"--dump-layers", "x"}, `--dump-layers "x"`},
		{[]string{"--log-level", "loud"}, `--log-level "loud"`},
		{[]string{"--layers", "-3"}, "--layers -3"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, &out, &errb)
		require.Equal(t, exitUsage, code, "%v: %s", c.args, errb.String())
		require.Contains(t, errb.String(), c.want, "%v", c.args)
	}
}

func TestEngineConfigErrorsExitWithError(t *testing.T) {
	code, _, errOut := tiny(t, "--trace", "no/such/file.jsonl")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "--trace no/such/file.jsonl: open no/such/file.jsonl: no such file")
	code, _, errOut = tiny(t, "--trace", "testdata/small.jsonl", "--page-size", "48")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "PageSize 48")
	code, _, errOut = tiny(t, "--trace", "testdata/small.jsonl", "--backend", "tpu")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, `Config.Backend: "tpu" is not registered`)
}

func TestParseSelection(t *testing.T) {
	sel, err := parseSelection("--x", "0, 3-5,9")
	require.NoError(t, err)
	var got []int
	for i := range 12 {
		if sel(i) {
			got = append(got, i)
		}
	}
	require.Equal(t, []int{0, 3, 4, 5, 9}, got)
	all, err := parseSelection("--x", "all")
	require.NoError(t, err)
	require.True(t, all(12345))
	for _, bad := range []string{"", "-1", "1-", "a", "2-1", "1,,2"} {
		_, err := parseSelection("--x", bad)
		require.Error(t, err, bad)
	}
}
