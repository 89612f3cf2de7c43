package cuda_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/internal/cudatune"
)

// bf16Paths are the projection GEMM's implementations the tests force, in
// the order BF16GEMMCounts reports them.
var bf16Paths = []string{"own", "mma", "cublaslt", "wgmma"}

// bf16Counts is BF16GEMMCounts and BF16WGMMACount as an array indexed
// like bf16Paths.
func bf16Counts(b *cuda.Backend) [4]int64 {
	own, mma, lt := b.BF16GEMMCounts()
	return [4]int64{own, mma, lt, b.BF16WGMMACount()}
}

// bf16Case is the shape grid of the GPU tests: V4's hidden sizes (K) and
// the projections' widths (N: ratio 128's 512, ratio 4's 1024, both
// halves of [wkv; wgate] at ratio 4), decode to prefill rows (the
// tensor-core kernel's token tiles of 8 and 16-row MMA edges, its chunks
// of 64 rows); every other case with X at an offset and padded stride and
// a padded, offset Y; then a few odd shapes.
func bf16Cases() []mlatest.BF16GEMMCase {
	var cs []mlatest.BF16GEMMCase
	i := 0
	for _, k := range []int{1024, 4096, 7168} {
		for _, n := range []int{512, 1024, 2048} {
			for _, m := range []int{1, 2, 3, 15, 16, 17, 32, 33, 64, 128, 1000} {
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
	// Odd shapes: N not a multiple of 64 (the tensor-core kernel's idle
	// warps), one stage of K, rows past a 64-row chunk.
	cs = append(cs,
		mlatest.BF16GEMMCase{Rows: 9, N: 80, K: 192},
		mlatest.BF16GEMMCase{Rows: 70, N: 16, K: 64, XOffset: 16, XStride: 72, YOffset: 16, YStride: 20},
		mlatest.BF16GEMMCase{Rows: 5, N: 1040, K: 128},
		mlatest.BF16GEMMCase{Rows: 129, N: 48, K: 320},
		// weights_proj alone at V4-Pro's hidden size and a decode batch:
		// cmd/bench's three-projection variant of a ratio-4 layer hung
		// in its graph at these shapes (2026-12-02-h200-indexer-layer).
		mlatest.BF16GEMMCase{Rows: 128, N: 64, K: 7168},
		mlatest.BF16GEMMCase{Rows: 32, N: 64, K: 7168},
		// ... and a 4096-token prefill of it (64 chunks of tokens).
		mlatest.BF16GEMMCase{Rows: 4096, N: 64, K: 7168},
		// The ratio-4 layer's one projection GEMM ([wkv; wgate] of the
		// compressor, of the indexer's compressor, weights_proj: 2624
		// outputs, 41 blocks with one of 64 rows) at decode batches.
		mlatest.BF16GEMMCase{Rows: 1, N: 2624, K: 4096},
		mlatest.BF16GEMMCase{Rows: 8, N: 2624, K: 4096, XOffset: 16, XStride: 4104, YOffset: 16, YStride: 2628},
		mlatest.BF16GEMMCase{Rows: 128, N: 2624, K: 4096},
		mlatest.BF16GEMMCase{Rows: 32, N: 2624, K: 7168},
		mlatest.BF16GEMMCase{Rows: 128, N: 2624, K: 7168})
	return cs
}

// bf16Rings are the tensor-core ring kernels the tests run beside the
// default kernel (cudatune.Knobs.BF16MMADepth; BF16MMAReduce 2: the split
// K finished in the kernel; BF16MMAWarpRows 32: two row groups a warp;
// BF16MMAMaxSplits), each on a backend of its own made once.
var bf16Rings = []struct {
	name  string
	knobs cudatune.Knobs
}{
	{"mma-d2f", cudatune.Knobs{BF16MMADepth: 2, BF16MMAReduce: 2}},
	{"mma-d4", cudatune.Knobs{BF16MMADepth: 4}},
	{"mma-d8", cudatune.Knobs{BF16MMADepth: 8}},
	{"mma-d4f", cudatune.Knobs{BF16MMADepth: 4, BF16MMAReduce: 2}},
	{"mma-d8f", cudatune.Knobs{BF16MMADepth: 8, BF16MMAReduce: 2}},
	{"mma-d4w", cudatune.Knobs{BF16MMADepth: 4, BF16MMAWarpRows: 32}},
	{"mma-d4wf", cudatune.Knobs{BF16MMADepth: 4, BF16MMAReduce: 2, BF16MMAWarpRows: 32}},
	{"mma-s16", cudatune.Knobs{BF16MMAMaxSplits: 16}},
	{"mma-d8f-s16", cudatune.Knobs{BF16MMADepth: 8, BF16MMAReduce: 2, BF16MMAMaxSplits: 16}},
}

var (
	ringOnce     sync.Once
	ringBackends map[string]*cuda.Backend
	ringErr      error
)

// ringBackend is the backend of bf16Rings' entry name (made once, shared
// by the tests like backend's).
func ringBackend(t *testing.T, name string) *cuda.Backend {
	t.Helper()
	backend(t) // skips without a device
	ringOnce.Do(func() {
		ringBackends = map[string]*cuda.Backend{}
		for _, r := range bf16Rings {
			b, err := cuda.NewTuned(cuda.Options{}, r.knobs)
			if err != nil {
				ringErr = err
				return
			}
			ringBackends[r.name] = b
		}
	})
	require.NoError(t, ringErr)
	return ringBackends[name]
}

// bf16Run is one implementation a test runs: a forced path on a backend.
type bf16Run struct {
	name, path string
	b          *cuda.Backend
}

// bf16Runs are the default backend's paths and the ring kernels' backends
// (bf16Rings: the tensor-core path forced).
func bf16Runs(t *testing.T) []bf16Run {
	b := backend(t)
	var out []bf16Run
	for _, p := range bf16Paths {
		out = append(out, bf16Run{p, p, b})
	}
	for _, r := range bf16Rings {
		out = append(out, bf16Run{r.name, "mma", ringBackend(t, r.name)})
	}
	return out
}

// forcePath sets the backend's projection GEMM path for the test and
// restores the default after it; it reports false (and logs why) when
// cuBLASLt or the tensor-core kernel is forced but absent.
func forcePath(t *testing.T, b *cuda.Backend, path string) bool {
	t.Helper()
	require.NoError(t, b.InitBF16GEMM())
	if path == "cublaslt" && b.CuBLASLtError() != nil {
		t.Logf("cuBLASLt unavailable: %v", b.CuBLASLtError())
		return false
	}
	if path == "mma" && b.BF16MMAError() != nil {
		t.Logf("tensor-core kernel unavailable: %v", b.BF16MMAError())
		return false
	}
	b.SetBF16GEMMPath(path)
	if path == "wgmma" && b.BF16WGMMAError() != nil {
		b.SetBF16GEMMPath("auto")
		t.Logf("sm_90a wgmma kernel unavailable: %v", b.BF16WGMMAError())
		return false
	}
	t.Cleanup(func() { b.SetBF16GEMMPath("auto") })
	return true
}

// TestBF16GEMM compares the device's projection GEMM, on each
// implementation, with the CPU backend's within gemm.BoundBF16, every
// element, over the shape grid with random operands (seed logged); Y
// poisoned with NaN first, X's gaps and the bytes around X NaN. Each
// implementation runs twice and must write the same bits both times (the
// engine verifies graph replays byte for byte). A ring kernel (bf16Rings)
// whose plan is the default kernel's must write the default kernel's bits
// (the same MMAs in the same order, the splits added in the same order);
// with a plan of its own it is held to the bound.
func TestBF16GEMM(t *testing.T) {
	runs := bf16Runs(t)
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
			sums, err := gemm.AbsSumsBF16(o) // once for every implementation's comparison
			require.NoError(t, err)
			var mmaGot []float32 // the default tensor-core kernel's
			var mmaPlan [4]int
			for _, run := range runs {
				b, path := run.b, run.path
				t.Run(run.name, func(t *testing.T) {
					x, w, err := mlatest.UploadBF16Operands(b, o, c.XOffset)
					require.NoError(t, err)
					defer b.Free(x)
					defer b.Free(w)
					if !forcePath(t, b, path) {
						t.Skip(path + " unavailable")
					}
					if path == "cublaslt" {
						if err := b.CuBLASLtSupportsBF16(c.Rows, c.N, c.K, max(c.XStride, c.K), max(c.YStride, c.N)); err != nil {
							t.Skipf("cuBLASLt refuses the shape (the kernel runs it): %v", err)
						}
					}
					before := bf16Counts(b)
					got, err := mlatest.RunBF16GEMM(ctx, b, c, x, w)
					require.NoError(t, err)
					wantCounts := before
					wantCounts[slices.Index(bf16Paths, path)]++
					require.Equal(t, wantCounts, bf16Counts(b), "%s did not run", path)
					again, err := mlatest.RunBF16GEMM(ctx, b, c, x, w)
					require.NoError(t, err)
					require.Equal(t, f32Bits(got), f32Bits(again), "two runs differ")
					if path == "mma" {
						var plan [4]int
						plan[0], plan[1], plan[2], plan[3] = b.BF16MMAPlanOf(c.Rows, c.N, c.K)
						if run.name == "mma" {
							mmaGot, mmaPlan = got, plan
						} else if mmaGot != nil && plan == mmaPlan {
							require.Equal(t, f32Bits(mmaGot), f32Bits(got), "%s differs from gemm_bf16_mma with the same plan %v", b.BF16MMAKernelName(), plan)
							t.Logf("%s: gemm_bf16_mma's bits (plan %v)", b.BF16MMAKernelName(), plan)
							return
						}
					}
					cmp, err := gemm.CompareF32Sums(o, sums, want, got)
					require.NoError(t, err)
					require.Zero(t, cmp.Violations, "%v", cmp)
					t.Logf("worst element %.3g of the bound; accumulation difference %.3g S (bound %.3g S)", cmp.Worst, cmp.AccumRel, gemm.BoundBF16(c.K))
				})
			}
		})
	}
}

