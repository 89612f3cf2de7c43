package cuda_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// TestTopKSourceCompiles compiles the top-k module with NVRTC for the
// H200's architecture where NVRTC is installed (no GPU needed).
func TestTopKSourceCompiles(t *testing.T) {
	skipCompileUnderRace(t)
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	// A cubin links the device intrinsics (__dp4a), which NVRTC provides
	// from CUDA 12 on, the backend's minimum; an older NVRTC (Debian's 11.8
	// on the build machine) is left to TestProgramsCompile's PTX check.
	if major, minor, _, _ := driver.NVRTCVersion(); major < 12 {
		t.Skipf("NVRTC %d.%d: the backend needs 12 or later to build a cubin; attention/mla/cuda's TestProgramsCompile checks the source", major, minor)
	}
	c, err := driver.CompileDetailed(kernels.TopKSource(), "topk.cu", driver.CompileOptions{Arch: "sm_90", NoFMAD: true, NoCache: true, Headers: kernels.Headers()})
	require.NoError(t, err)
	t.Logf("NVRTC log: %q", c.Log)
	for _, k := range []string{kernels.TopKScoreKernel, kernels.TopKScoreMMA4XKernel, kernels.TopKSelect4NKernel, kernels.TopKSelect5EKernel} {
		require.True(t, bytes.Contains(c.Cubin, []byte(k)), "the cubin has no %s", k)
	}
}

// TestTopKSourceLayout: the module is topk.cu (including common.cuh), which
// defines the kernels the host loads by name and takes TopKParams.
func TestTopKSourceLayout(t *testing.T) {
	src := kernels.TopKSource()
	require.Contains(t, src, "\n#include \"common.cuh\"\n")
	for _, k := range []string{kernels.TopKScoreKernel, kernels.TopKScoreMMA4XKernel, kernels.TopKSelect4NKernel, kernels.TopKSelect5EKernel} {
		require.Contains(t, src, `extern "C" __global__ void __launch_bounds__`)
		require.Regexp(t, `\) `+k+`\(const TopKParams p\)`, src)
	}
}
