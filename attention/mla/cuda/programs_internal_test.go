package cuda

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// TestProgramsCompile compiles every program of the backend to PTX with
// the options it loads with (the default knobs), wherever NVRTC loads: on
// the build machine too (CUDA 11.8's NVRTC, Debian's libnvrtc11.2, is
// enough for compute_90), so a kernel edit that stops compiling fails here
// before it reaches a device. PTX is what NVRTC's front end produces;
// ptxas runs only on the device.
func TestProgramsCompile(t *testing.T) {
	skipCompileUnderRace(t)
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("NVRTC not found, the kernels' sources are not compiled on this machine: %v", err)
	}
	major, minor, path, _ := driver.NVRTCVersion()
	t.Logf("NVRTC %d.%d from %s", major, minor, path)
	files := map[string]bool{}
	for _, p := range programs {
		files[p.file] = true
		t.Run(p.file, func(t *testing.T) {
			opts := p.options("sm_90", cudatune.Knobs{}.Defaults())
			if strings.HasSuffix(opts.Arch, "a") && major < 12 {
				// NVRTC 11 has no arch-specific targets; the front end is
				// the same (the wgmma and bulk copy PTX are inline asm,
				// checked by ptxas on the device only).
				t.Logf("%s: NVRTC %d.%d has no %s, compiled for compute_90", p.file, major, minor, opts.Arch)
				opts.Arch = "sm_90"
			}
			ptx, err := driver.CompilePTX(p.src(), p.file, opts)
			require.NoError(t, err)
			require.True(t, strings.Contains(ptx, ".entry"), "the PTX has kernels")
		})
	}
	require.Len(t, files, len(programs), "each program once")
}

// TestRewriteSourceCompiles compiles the backed-out f16 rewrite of the FP8
// GEMM that TestCUDAGEMMChainReplay -gemm.rewrite runs (testdata), with the
// options LoadRewriteGEMM uses, so the device run does not find it broken.
func TestRewriteSourceCompiles(t *testing.T) {
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("NVRTC not found: %v", err)
	}
	src, err := os.ReadFile("testdata/gemm_fp8_f16_rewrite_508f76b.cu")
	require.NoError(t, err)
	stages, _ := rewriteStages(227 << 10) // the H200's opt-in shared memory a block
	require.Equal(t, 4, stages)
	opts := fp8GEMMProgram.opts("sm_90", cudatune.Knobs{}.Defaults())
	opts.Defines = map[string]string{"GEMM_STAGES": strconv.Itoa(stages)}
	for _, s := range []string{string(src), CoherentLoads(string(src))} {
		ptx, err := driver.CompilePTX(s, "gemm_fp8_f16_rewrite_508f76b.cu", opts)
		require.NoError(t, err)
		require.Contains(t, ptx, ".entry gemm_fp8(")
	}
}

// skipCompileUnderRace skips a test that only runs NVRTC under the race
// detector: the compiler is native code the detector does not watch, and
// it took half of the package's time under -race (25 of 57 CPU seconds,
// 2026-12-02). .ci/run's second step (no detector, the invariants tag)
// compiles every program. (kernels/cuda's tests have the same helper: a
// test helper does not cross packages.)
func skipCompileUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("-race: NVRTC is native code the detector does not watch; .ci/run's step without -race compiles every program")
	}
}
