package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
)

// bf16Paths are the projection GEMM's implementations the tests force.
var bf16Paths = []string{"own", "cublaslt"}

// bf16Case is the shape grid of the GPU tests: V4's hidden sizes (K) and
// the projections' widths (N: ratio 128's 512, ratio 4's 1024, both
// halves of [wkv; wgate] at ratio 4), decode to prefill rows; every other
// case with X at an offset and padded stride and a padded, offset Y.
func bf16Cases() []mlatest.BF16GEMMCase {
	var cs []mlatest.BF16GEMMCase
	i := 0
	for _, k := range []int{1024, 4096, 7168} {
		for _, n := range []int{512, 1024, 2048} {
			for _, m := range []int{1, 2, 3, 16, 128, 1000} {
				c := mlatest.BF16GEMMCase{Rows: m, N: n, K: k}
				if i%2 == 1 {
					c.XOffset, c.XStride = 48, k+24
					c.YOffset, c.YStride = 32, n+12
				}
				cs = append(cs, c)
				i++
			}
		}
	}
	return cs
}

// forcePath sets the backend's projection GEMM path for the test and
// restores the default after it; it reports false (and logs why) when
// cuBLASLt is forced but absent.
func forcePath(t *testing.T, b *cuda.Backend, path string) bool {
	t.Helper()
	require.NoError(t, b.InitBF16GEMM())
	if path == "cublaslt" && b.CuBLASLtError() != nil {
		t.Logf("cuBLASLt unavailable: %v", b.CuBLASLtError())
		return false
	}
	b.SetBF16GEMMPath(path)
	t.Cleanup(func() { b.SetBF16GEMMPath("auto") })
	return true
}

// TestBF16GEMM compares the device's projection GEMM, on each
// implementation, with the CPU backend's within gemm.BoundBF16, every
// element, over the shape grid with random operands (seed logged); Y
// poisoned with NaN first, X's gaps and the bytes around X NaN.
func TestBF16GEMM(t *testing.T) {
	b := backend(t)
	host := cpu.New(0)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 21))
	ctx := context.Background()
	for _, c := range bf16Cases() {
		t.Run(c.String(), func(t *testing.T) {
			o := mlatest.RandomBF16Operands(r, c)
			hx, hw, err := mlatest.UploadBF16Operands(host, o, c.XOffset)
			require.NoError(t, err)
			want, err := mlatest.RunBF16GEMM(ctx, host, c, hx, hw)
			require.NoError(t, err)
			x, w, err := mlatest.UploadBF16Operands(b, o, c.XOffset)
			require.NoError(t, err)
			defer b.Free(x)
			defer b.Free(w)
			for _, path := range bf16Paths {
				t.Run(path, func(t *testing.T) {
					if !forcePath(t, b, path) {
						t.Skip("cuBLASLt unavailable")
					}
					if path == "cublaslt" {
						if err := b.CuBLASLtSupportsBF16(c.Rows, c.N, c.K, max(c.XStride, c.K), max(c.YStride, c.N)); err != nil {
							t.Skipf("cuBLASLt refuses the shape (the kernel runs it): %v", err)
						}
					}
					own0, lt0 := b.BF16GEMMCounts()
					got, err := mlatest.RunBF16GEMM(ctx, b, c, x, w)
					require.NoError(t, err)
					own1, lt1 := b.BF16GEMMCounts()
					if path == "own" {
						require.Equal(t, [2]int64{own0 + 1, lt0}, [2]int64{own1, lt1}, "the kernel did not run")
					} else {
						require.Equal(t, [2]int64{own0, lt0 + 1}, [2]int64{own1, lt1}, "cuBLASLt did not run")
					}
					cmp, err := gemm.CompareF32(o, want, got)
					require.NoError(t, err)
					require.Zero(t, cmp.Violations, "%v", cmp)
					t.Logf("worst element %.3g of the bound; accumulation difference %.3g S (bound %.3g S)", cmp.Worst, cmp.AccumRel, gemm.BoundBF16(c.K))
				})
			}
		})
	}
}