// TestBF16GEMMAuto: by default the tensor-core kernel runs every shape
// it can up to cudatune's BF16MMAMaxRows rows, cuBLASLt every other shape
// it accepts, the tensor-core kernel what cuBLASLt refuses, and the simple
// kernel the rest.
func TestBF16GEMMAuto(t *testing.T) {
	b := backend(t)
	require.NoError(t, b.InitBF16GEMM())
	mmaErr := b.BF16MMAError()
	if mmaErr != nil {
		t.Logf("tensor-core kernel unavailable: %v", mmaErr)
	}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []mlatest.BF16GEMMCase{
		{Rows: 1, N: 512, K: 4096}, {Rows: 2, N: 1024, K: 1024}, {Rows: 64, N: 2048, K: 4096}, // tensor cores
		{Rows: 65, N: 2048, K: 4096}, {Rows: 128, N: 1024, K: 1024}, // above its rows
		{Rows: 3, N: 24, K: 64}, {Rows: 3, N: 32, K: 96}, // N or K it cannot run
	} {
		o := mlatest.RandomBF16Operands(r, c)
		x, w, err := mlatest.UploadBF16Operands(b, o, 0)
		require.NoError(t, err)
		want := 2 // cuBLASLt
		mmaRuns := mmaErr == nil && c.N%16 == 0 && c.K%64 == 0
		switch {
		case mmaRuns && c.Rows <= cudatune.SM90.Knobs.BF16MMAMaxRows:
			want = 1
		case b.CuBLASLtSupportsBF16(c.Rows, c.N, c.K, c.K, c.N) != nil && mmaRuns:
			want = 1 // where cuBLASLt refuses, the tensor-core kernel
		case b.CuBLASLtSupportsBF16(c.Rows, c.N, c.K, c.K, c.N) != nil:
			want = 0
		}
		before := bf16Counts(b)
		got, err := mlatest.RunBF16GEMM(ctx, b, c, x, w)
		require.NoError(t, err)
		before[want]++
		require.Equal(t, before, bf16Counts(b), "%v: %s did not run", c, bf16Paths[want])
		ref, err := gemm.ReferenceBF16(o)
		require.NoError(t, err)
		require.NoError(t, gemm.CheckBoundF32(o, ref, got))
		require.NoError(t, b.Free(x))
		require.NoError(t, b.Free(w))
	}
}

