package cuda

import (
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
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("NVRTC not found, the kernels' sources are not compiled on this machine: %v", err)
	}
	major, minor, path, _ := driver.NVRTCVersion()
	t.Logf("NVRTC %d.%d from %s", major, minor, path)
	files := map[string]bool{}
	for _, p := range programs {
		files[p.file] = true
		t.Run(p.file, func(t *testing.T) {
			opts := p.opts("sm_90", cudatune.Knobs{}.Defaults())
			ptx, err := driver.CompilePTX(p.src(), p.file, opts)
			require.NoError(t, err)
			require.True(t, strings.Contains(ptx, ".entry"), "the PTX has kernels")
		})
	}
	require.Len(t, files, len(programs), "each program once")
}