// TestBF16GEMMAuto: by default cuBLASLt runs every shape it accepts and
// the kernel the others.
func TestBF16GEMMAuto(t *testing.T) {
	b := backend(t)
	require.NoError(t, b.InitBF16GEMM())
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []mlatest.BF16GEMMCase{{Rows: 1, N: 512, K: 4096}, {Rows: 2, N: 1024, K: 1024}, {Rows: 64, N: 2048, K: 4096}} {
		o := mlatest.RandomBF16Operands(r, c)
		x, w, err := mlatest.UploadBF16Operands(b, o, 0)
		require.NoError(t, err)
		supported := b.CuBLASLtSupportsBF16(c.Rows, c.N, c.K, c.K, c.N)
		own0, lt0 := b.BF16GEMMCounts()
		got, err := mlatest.RunBF16GEMM(ctx, b, c, x, w)
		require.NoError(t, err)
		own1, lt1 := b.BF16GEMMCounts()
		if supported == nil {
			require.Equal(t, [2]int64{own0, lt0 + 1}, [2]int64{own1, lt1}, "%v: cuBLASLt accepts the shape but did not run it", c)
		} else {
			t.Logf("%v: cuBLASLt: %v", c, supported)
			require.Equal(t, [2]int64{own0 + 1, lt0}, [2]int64{own1, lt1}, "%v: the kernel did not run", c)
		}
		want, err := gemm.ReferenceBF16(o)
		require.NoError(t, err)
		require.NoError(t, gemm.CheckBoundF32(o, want, got))
		require.NoError(t, b.Free(x))
		require.NoError(t, b.Free(w))
	}
}

// TestBF16GEMMGraph captures the projection GEMM on each implementation
// into a CUDA graph: its replay writes what a direct call writes, within
// the bound of the host reference. The kernel's capture comes first, with
// the shape only prepared (PrepareBF16GEMM): nothing of ours loads or
// allocates during a capture. cuBLASLt's runs after a direct call, as the
// engine's first, eager run of a layer does (the library may load its own
// kernels at their first launch).
func TestBF16GEMMGraph(t *testing.T) {
	b := backend(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 22))
	ctx := context.Background()
	for i, path := range bf16Paths {
		t.Run(path, func(t *testing.T) {
			if !forcePath(t, b, path) {
				t.Skip("cuBLASLt unavailable")
			}
			// A shape of its own per path, so that the kernel's capture is
			// the shape's first call.
			c := mlatest.BF16GEMMCase{Rows: 5 + 8*i, N: 1024, K: 4096, XOffset: 16, XStride: 4104, YOffset: 16, YStride: 1028}
			require.NoError(t, b.PrepareBF16GEMM(c.Rows, c.N, c.K, c.XStride, c.YStride))
			if path == "cublaslt" {
				if err := b.CuBLASLtSupportsBF16(c.Rows, c.N, c.K, c.XStride, c.YStride); err != nil {
					t.Skipf("cuBLASLt refuses the shape: %v", err)
				}
			}
			o := mlatest.RandomBF16Operands(r, c)
			x, w, err := mlatest.UploadBF16Operands(b, o, c.XOffset)
			require.NoError(t, err)
			defer b.Free(x)
			defer b.Free(w)
			size := mlatest.BF16GEMMYBytes(c)
			y, err := b.Alloc(size)
			require.NoError(t, err)
			defer b.Free(y)
			args := mlatest.BF16GEMMArgs(c, x, w, y)
			direct := func() []byte {
				require.NoError(t, b.Fill(y, 0, size, 0xFF))
				require.NoError(t, b.BF16GEMM(ctx, args))
				out := make([]byte, size)
				require.NoError(t, b.Read(out, y, 0))
				return out
			}
			var first []byte
			if path == "cublaslt" {
				first = direct()
			}
			require.NoError(t, b.Fill(y, 0, size, 0xFF))
			g, err := b.Capture(func() error { return b.BF16GEMM(ctx, args) })
			require.NoError(t, err)
			defer g.Close()
			require.NoError(t, g.Launch())
			require.NoError(t, b.Synchronize(ctx))
			replayed := make([]byte, size)
			require.NoError(t, b.Read(replayed, y, 0))
			got, err := mlatest.ReadBF16GEMMY(c, replayed)
			require.NoError(t, err)
			want, err := gemm.ReferenceBF16(o)
			require.NoError(t, err)
			require.NoError(t, gemm.CheckBoundF32(o, want, got))
			if first == nil {
				first = direct()
			}
			require.Equal(t, first, replayed, "the replay differs from the direct call")
		})
	}
}

