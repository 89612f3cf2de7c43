package cuda_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/internal/cudatune"
)

// bf16WGFinishes are the sm_90a kernel's split-K finishes the tests run
// beside the default backend's (the architecture's: the reduction launch),
// each on a backend of its own (Knobs.BF16WGMMAFinish): the unit's last
// block, clusters where they fit (with W prefetched into L2,
// Knobs.BF16WGMMAL2Prefetch), and the last block's finish of at most 3
// splits (Knobs.BF16WGMMAMaxSplits: other K ranges, held to the bound).
var bf16WGFinishes = []struct {
	name  string
	knobs cudatune.Knobs
}{
	{"wgmma-last", cudatune.Knobs{BF16WGMMAFinish: cudatune.BF16WGMMAFinishLast}},
	{"wgmma-cluster-l2pf", cudatune.Knobs{BF16WGMMAFinish: cudatune.BF16WGMMAFinishCluster, BF16WGMMAL2Prefetch: 1}},
	{"wgmma-last-s3", cudatune.Knobs{BF16WGMMAFinish: cudatune.BF16WGMMAFinishLast, BF16WGMMAMaxSplits: 3}},
}

// bf16WGRows are the batch sizes of TestBF16WGMMAShapes: decode (1 to 128
// rows, b = 32 MTP 3 is 128), the token tiles' edges, and small prefills
// over several 128-row chunks.
var bf16WGRows = []int{1, 2, 3, 8, 16, 31, 32, 64, 127, 128, 129, 256, 512}

// bf16WGShapes are the engine's projection GEMMs (N x K): both models'
// ratio-4 fused projection and ratio 128's [wkv; wgate], and V4-Pro's
// weights_proj.
var bf16WGShapes = []struct{ n, k int }{{2624, 4096}, {1024, 4096}, {2624, 7168}, {1024, 7168}, {64, 7168}}

// refBF16 is the host reference of o and its abs sums, rows split over
// one goroutine a core (the reference is row by row; the shapes here are
// large).
func refBF16(t *testing.T, o *gemm.BF16Operands) (ref []float32, sums []float64) {
	chunk := max(8, (o.Rows+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0))
	ref = make([]float32, o.Rows*o.N)
	sums = make([]float64, o.Rows*o.N)
	var wg sync.WaitGroup
	errs := make([]error, (o.Rows+chunk-1)/chunk)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r0, r1 := i*chunk, min(o.Rows, (i+1)*chunk)
			sub := &gemm.BF16Operands{Rows: r1 - r0, N: o.N, K: o.K, X: o.X[r0*o.XStride:], XStride: o.XStride, W: o.W}
			y, err := gemm.ReferenceBF16(sub)
			if err == nil {
				var s []float64
				if s, err = gemm.AbsSumsBF16(sub); err == nil {
					copy(sums[r0*o.N:], s)
				}
			}
			copy(ref[r0*o.N:], y)
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return ref, sums
}

// bf16WGBackends are the default backend and one backend a finish, the
// sm_90a path forced on each; it skips where the kernel is unavailable.
func bf16WGBackends(t *testing.T) []bf16Run {
	b := backend(t)
	if !forcePath(t, b, "wgmma") {
		t.Skip("the sm_90a wgmma kernel is unavailable")
	}
	t.Logf("clusters of 2..8 blocks at once: %v", b.BF16WGMMAClusters())
	runs := []bf16Run{{"wgmma", "wgmma", b}}
	for _, f := range bf16WGFinishes {
		fb, err := cuda.NewTuned(cuda.Options{}, f.knobs)
		require.NoError(t, err)
		t.Cleanup(func() { fb.Close() })
		require.True(t, forcePath(t, fb, "wgmma"))
		runs = append(runs, bf16Run{f.name, "wgmma", fb})
	}
	return runs
}

