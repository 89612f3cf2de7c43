package cuda_test

import (
	"context"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/numerics"
)

var (
	shared     *cuda.Backend
	sharedErr  error
	sharedOnce sync.Once
)

// backend opens one device backend for the package's tests, or skips with
// the reason CUDA is unavailable.
func backend(t *testing.T) *cuda.Backend {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("CUDA backend unavailable: %v", err)
	}
	sharedOnce.Do(func() { shared, sharedErr = cuda.New(cuda.Options{}) })
	require.NoError(t, sharedErr)
	return shared
}

func TestCUDAConformance(t *testing.T) {
	b := backend(t)
	p := b.Props()
	t.Logf("device %s (%s, %d SMs)", p.Name, p.Arch(), p.SMCount)
	mlatest.Test(t, b)
}

// TestCUDAConformanceVariants runs the suite on other launch shapes:
// warps that stream long ranges through their rings (odd warp counts and
// depths), one row in flight, and launches without programmatic dependent launch.
func TestCUDAConformanceVariants(t *testing.T) {
	backend(t)
	variants := map[string]cuda.Options{
		// One small block: every warp streams a long range through its ring.
		"one-block": {Warps: 3, KVDepth: 3, QDepth: 5, MaxBlocks: 1},
		"depth1":    {Warps: 1, KVDepth: 1, QDepth: 1, MaxBlocks: 2},
		"no-pdl":    {NoPDL: true},
		"separate":  {SeparateLaunches: true},
		"wide":      {Warps: 4, KVDepth: 8, QDepth: 8},
	}
	for name, opts := range variants {
		b, err := cuda.New(opts)
		require.NoError(t, err)
		t.Run(name, func(t *testing.T) { mlatest.Test(t, b) })
		require.NoError(t, b.Close())
	}
}

func TestCUDAMixedEqualsParts(t *testing.T) {
	mlatest.MixedEqualsParts(t, backend(t))
}

// TestCUDAE4M3Exhaustive converts every float32 bit pattern with the
// hardware instruction and compares it with numerics.E4M3FromF32.
func TestCUDAE4M3Exhaustive(t *testing.T) {
	b := backend(t)
	if testing.Short() {
		t.Skip("short mode: the 2^32 sweep takes about a minute")
	}
	const chunk = 1 << 28
	out, err := b.Alloc(chunk)
	require.NoError(t, err)
	defer b.Free(out)
	host := make([]byte, chunk)
	diffs := 0
	negNaN := map[byte]int{}
	for c := uint64(0); c < 1<<32; c += chunk {
		base := uint32(c)
		require.NoError(t, b.E4M3Sweep(out, base, chunk))
		require.NoError(t, b.Read(host, out, 0))
		workers := runtime.GOMAXPROCS(0)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				local := 0
				localNaN := map[byte]int{}
				for i := w; i < chunk; i += workers {
					bits := base + uint32(i)
					f := math.Float32frombits(bits)
					want := numerics.E4M3FromF32(f)
					if host[i] != want {
						local++
						if local <= 3 {
							t.Errorf("e4m3(%#08x = %g): hardware %#02x, Go %#02x", bits, f, host[i], want)
						}
					}
					if f != f && bits&0x80000000 != 0 {
						localNaN[host[i]]++
					}
				}
				mu.Lock()
				diffs += local
				for k, v := range localNaN {
					negNaN[k] += v
				}
				mu.Unlock()
			}(w)
		}
		wg.Wait()
	}
	t.Logf("2^32 inputs, %d differences; negative NaN inputs became %v", diffs, negNaN)
	require.Zero(t, diffs)
}

// TestCUDABF16Exhaustive rounds every float32 bit pattern to bf16 with the
// kernels' hardware conversion and compares it with numerics.BF16FromF32.
func TestCUDABF16Exhaustive(t *testing.T) {
	b := backend(t)
	if testing.Short() {
		t.Skip("short mode: the 2^32 sweep takes about a minute")
	}
	const chunk = 1 << 28
	out, err := b.Alloc(2 * chunk)
	require.NoError(t, err)
	defer b.Free(out)
	host := make([]byte, 2*chunk)
	var diffs atomic.Int64
	for c := uint64(0); c < 1<<32; c += chunk {
		base := uint32(c)
		require.NoError(t, b.BF16Sweep(out, base, chunk))
		require.NoError(t, b.Read(host, out, 0))
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := w; i < chunk; i += workers {
					bits := base + uint32(i)
					got := uint16(host[2*i]) | uint16(host[2*i+1])<<8
					if want := numerics.BF16FromF32(math.Float32frombits(bits)); got != want {
						if diffs.Add(1) <= 3 {
							t.Errorf("bf16(%#08x): GPU %#04x, Go %#04x", bits, got, want)
						}
					}
				}
			}(w)
		}
		wg.Wait()
	}
	t.Logf("2^32 inputs, %d differences", diffs.Load())
	require.Zero(t, diffs.Load())
}

func TestCUDAAvailableOrSkip(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("CUDA backend unavailable: %v", err)
	}
	b := backend(t)
	d, err := b.Time(context.Background(), func() error { return nil })
	require.NoError(t, err)
	require.GreaterOrEqual(t, d, 0*d)
}
