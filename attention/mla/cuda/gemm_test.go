package cuda_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/weights"
)

// TestCUDAGEMM runs the GEMM conformance cases at V4-Flash's shapes with
// the default choice of implementation (the architecture description's
// rules: the wgmma kernel, the own kernel or cuBLASLt by shape).
func TestCUDAGEMM(t *testing.T) {
	b := backend(t)
	mlatest.TestGEMM(t, b)
	own, lt := b.GEMMCounts()
	t.Logf("GEMMs run: own kernel %d, cuBLASLt %d, wgmma %d (cuBLASLt: %v)", own, lt, b.WGMMACount(), b.CuBLASLtError())
}

// TestCUDAGEMMPaths runs the cases once per implementation: the own kernel
// for every batch, and cuBLASLt for every batch it accepts.
func TestCUDAGEMMPaths(t *testing.T) {
	backend(t)
	wg := cuda.Options{GEMMWGMMA: true, NoCuBLASLt: true}
	for name, path := range map[string]struct {
		opts  cuda.Options
		knobs cudatune.Knobs
	}{
		"own":               {cuda.Options{NoCuBLASLt: true, NoWGMMA: true}, cudatune.Knobs{}},
		"cublaslt":          {cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true}, cudatune.Knobs{}},
		"wgmma":             {wg, cudatune.Knobs{}},
		"wgmma-narrow":      {wg, cudatune.Knobs{WGMMAKernel: cudatune.WGMMANarrow}},
		"wgmma-narrow-pipe": {wg, cudatune.Knobs{WGMMAKernel: cudatune.WGMMANarrowPipe}},
		"wgmma-wide-pipe":   {wg, cudatune.Knobs{WGMMAKernel: cudatune.WGMMAWidePipe}},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := cuda.NewTuned(path.opts, path.knobs)
			require.NoError(t, err)
			defer b.Close()
			if err := b.InitGEMM(); strings.HasPrefix(name, "wgmma") && errors.Is(err, cuda.ErrWGMMAUnavailable) {
				t.Skipf("%v", err)
			} else {
				require.NoError(t, err)
			}
			if name == "cublaslt" && b.CuBLASLtError() != nil {
				t.Skipf("cuBLASLt unavailable: %v", b.CuBLASLtError())
			}
			if name == "cublaslt" {
				for _, m := range []int{4, 16, 128, 4096} {
					t.Logf("cuBLASLt at M = %d, N = 1536, K = 4096: %v", m, b.CuBLASLtSupports(m, 1536, 4096, 1536))
				}
			}
			// Pro scaled to N/8 keeps its K (7168: 56 blocks, uneven splits).
			mlatest.TestGEMMShapes(t, b, append(slices.Clone(mlatest.FlashGEMMs), mlatest.ScaledGEMMs(mlatest.ProGEMMs, 8)...))
			own, lt := b.GEMMCounts()
			t.Logf("GEMMs run: own kernel %d, cuBLASLt %d", own, lt)
			if strings.HasPrefix(name, "wgmma") {
				require.Zero(t, own+lt)
				require.Positive(t, b.WGMMACount())
			} else if name == "own" {
				require.Zero(t, lt)
			} else {
				require.Positive(t, lt, "no GEMM went to cuBLASLt")
			}
		})
	}
}

// uploadCase makes random operands from seed, uploads them and computes
// the host reference.
func uploadCase(t testing.TB, b *cuda.Backend, seed uint64, m, n, k int) (*gemm.Activations, *weights.FP8Matrix, *mla.FP8Weight, mla.FP8Activations, []uint16) {
	r := rand.New(rand.NewPCG(seed, 3))
	hw := mlatest.RandomFP8Weight(r, n, k)
	hx := mlatest.RandomActivations(r, m, k, m)
	w, err := mlatest.UploadFP8Weight(b, hw)
	require.NoError(t, err)
	x, err := mlatest.UploadActivations(b, hx)
	require.NoError(t, err)
	want, err := gemm.Reference(hx, hw)
	require.NoError(t, err)
	return hx, hw, w, x, want
}

