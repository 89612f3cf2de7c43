package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// wgmmaShared is one backend a split finish, made once.
type wgmmaShared struct {
	once         sync.Once
	b            *cuda.Backend
	err, skipErr error
}

var wgmmaBackends = make([]wgmmaShared, len(wgmmaFinishes))

// wgmmaFinishes are the wgmma kernel's ways to finish a split K, as
// cudatune.Knobs.WGMMAClusterSplits names them (the tile's last block from global
// partials, thread-block clusters of up to 8 splits reduced through
// distributed shared memory), and its blocks sharing the activation tile
// in clusters of 2 and 4 (Knobs.WGMMAMulticast), which run
// wgmmaMulticastCases; then the narrow kernel families (Knobs.WGMMAKernel)
// with each split finish (TestCUDAWGMMANarrowGEMM runs wgmmaNarrowCases
// on them); then the token chunks of a weight tile sharing it in clusters
// (Knobs.WGMMAWeightMulticast, up to 4 chunks: Knobs.WGMMANarrowChunks),
// and with the activation shared too (clusters of 4 chunks x 2 tiles).
var wgmmaFinishes = []struct {
	name                     string
	clusterSplits, multicast int
	kernel                   cudatune.WGMMAKernel
	wcast, chunks            int
}{{"last-block", -1, -1, 0, 0, 0}, {"cluster", 8, -1, 0, 0, 0}, {"multicast-2", 8, 2, 0, 0, 0}, {"multicast-4", 8, 4, 0, 0, 0},
	{"narrow-last-block", -1, -1, cudatune.WGMMANarrow, 0, 0}, {"narrow-cluster", 8, -1, cudatune.WGMMANarrow, 0, 0},
	{"narrow-pipe-last-block", -1, -1, cudatune.WGMMANarrowPipe, 0, 0}, {"narrow-pipe-cluster", 8, -1, cudatune.WGMMANarrowPipe, 0, 0},
	{"wide-pipe-cluster", 8, -1, cudatune.WGMMAWidePipe, 0, 0},
	{"wcast-4", 8, -1, 0, 4, 0}, {"narrow-wcast-4", -1, -1, cudatune.WGMMANarrow, 4, 4},
	{"narrow-pipe-wcast-4", 8, -1, cudatune.WGMMANarrowPipe, 4, 4}, {"narrow-pipe-wcast-2", 8, -1, cudatune.WGMMANarrowPipe, 2, 0},
	{"narrow-pipe-wcast-4-mc-2", 8, 2, cudatune.WGMMANarrowPipe, 4, 4}}

// wgmmaBackend is a backend whose every FP8 GEMM runs the sm_90a wgmma
// kernel (Options.GEMMWGMMA, cuBLASLt not loaded) with split finish f of
// wgmmaFinishes, or skips the test saying why the kernel cannot run here.
func wgmmaBackend(t *testing.T, f int) *cuda.Backend {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("CUDA backend unavailable: %v", err)
	}
	w := &wgmmaBackends[f]
	w.once.Do(func() {
		w.b, w.err = cuda.NewTuned(cuda.Options{GEMMWGMMA: true, NoCuBLASLt: true},
			cudatune.Knobs{WGMMAClusterSplits: wgmmaFinishes[f].clusterSplits, WGMMAMulticast: wgmmaFinishes[f].multicast,
				WGMMAKernel: wgmmaFinishes[f].kernel, WGMMAWeightMulticast: wgmmaFinishes[f].wcast, WGMMANarrowChunks: wgmmaFinishes[f].chunks})
		if w.err == nil {
			if err := w.b.InitGEMM(); errors.Is(err, cuda.ErrWGMMAUnavailable) {
				w.skipErr = err
			} else {
				w.err = err
			}
		}
	})
	if w.skipErr != nil {
		t.Skipf("%v", w.skipErr)
	}
	require.NoError(t, w.err)
	return w.b
}

// wgmmaRows are the batch sizes the wgmma kernel is checked at: every
// token tile's edges (8, 16, 32, 64, 128 and one past), two chunks (129,
// 256) and four (512).
var wgmmaRows = []int{1, 2, 3, 8, 16, 31, 32, 64, 127, 128, 129, 256, 512}

