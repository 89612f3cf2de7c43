package cuda_test

import (
	"context"
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/kernels/cuda"
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

// TestCUDAConformanceVariants runs the suite on every launch shape the
// backend can pick, including odd ones (a Q chunk that does not divide the
// heads) and programmatic dependent launch.
func TestCUDAConformanceVariants(t *testing.T) {
	backend(t)
	variants := map[string]cuda.Options{
		"rows2":           {RowsPerWarp: 2, WarpsPerBlock: 2},
		"rows4":           {RowsPerWarp: 4, WarpsPerBlock: 3},
		"q5x3":            {QWarps: 5, QRows: 3},
		"q1x1-pdl":        {QWarps: 1, QRows: 1, PDL: true},
		"rows4-q16x4-pdl": {RowsPerWarp: 4, QWarps: 16, QRows: 4, PDL: true},
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

func TestCUDAAvailableOrSkip(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("CUDA backend unavailable: %v", err)
	}
	b := backend(t)
	d, err := b.Time(context.Background(), func() error { return nil })
	require.NoError(t, err)
	require.GreaterOrEqual(t, d, 0*d)
}