// TestBF16MMARefusesShapes: forced to the tensor-core kernel, a shape it
// cannot run (N not a multiple of 16, K not of 64) is an error naming the
// dimension, before anything is enqueued.
func TestBF16MMARefusesShapes(t *testing.T) {
	b := backend(t)
	if !forcePath(t, b, "mma") {
		t.Skip("tensor-core kernel unavailable")
	}
	r := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		c    mlatest.BF16GEMMCase
		want string
	}{
		{mlatest.BF16GEMMCase{Rows: 2, N: 24, K: 64}, "N = 24"},
		{mlatest.BF16GEMMCase{Rows: 2, N: 32, K: 96}, "K = 96"},
	} {
		o := mlatest.RandomBF16Operands(r, tc.c)
		x, w, err := mlatest.UploadBF16Operands(b, o, 0)
		require.NoError(t, err)
		size := mlatest.BF16GEMMYBytes(tc.c)
		y, err := b.Alloc(size)
		require.NoError(t, err)
		require.NoError(t, b.Fill(y, 0, size, 0x5A))
		before := bf16Counts(b)
		require.ErrorContains(t, b.BF16GEMM(context.Background(), mlatest.BF16GEMMArgs(tc.c, x, w, y)), tc.want)
		require.Equal(t, before, bf16Counts(b))
		host := make([]byte, size)
		require.NoError(t, b.Read(host, y, 0))
		require.Equal(t, bytes.Repeat([]byte{0x5A}, size), host, "the refused call wrote Y")
		for _, buf := range []mla.Buffer{x, w, y} {
			require.NoError(t, b.Free(buf))
		}
	}
}