// wgmmaCases are TestCUDAWGMMAGEMM's cases: both models' four GEMMs at
// full size up to 32 rows (V4-Pro's wq_b, 100 MB of weights, at 1 and 8),
// every size of wgmmaRows with the models' K and 256 outputs (so N is
// narrow and K splits at every M), odd sizes with a padded scale stride
// and a strided, offset Y; 4096 rows once; NaN inputs over two chunks
// (TestCUDAWGMMASmallShapes runs mlatest's small cases).
func wgmmaCases() []mlatest.GEMMCase {
	var cs []mlatest.GEMMCase
	odd := func(c mlatest.GEMMCase) mlatest.GEMMCase {
		if c.Rows%2 == 1 {
			c.ScaleStride = c.Rows + 3
			c.YOffset = 48
			c.YStride = c.Shape.N + 24
		}
		return c
	}
	full := append(append([]mlatest.GEMMShape{}, mlatest.FlashGEMMs...), mlatest.ProGEMMs...)
	for _, s := range full {
		rows := []int{1, 3, 8, 16, 32}
		if s.N*s.K > 64<<20 {
			rows = []int{1, 8}
		}
		for _, m := range rows {
			cs = append(cs, odd(mlatest.GEMMCase{Shape: s, Rows: m}))
		}
	}
	for _, s := range full {
		narrow := mlatest.GEMMShape{Name: fmt.Sprintf("%s-n256", s.Name), N: 256, K: s.K}
		for _, m := range wgmmaRows {
			cs = append(cs, odd(mlatest.GEMMCase{Shape: narrow, Rows: m}))
		}
	}
	return append(cs,
		mlatest.GEMMCase{Shape: mlatest.GEMMShape{Name: "flash-wqb-n256", N: 256, K: 1024}, Rows: 4096},
		mlatest.GEMMCase{Shape: mlatest.GEMMShape{Name: "n256-k384", N: 256, K: 384}, Rows: 130, NaN: true})
}

// wgmmaNarrowCases are the shapes the narrow kernels are for at the
// sizes where their token tile narrows (several chunks of the full K, no
// split) and around them: V4-Flash's and V4-Pro's [wq_a; wkv] and the
// indexer's wq_b at 64, 96, 127, 128 and 129 rows, odd sizes with a
// padded scale stride and a strided, offset Y.
func wgmmaNarrowCases() []mlatest.GEMMCase {
	var cs []mlatest.GEMMCase
	for _, s := range []mlatest.GEMMShape{mlatest.FlashGEMMs[0], mlatest.ProGEMMs[0],
		{Name: "flash-idx-wqb", N: 8192, K: 1024}, {Name: "pro-idx-wqb", N: 8192, K: 1536}} {
		for _, m := range []int{64, 96, 127, 128, 129} {
			c := mlatest.GEMMCase{Shape: s, Rows: m}
			if m%2 == 1 {
				c.ScaleStride, c.YOffset, c.YStride = m+3, 48, s.N+24
			}
			cs = append(cs, c)
		}
	}
	return cs
}

// wgmmaMulticastCases are the shapes whose blocks share the activation
// tile: 68 row tiles (more than half the device, so no split; a multiple
// of 4) at one chunk, every token tile from 16 rows, odd sizes with a
// padded scale stride and a strided Y; and V4-Flash's wq_b at 32 rows.
func wgmmaMulticastCases() []mlatest.GEMMCase {
	s := mlatest.GEMMShape{Name: "n8704-k1024", N: 8704, K: 1024}
	var cs []mlatest.GEMMCase
	for _, m := range []int{16, 17, 31, 32, 64, 100, 127, 128} {
		c := mlatest.GEMMCase{Shape: s, Rows: m}
		if m%2 == 1 {
			c.ScaleStride, c.YOffset, c.YStride = m+3, 48, s.N+24
		}
		cs = append(cs, c)
	}
	return append(cs, mlatest.GEMMCase{Shape: mlatest.FlashGEMMs[1], Rows: 32},
		mlatest.GEMMCase{Shape: mlatest.GEMMShape{Name: "n8704-k384", N: 8704, K: 384}, Rows: 99, NaN: true})
}

// TestCUDAWGMMAGEMM runs wgmmaCases on the wgmma kernel against the host
// reference within package gemm's bound (fresh random operands with block
// scales over many octaves, Y poisoned and its padding checked), then the
// refusals.
func TestCUDAWGMMAGEMM(t *testing.T) {
	for f, fin := range wgmmaFinishes {
		t.Run(fin.name, func(t *testing.T) {
			b := wgmmaBackend(t, f)
			before := b.WGMMACount()
			ran := 0
			cases := wgmmaCases()
			if fin.multicast > 1 && fin.wcast == 0 {
				cases = wgmmaMulticastCases()
			}

			for _, c := range cases {
				t.Run(c.String(), func(t *testing.T) {
					ran++
					seed := mlatest.Seed(t)
					cmp, err := mlatest.CheckGEMM(b, c, seed)
					require.NoError(t, err)
					t.Logf("worst element %.3g of the bound; accumulation difference %.3g S (bound %.3g S)", cmp.Worst, cmp.AccumRel, gemm.Bound(c.Shape.K))
				})
			}
			own, lt := b.GEMMCounts()
			require.Zero(t, own+lt, "a GEMM did not run on the wgmma kernel")
			require.GreaterOrEqual(t, b.WGMMACount()-before, int64(ran))
		})
	}
}

