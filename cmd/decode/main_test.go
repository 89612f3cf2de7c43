package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/kvcache"
)

// tiny runs the command with the 2-head test model on the cpu backend.
func tiny(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	// A small pool: allocating and clearing the default one is slow under
	// the race detector.
	// Two layers (ratios 0 and 4) unless a test asks for more.
	base := []string{"--model", "testdata/tiny_config.json", "--backend", "cpu", "--log-level", "warn", "--pages", "64", "--layers", "2"}
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
	code, out, errOut := tiny(t, "--trace", "testdata/small.jsonl", "--json", "--cache-format", "bf16", "--q-format", "bf16", "--page-size", "16", "--pages", "40")
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

// TestRopeModeFlag: --rope-mode exact builds the exact tables, which the
// dumps record and --verify checks byte for byte like the default.
func TestRopeModeFlag(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := tiny(t, "--trace", "testdata/small.jsonl", "--rope-mode", "exact", "--verify", "--dump", dir, "--dump-iters", "1", "--dump-layers", "1", "--summary-only")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "verify:   5 iterations byte-identical")
	data, err := os.ReadFile(filepath.Join(dir, "iter00001_layer01.safetensors"))
	require.NoError(t, err)
	_, meta, err := safetensors.Read(data)
	require.NoError(t, err)
	require.Equal(t, "exact", meta["rope_mode"])
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
	require.Equal(t, "reference", meta["rope_mode"], "the default RoPE mode")
	require.Equal(t, "1e-06", meta["rms_norm_eps"])
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
		{"sequences beyond --compressor-sequences", threeSeqs, []string{"--compressor-sequences", "2"},
			"trace line 2: engine: Begin: compressor state: kvcache: cache full: the batch creates 1 sequences, 2 hold state slots of at most 2"},
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

// threeSeqs prefills three sequences in chunks, two at a time: the third
// line holds three live states and moves two of them.
const threeSeqs = `{"context":[{"seq":1,"tokens":20},{"seq":2,"tokens":20}]}
{"context":[{"seq":1,"tokens":20},{"seq":3,"tokens":20}]}
{"context":[{"seq":2,"tokens":20},{"seq":3,"tokens":20}],"finish":[1,2,3]}
`

// TestCompressorSlotsTrace: three sequences prefilling in chunks run with
// the default state slots (a pool of 2 x the largest batch alone refused
// the third line), and --verify passes.
func TestCompressorSlotsTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "three.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(threeSeqs), 0o644))
	code, out, errOut := tiny(t, "--trace", path, "--verify", "--summary-only")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "pool state-4:")
	require.Contains(t, out, "state slots")
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
		{[]string{"--rope-mode", "float32"}, `unknown RoPE mode "float32"`},
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

// TestIdleFlagsAreRefused: a flag that does nothing in the mode chosen
// exits 2, naming it and why, instead of being ignored.
func TestIdleFlagsAreRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--compress=false", "--compressed-pages-4", "8"}, "--compressed-pages-4 does nothing with --compress=false"},
		{[]string{"--compress=false", "--max-drafts", "3"}, "--max-drafts does nothing with --compress=false"},
		{[]string{"--compress=false", "--compressor-sequences", "9"}, "--compressor-sequences does nothing with --compress=false"},
		{[]string{"--layers", "1", "--compressor-sequences", "9"}, "--compressor-sequences does nothing without a compressed layer"},
		{[]string{"--compress=false", "--topk-scratch", "64"}, "--topk-scratch does nothing with --compress=false"},
		{[]string{"--compress=false", "--indexer-query-format", "fp8"}, "--indexer-query-format does nothing with --compress=false"},
		{[]string{"--layers", "1", "--compressed-pages-128", "8"}, "--compressed-pages-128 does nothing without a compressed layer among --layers 1 (the first ratio-4 or ratio-128 layer of tiny-dsv4 is layer 1)"},
		{[]string{"--layers", "1", "--max-drafts", "3"}, "--max-drafts does nothing without a compressed layer"},
		{[]string{"--layers", "2", "--compressed-pages-128", "8"}, "--compressed-pages-128 8 does nothing: no layer among --layers 2 has ratio 128"},
		{[]string{"--kv-scale", "2"}, "--kv-scale does nothing with --cache-format fp8_ue8m0"},
		{[]string{"--q-format", "bf16", "--q-scale", "2"}, "--q-scale does nothing with --q-format bf16"},
		{[]string{"--dump-iters", "1"}, "--dump-iters does nothing without --dump"},
		{[]string{"--dump-layers", "1"}, "--dump-layers does nothing without --dump"},
		{[]string{"--device", "1"}, "--device does nothing with --backend cpu"},
		{[]string{"--graph=false"}, "--graph does nothing with --backend cpu"},
		{[]string{"--json", "--summary-only"}, "--summary-only does nothing with --json"},
	} {
		code, _, errOut := tiny(t, append([]string{"--trace", "testdata/small.jsonl"}, c.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%v", c.args)
	}
}

// TestDraftsPastMaxDraftsRefusedByLine: a generation step deeper than
// --max-drafts is refused before anything runs, naming its line.
func TestDraftsPastMaxDraftsRefusedByLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "deep.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("{\"context\":[{\"seq\":1,\"tokens\":40}]}\n# a deeper step\n{\"generation\":{\"mtp\":4,\"seqs\":[1]}}\n"), 0o644))
	code, out, errOut := tiny(t, "--trace", path, "--max-drafts", "3")
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "trace line 3: generation.mtp = 4, more than --max-drafts 3")
	require.Empty(t, out, "nothing ran")
	code, _, errOut = tiny(t, "--trace", path, "--max-drafts", "4")
	require.Equal(t, exitOK, code, errOut)
}