// f32Bits is v's bit patterns, for byte-for-byte comparisons.
func f32Bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

// TestBF16GEMMGraph captures the projection GEMM on each implementation
// into a CUDA graph: its replay writes what a direct call writes, within
// the bound of the host reference. The kernel's capture comes first, with
// the shape only prepared (PrepareBF16GEMM): nothing of ours loads or
// allocates during a capture. cuBLASLt's runs after a direct call, as the
// engine's first, eager run of a layer does (the library may load its own
// kernels at their first launch).
func TestBF16GEMMGraph(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 22))
	ctx := context.Background()
	for i, run := range bf16Runs(t) {
		b, path := run.b, run.path
		t.Run(run.name, func(t *testing.T) {
			if !forcePath(t, b, path) {
				t.Skip(path + " unavailable")
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

// sideStreamCase is one GEMM of a two-stream test: its operands (an index
// into sideStreamShapes: GEMMs of one shape share them, each has its own
// Y) and whether it goes to the side stream.
type sideStreamCase struct {
	shape int
	side  bool
}

// sideStreamShapes and sideStreamCases are the two-stream tests' GEMMs:
// split-K GEMMs of mixed shapes on both streams, then four layers of
// cmd/bench's three-projection ratio-4 layer at V4-Pro decode (b = 32 MTP
// 3: 128 rows, K = 7168): the compressor's N = 2048 and the indexer
// compressor's N = 512 on the side stream, weights_proj's N = 64 on the
// main stream, the graph that hung on the H200
// (2026-12-02-h200-indexer-layer).
var sideStreamShapes = []mlatest.BF16GEMMCase{
	{Rows: 7, N: 1024, K: 4096},
	{Rows: 33, N: 2048, K: 1024, XOffset: 32, XStride: 1032, YOffset: 48, YStride: 2052},
	{Rows: 64, N: 512, K: 7168},
	{Rows: 128, N: 2048, K: 7168},
	{Rows: 128, N: 512, K: 7168},
	{Rows: 128, N: 64, K: 7168},
}

func sideStreamCases() []sideStreamCase {
	cs := []sideStreamCase{{0, false}, {1, true}, {2, false}} // the last after the side one was issued
	for range 4 {
		cs = append(cs, sideStreamCase{3, true}, sideStreamCase{4, true}, sideStreamCase{5, false})
	}
	return cs
}

// sideStreamRun issues sideStreamCases on b: each alone on the main stream
// (synchronized after each: nothing overlaps), then on both streams (the
// side ones inside Side, one fork a case, then the join) eagerly and
// captured into one graph replayed replays times (the outputs poisoned
// before the last); every result of the two streams must equal the one
// alone, byte for byte, and weights_proj's be within the bound of the host
// reference.
func sideStreamRun(t *testing.T, b *cuda.Backend, seed uint64, replays int) {
	r := rand.New(rand.NewPCG(seed, 23))
	ctx := context.Background()
	type operands struct {
		o    *gemm.BF16Operands
		x, w mla.Buffer
	}
	ops := make([]operands, len(sideStreamShapes))
	for i, c := range sideStreamShapes {
		o := mlatest.RandomBF16Operands(r, c)
		x, w, err := mlatest.UploadBF16Operands(b, o, c.XOffset)
		require.NoError(t, err)
		defer b.Free(x)
		defer b.Free(w)
		ops[i] = operands{o, x, w}
	}
	type run struct {
		sideStreamCase
		args *mla.BF16GEMMArgs
		y    mla.Buffer
		size int
	}
	var runs []run
	for _, sc := range sideStreamCases() {
		c := sideStreamShapes[sc.shape]
		size := mlatest.BF16GEMMYBytes(c)
		y, err := b.Alloc(size)
		require.NoError(t, err)
		defer b.Free(y)
		runs = append(runs, run{sideStreamCase: sc, args: mlatest.BF16GEMMArgs(c, ops[sc.shape].x, ops[sc.shape].w, y), y: y, size: size})
	}
	issue := func() error {
		for _, rn := range runs {
			if !rn.side {
				if err := b.BF16GEMM(ctx, rn.args); err != nil {
					return err
				}
				continue
			}
			if err := b.Side(ctx, func() error { return b.BF16GEMM(ctx, rn.args) }); err != nil {
				return err
			}
		}
		return b.JoinKV(ctx)
	}
	results := func() [][]byte {
		require.NoError(t, b.Synchronize(ctx))
		out := make([][]byte, len(runs))
		for i, rn := range runs {
			out[i] = make([]byte, rn.size)
			require.NoError(t, b.Read(out[i], rn.y, 0))
		}
		return out
	}
	poison := func() {
		for _, rn := range runs {
			require.NoError(t, b.Fill(rn.y, 0, rn.size, 0xFF))
		}
		require.NoError(t, b.Synchronize(ctx))
	}
	poison()
	for _, rn := range runs {
		require.NoError(t, b.BF16GEMM(ctx, rn.args))
		require.NoError(t, b.Synchronize(ctx))
	}
	alone := results()
	last := len(runs) - 1
	got, err := mlatest.ReadBF16GEMMY(sideStreamShapes[runs[last].shape], alone[last])
	require.NoError(t, err)
	want, err := gemm.ReferenceBF16(ops[runs[last].shape].o)
	require.NoError(t, err)
	require.NoError(t, gemm.CheckBoundF32(ops[runs[last].shape].o, want, got), "weights_proj alone")
	poison()
	require.NoError(t, issue())
	eager := results()
	for i, rn := range runs {
		require.Equal(t, alone[i], eager[i], "%v (side stream %v): the two streams' eager result differs from the GEMM's alone", sideStreamShapes[rn.shape], rn.side)
	}
	poison()
	g, err := b.Capture(issue)
	require.NoError(t, err)
	defer g.Close()
	for i := range replays {
		if i == replays-1 {
			poison() // the last replay writes every output itself (a finishing kernel's counters were left ready)
		}
		require.NoError(t, g.Launch())
	}
	replayed := results()
	for i, rn := range runs {
		require.Equal(t, alone[i], replayed[i], "%v (side stream %v): the replays differ from the GEMM alone", sideStreamShapes[rn.shape], rn.side)
	}
}

// TestBF16GEMMSideStream runs split-K projection GEMMs on the main stream
// and, at the same time, on the side stream (Side, as the engine issues
// the compressor under the layer's GEMMs), on the tensor-core kernels and
// on cuBLASLt, eagerly and as one graph replayed 50 times: each stream has
// its own split-K workspace (the kernels' partials, and cuBLASLt's since
// the three-projection graph of 2026-12-02-h200-indexer-layer hung on one),
// so every result is within the bound of the host reference and every
// replay writes what the eager calls write, byte for byte.
func TestBF16GEMMSideStream(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, run := range bf16Runs(t) {
		if run.path == "own" {
			continue // no split K
		}
		t.Run(run.name, func(t *testing.T) {
			if !forcePath(t, run.b, run.path) {
				t.Skip(run.path + " unavailable")
			}
			sideStreamRun(t, run.b, seed, 50)
		})
	}
}

var bf16OneWorkspace = flag.Bool("bf16.oneworkspace", false,
	"TestBF16GEMMOneWorkspace: run TestBF16GEMMSideStream's cuBLASLt case with every matmul on one workspace, as before 2026-12-02 (may hang)")

// TestBF16GEMMOneWorkspace is TestBF16GEMMSideStream's cuBLASLt case with
// both streams' matmuls on cuBLASLt's one workspace, as the backend ran
// them before each stream had its own: it shows what the second workspace
// prevents (corrupt results or a hang in the replays). Run with
// -bf16.oneworkspace under a timeout; it is expected to fail.
func TestBF16GEMMOneWorkspace(t *testing.T) {
	if !*bf16OneWorkspace {
		t.Skip("run with -bf16.oneworkspace (expected to fail or hang)")
	}
	b := backend(t)
	if !forcePath(t, b, "cublaslt") {
		t.Skip("cuBLASLt unavailable")
	}
	b.SetCuBLASLtOneWorkspace(true)
	defer b.SetCuBLASLtOneWorkspace(false)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	sideStreamRun(t, b, seed, 200)
}

// TestBF16GEMMRefusals: bad arguments are refused before anything is
// enqueued, on each implementation.
func TestBF16GEMMRefusals(t *testing.T) {
	b := backend(t)
	for _, path := range bf16Paths {
		t.Run(path, func(t *testing.T) {
			if !forcePath(t, b, path) {
				t.Skip(path + " unavailable")
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
// ([wkv; wgate]: 2048 outputs from hidden 4096), ratio 128's (1024) and
// V4-Pro's (hidden 7168) on each implementation, each call synchronized
// (so the launch overhead is in the time; the bytes are the weight's).
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
		if path == "cublaslt" && b.CuBLASLtError() != nil || path == "mma" && b.BF16MMAError() != nil {
			continue
		}
		b.SetBF16GEMMPath(path)
		if path == "wgmma" && b.BF16WGMMAError() != nil {
			continue
		}
		for _, sh := range []struct{ m, n, k int }{
			{1, 2048, 4096}, {16, 2048, 4096}, {32, 2048, 4096}, {64, 2048, 4096}, {128, 2048, 4096}, {1024, 2048, 4096},
			{32, 1024, 4096}, {64, 1024, 4096}, {32, 2048, 7168}, {64, 2048, 7168},
		} {
			m := sh.m
			c := mlatest.BF16GEMMCase{Rows: m, N: sh.n, K: sh.k}
			if path == "mma" && m > 128 || path == "cublaslt" && b.CuBLASLtSupportsBF16(m, c.N, c.K, c.K, c.N) != nil {
				continue
			}
			o := mlatest.RandomBF16Operands(rand.New(rand.NewPCG(1, uint64(m))), c)
			x, w, err := mlatest.UploadBF16Operands(b, o, 0)
			require.NoError(bm, err)
			y, err := b.Alloc(mlatest.BF16GEMMYBytes(c))
			require.NoError(bm, err)
			a := mlatest.BF16GEMMArgs(c, x, w, y)
			bm.Run(fmt.Sprintf("%s/n%d/k%d/m%d", path, c.N, c.K, m), func(bm *testing.B) {
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