// TestCUDAWGMMANarrowGEMM runs wgmmaNarrowCases, the sizes at which the
// narrow families' token tile narrows, on each kernel family (with the
// cluster split finish, the default; no split happens at these sizes)
// against the host reference within package gemm's bound.
func TestCUDAWGMMANarrowGEMM(t *testing.T) {
	for _, f := range []struct {
		name string
		fin  int // of wgmmaFinishes
	}{{"wide", 1}, {"narrow", 5}, {"narrow-pipe", 7}, {"wide-pipe", 8}, {"narrow-wcast-4", 10}, {"narrow-pipe-wcast-4", 11},
		{"narrow-pipe-wcast-2", 12}, {"narrow-pipe-wcast-4-mc-2", 13}} {
		t.Run(f.name, func(t *testing.T) {
			b := wgmmaBackend(t, f.fin)
			before := b.WGMMACount()
			ran := 0
			for _, c := range wgmmaNarrowCases() {
				t.Run(c.String(), func(t *testing.T) {
					ran++
					seed := mlatest.Seed(t)
					cmp, err := mlatest.CheckGEMM(b, c, seed)
					require.NoError(t, err)
					t.Logf("worst element %.3g of the bound; accumulation difference %.3g S (bound %.3g S)", cmp.Worst, cmp.AccumRel, gemm.Bound(c.Shape.K))
				})
			}
			own, lt := b.GEMMCounts()
			require.Zero(t, own+lt, "a GEMM did not run on the wgmma kernel")
			require.GreaterOrEqual(t, b.WGMMACount()-before, int64(ran))
		})
	}
}

// TestCUDAWGMMASmallShapes runs mlatest's small cases (one and two K
// blocks, a strided offset Y, NaN inputs) and its refusals (bad arguments
// refused before the kernel is launched, Y untouched) on the wgmma kernel.
func TestCUDAWGMMASmallShapes(t *testing.T) {
	for f, fin := range wgmmaFinishes {
		t.Run(fin.name, func(t *testing.T) { mlatest.TestGEMMShapes(t, wgmmaBackend(t, f), nil) })
	}
}

// wgmmaFront is one GEMM shape's operands for TestCUDAWGMMAReplay: a main
// and a side weight reading the same activations, their outputs.
type wgmmaFront struct {
	m, k        int
	w, wSide    *mla.FP8Weight
	hw, hwSide  *weights.FP8Matrix
	x           mla.FP8Activations
	y, ySide    mla.Buffer
	yLen, ysLen int
}

// TestCUDAWGMMAReplay captures the wgmma GEMM into a CUDA graph, a second
// one on the side stream beside it (each stream has its own split-K
// workspace), and replays the graph with new activations written into the
// captured buffers: each replay's bytes equal an eager run's on the same
// inputs, an eager run is byte-equal to the one before it (the split-K
// order is fixed), and the first is within the bound of the host
// reference. Shapes: V4-Flash's [wq_a; wkv] at 1 and 31 rows (split K),
// its wq_b (half its outputs) at 129 (two token chunks, two units a block), V4-Pro's
// [wq_a; wkv] at 64.
func TestCUDAWGMMAReplay(t *testing.T) {
	for f, fin := range wgmmaFinishes {
		t.Run(fin.name, func(t *testing.T) { testWGMMAReplay(t, wgmmaBackend(t, f)) })
	}
}

