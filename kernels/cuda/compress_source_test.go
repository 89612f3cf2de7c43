package cuda_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// TestCompressSourceCompiles compiles the compressor's module with NVRTC
// for the H200's architecture where NVRTC is installed (no GPU needed):
// the module defines compress_entries and none of prologue.cu's kernels.
func TestCompressSourceCompiles(t *testing.T) {
	skipCompileUnderRace(t)
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	c, err := driver.CompileDetailed(kernels.CompressSource(), "compress.cu", driver.CompileOptions{Arch: "sm_90", NoFMAD: true, NoCache: true, Headers: kernels.Headers()})
	require.NoError(t, err)
	t.Logf("NVRTC log: %q", c.Log)
	require.True(t, bytes.Contains(c.Cubin, []byte("compress_entries")), "the cubin has no compress_entries")
	for _, k := range []string{"kv_fp8_ue8m0", "q_fp8", "layer_bf16_qbf16"} {
		require.False(t, bytes.Contains(c.Cubin, []byte(k)), "the compressor's module compiled prologue kernel %s", k)
	}
}

func TestCompressSourceLayout(t *testing.T) {
	src := kernels.CompressSource()
	require.Contains(t, src, "#define PROLOGUE_HELPERS_ONLY  // prologue.cu's helpers, none of its kernels\n#include \"prologue.cu\"\n#include \"exp32.cuh\"\n")
	require.Contains(t, src, "\n#line 1 \"indexer.cu\"\n")
}
