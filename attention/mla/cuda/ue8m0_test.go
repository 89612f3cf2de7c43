package cuda_test

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/numerics"
)

// ue8m0Source holds the test-only exponent sweep, embedded so that the test
// binary runs from any directory.
//
//go:embed testdata/ue8m0.cu
var ue8m0Source string

// TestCUDAUE8M0ExponentExhaustive runs both modules' ue8m0_exp (prologue.cu's,
// of the KV cache's fp8_ue8m0 groups, and chain.cu's, of act_quant's blocks:
// the division-free form, numerics.UE8M0ExponentBits) on every float32 bit
// pattern and compares each byte with the exponent of numerics.UE8M0, the
// division form. The outputs are poisoned with 0xFF, a byte no exponent
// takes, before each chunk.
func TestCUDAUE8M0ExponentExhaustive(t *testing.T) {
	b := backend(t)
	if testing.Short() {
		t.Skip("short mode: the 2^32 sweep takes about a minute")
	}
	modules := []struct {
		name    string
		compile func(file, src string) (*driver.Module, error)
	}{
		{"prologue.cu", b.CompileWithTestKernels},
		{"chain.cu", b.CompileWithChainKernels},
	}
	const chunk = 1 << 28
	fns := make([]*driver.Function, len(modules))
	hosts := make([][]byte, len(modules))
	for m, mod := range modules {
		compiled, err := mod.compile("ue8m0.cu", ue8m0Source)
		require.NoError(t, err, mod.name)
		defer func() { require.NoError(t, compiled.Unload()) }()
		fns[m], err = compiled.Function("ue8m0_exp_sweep")
		require.NoError(t, err, mod.name)
		hosts[m] = make([]byte, chunk)
	}
	out, err := b.Alloc(chunk)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Free(out)) }()
	grid := driver.Dim3{uint32(b.Props().SMCount * 8), 1, 1}

	diffs := make([]atomic.Int64, len(modules))
	everyFloat32(t, chunk, func(base uint32) {
		for m := range modules {
			require.NoError(t, b.Fill(out, 0, chunk, 0xFF))
			require.NoError(t, b.Context().Launch(fns[m], grid, driver.Dim3{256, 1, 1}, 0, b.Stream(),
				out.(*cuda.Buffer).Ptr(), base, uint32(chunk)))
			require.NoError(t, b.Read(hosts[m], out, 0))
		}
	}, func(i int, bits uint32) error {
		want, _ := numerics.UE8M0(math.Float32frombits(bits))
		var errs []error
		for m, host := range hosts {
			if host[i] != want {
				diffs[m].Add(1)
				errs = append(errs, fmt.Errorf("%s: ue8m0_exp(%#08x = %g) = %d, UE8M0's exponent %d",
					modules[m].name, bits, math.Float32frombits(bits), host[i], want))
			}
		}
		return errors.Join(errs...)
	})
	for m, mod := range modules {
		t.Logf("%s: 2^32 inputs, %d differences", mod.name, diffs[m].Load())
		require.Zero(t, diffs[m].Load(), mod.name)
	}
}

// TestUE8M0TestKernelCompiles compiles testdata/ue8m0.cu after prologue.cu's
// helpers (PROLOGUE_HELPERS_ONLY, as the compressor's program: its kernels
// need a newer NVRTC than some hosts have) and after chain.cu with NVRTC
// where it is installed (no GPU needed).
func TestUE8M0TestKernelCompiles(t *testing.T) {
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	for _, c := range []struct {
		name, src string
		kernels   []string
	}{
		{"prologue.cu", "#define PROLOGUE_HELPERS_ONLY\n" + kernels.PrologueSource(), []string{"ue8m0_exp_sweep"}},
		{"chain.cu", kernels.ChainSource(), []string{"ue8m0_exp_sweep", "act_quant", "norm_quant"}},
	} {
		src := c.src + "\n#line 1 \"ue8m0.cu\"\n" + ue8m0Source
		compiled, err := driver.CompileDetailed(src, "ue8m0.cu", driver.CompileOptions{Arch: "sm_90", NoCache: true, Headers: kernels.Headers()})
		require.NoError(t, err, c.name)
		for _, k := range c.kernels {
			require.True(t, bytes.Contains(compiled.Cubin, []byte(k)), "%s: the cubin has no %s", c.name, k)
		}
	}
}
