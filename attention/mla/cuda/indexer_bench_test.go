package cuda_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/metadata"
)

// BenchmarkCUDAIndexer times the indexer's prologue kernels of one ratio-4
// layer (DESIGN.md section 9) after their GEMMs: the query (RoPE, Hadamard,
// MXFP4 of 64 heads and the head weights) and the key cache (the indexer
// compressor's step), at b = 32 MTP 3 (128 rows, decode steps of 4 rows
// mid-sequence), b = 1 MTP 3 (4 rows) and at 512-token to 16K-token
// prefill (512, 1K, 2K, 4K, 16K: where the query kernels cross over),
// each under every kernel choice (cudatune.Knobs.IndexerQuery: late =
// indexer_query, early = indexer_query_early, lean = indexer_query_lean, wide =
// indexer_query_wide, stream = indexer_query_stream, lane =
// indexer_query_lane, -gN: on N blocks a multiprocessor; IndexerKeys: split =
// compress_step at width 128 then indexer_step_finish, fused =
// indexer_step). Each is captured 20 times in one CUDA graph; the best
// replay of b.N is reported per call, beside its copy floor: the time a
// device-to-device copy takes to move as many bytes (each byte a copy
// moves is read once and written once, so the floor of R bytes read and W
// written is (R+W)/2 at the copy rate).
func BenchmarkCUDAIndexer(bm *testing.B) {
	if err := cuda.Available(); err != nil {
		bm.Skipf("CUDA backend unavailable: %v", err)
	}
	type kernels struct {
		name string
		k    cudatune.Knobs
	}
	queryKernels := []kernels{{"late", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLate, IndexerQueryWideMinRows: -1}},
		{"early", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryEarly, IndexerQueryWideMinRows: -1}},
		{"lean", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLean, IndexerQueryWideMinRows: -1}},
		{"wide", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryWide}},
		{"stream", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1}},
		// The stream kernel on fewer blocks (MaxBlocks: 4 and 2 a multiprocessor
		// of the H200's 132), each warp looping over more units.
		{"stream-g4", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1, MaxBlocks: 528}},
		{"stream-g2", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1, MaxBlocks: 264}},
		// And 1, 3, 6 and 8 a multiprocessor (the default grid is up to 16).
		{"stream-g1", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1, MaxBlocks: 132}},
		{"stream-g3", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1, MaxBlocks: 396}},
		{"stream-g6", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1, MaxBlocks: 792}},
		{"stream-g8", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryStream, IndexerQueryWideMinRows: -1, MaxBlocks: 1056}},
		{"lane", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLane, IndexerQueryWideMinRows: -1}},
		// The token-major kernel on its one wave of 2 blocks a
		// multiprocessor, and 1, 3, 4.
		{"tok", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok, IndexerQueryWideMinRows: -1}},
		{"tok-g1", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok, IndexerQueryWideMinRows: -1, IndexerQueryTokBlocksPerSM: 1}},
		{"tok-g3", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok, IndexerQueryWideMinRows: -1, IndexerQueryTokBlocksPerSM: 3}},
		{"tok-g4", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok, IndexerQueryWideMinRows: -1, IndexerQueryTokBlocksPerSM: 4}},
		// The lane kernel on 3 and 12 blocks a multiprocessor (its own
		// grid is 6, one wave: fewer, or the waves the driver places).
		{"lane-g3", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLane, IndexerQueryWideMinRows: -1, MaxBlocks: 396}},
		{"lane-g12", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryLane, IndexerQueryWideMinRows: -1, MaxBlocks: 1584}}}
	keyKernels := []kernels{{"split", cudatune.Knobs{IndexerKeys: cudatune.IndexerKeysSplit}},
		{"fused", cudatune.Knobs{IndexerKeys: cudatune.IndexerKeysFused}}}
	backends := map[string]*cuda.Backend{}
	for _, v := range append(append([]kernels(nil), queryKernels...), keyKernels...) {
		b, err := cuda.NewTuned(cuda.Options{}, v.k)
		require.NoError(bm, err)
		defer b.Close()
		require.NoError(bm, b.LoadCompressor())
		backends[v.name] = b
	}
	copyRate := measureCopyRate(bm, backends["late"])
	bm.Logf("device-to-device copy: %.0f GB/s", copyRate/1e9)
	ctx := context.Background()
	const reps = 20
	timeGraph := func(bm *testing.B, b *cuda.Backend, f func() error) float64 {
		g, err := b.Capture(func() error {
			for range reps {
				if err := f(); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(bm, err)
		defer g.Close()
		require.NoError(bm, g.Launch()) // warm
		bm.ResetTimer()
		var best time.Duration
		for i := 0; i < bm.N; i++ {
			d, err := b.Time(ctx, g.Launch)
			require.NoError(bm, err)
			if i == 0 || d < best {
				best = d
			}
		}
		return best.Seconds() / reps
	}
	type shape struct {
		name string
		reqs []metadata.Request
		seqs []mlatest.CompressSeqSpec
	}
	cached := map[uint64]int{}
	decode := func(n int) shape {
		s := shape{name: fmt.Sprintf("b%d-mtp3", n)}
		for i := range n {
			s.reqs = append(s.reqs, metadata.Request{Seq: uint64(i + 1), Phase: metadata.Generation, MTP: 3})
			cached[uint64(i+1)] = 1000 + 97*i
			s.seqs = append(s.seqs, mlatest.CompressSeqSpec{Start: 1000 + 97*i, Rows: 4})
		}
		return s
	}
	shapes := []shape{decode(32), decode(1)}
	for _, n := range []int{512, 1024, 2048, 4096, 16384} {
		name := fmt.Sprintf("prefill-%dK", n/1024)
		if n < 1024 {
			name = fmt.Sprintf("prefill-%d", n)
		}
		shapes = append(shapes, shape{name,
			[]metadata.Request{{Seq: 1, Phase: metadata.Context, NewTokens: n}}, []mlatest.CompressSeqSpec{{Start: 0, Rows: n}}})
	}
	for _, s := range shapes {
		// One case a shape for every kernel (16K rows are 256 MiB of input
		// to draw), built at the first kernel the -bench pattern selects.
		var c *mlatest.IndexerQueryCase
		for _, kv := range queryKernels {
			b := backends[kv.name]
			bm.Run("query/"+s.name+"/"+kv.name, func(bm *testing.B) {
				if c == nil {
					var err error
					c, err = mlatest.NewIndexerQueryCase(mlatest.Scenario{Name: s.name, Reqs: s.reqs, Cached: cached, Heads: 1, PageSize: 64}, 1)
					require.NoError(bm, err)
				}
				a, free, err := c.Upload(b)
				require.NoError(bm, err)
				defer free()
				launches := mla.Plan(c.M)
				per := timeGraph(bm, b, func() error { return mla.RunIndexerQuery(ctx, b, launches, a) })
				rows := c.M.Tokens
				moved := float64(rows) * mla.IndexerHeads * (mla.IndexerDim*2 + 4 + mla.IndexerEntryBytes + 2)
				bm.ReportMetric(per*1e6, "us/layer")
				floor := moved / 2 / copyRate
				bm.ReportMetric(floor*1e6, "us-copy-floor")
				bm.Logf("indexer query %s %s: %d rows, %.2f us a layer (floor %.2f us: %.0f bytes read and written)", s.name, kv.name, rows, per*1e6, floor*1e6, moved)
			})
		}
		for _, kv := range keyKernels {
			b := backends[kv.name]
			bm.Run("keys/"+s.name+"/"+kv.name, func(bm *testing.B) {
				cs, err := mlatest.NewCompressCase(mlatest.CompressScenario{Name: s.name, Ratio: 4, MaxDrafts: 3, PageSize: 64, APE: true,
					Indexer: true, Seqs: s.seqs}, 1)
				require.NoError(bm, err)
				a, free, err := cs.Upload(b)
				require.NoError(bm, err)
				defer free()
				per := timeGraph(bm, b, func() error { return b.CompressStep(ctx, a) })
				rows := 0
				for _, q := range s.seqs {
					rows += q.Rows
				}
				moved := float64(rows)*2*256*4*2 + float64(len(cs.Plan.Jobs))*mla.IndexerEntryBytes // KG read, ring written, entries
				bm.ReportMetric(per*1e6, "us/layer")
				floor := moved / 2 / copyRate
				bm.ReportMetric(floor*1e6, "us-copy-floor")
				bm.Logf("indexer keys %s %s: %d rows, %d entries, %.2f us a layer (floor %.2f us)", s.name, kv.name, rows, len(cs.Plan.Jobs), per*1e6, floor*1e6)
			})
		}
	}
}

// BenchmarkCUDAIndexerGEMMs measures, for the engine's integration, the
// indexer's GEMMs alone and fused with the layer's (DESIGN.md section 9):
// V4-Flash's wq_b (64 heads: N = 32768, K = 1024) and the indexer's wq_b
// (N = 8192) as two FP8 GEMMs against one [wq_b; indexer wq_b]; the
// ratio-4 compressor's projection (N = 2048, K = 4096), the indexer
// compressor's (N = 512) and weights_proj (N = 64) as three bf16 GEMMs
// against one. Rows 128 (b = 32 MTP 3) and 4096; back to back in CUDA
// graphs of 20 calls, the best of b.N replays.
func BenchmarkCUDAIndexerGEMMs(bm *testing.B) {
	if err := cuda.Available(); err != nil {
		bm.Skipf("CUDA backend unavailable: %v", err)
	}
	b, err := cuda.New(cuda.Options{})
	require.NoError(bm, err)
	defer b.Close()
	require.NoError(bm, b.InitGEMM())
	ctx := context.Background()
	const reps = 20
	timeGraph := func(bm *testing.B, fs ...func() error) float64 {
		g, err := b.Capture(func() error {
			for range reps {
				for _, f := range fs {
					if err := f(); err != nil {
						return err
					}
				}
			}
			return nil
		})
		require.NoError(bm, err)
		defer g.Close()
		require.NoError(bm, g.Launch())
		var best time.Duration
		for i := 0; i < max(bm.N, 3); i++ {
			d, err := b.Time(ctx, g.Launch)
			require.NoError(bm, err)
			if i == 0 || d < best {
				best = d
			}
		}
		return best.Seconds() / reps * 1e6
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, m := range []int{128, 4096} {
		bm.Run(fmt.Sprintf("fp8-wq_b/m%d", m), func(bm *testing.B) {
			x, err := mlatest.UploadActivations(b, mlatest.RandomActivations(r, m, 1024, m))
			require.NoError(bm, err)
			defer mlatest.FreeGEMMBuffers(b, &mla.FP8Weight{}, x)
			gemm := func(n int) (func() error, func()) {
				w, err := mlatest.UploadFP8Weight(b, mlatest.RandomFP8Weight(r, n, 1024))
				require.NoError(bm, err)
				y, err := b.Alloc(2 * m * n)
				require.NoError(bm, err)
				args := &mla.GEMMArgs{X: x, W: w, Y: y, YStride: n}
				require.NoError(bm, b.GEMM(ctx, args))
				return func() error { return b.GEMM(ctx, args) }, func() { _ = b.Free(y); mlatest.FreeGEMMBuffers(b, w, mla.FP8Activations{}) }
			}
			main, f1 := gemm(32768)
			defer f1()
			idx, f2 := gemm(8192)
			defer f2()
			fused, f3 := gemm(32768 + 8192)
			defer f3()
			alone, both, one := timeGraph(bm, main), timeGraph(bm, main, idx), timeGraph(bm, fused)
			bm.ReportMetric(both-alone, "us-added-two")
			bm.ReportMetric(one-alone, "us-added-fused")
			bm.Logf("m %d: wq_b %.1f us; + indexer wq_b as a second GEMM %.1f us (+%.1f); fused [wq_b; indexer wq_b] %.1f us (+%.1f)",
				m, alone, both, both-alone, one, one-alone)
		})
		bm.Run(fmt.Sprintf("bf16-projections/m%d", m), func(bm *testing.B) {
			gemm := func(n int) (func() error, func()) {
				c := mlatest.BF16GEMMCase{Rows: m, N: n, K: 4096}
				x, w, err := mlatest.UploadBF16Operands(b, mlatest.RandomBF16Operands(r, c), 0)
				require.NoError(bm, err)
				y, err := b.Alloc(mlatest.BF16GEMMYBytes(c))
				require.NoError(bm, err)
				args := mlatest.BF16GEMMArgs(c, x, w, y)
				require.NoError(bm, b.BF16GEMM(ctx, args))
				return func() error { return b.BF16GEMM(ctx, args) }, func() { _ = b.Free(x); _ = b.Free(w); _ = b.Free(y) }
			}
			comp, f1 := gemm(2048)
			defer f1()
			icomp, f2 := gemm(512)
			defer f2()
			wproj, f3 := gemm(64)
			defer f3()
			fused, f4 := gemm(2048 + 512 + 64)
			defer f4()
			alone, three, one := timeGraph(bm, comp), timeGraph(bm, comp, icomp, wproj), timeGraph(bm, fused)
			bm.ReportMetric(three-alone, "us-added-three")
			bm.ReportMetric(one-alone, "us-added-fused")
			bm.Logf("m %d: compressor projection %.1f us; + indexer compressor and weights_proj as two more GEMMs %.1f us (+%.1f); one fused GEMM %.1f us (+%.1f)",
				m, alone, three, three-alone, one, one-alone)
		})
	}
}