// TestBF16WGMMAShapes runs the sm_90a kernel, forced, on every finish
// (bf16WGFinishes) over the engine's shapes at every batch size of
// bf16WGRows, plus odd shapes (N past a 128-row tile, one stage of K,
// offset and strided X and Y): fresh random operands (seed logged; W and
// X drawn once a shape at the most rows, a GEMM of m rows reading the
// first m), Y poisoned, every element within gemm.BoundBF16 of the host
// reference and every byte around Y untouched (RunBF16GEMM); each run
// twice, the same bits both times, and every finish with the default's
// split of K the default's bits (the splits added in the same order).
func TestBF16WGMMAShapes(t *testing.T) {
	runs := bf16WGBackends(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 25))
	ctx := context.Background()
	type group struct {
		base  mlatest.BF16GEMMCase
		cases []mlatest.BF16GEMMCase
	}
	var groups []group
	most := bf16WGRows[len(bf16WGRows)-1]
	for _, s := range bf16WGShapes {
		g := group{base: mlatest.BF16GEMMCase{Rows: most, N: s.n, K: s.k}}
		for _, m := range bf16WGRows {
			g.cases = append(g.cases, mlatest.BF16GEMMCase{Rows: m, N: s.n, K: s.k})
		}
		groups = append(groups, g)
	}
	for _, c := range []mlatest.BF16GEMMCase{
		{Rows: 9, N: 80, K: 192},
		{Rows: 70, N: 16, K: 64, XOffset: 16, XStride: 72, YOffset: 16, YStride: 20},
		{Rows: 129, N: 48, K: 320},
		{Rows: 5, N: 1040, K: 128},
		{Rows: 8, N: 2624, K: 4096, XOffset: 16, XStride: 4104, YOffset: 16, YStride: 2628},
		{Rows: 200, N: 1168, K: 1024, XOffset: 48, XStride: 1048, YOffset: 32, YStride: 1180},
	} {
		groups = append(groups, group{base: c, cases: []mlatest.BF16GEMMCase{c}})
	}
	for _, g := range groups {
		o := mlatest.RandomBF16Operands(r, g.base)
		ref, sums := refBF16(t, o)
		ups := make([][2]mla.Buffer, len(runs))
		for i, run := range runs {
			x, w, err := mlatest.UploadBF16Operands(run.b, o, g.base.XOffset)
			require.NoError(t, err)
			ups[i] = [2]mla.Buffer{x, w}
		}
		for _, c := range g.cases {
			t.Run(c.String(), func(t *testing.T) {
				sub := &gemm.BF16Operands{Rows: c.Rows, N: c.N, K: c.K, X: o.X, XStride: o.XStride, W: o.W}
				want, s := ref[:c.Rows*c.N], sums[:c.Rows*c.N]
				var first []float32
				var firstPlan string
				for i, run := range runs {
					b := run.b
					before := b.BF16WGMMACount()
					got, err := mlatest.RunBF16GEMM(ctx, b, c, ups[i][0], ups[i][1])
					require.NoError(t, err, run.name)
					require.Equal(t, before+1, b.BF16WGMMACount(), "%s: the wgmma kernel did not run", run.name)
					again, err := mlatest.RunBF16GEMM(ctx, b, c, ups[i][0], ups[i][1])
					require.NoError(t, err, run.name)
					require.Equal(t, f32Bits(got), f32Bits(again), "%s: two runs differ", run.name)
					cmp, err := gemm.CompareF32Sums(sub, s, want, got)
					require.NoError(t, err)
					require.Zero(t, cmp.Violations, "%s (%s): %v", run.name, b.BF16WGMMAPlanOf(c.Rows, c.N, c.K), cmp)
					key := b.BF16WGMMASplitKey(c.Rows, c.N, c.K)
					if i == 0 {
						first, firstPlan = got, key
						t.Logf("%s: worst element %.3g of the bound; accumulation difference %.3g S (bound %.3g S)",
							b.BF16WGMMAPlanOf(c.Rows, c.N, c.K), cmp.Worst, cmp.AccumRel, gemm.BoundBF16(c.K))
					} else if key == firstPlan {
						require.Equal(t, f32Bits(first), f32Bits(got), "%s differs from the default with the same split (%s)", run.name, key)
					}
				}
			})
		}
		for i, run := range runs {
			require.NoError(t, run.b.Free(ups[i][0]))
			require.NoError(t, run.b.Free(ups[i][1]))
		}
	}
}

// TestBF16WGMMAAuto: with Knobs.BF16WGMMAMaxRows the automatic path runs
// the sm_90a kernel for every shape it can up to that many rows, and the
// other implementations' choice above them or where K is not a multiple
// of 64.
func TestBF16WGMMAAuto(t *testing.T) {
	backend(t)
	b, err := cuda.NewTuned(cuda.Options{}, cudatune.Knobs{BF16WGMMAMaxRows: 128})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.InitBF16GEMM())
	if err := b.BF16WGMMAError(); err != nil {
		t.Skipf("the sm_90a wgmma kernel is unavailable: %v", err)
	}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		c  mlatest.BF16GEMMCase
		wg bool
	}{
		{mlatest.BF16GEMMCase{Rows: 1, N: 2624, K: 4096}, true},
		{mlatest.BF16GEMMCase{Rows: 128, N: 1024, K: 7168}, true},
		{mlatest.BF16GEMMCase{Rows: 129, N: 1024, K: 1024}, false},
		{mlatest.BF16GEMMCase{Rows: 3, N: 32, K: 96}, false},
	} {
		o := mlatest.RandomBF16Operands(r, c.c)
		x, w, err := mlatest.UploadBF16Operands(b, o, 0)
		require.NoError(t, err)
		before := b.BF16WGMMACount()
		got, err := mlatest.RunBF16GEMM(ctx, b, c.c, x, w)
		require.NoError(t, err)
		if c.wg {
			require.Equal(t, before+1, b.BF16WGMMACount(), "%v: the wgmma kernel did not run", c.c)
		} else {
			require.Equal(t, before, b.BF16WGMMACount(), "%v: the wgmma kernel ran", c.c)
		}
		ref, err := gemm.ReferenceBF16(o)
		require.NoError(t, err)
		require.NoError(t, gemm.CheckBoundF32(o, ref, got))
		require.NoError(t, b.Free(x))
		require.NoError(t, b.Free(w))
	}
}

// TestBF16WGMMARefusesShapes: forced to the sm_90a kernel, K not a
// multiple of 64 is an error naming it, before anything is enqueued.
func TestBF16WGMMARefusesShapes(t *testing.T) {
	b := backend(t)
	if !forcePath(t, b, "wgmma") {
		t.Skip("the sm_90a wgmma kernel is unavailable")
	}
	c := mlatest.BF16GEMMCase{Rows: 2, N: 32, K: 96}
	o := mlatest.RandomBF16Operands(rand.New(rand.NewPCG(9, 10)), c)
	x, w, err := mlatest.UploadBF16Operands(b, o, 0)
	require.NoError(t, err)
	defer b.Free(x)
	defer b.Free(w)
	size := mlatest.BF16GEMMYBytes(c)
	y, err := b.Alloc(size)
	require.NoError(t, err)
	defer b.Free(y)
	before := bf16Counts(b)
	require.ErrorContains(t, b.BF16GEMM(context.Background(), mlatest.BF16GEMMArgs(c, x, w, y)), "K = 96")
	require.Equal(t, before, bf16Counts(b))
}