// TestCUDAGEMMDeterministic: the split-K reduction adds the partials in a
// fixed order, so the same inputs give the same bytes every time.
func TestCUDAGEMMDeterministic(t *testing.T) {
	b := backend(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, s := range []struct{ m, n, k int }{{1, 1536, 4096}, {33, 1536, 4096}, {128, 2048, 7168}} {
		_, _, w, x, _ := uploadCase(t, b, seed, s.m, s.n, s.k)
		first, err := mlatest.RunGEMM(b, x, w, 0, s.n)
		require.NoError(t, err)
		for range 3 {
			again, err := mlatest.RunGEMM(b, x, w, 0, s.n)
			require.NoError(t, err)
			require.Equal(t, first, again, "m%d n%d k%d", s.m, s.n, s.k)
		}
		mlatest.FreeGEMMBuffers(b, w, x)
	}
}

// TestCUDAGEMMRefusesNarrowN: the kernel needs N in 128-row blocks.
func TestCUDAGEMMRefusesNarrowN(t *testing.T) {
	b := backend(t)
	r := rand.New(rand.NewPCG(1, 1))
	w, err := mlatest.UploadFP8Weight(b, mlatest.RandomFP8Weight(r, 200, 128))
	require.NoError(t, err)
	x, err := mlatest.UploadActivations(b, mlatest.RandomActivations(r, 2, 128, 2))
	require.NoError(t, err)
	defer mlatest.FreeGEMMBuffers(b, w, x)
	y, err := b.Alloc(2 * 2 * 200)
	require.NoError(t, err)
	defer b.Free(y)
	err = b.GEMM(context.Background(), &mla.GEMMArgs{X: x, W: w, Y: y, YStride: 200})
	require.ErrorContains(t, err, "W.N = 200 must be a multiple of 128")
}

// TestCUDAGEMMGraph captures GEMMs (the own kernel with split-K and, where
// available, cuBLASLt) into a CUDA graph and checks that a replay writes
// what a direct call wrote.
func TestCUDAGEMMGraph(t *testing.T) {
	b := backend(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	ctx := context.Background()
	for _, m := range []int{2, 300} {
		hx, hw, w, x, want := uploadCase(t, b, seed, m, 1536, 4096)
		y, err := b.Alloc(2 * m * 1536)
		require.NoError(t, err)
		args := &mla.GEMMArgs{X: x, W: w, Y: y, YStride: 1536}
		require.NoError(t, b.GEMM(ctx, args)) // prepares the plan outside the capture
		direct := make([]byte, 2*m*1536)
		require.NoError(t, b.Read(direct, y, 0))
		got := make([]uint16, m*1536)
		for i := range got {
			got[i] = uint16(direct[2*i]) | uint16(direct[2*i+1])<<8
		}
		require.NoError(t, gemm.CheckBound(hx, hw, want, got))
		require.NoError(t, b.Fill(y, 0, len(direct), 0xA5))
		g, err := b.Capture(func() error { return b.GEMM(ctx, args) })
		require.NoError(t, err, "m%d", m)
		require.NoError(t, g.Launch())
		require.NoError(t, b.Synchronize(ctx))
		replayed := make([]byte, len(direct))
		require.NoError(t, b.Read(replayed, y, 0))
		require.Equal(t, direct, replayed, "m%d: replay differs from the direct call", m)
		require.NoError(t, g.Close())
		mlatest.FreeGEMMBuffers(b, w, x)
		require.NoError(t, b.Free(y))
	}
}

var (
	gemmTimes     = flag.Bool("gemm.times", false, "TestGEMMTimes: time the GEMM implementations at V4-Flash and V4-Pro shapes")
	gemmTimesRows = flag.String("gemm.times.rows", "1,8,32,128,256,512,1024,4096", "TestGEMMTimes: the batch sizes, comma-separated")
	// A profiler run wants one shape and one path, not all of them.
	gemmTimesShapes = flag.String("gemm.times.shapes", "", "TestGEMMTimes: a regexp the shape names must match (empty: every shape)")
	// Shapes beside the models' (name:N:K, comma-separated): K sweeps that
	// split a kernel's time into a fixed cost and a cost a K block.
	gemmTimesExtra = flag.String("gemm.times.extra", "", "TestGEMMTimes: more shapes, name:N:K comma-separated")
	gemmTimesPaths = flag.String("gemm.times.paths", "own,cublaslt,wgmma,wgmma-cluster,wgmma-mc2,wgmma-mc4", "TestGEMMTimes: the implementations, comma-separated")
)

// TestGEMMTimes prints device times of the GEMM at V4-Flash and V4-Pro
// shapes for each implementation: "cold" with L2 flushed before each call
// (a 256 MiB memset), "b2b" back to back on the same inputs (weights
// partly L2-resident), both replayed from CUDA graphs (no host launch cost),
// and the weight bandwidth of the cold time. Run with
// -gemm.times. The first column is the own kernel forced (NoCuBLASLt), the
// second cuBLASLt wherever it accepts the shape (GEMMOwnMaxM = -1; its
// path column says "own" where cuBLASLt refused), the third the sm_90a
// wgmma kernel (GEMMWGMMA, where it runs): together they are what the
// architecture description's choices (cudatune.SM90.FP8.Own and
// FP8.WGMMA.Use) are read from.
func TestGEMMTimes(t *testing.T) {
	if !*gemmTimes {
		t.Skip("run with -gemm.times")
	}
	backend(t)
	var ms []int
	for _, f := range strings.Split(*gemmTimesRows, ",") {
		m, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, "-gemm.times.rows")
		ms = append(ms, m)
	}
	shapes := append(slices.Clone(mlatest.FlashGEMMs), mlatest.ProGEMMs...)
	// The ratio-4 layers' indexer wq_b (64 heads x 128 from q_lora_rank).
	shapes = append(shapes, mlatest.GEMMShape{Name: "flash-idx-wqb", N: 8192, K: 1024}, mlatest.GEMMShape{Name: "pro-idx-wqb", N: 8192, K: 1536})
	for _, f := range strings.Split(*gemmTimesExtra, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		var s mlatest.GEMMShape
		var err error
		parts := strings.Split(f, ":")
		require.Len(t, parts, 3, "-gemm.times.extra %q: want name:N:K", f)
		s.Name = parts[0]
		s.N, err = strconv.Atoi(parts[1])
		require.NoError(t, err, "-gemm.times.extra %q", f)
		s.K, err = strconv.Atoi(parts[2])
		require.NoError(t, err, "-gemm.times.extra %q", f)
		shapes = append(shapes, s)
	}
	shapeRe, err := regexp.Compile(*gemmTimesShapes)
	require.NoError(t, err, "-gemm.times.shapes")
	shapes = slices.DeleteFunc(shapes, func(s mlatest.GEMMShape) bool { return !shapeRe.MatchString(s.Name) })
	paths := strings.Split(*gemmTimesPaths, ",")
	type row struct{ cold, b2b time.Duration }
	results := map[string]map[string]row{}
	ran := map[string]string{}
	wg := cuda.Options{GEMMWGMMA: true, NoCuBLASLt: true}
	for _, path := range []struct {
		name  string
		opts  cuda.Options
		knobs cudatune.Knobs
	}{{"own", cuda.Options{NoCuBLASLt: true, NoWGMMA: true}, cudatune.Knobs{}}, {"cublaslt", cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true}, cudatune.Knobs{}},
		{"cublaslt-ws", cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true}, cudatune.Knobs{CuBLASLtSplitK: cudatune.CuBLASLtSplitKWorkspace}},
		{"cublaslt-nosplit", cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true}, cudatune.Knobs{CuBLASLtSplitK: cudatune.CuBLASLtSplitKNone}},
		// The heuristic's 2nd to 4th results (CuBLASLtFP8Heuristic).
		{"cublaslt-h2", cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true}, cudatune.Knobs{CuBLASLtFP8Heuristic: 2}},
		{"cublaslt-h3", cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true}, cudatune.Knobs{CuBLASLtFP8Heuristic: 3}},
		{"cublaslt-h4", cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true}, cudatune.Knobs{CuBLASLtFP8Heuristic: 4}},
		{"wgmma", wg, cudatune.Knobs{WGMMAClusterSplits: -1, WGMMAMulticast: -1}},
		{"wgmma-cluster", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1}},
		{"wgmma-narrow", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrow}},
		{"wgmma-npipe", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe}},
		// The narrow planner capped at 1 and 2 token chunks (then K split in clusters), and clusters of at most 4.
		{"npipe-c1", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 1}},
		{"npipe-c2", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 2}},
		{"npipe-c1-cl4", wg, cudatune.Knobs{WGMMAClusterSplits: 4, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 1}},
		{"narrow-c1", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrow, WGMMANarrowChunks: 1}},
		// No split: the GEMM on few multiprocessors (12, 24, 48 blocks at V4-Flash's [wq_a; wkv], 128 rows).
		{"wide-s1", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAMaxSplits: 1}},
		{"npipe-c1-s1", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 1, WGMMAMaxSplits: 1}},
		{"narrow-c1-s1", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrow, WGMMANarrowChunks: 1, WGMMAMaxSplits: 1}},
		{"npipe-c2-s1", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 2, WGMMAMaxSplits: 1}},
		{"wgmma-wpipe", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMAWidePipe}},
		// The token chunks of a weight tile in clusters sharing it (TMA multicast of the weights).
		{"npipe-c4", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 4}},
		{"npipe-c4-st4", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 4, WGMMANarrowStages: 4}},
		{"npipe-c4-st8", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 4, WGMMANarrowStages: 8}},
		{"npipe-wc4", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 4, WGMMAWeightMulticast: 4}},
		{"npipe-wc2", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 4, WGMMAWeightMulticast: 2}},
		{"npipe-c2-wc2", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMAWeightMulticast: 2}},
		{"narrow-wc4", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAKernel: cudatune.WGMMANarrow, WGMMANarrowChunks: 4, WGMMAWeightMulticast: 4}},
		{"npipe-wc4-mc2", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: 2, WGMMAKernel: cudatune.WGMMANarrowPipe, WGMMANarrowChunks: 4, WGMMAWeightMulticast: 4}},
		{"narrow-wc4-mc2", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: 2, WGMMAKernel: cudatune.WGMMANarrow, WGMMANarrowChunks: 4, WGMMAWeightMulticast: 4}},
		{"wide-wc4", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: -1, WGMMAWeightMulticast: 4}},
		{"wgmma-mc2", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: 2}},
		{"wgmma-mc4", wg, cudatune.Knobs{WGMMAClusterSplits: 8, WGMMAMulticast: 4}}} {
		if !slices.Contains(paths, path.name) {
			continue
		}
		b, err := cuda.NewTuned(path.opts, path.knobs)
		require.NoError(t, err)
		if err := b.InitGEMM(); strings.HasPrefix(path.name, "wgmma") && errors.Is(err, cuda.ErrWGMMAUnavailable) {
			t.Logf("%v", err)
			require.NoError(t, b.Close())
			continue
		} else {
			require.NoError(t, err)
		}
		if strings.HasPrefix(path.name, "cublaslt") && b.CuBLASLtError() != nil {
			t.Logf("cuBLASLt unavailable: %v", b.CuBLASLtError())
			require.NoError(t, b.Close())
			continue
		}
		flush, err := b.Alloc(256 << 20)
		require.NoError(t, err)
		ctx := context.Background()
		for _, s := range shapes {
			r := rand.New(rand.NewPCG(uint64(s.N), uint64(s.K)))
			w, err := mlatest.UploadFP8Weight(b, mlatest.RandomFP8Weight(r, s.N, s.K))
			require.NoError(t, err)
			for _, m := range ms {
				x, err := mlatest.UploadActivations(b, mlatest.RandomActivations(r, m, s.K, m))
				require.NoError(t, err)
				y, err := b.Alloc(2 * m * s.N)
				require.NoError(t, err)
				args := &mla.GEMMArgs{X: x, W: w, Y: y, YStride: s.N}
				_, lt0 := b.GEMMCounts()
				wg0 := b.WGMMACount()
				require.NoError(t, b.GEMM(ctx, args)) // warm-up: plans, module
				which := "own"
				if _, lt1 := b.GEMMCounts(); lt1 > lt0 {
					which = "cublaslt"
					if a, err := b.CuBLASLtAlgorithm(m, s.N, s.K, s.N); err == nil {
						fmt.Printf("ALGO %-16s %s/m%d %v\n", path.name, s.Name, m, a)
					}
				} else if b.WGMMACount() > wg0 {
					which = path.name
				}
				// Timed as CUDA graphs so that the host's launch cost (one
				// hand-over per call) stays out: b2b is a graph of reps GEMMs;
				// cold is a graph of reps (L2 flush, GEMM) pairs less a graph
				// of the flushes alone.
				const reps = 20
				timeGraph := func(f func() error) time.Duration {
					g, err := b.Capture(func() error {
						for range reps {
							if err := f(); err != nil {
								return err
							}
						}
						return nil
					})
					require.NoError(t, err)
					defer g.Close()
					require.NoError(t, g.Launch())
					d, err := b.Time(ctx, g.Launch)
					require.NoError(t, err)
					return d
				}
				fill := func() error { return b.Fill(flush, 0, 256<<20, byte(m)) }
				gemm := func() error { return b.GEMM(ctx, args) }
				b2b := timeGraph(gemm)
				flushes := timeGraph(fill)
				cold := timeGraph(func() error {
					if err := fill(); err != nil {
						return err
					}
					return gemm()
				}) - flushes
				key := fmt.Sprintf("%s/m%d", s.Name, m)
				if results[key] == nil {
					results[key] = map[string]row{}
				}
				results[key][path.name] = row{cold / reps, b2b / reps}
				ran[key+"/"+path.name] = which
				// As it is measured too, so that a run cut short keeps what it timed.
				fmt.Printf("TIMES %-11s %-22s ran %-11s cold %8.2f us  b2b %8.2f us  cold %5.0f GB/s\n", path.name, key, which,
					float64(cold/reps)/float64(time.Microsecond), float64(b2b/reps)/float64(time.Microsecond),
					float64(s.N*s.K)/(float64(cold/reps)/float64(time.Microsecond))/1e3)
				require.NoError(t, b.Free(y))
				mlatest.FreeGEMMBuffers(b, &mla.FP8Weight{}, x)
			}
			mlatest.FreeGEMMBuffers(b, w, mla.FP8Activations{})
		}
		require.NoError(t, b.Free(flush))
		require.NoError(t, b.Close())
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	fmt.Printf("%-22s", "GEMM")
	for range paths {
		fmt.Printf(" %-13s %8s %8s %9s  ", "path", "cold us", "b2b us", "cold GB/s")
	}
	fmt.Printf(" %8s\n", "floor us")
	for _, s := range shapes {
		wbytes := float64(s.N * s.K)
		for _, m := range ms {
			key := fmt.Sprintf("%s/m%d", s.Name, m)
			line := fmt.Sprintf("%-22s", key)
			for _, p := range paths {
				rw, ok := results[key][p]
				if !ok {
					line += fmt.Sprintf(" %-13s %8s %8s %9s  ", p, "-", "-", "-")
					continue
				}
				line += fmt.Sprintf(" %-13s %8.1f %8.1f %9.0f  ", ran[key+"/"+p], us(rw.cold), us(rw.b2b), wbytes/us(rw.cold)/1e3)
			}
			line += fmt.Sprintf(" %8.1f", wbytes/4.1e12*1e6)
			fmt.Println(line)
		}
	}
}

