package cuda_test

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// The shared backend's knobs, so that the suites that run on it (the GEMM
// graph, determinism and streams tests among them) check a variant before
// it becomes a default.
var (
	wgmmaNarrowFlag = flag.Int("cuda.wgnarrow", 0, "the shared backend's cudatune.Knobs.WGMMANarrow (a wgmma kernel family for the narrow GEMMs at up to 128 rows)")
	wgmmaChunksFlag = flag.Int("cuda.wgchunks", 0, "the shared backend's cudatune.Knobs.WGMMANarrowChunks (the narrow planner's most token chunks)")
	wgmmaWCastFlag  = flag.Int("cuda.wgwcast", 0, "the shared backend's cudatune.Knobs.WGMMAWeightMulticast (clusters of token-chunk blocks sharing the weight tile)")
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
	sharedOnce.Do(func() {
		shared, sharedErr = cuda.NewTuned(cuda.Options{}, cudatune.Knobs{WGMMANarrow: cudatune.WGMMAKernel(*wgmmaNarrowFlag),
			WGMMANarrowChunks: *wgmmaChunksFlag, WGMMAWeightMulticast: *wgmmaWCastFlag})
	})
	require.NoError(t, sharedErr)
	return shared
}

func TestCUDAConformance(t *testing.T) {
	b := backend(t)
	p := b.Props()
	t.Logf("device %s (%s, %d SMs)", p.Name, p.Arch(), p.SMCount)
	mlatest.Test(t, b)
}

// TestCUDALargeContext runs a context batch past the FP8 Q direct-path
// threshold with the default knobs, every byte against the reference: in
// the fused layer grid FP8 Q streams and bf16 Q takes the direct path (a
// grid of over a hundred thousand blocks of half the warps, a size the
// suite's small scenarios never reach); as separate launches the KV kernel
// streams beside a direct bf16 Q kernel. Long (about a gigabyte of rows),
// so -short skips it.
func TestCUDALargeContext(t *testing.T) {
	fused := backend(t)
	if testing.Short() {
		t.Skip("-short: about a gigabyte of rows")
	}
	const heads = 64
	tokens := cudatune.SM90.Knobs.DirectMaxRows/heads + 77 // 8269: 77 tokens past the FP8 threshold
	s := mlatest.Scenario{Name: "context/large", Heads: heads, PageSize: 64, Cached: map[uint64]int{2: 45}, Reqs: []metadata.Request{
		{Seq: 1, Phase: metadata.Context, NewTokens: tokens - 3001},
		{Seq: 2, Phase: metadata.Context, NewTokens: 3001},
	}}
	l := mla.Launch{Rows: tokens}
	require.Equal(t, abi.Streaming, cuda.PathFor(cudatune.Knobs{}, l, heads, mla.QFP8), "FP8 Q (and a KV kernel alone) at this size")
	require.Equal(t, abi.Direct, cuda.PathFor(cudatune.Knobs{}, l, heads, mla.QBF16), "bf16 Q at this size")
	separate, err := cuda.NewTuned(cuda.Options{}, cudatune.Knobs{SeparateLaunches: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, separate.Close()) }()
	qbf16 := mlatest.Config{Format: kvcache.FormatFP8UE8M0, QBF16: true}
	runs := []struct {
		name string
		b    *cuda.Backend
		c    mlatest.Config
	}{
		{"fused", fused, qbf16},
		{"fused", fused, mlatest.Config{Format: kvcache.FormatFP8UE8M0}},
		{"fused", fused, mlatest.Config{Format: kvcache.FormatBF16, QBF16: true}},
		{"separate", separate, qbf16},
	}
	for _, r := range runs {
		t.Run(r.name+"/"+r.c.String(), func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			require.NoError(t, mlatest.Check(r.b, s, r.c, seed))
		})
	}
}