// TestBF16GEMMRefusals: bad arguments are refused before anything is
// enqueued, on each implementation.
func TestBF16GEMMRefusals(t *testing.T) {
	b := backend(t)
	for _, path := range bf16Paths {
		t.Run(path, func(t *testing.T) {
			if !forcePath(t, b, path) {
				t.Skip("cuBLASLt unavailable")
			}
			mlatest.TestBF16GEMMRefusals(t, b)
		})
	}
	// A host buffer is not device memory.
	host, err := cpu.New(1).Alloc(1 << 12)
	require.NoError(t, err)
	c := mlatest.BF16GEMMCase{Rows: 1, N: 8, K: 8}
	dev, err := b.Alloc(1 << 12)
	require.NoError(t, err)
	defer b.Free(dev)
	for name, a := range map[string]*mla.BF16GEMMArgs{
		"X": mlatest.BF16GEMMArgs(c, host, dev, dev),
		"W": mlatest.BF16GEMMArgs(c, dev, host, dev),
		"Y": mlatest.BF16GEMMArgs(c, dev, dev, host),
	} {
		require.ErrorContains(t, b.BF16GEMM(context.Background(), a), "not a CUDA buffer", name)
	}
}

// BenchmarkBF16GEMM times the projection GEMM at V4-Flash's ratio-4 shape
// ([wkv; wgate]: 2048 outputs from hidden 4096) on each implementation,
// each call synchronized.
func BenchmarkBF16GEMM(bm *testing.B) {
	if err := cuda.Available(); err != nil {
		bm.Skipf("CUDA backend unavailable: %v", err)
	}
	b, err := cuda.New(cuda.Options{})
	require.NoError(bm, err)
	defer b.Close()
	require.NoError(bm, b.InitBF16GEMM())
	ctx := context.Background()
	for _, path := range bf16Paths {
		if path == "cublaslt" && b.CuBLASLtError() != nil {
			continue
		}
		b.SetBF16GEMMPath(path)
		for _, m := range []int{1, 16, 128, 1024} {
			c := mlatest.BF16GEMMCase{Rows: m, N: 2048, K: 4096}
			if path == "cublaslt" && b.CuBLASLtSupportsBF16(m, c.N, c.K, c.K, c.N) != nil {
				continue
			}
			o := mlatest.RandomBF16Operands(rand.New(rand.NewPCG(1, uint64(m))), c)
			x, w, err := mlatest.UploadBF16Operands(b, o, 0)
			require.NoError(bm, err)
			y, err := b.Alloc(mlatest.BF16GEMMYBytes(c))
			require.NoError(bm, err)
			a := mlatest.BF16GEMMArgs(c, x, w, y)
			bm.Run(fmt.Sprintf("%s/m%d", path, m), func(bm *testing.B) {
				bm.SetBytes(int64(2 * c.N * c.K))
				for bm.Loop() {
					if err := b.BF16GEMM(ctx, a); err != nil {
						bm.Fatal(err)
					}
					if err := b.Synchronize(ctx); err != nil {
						bm.Fatal(err)
					}
				}
			})
			for _, buf := range []mla.Buffer{x, w, y} {
				require.NoError(bm, b.Free(buf))
			}
		}
	}
}