// TestCUDAGEMMWorkspaceReserve: a fresh backend's FreeMemory keeps back
// the GEMMs' workspaces it will allocate at the first GEMMs (so the
// engine's default MemoryLimit does not promise that memory to the
// caches), and keeps nothing back once they are allocated.
func TestCUDAGEMMWorkspaceReserve(t *testing.T) {
	backend(t) // skips without a device
	b, err := cuda.New(cuda.Options{})
	require.NoError(t, err)
	defer b.Close()
	// One of each a stream (main, side, third): FP8 split-K partials 3 x
	// 32 MiB, bf16 3 x (8 MiB + 16 KiB of counters), cuBLASLt 3 x 32 MiB,
	// the wgmma kernel's 3 x 4 KiB of split counters (the H200's
	// architecture description chooses it).
	const all = 216<<20 + 3*16<<10 + 3*4<<10
	require.Equal(t, int64(all), b.WorkspaceReserve())
	freeOf := func() (reported, device int64) {
		reported, err := b.FreeMemory()
		require.NoError(t, err)
		free, _, err := b.Context().MemInfo()
		require.NoError(t, err)
		return reported, int64(free)
	}
	reported, device := freeOf()
	require.Equal(t, device-all, reported)
	require.NoError(t, b.InitGEMM())
	require.Equal(t, int64(24<<20+3*16<<10), b.WorkspaceReserve(), "after InitGEMM only the bf16 GEMM's partials and counters are to come")
	x, err := b.Alloc(2 * 128)
	require.NoError(t, err)
	w, err := b.Alloc(2 * 128 * 128)
	require.NoError(t, err)
	y, err := b.Alloc(4 * 128)
	require.NoError(t, err)
	require.NoError(t, b.BF16GEMM(context.Background(), &mla.BF16GEMMArgs{Rows: 1, N: 128, K: 128, X: x, XStride: 128, W: w, Y: y, YStride: 128}))
	require.Zero(t, b.WorkspaceReserve())
	reported, device = freeOf()
	require.Equal(t, device, reported)
}