func TestTraceFileErrorExitsWithError(t *testing.T) {
	code, _, errOut := tiny(t, "--trace", "no/such/file.jsonl")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "--trace no/such/file.jsonl: open no/such/file.jsonl: no such file")
}

// TestBadFlagValuesExitWithUsage: every bad flag value exits 2 with a
// message naming the flag, those the engine checks included, and before
// anything is allocated.
func TestBadFlagValuesExitWithUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--page-size", "48"}, "--page-size: engine: Config.Cache.PageSize: kvcache: Config.PageSize 48 must be a power of two"},
		{[]string{"--page-size", "2097152"}, "--page-size: engine: Config.Cache.PageSize"},
		{[]string{"--pages", "0"}, "--pages 0: must be positive"},
		{[]string{"--pages", "-4"}, "--pages -4: must be positive"},
		{[]string{"--cache-format", "fp8_pertensor", "--kv-scale", "0"}, "--kv-scale: engine: Config.Cache.KVScale"},
		{[]string{"--q-scale", "-1"}, "--q-scale: engine: Config.QScale: -1"},
		{[]string{"--layers", "9"}, "--layers: engine: Config.Layers: 9, must be in [1, 4]"},
		{[]string{"--max-seqs", "-1"}, "--max-seqs: engine: Config.MaxSeqs: -1"},
		{[]string{"--max-seqs", "1000000"}, "--max-seqs: engine: Config.MaxSeqs: 1000000, must be in [1, 65536]"},
		{[]string{"--max-tokens", "-1"}, "--max-tokens: engine: Config.MaxTokens: -1"},
		{[]string{"--max-tokens", "33554432"}, "--max-tokens: engine: Config.MaxTokens: 33554432, must be in [1, 16777216]"},
		{[]string{"--rope-positions", "2000000"}, "--rope-positions: engine: Config.RopePositions: 2000000"},
		{[]string{"--cpu-workers", "-2"}, "--cpu-workers: engine: Config.CPUWorkers: -2"},
		{[]string{"--backend", "auto", "--device", "-1"}, "--device: engine: Config.Device: -1"},
		{[]string{"--backend", "tpu"}, `--backend "tpu": want one of auto, cpu`},
		{[]string{"--memory-limit", "lots"}, `--memory-limit "lots": want a size like`},
		{[]string{"--memory-limit", "-1GiB"}, `--memory-limit "-1GiB"`},
		{[]string{"--memory-limit", "99999999TiB"}, `--memory-limit "99999999TiB"`},
		{[]string{"--dump", "unused", "--dump-layers", "4", "--layers", "2"}, `--dump-layers "4": layer 4 is beyond --layers 2 (layers 0 to 1 run)`},
		{[]string{"--dump", "unused", "--dump-layers", "0,5-7"}, `--dump-layers "0,5-7": layer 7 is beyond --layers 2`},
		// 2^24 tokens of 2 heads: 68 GiB of buffers, past a 1 GiB limit.
		{[]string{"--max-tokens", "16777216", "--memory-limit", "1GiB", "--input", "projected"},
			"--max-tokens: engine: Config.MaxTokens: more memory than MemoryLimit: the engine would allocate 68.0 GiB (input buffers 52.0 GiB, Q output 16.0 GiB"},
		// The chain's buffers count too.
		{[]string{"--max-tokens", "16777216", "--memory-limit", "1GiB"},
			"--max-tokens: engine: Config.MaxTokens: more memory than MemoryLimit: the engine would allocate 82.2 GiB (input buffers 52.0 GiB, Q output 16.0 GiB, chain buffers 14.2 GiB"},
		{[]string{"--pages", "1000000", "--layers", "0", "--memory-limit", "32GiB"},
			"--pages: engine: Config.Cache.NumPages: more memory than MemoryLimit: the engine would allocate 141.0 GiB (KV cache pools 139.5 GiB"},
		// The default is the host's available memory (the cpu backend):
		// 4 million pages of every layer pass any host.
		{[]string{"--pages", "4000000", "--layers", "0"},
			"--pages: engine: Config.Cache.NumPages: more memory than MemoryLimit: the engine would allocate"},
		{[]string{"--pages", "4000000", "--layers", "0"}, "(0: the cpu backend's free memory)"},
		{[]string{"--topk-scratch", "-1"}, "--topk-scratch: engine: Config.Compressor.IndexerTopKScratch: -1"},
		{[]string{"--input", "projected", "--topk-scratch", "64"}, "--topk-scratch: engine: Config.Compressor.IndexerTopKScratch: 64"},
		{[]string{"--indexer-query-format", "fp4"}, `--indexer-query-format "fp4": want mxfp4 or fp8`},
		{[]string{"--input", "projected", "--indexer-query-format", "fp8"}, "--indexer-query-format: engine: Config.Compressor.IndexerQueryFormat: fp8 without the indexer's compute"},
		// The fp8 query format runs no top-k selection: no scratch for it.
		{[]string{"--indexer-query-format", "fp8", "--topk-scratch", "64"}, "--topk-scratch: engine: Config.Compressor.IndexerTopKScratch: 64 with IndexerQueryFormat fp8, which runs no top-k selection"},
		{[]string{"--verify", "--pages", "300000", "--memory-limit", "24GiB"},
			"--verify: the engine and its cpu reference would allocate 45.1 GiB, more than --memory-limit 24.0 GiB (22.5 GiB each"},
	} {
		code, _, errOut := tiny(t, append([]string{"--trace", "testdata/small.jsonl"}, c.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%v", c.args)
	}
}

// TestHugeLineIsRefusedByLineNumber: a valid one-line trace asking for
// 2^24 tokens is refused with its line number, before the buffers it would
// size are allocated (it used to end in a fatal out-of-memory crash).
func TestHugeLineIsRefusedByLineNumber(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("# one huge prompt\n{\"context\":[{\"seq\":1,\"tokens\":16777216}]}\n"), 0o644))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pages", "8"}, "trace line 2: the batch's sequences hold 16777216 tokens after it, 262144 pages of 64 tokens, more than the whole pool of 8 pages: it can never fit (--pages 8, --page-size 64)"},
		// A pool that holds it: the buffers sized for the line pass the limit.
		{[]string{"--pages", "262144", "--memory-limit", "24GiB"}, "trace line 2: its batch of 16777216 tokens sets --max-tokens: engine: Config.MaxTokens: more memory than MemoryLimit: the engine would allocate"},
	} {
		code, _, errOut := tiny(t, append([]string{"--trace", path}, c.args...)...)
		require.Equal(t, exitError, code, errOut)
		require.Contains(t, errOut, c.want)
	}
}

