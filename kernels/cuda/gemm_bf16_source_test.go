package cuda_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// TestBF16GEMMSourceCompiles compiles the bf16 GEMM's module with NVRTC
// for the H200's architecture where NVRTC is installed (no GPU needed), as
// the backend does, without warnings.
func TestBF16GEMMSourceCompiles(t *testing.T) {
	skipCompileUnderRace(t)
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	c, err := driver.CompileDetailed(kernels.BF16GEMMSource(), "gemm_bf16.cu", driver.CompileOptions{Arch: "sm_90", NoFMAD: true, NoCache: true, Headers: kernels.Headers()})
	require.NoError(t, err)
	require.Empty(t, c.Log, "NVRTC log")
	require.True(t, bytes.Contains(c.Cubin, []byte("gemm_bf16_f32")), "the cubin has no gemm_bf16_f32")
}

// TestBF16MMAGEMMSourceCompiles compiles the tensor-core bf16 GEMM's module
// with NVRTC for the H200's architecture (no GPU needed), as the backend
// does, without warnings, and checks ptxas's report: no spills (the
// kernel's pipeline lives in registers).
func TestBF16MMAGEMMSourceCompiles(t *testing.T) {
	skipCompileUnderRace(t)
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	c, err := driver.CompileDetailed(kernels.BF16MMAGEMMSource(), "gemm_bf16_mma.cu", driver.CompileOptions{Arch: "sm_90", NoFMAD: true, NoCache: true, Headers: kernels.Headers()})
	require.NoError(t, err)
	require.Empty(t, c.Log, "NVRTC log")
	for _, name := range []string{"gemm_bf16_mma", "gemm_bf16_mma_d2f", "gemm_bf16_mma_d4", "gemm_bf16_mma_d8", "gemm_bf16_mma_d4f", "gemm_bf16_mma_d8f", "gemm_bf16_mma_d4w", "gemm_bf16_mma_d4wf", "gemm_bf16_mma_reduce"} {
		require.True(t, bytes.Contains(c.Cubin, []byte(name)), "the cubin has no %s", name)
	}
	v, err := driver.CompileDetailed(kernels.BF16MMAGEMMSource(), "gemm_bf16_mma.cu",
		driver.CompileOptions{Arch: "sm_90", NoFMAD: true, NoCache: true, Headers: kernels.Headers(), Extra: []string{"--ptxas-options=-v"}})
	require.NoError(t, err)
	t.Logf("ptxas:\n%s", v.Log)
	for _, name := range []string{"gemm_bf16_mma", "gemm_bf16_mma_d2f", "gemm_bf16_mma_d4", "gemm_bf16_mma_d8", "gemm_bf16_mma_d4f", "gemm_bf16_mma_d8f", "gemm_bf16_mma_d4w", "gemm_bf16_mma_d4wf", "gemm_bf16_mma_reduce"} {
		require.Regexp(t, `Function properties for `+name+`\n[^\n]* 0 bytes spill stores, 0 bytes spill loads\n`, v.Log, "%s spills", name)
	}
}