// TestCUDAGEMMStreams runs each FP8 GEMM path on the main stream alone,
// then on the main stream, inside Side and inside Aux (the third stream) at
// once, eagerly and as one captured graph, each into its own output: every
// result within package gemm's bound of the host reference and the same
// bytes on every stream (each stream has its own split-K workspaces and
// cuBLASLt workspace, so GEMMs in flight at once never share partials). It
// runs under each cudatune.CuBLASLtSplitK and logs cuBLASLt's algorithm
// for each shape. The shapes are the indexer's wq_b at the graph path's 16
// padded rows (the tiny model's K = 256, where cuBLASLt's default choice
// wrote wrong columns on 2026-12-02, and V4-Flash's 1024), at 8 rows (the
// wgmma kernel) and 128, the tiny model's wq_b and fused A projection, and
// V4-Flash's fused A projection at 16 and 128 rows. -cuda.wgnarrow runs it under that knob.
func TestCUDAGEMMStreams(t *testing.T) {
	backend(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	ctx := context.Background()
	for _, split := range []cudatune.CuBLASLtSplitK{cudatune.CuBLASLtSplitKAny, cudatune.CuBLASLtSplitKWorkspace, cudatune.CuBLASLtSplitKNone} {
		t.Run(split.String(), func(t *testing.T) {
			b, err := cuda.NewTuned(cuda.Options{}, cudatune.Knobs{CuBLASLtSplitK: split, WGMMANarrow: cudatune.WGMMAKernel(*wgmmaNarrowFlag)})
			require.NoError(t, err)
			defer b.Close()
			for _, s := range []struct{ m, n, k int }{{16, 8192, 256}, {32, 8192, 256}, {16, 1024, 256}, {16, 768, 256}, {16, 8192, 1024}, {8, 8192, 256}, {8, 8192, 1024}, {128, 8192, 1024}, {16, 1536, 4096}, {128, 1536, 4096}} {
				t.Run(fmt.Sprintf("m%d-n%d-k%d", s.m, s.n, s.k), func(t *testing.T) {
					if a, err := b.CuBLASLtAlgorithm(s.m, s.n, s.k, s.n); err == nil {
						t.Logf("ALGO %s m%d-n%d-k%d: %v", split, s.m, s.n, s.k, a)
					} else {
						t.Logf("ALGO %s m%d-n%d-k%d: none: %v", split, s.m, s.n, s.k, err)
					}
					hx, hw, w, x, want := uploadCase(t, b, seed, s.m, s.n, s.k)
					defer mlatest.FreeGEMMBuffers(b, w, x)
					n := 2 * s.m * s.n
					var ys [3]mla.Buffer
					for i := range ys {
						y, err := b.Alloc(n)
						require.NoError(t, err)
						defer b.Free(y)
						ys[i] = y
					}
					gemmOn := func(i int) error { return b.GEMM(ctx, &mla.GEMMArgs{X: x, W: w, Y: ys[i], YStride: s.n}) }
					// The three streams: main, side, third; joined at the end.
					all := func() error {
						err := errors.Join(b.Side(ctx, func() error { return gemmOn(1) }),
							b.Aux(ctx, func() error { return gemmOn(2) }), gemmOn(0))
						return errors.Join(err, b.JoinKV(ctx))
					}
					check := func(what string, i int) []byte {
						require.NoError(t, b.Synchronize(ctx))
						out := make([]byte, n)
						require.NoError(t, b.Read(out, ys[i], 0))
						got := make([]uint16, s.m*s.n)
						for j := range got {
							got[j] = uint16(out[2*j]) | uint16(out[2*j+1])<<8
						}
						require.NoError(t, gemm.CheckBound(hx, hw, want, got), "%s, stream %d", what, i)
						return out
					}
					read := func(what string) (out [3][]byte) {
						for i := range ys {
							out[i] = check(what, i)
						}
						return out
					}
					poison := func() {
						for _, y := range ys {
							require.NoError(t, b.Fill(y, 0, n, 0xA5))
						}
					}
					poison()
					require.NoError(t, gemmOn(0))
					alone := check("main stream alone", 0)
					poison()
					require.NoError(t, all()) // eager: also plans every shape on every stream before the capture
					eager := read("eager")
					require.Equal(t, alone, eager[0], "main stream beside the others differs from it alone")
					require.Equal(t, eager[0], eager[1], "side stream differs from main")
					require.Equal(t, eager[0], eager[2], "third stream differs from main")
					g, err := b.Capture(all)
					require.NoError(t, err)
					defer g.Close()
					for rep := range 3 {
						poison()
						require.NoError(t, g.Launch())
						replayed := read(fmt.Sprintf("replay %d", rep))
						for i := range replayed {
							require.Equal(t, eager[0], replayed[i], "replay %d, stream %d differs from the eager main stream", rep, i)
						}
					}
				})
			}
		})
	}
}

// TestCUDACuBLASLtScaleRows maps where cuBLASLt's FP8 GEMM is right: every
// shape of M in {16, 32, 128}, N in {1024, 2048, 4096, 8192} and K in
// {256, 384, 512, 640, 1024} through cuBLASLt (where it accepts the shape),
// within package gemm's bound or not, logged; the shapes the backend sends
// to it (cublasLtScaleRowsOK) must all be within the bound.
func TestCUDACuBLASLtScaleRows(t *testing.T) {
	backend(t)
	b, err := cuda.New(cuda.Options{GEMMOwnMaxM: -1, NoWGMMA: true})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.InitGEMM())
	if b.CuBLASLtError() != nil {
		t.Skipf("cuBLASLt unavailable: %v", b.CuBLASLtError())
	}
	b.SetCuBLASLtAnyK(true)
	defer b.SetCuBLASLtAnyK(false)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, k := range []int{256, 384, 512, 640, 1024} {
		for _, n := range []int{1024, 2048, 4096, 8192} {
			for _, m := range []int{16, 32, 128} {
				hx, hw, w, x, want := uploadCase(t, b, seed, m, n, k)
				_, lt0 := b.GEMMCounts()
				got, err := mlatest.RunGEMM(b, x, w, 0, n)
				require.NoError(t, err)
				mlatest.FreeGEMMBuffers(b, w, x)
				if _, lt1 := b.GEMMCounts(); lt1 == lt0 {
					t.Logf("LTMAP m%d n%d k%d: cuBLASLt refused the shape", m, n, k)
					continue
				}
				err = gemm.CheckBound(hx, hw, want, got)
				t.Logf("LTMAP m%d n%d k%d admitted %v: %v", m, n, k, cuda.CuBLASLtScaleRowsOK(k), err)
				if cuda.CuBLASLtScaleRowsOK(k) {
					require.NoError(t, err, "m%d n%d k%d", m, n, k)
				}
			}
		}
	}
}