func TestParseSelection(t *testing.T) {
	sel, largest, err := parseSelection("--x", "0, 3-5,9")
	require.NoError(t, err)
	require.Equal(t, 9, largest)
	var got []int
	for i := range 12 {
		if sel(i) {
			got = append(got, i)
		}
	}
	require.Equal(t, []int{0, 3, 4, 5, 9}, got)
	all, largest, err := parseSelection("--x", "all")
	require.NoError(t, err)
	require.True(t, all(12345))
	require.Equal(t, -1, largest)
	for _, bad := range []string{"", "-1", "1-", "a", "2-1", "1,,2"} {
		_, _, err := parseSelection("--x", bad)
		require.Error(t, err, bad)
	}
}

// TestDefaultRunShowsTheCacheModel: with no flags but the model, decode
// replays the embedded chain trace from hidden states through layers of
// ratio 4 and 128 with the compressor and the window, and its summary gives
// the accepted tokens, their rate and one longest-sequence figure. (The
// default model, V4-Flash, runs the same flags: its first four layers have
// ratios 0, 0, 4, 128.)
func TestDefaultRunShowsTheCacheModel(t *testing.T) {
	o, err := parseFlags(nil, &bytes.Buffer{})
	require.NoError(t, err)
	ro, steps, name, err := o.config(zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, "embedded chain trace", name)
	r, err := ro.Engine.Resolve()
	require.NoError(t, err)
	require.Equal(t, engine.InputHidden, r.Input)
	require.Equal(t, kvcache.DSv4Window, r.Cache.Window)
	require.True(t, r.Compresses())
	var ratios []int
	for l := range r.Layers {
		n, err := r.Model.CompressRatio(l)
		require.NoError(t, err)
		ratios = append(ratios, n)
	}
	require.Equal(t, []int{0, 0, 4, 128}, ratios, "V4-Flash's first four layers")
	accepts := 0
	for _, s := range steps {
		if s.Generation != nil && s.Generation.Accept != nil {
			accepts++
		}
	}
	require.Positive(t, accepts, "the trace has accept lists")

	code, out, errOut := tiny(t, "--summary-only", "--layers", strconv.Itoa(o.layers))
	require.Equal(t, exitOK, code, errOut)
	for _, want := range []string{
		"replayed embedded chain trace: 8 lines, 8 iterations",
		"tiny-dsv4, 4 layers",
		"tokens:   context 238, generation 60, total 298; accepted 274 (24 MTP drafts rejected)",
		" accepted tokens/s",
		"(window 128 tokens)",
		"pool ratio-4:", "pool ratio-128:",
		"longest sequence: 212 tokens:",
		" indexer entries selected (over the token rows of the ratio-4 layers)",
	} {
		require.Contains(t, out, want)
	}
	require.Equal(t, 1, strings.Count(out, "longest sequence"), "one longest-sequence figure")
}