func testWGMMAReplay(t *testing.T, b *cuda.Backend) {
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, s := range []struct {
		name           string
		m, n, nSide, k int
	}{
		{"flash-wqa-wkv-m1", 1, 1536, 512, 4096},
		{"flash-wqa-wkv-m31", 31, 1536, 512, 4096},
		{"flash-wqb-n16384-m129", 129, 16384, 1536, 1024},
		{"pro-wqa-wkv-m64", 64, 2048, 512, 7168},
		{"n8704-m100", 100, 8704, 512, 1024}, // shared activation tiles under multicast
	} {
		t.Run(s.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(s.m)<<32|uint64(s.n)))
			f := newWGMMAFront(t, b, r, s.m, s.n, s.nSide, s.k)
			issue := func(g func(context.Context, *mla.GEMMArgs) error) error {
				if err := b.Side(ctx, func() error {
					return g(ctx, &mla.GEMMArgs{X: f.x, W: f.wSide, Y: f.ySide, YStride: s.nSide})
				}); err != nil {
					return err
				}
				if err := g(ctx, &mla.GEMMArgs{X: f.x, W: f.w, Y: f.y, YStride: s.n}); err != nil {
					return err
				}
				return b.JoinKV(ctx)
			}
			run := func(launch func() error) (y, ySide []byte) {
				require.NoError(t, b.Fill(f.y, 0, f.yLen, 0xA5))
				require.NoError(t, b.Fill(f.ySide, 0, f.ysLen, 0xA5))
				require.NoError(t, b.Synchronize(ctx))
				require.NoError(t, launch())
				require.NoError(t, b.Synchronize(ctx))
				y, ySide = make([]byte, f.yLen), make([]byte, f.ysLen)
				require.NoError(t, b.Read(y, f.y, 0))
				require.NoError(t, b.Read(ySide, f.ySide, 0))
				return y, ySide
			}
			eager := func() ([]byte, []byte) { return run(func() error { return issue(b.WGMMAGEMM) }) }

			hx := f.newInputs(t, b, r)
			y0, ys0 := eager()
			requireBound(t, "main", hx, f.hw, y0)
			requireBound(t, "side", hx, f.hwSide, ys0)
			y1, ys1 := eager()
			require.Equal(t, y0, y1, "eager runs differ (main)")
			require.Equal(t, ys0, ys1, "eager runs differ (side)")

			graph, err := b.Capture(func() error { return issue(b.WGMMAGEMM) })
			require.NoError(t, err)
			defer graph.Close()
			for i := range 3 {
				f.newInputs(t, b, r)
				gy, gys := run(graph.Launch)
				ey, eys := eager()
				require.Equal(t, ey, gy, "replay %d: main output differs from an eager run", i)
				require.Equal(t, eys, gys, "replay %d: side output differs from an eager run", i)
			}
		})
	}
}

func newWGMMAFront(t *testing.T, b *cuda.Backend, r *rand.Rand, m, n, nSide, k int) *wgmmaFront {
	f := &wgmmaFront{m: m, k: k, yLen: 2 * m * n, ysLen: 2 * m * nSide}
	var err error
	f.hw, f.hwSide = mlatest.RandomFP8Weight(r, n, k), mlatest.RandomFP8Weight(r, nSide, k)
	f.w, err = mlatest.UploadFP8Weight(b, f.hw)
	require.NoError(t, err)
	f.wSide, err = mlatest.UploadFP8Weight(b, f.hwSide)
	require.NoError(t, err)
	hx := mlatest.RandomActivations(r, m, k, m)
	f.x, err = mlatest.UploadActivations(b, hx)
	require.NoError(t, err)
	f.y, err = b.Alloc(f.yLen)
	require.NoError(t, err)
	f.ySide, err = b.Alloc(f.ysLen)
	require.NoError(t, err)
	t.Cleanup(func() {
		mlatest.FreeGEMMBuffers(b, f.w, f.x)
		mlatest.FreeGEMMBuffers(b, f.wSide, mla.FP8Activations{})
		_ = b.Free(f.y)
		_ = b.Free(f.ySide)
	})
	return f
}

// newInputs writes fresh activations and scales into the front's buffers
// (the ones a captured graph reads) and returns them.
func (f *wgmmaFront) newInputs(t *testing.T, b *cuda.Backend, r *rand.Rand) *gemm.Activations {
	hx := mlatest.RandomActivations(r, f.m, f.k, f.m)
	require.NoError(t, b.Synchronize(context.Background()))
	require.NoError(t, b.Write(f.x.Data, 0, hx.Data))
	require.NoError(t, b.Write(f.x.Scale, 0, numerics.F32Bytes(hx.Scale)))
	return hx
}

// requireBound checks a dense bf16 output against the host reference.
func requireBound(t *testing.T, what string, hx *gemm.Activations, hw *weights.FP8Matrix, y []byte) {
	t.Helper()
	want, err := gemm.Reference(hx, hw)
	require.NoError(t, err)
	got := make([]uint16, len(want))
	for i := range got {
		got[i] = uint16(y[2*i]) | uint16(y[2*i+1])<<8
	}
	require.NoError(t, gemm.CheckBound(hx, hw, want, got), what)
}