// TestCUDAConformanceVariants runs the suite on other launch shapes. The
// default backend puts every launch of the suite on the direct path; the
// streaming pipeline runs with the direct path off: warps that stream long
// ranges through their rings (odd warp counts, depths and Q chunks, a chunk
// shorter than the depth and one longer than a warp's share), one row in
// flight, its default shape, as separate KV and Q launches. The direct
// path runs without programmatic dependent launch, as separate launches and
// with odd block shapes, and two thresholds put the suite's launches on both
// sides of the boundary (TestSuiteCrossesThePathBoundary checks that they
// do).
func TestCUDAConformanceVariants(t *testing.T) {
	backend(t)
	// Every launch streams, whatever its Q format.
	streaming := func(k cudatune.Knobs) cudatune.Knobs {
		k.DirectMaxRows, k.DirectMaxRowsBF16 = -1, -1
		return k
	}
	variants := map[string]struct {
		opts  cuda.Options
		knobs cudatune.Knobs
	}{
		// One small block: every warp streams a long range through its ring.
		"one-block":          {knobs: streaming(cudatune.Knobs{Warps: 3, KVDepth: 3, QDepth: 5, QChunk: 3, MaxBlocks: 1})},
		"depth1":             {knobs: streaming(cudatune.Knobs{Warps: 1, KVDepth: 1, QDepth: 1, QChunk: 5, MaxBlocks: 2})},
		"wide":               {knobs: streaming(cudatune.Knobs{Warps: 4, KVDepth: 8, QDepth: 8, QChunk: 1000})},
		"streaming":          {knobs: streaming(cudatune.Knobs{})},
		"streaming-separate": {knobs: streaming(cudatune.Knobs{SeparateLaunches: true})},
		// The direct path with its minimum named (DirectMinRows 1), so these
		// stay direct whatever the default minimum becomes.
		"direct":   {knobs: cudatune.Knobs{DirectMinRows: 1}},
		"no-pdl":   {opts: cuda.Options{NoPDL: true}, knobs: cudatune.Knobs{DirectMinRows: 1}},
		"separate": {knobs: cudatune.Knobs{SeparateLaunches: true, DirectMinRows: 1}},
		// Blocks of 3 warps and 3 Q rows a warp (a warp's rows straddle
		// tokens, a block's the KV/Q split), registers capped at 42 by 16
		// blocks a multiprocessor (the compiler spills).
		"direct-3warps-3rows": {knobs: cudatune.Knobs{DirectWarps: 3, DirectQRows: 3, DirectMinBlocks: 16, DirectMinRows: 1}},
		// 8 Q rows a warp: with the suite's small head counts a warp's rows
		// span several tokens, each resolved when its first row is reached.
		"direct-8rows": {knobs: cudatune.Knobs{DirectQRows: 8, DirectMinRows: 1}},
		// Blocks of half the warps for every launch of more than one Q
		// row (the default halves them only for grids of more than a wave).
		"direct-half-blocks": {knobs: cudatune.Knobs{DirectHalfBlockRows: 1, DirectMinRows: 1}},
		"direct-1warp-1row":  {knobs: cudatune.Knobs{DirectWarps: 1, DirectQRows: 1, DirectMinRows: 1}},
		"boundary":           {knobs: boundaryKnobs()},
		"split":              {knobs: splitKnobs()},
	}
	for name, v := range variants {
		b, err := cuda.NewTuned(v.opts, v.knobs)
		require.NoError(t, err)
		t.Run(name, func(t *testing.T) { mlatest.Test(t, b) })
		require.NoError(t, b.Close())
	}
}

// TestCUDACompressStep runs the compressor step's conformance suite (it
// skips until the backend implements mla.CompressStepper).
func TestCUDACompressStep(t *testing.T) {
	mlatest.TestCompressStep(t, backend(t))
}

// TestCUDAIndexerQuery runs the indexer query's conformance suite
// (DESIGN.md section 9): every batch shape in both query formats (MXFP4
// and FP8), every byte of the query rows and the head weights against
// mlatest's scalar reference.
func TestCUDAIndexerQuery(t *testing.T) {
	mlatest.TestIndexerQuery(t, backend(t))
}

// TestCUDAIndexerRotation is "rotate both or neither" on the device: the
// indexer cache entries and the queries from the kernels, planted keys
// scored as the selection scores them.
func TestCUDAIndexerRotation(t *testing.T) {
	mlatest.TestIndexerRotation(t, backend(t))
}

// TestCUDAIndexerKernels runs the conformance suites of the indexer's
// kernels under each choice (cudatune.Knobs.IndexerKeys: the compressor
// step's suite; IndexerQuery: the query's) and rotate both or neither
// under each: every one writes mlatest's reference bytes, whichever is the
// default.
func TestCUDAIndexerKernels(t *testing.T) {
	if err := cuda.Available(); err != nil {
		t.Skipf("CUDA backend unavailable: %v", err)
	}
	for _, v := range []struct {
		name string
		k    cudatune.Knobs
	}{
		{"keys=split", cudatune.Knobs{IndexerKeys: cudatune.IndexerKeysSplit}},
		{"keys=fused", cudatune.Knobs{IndexerKeys: cudatune.IndexerKeysFused}},
		// Each kernel at every size (no wide kernel from a row count on).
		{"query=late", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLate, IndexerQueryWideMinRows: -1}},
		{"query=early", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryEarly, IndexerQueryWideMinRows: -1}},
		{"query=lean", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLean, IndexerQueryWideMinRows: -1}},
		{"query=wide", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryWide}},
		// Two blocks: every warp's grid-stride loop past its first unit.
		{"query=wide,maxblocks=2", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryWide, MaxBlocks: 2}},
		{"query=stream", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1}},
		{"query=stream,maxblocks=2", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1, MaxBlocks: 2}},
		{"query=lane", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLane, IndexerQueryWideMinRows: -1}},
		{"query=lane,maxblocks=2", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLane, IndexerQueryWideMinRows: -1, MaxBlocks: 2}},
		// Its own grid (one wave), and two blocks: runs across tokens.
		{"query=tok", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok, IndexerQueryWideMinRows: -1}},
		{"query=tok,maxblocks=2", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok, IndexerQueryWideMinRows: -1, MaxBlocks: 2}},
		{"query=tok,maxblocks=3", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok, IndexerQueryWideMinRows: -1, MaxBlocks: 3}},
	} {
		t.Run(v.name, func(t *testing.T) {
			b, err := cuda.NewTuned(cuda.Options{}, v.k)
			require.NoError(t, err)
			defer func() { require.NoError(t, b.Close()) }()
			if v.k.IndexerKeys != 0 {
				t.Run("CompressStep", func(t *testing.T) { mlatest.TestCompressStep(t, b) })
			} else {
				t.Run("IndexerQuery", func(t *testing.T) { mlatest.TestIndexerQuery(t, b) })
			}
			t.Run("IndexerRotation", func(t *testing.T) { mlatest.TestIndexerRotation(t, b) })
		})
	}
}

