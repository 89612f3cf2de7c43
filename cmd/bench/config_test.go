package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/kvcache"
)

func TestParseFlagsDefaults(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 4, 8, 16, 32, 64, 128, 256}, c.GenBatches)
	assert.Equal(t, []int{0, 3}, c.MTPs)
	assert.Equal(t, []int{1024, 4096, 16384, 65536}, c.CtxTokens)
	require.Len(t, c.Models, 2)
	assert.Equal(t, "flash", c.Models[0].Name)
	assert.Equal(t, 64, c.Models[0].Heads)
	assert.Equal(t, 43, c.Models[0].Layers)
	assert.Equal(t, "pro", c.Models[1].Name)
	assert.Equal(t, 1536, c.Models[1].QLora)
	assert.Equal(t, []kvcache.Format{kvcache.FormatFP8UE8M0, kvcache.FormatBF16, kvcache.FormatFP8PerTensor}, c.Formats)
	assert.True(t, c.Kernels && c.Graph && c.Iteration && c.HostCost && c.VariantKernels)
	assert.Equal(t, int64(48e9), c.GraphMemBytes)
	assert.Equal(t, variant{}, c.Main)
	assert.Empty(t, c.Variants)
	assert.Len(t, c.shapes(), 9*2+4)
	assert.True(t, c.Chain)
	assert.Equal(t, 8, c.ChainLayers)
	assert.Equal(t, []int{1, 8, 32, 128, 256}, c.ChainBatches)
	assert.Equal(t, []int{1024, 4096, 16384}, c.ChainCtxTokens)
	assert.Len(t, c.chainShapes(), 5*2+3)
	assert.Equal(t, 20, c.IterationReps)
	assert.Empty(t, c.CPUProfile)
}

func TestParseFlagsProfile(t *testing.T) {
	c, err := parseFlags([]string{"--iteration-reps", "5000", "--cpuprofile", "eager.prof"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 5000, c.IterationReps)
	assert.Equal(t, "eager.prof", c.CPUProfile)
	_, err = parseFlags([]string{"--iteration-reps", "0"}, io.Discard)
	require.EqualError(t, err, "--iteration-reps = 0, must be in [1, 100000]")

	path := filepath.Join(t.TempDir(), "cpu.prof")
	stop, err := startCPUProfile(path)
	require.NoError(t, err)
	require.NoError(t, stop())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Positive(t, fi.Size(), "the profile was written")
	_, err = startCPUProfile(filepath.Join(t.TempDir(), "missing", "cpu.prof"))
	require.ErrorContains(t, err, "--cpuprofile: ")
}

func TestParseFlagsChainOnly(t *testing.T) {
	c, err := parseFlags([]string{"--chain-only", "--chain-layers", "4"}, io.Discard)
	require.NoError(t, err)
	assert.True(t, c.Chain)
	assert.False(t, c.Kernels || c.Graph || c.Iteration || c.HostCost, "only the chain runs")
	assert.Equal(t, 4, c.ChainLayers)

	c, err = parseFlags([]string{"--quick"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 32}, c.ChainBatches)
	assert.Equal(t, []int{4096}, c.ChainCtxTokens)
}

func TestParseFlagsQuick(t *testing.T) {
	c, err := parseFlags([]string{"--quick", "--models", "pro", "--variant", "warps=4", "--variants", "nopdl;qd=2"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 32, 256}, c.GenBatches)
	assert.Equal(t, []int{4096}, c.CtxTokens)
	assert.Equal(t, 4, c.Main.Warps)
	require.Len(t, c.Variants, 2)
	assert.True(t, c.Variants[0].NoPDL)
	assert.Equal(t, 2, c.Variants[1].QDepth)

	// Explicit lists win over --quick; "none" drops the context shapes.
	c, err = parseFlags([]string{"--quick", "--gen-batches", "3,5", "--ctx-tokens", "none", "--mtp", "1"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []int{3, 5}, c.GenBatches)
	assert.Empty(t, c.CtxTokens)
	shapes := c.shapes()
	require.Len(t, shapes, 2)
	assert.Equal(t, 6, shapes[0].Tokens)
	assert.Equal(t, 10, shapes[1].Tokens)
}

func TestParseFlagsErrors(t *testing.T) {
	cases := []struct {
		args []string
		err  string
	}{
		{[]string{"--models", "flash,huge"}, `unknown model "huge"`},
		{[]string{"--models", ","}, "no model named"},
		{[]string{"--formats", "fp4"}, "--formats"},
		{[]string{"--gen-batches", "1,x"}, `--gen-batches: "x" is not a whole number`},
		{[]string{"--gen-batches", "0"}, "--gen-batches: 0 is outside [1, 4096]"},
		{[]string{"--mtp", "16"}, "--mtp: 16 is outside"},
		{[]string{"--ctx-tokens", "-5"}, "--ctx-tokens: -5 is outside"},
		{[]string{"--variant", "warps=z"}, "--variant: "},
		{[]string{"--variants", "qd=1;bad"}, `--variants: variant "bad": unknown option`},
		{[]string{"--reps", "0"}, "--reps = 0"},
		{[]string{"--graph-reps", "-1"}, "--graph-reps = -1"},
		{[]string{"--graph-mem-gb", "0"}, "--graph-mem-gb = 0"},
		{[]string{"--contiguous-latent", "--check-dir", "x"}, "--contiguous-latent is a diagnostic"},
		{[]string{"--chain-layers", "0"}, "--chain-layers = 0"},
		{[]string{"--chain-batches", "0"}, "--chain-batches: 0 is outside"},
		{[]string{"--chain-ctx-tokens", "x"}, `--chain-ctx-tokens: "x" is not a whole number`},
		{[]string{"--chain-only", "--chain=false"}, "--chain-only and --chain=false"},
		{[]string{"--contiguous-latent"}, "the chain writes the fused rows"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, "no-such-flag"},
	}
	for _, c := range cases {
		t.Run(c.err, func(t *testing.T) {
			_, err := parseFlags(c.args, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.err)
		})
	}
}

// TestFlushBytes: the H200's 50 MB L2 gets the 256 MiB every result was
// measured with; a larger L2 five times its size.
func TestFlushBytes(t *testing.T) {
	require.Equal(t, 256<<20, flushBytes(50<<20))
	require.Equal(t, 256<<20, flushBytes(0))
	require.Equal(t, 5*(126<<20), flushBytes(126<<20))
}