func TestCUDAMixedEqualsParts(t *testing.T) {
	mlatest.MixedEqualsParts(t, backend(t))
}

// sweepSource holds the test-only conversion kernels, embedded so that the
// test binary runs from any directory (scripts/run-gpu-tests.sh).
//
//go:embed testdata/sweep.cu
var sweepSource string

var (
	sweeps     map[string]*driver.Function
	sweepsErr  error
	sweepsOnce sync.Once
)

// sweep runs one of the test-only conversion kernels of testdata/sweep.cu
// (compiled after prologue.cu, so that they run its helpers) over the n
// float32 bit patterns base, base+1, ... into out.
func sweep(t *testing.T, b *cuda.Backend, kernel string, out mla.Buffer, base uint32, n int) error {
	t.Helper()
	sweepsOnce.Do(func() {
		mod, err := b.CompileWithTestKernels("sweep.cu", sweepSource)
		if err != nil {
			sweepsErr = err
			return
		}
		sweeps = map[string]*driver.Function{}
		for _, name := range []string{"e4m3_sweep", "bf16_sweep"} {
			if sweeps[name], sweepsErr = mod.Function(name); sweepsErr != nil {
				return
			}
		}
	})
	require.NoError(t, sweepsErr)
	if n%2 != 0 {
		return fmt.Errorf("%s: n = %d must be even", kernel, n)
	}
	grid := driver.Dim3{uint32(b.Props().SMCount * 8), 1, 1}
	return b.Context().Launch(sweeps[kernel], grid, driver.Dim3{256, 1, 1}, 0, b.Stream(), out.(*cuda.Buffer).Ptr(), base, uint32(n))
}

// everyFloat32 checks a GPU conversion on all 2^32 float32 bit patterns,
// a chunk at a time: produce(base) runs the kernels over the chunk's
// patterns base, base+1, ... and reads their outputs back, then check(i,
// bits) compares the chunk's pattern i with the Go reference on every CPU.
// It reports the first three differences and returns how many patterns
// differed.
func everyFloat32(t *testing.T, chunk int, produce func(base uint32), check func(i int, bits uint32) error) int64 {
	t.Helper()
	var diffs atomic.Int64
	workers := runtime.GOMAXPROCS(0)
	for c := uint64(0); c < 1<<32; c += uint64(chunk) {
		base := uint32(c)
		produce(base)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < chunk; i += workers {
					if err := check(i, base+uint32(i)); err != nil && diffs.Add(1) <= 3 {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
	}
	return diffs.Load()
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
	var negNaN [256]atomic.Int64 // the bytes negative NaN inputs became
	diffs := everyFloat32(t, chunk, func(base uint32) {
		require.NoError(t, b.Fill(out, 0, chunk, 0xA5))
		require.NoError(t, sweep(t, b, "e4m3_sweep", out, base, chunk))
		require.NoError(t, b.Read(host, out, 0))
	}, func(i int, bits uint32) error {
		f := math.Float32frombits(bits)
		if f != f && bits&0x80000000 != 0 {
			negNaN[host[i]].Add(1)
		}
		if want := numerics.E4M3FromF32(f); host[i] != want {
			return fmt.Errorf("e4m3(%#08x = %g): hardware %#02x, Go %#02x", bits, f, host[i], want)
		}
		return nil
	})
	became := map[byte]int64{}
	for v := range negNaN {
		if n := negNaN[v].Load(); n > 0 {
			became[byte(v)] = n
		}
	}
	t.Logf("2^32 inputs, %d differences; negative NaN inputs became %v", diffs, became)
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
	diffs := everyFloat32(t, chunk, func(base uint32) {
		require.NoError(t, b.Fill(out, 0, 2*chunk, 0xA5))
		require.NoError(t, sweep(t, b, "bf16_sweep", out, base, chunk))
		require.NoError(t, b.Read(host, out, 0))
	}, func(i int, bits uint32) error {
		got := uint16(host[2*i]) | uint16(host[2*i+1])<<8
		if want := numerics.BF16FromF32(math.Float32frombits(bits)); got != want {
			return fmt.Errorf("bf16(%#08x): GPU %#04x, Go %#04x", bits, got, want)
		}
		return nil
	})
	t.Logf("2^32 inputs, %d differences", diffs)
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
