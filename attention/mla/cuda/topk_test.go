package cuda_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

// topkKernels are the score kernels (and select kernels, after a "+"),
// each test run with every one (the shared backend is left on the
// default): the sweep and global-memory ways of each select through its
// small shared memory ("s", "g").
var topkKernels = []string{"dp4a", "mma4x", "mma4x+select4n", "mma4x+select4ns", "mma4x+select4ng", "mma4x+select5e", "mma4x+select5es"}

func TestCUDATopKConformance(t *testing.T) {
	b := backend(t)
	for _, k := range topkKernels {
		t.Run(k, func(t *testing.T) {
			b.SetTopKScore(k)
			defer b.SetTopKScore("default")
			mlatest.TestTopK(t, b)
		})
	}
}

// topkDecode is a decode batch of seqs sequences of 1+mtp tokens, each at
// a random position near ctx.
func topkDecode(r *rand.Rand, seqs, mtp, ctx int) []mlatest.TopKSeqSpec {
	out := make([]mlatest.TopKSeqSpec, seqs)
	for i := range out {
		out[i] = mlatest.TopKSeqSpec{Start: max(0, min(mla.MaxTopKPositions-1-mtp, ctx-r.IntN(300))), Rows: 1 + mtp}
	}
	return out
}

// TestCUDATopKLarge: batches the conformance suite's small ones do not
// reach, every index against the CPU backend: decode b=32 MTP 3 at 8K
// context for both models' index_topk (and with the narrow scales of
// rotated vectors), at 64K (several tiles a block), a 256-token prefill
// chunk at a cached offset of 8K, a 1024-token one at 2K, a mixed batch, 300 sequences of one
// token, and one sequence at the model's 1M-token limit (262,144 entries,
// pages shuffled).
func TestCUDATopKLarge(t *testing.T) {
	b := backend(t)
	host := cpu.New(0)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	scenarios := []mlatest.TopKScenario{
		{Name: "decode-b32-mtp3-8k/flash", TopK: 512, PageSize: 64, Seqs: topkDecode(r, 32, 3, 8192), PadRows: 3},
		{Name: "decode-b32-mtp3-8k/pro", TopK: 1024, PageSize: 64, Seqs: topkDecode(r, 32, 3, 8192)},
		{Name: "prefill-256-at-8k/pro", TopK: 1024, PageSize: 64, Seqs: []mlatest.TopKSeqSpec{{Start: 8000 + r.IntN(100), Rows: 256}}},
		// Enough rows of few keys for Knobs.TopKSelectNarrowAt: the
		// default select of a prefill chunk.
		{Name: "prefill-1024-at-2k/flash", TopK: 512, PageSize: 64, Seqs: []mlatest.TopKSeqSpec{{Start: 2100 + r.IntN(100), Rows: 1024}}},
		{Name: "mixed/flash", TopK: 512, PageSize: 64, PadRows: 5,
			Seqs: append([]mlatest.TopKSeqSpec{{Start: 3000, Rows: 100}, {Start: 0, Rows: 64}}, topkDecode(r, 8, 1, 6000)...)},
		// Rows of 8K and 64K context in one launch.
		{Name: "decode-8k-and-64k/flash", TopK: 512, PageSize: 64, Seqs: append(topkDecode(r, 4, 3, 8192), topkDecode(r, 4, 3, 65536)...)},
		{Name: "decode-b32-mtp3-8k-narrow/flash", TopK: 512, PageSize: 64, Keys: mlatest.KeysNarrow, Seqs: topkDecode(r, 32, 3, 8192)},
		// At 64K each block of the four-row kernels scores several tiles
		// (8K and the small cases take one a block): the tile pipeline.
		{Name: "decode-b32-mtp3-64k/flash", TopK: 512, PageSize: 64, Seqs: topkDecode(r, 32, 3, 65536)},
		{Name: "decode-b32-mtp3-64k-narrow/pro", TopK: 1024, PageSize: 64, Keys: mlatest.KeysNarrow, Seqs: topkDecode(r, 32, 3, 65536)},
		// More sequences than topk_select4n and 5 copy to shared memory (its
		// plan's MaxSeqs 301 > 256): the rows resolved in global memory.
		{Name: "decode-b300/flash", TopK: 512, PageSize: 64, Seqs: topkDecode(r, 300, 0, 2400)},
		{Name: "1M/pro", TopK: 1024, PageSize: 64, Seqs: []mlatest.TopKSeqSpec{{Start: mla.MaxTopKPositions - 2, Rows: 2}}},
		{Name: "1M-planted/flash", TopK: 512, PageSize: 64, Planted: true, Seqs: []mlatest.TopKSeqSpec{{Start: mla.MaxTopKPositions - 1, Rows: 1}}},
	}
	defer b.SetTopKScore("default")
	for _, s := range scenarios {
		t.Run(s.Name, func(t *testing.T) {
			if testing.Short() && s.Seqs[0].Start > 100_000 {
				t.Skip("-short: the 1M-token context")
			}
			c, err := mlatest.NewTopKCase(s, r.Uint64())
			require.NoError(t, err)
			want, err := c.Run(host)
			require.NoError(t, err)
			for _, k := range topkKernels {
				b.SetTopKScore(k)
				got, err := c.Run(b)
				require.NoError(t, err)
				require.NoError(t, c.Compare(got, want), "score kernel %s", k)
				require.NoError(t, c.CheckPlanted(got), "score kernel %s", k)
			}
		})
	}
}

// TestCUDATopKGraph captures one selection in a CUDA graph and replays it
// after rewriting the plan, the queries and the weights in their buffers
// (the shape unchanged), with each score kernel: each replay's indices
// equal the CPU backend's on that iteration's inputs.
func TestCUDATopKGraph(t *testing.T) {
	b := backend(t)
	require.NoError(t, b.LoadTopK())
	for _, k := range topkKernels {
		t.Run(k, func(t *testing.T) {
			b.SetTopKScore(k)
			defer b.SetTopKScore("default")
			testTopKGraph(t, b)
		})
	}
}

// testTopKGraph is TestCUDATopKGraph with the backend's score kernel.
func testTopKGraph(t *testing.T, b *cuda.Backend) {
	host := cpu.New(0)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	s := mlatest.TopKScenario{Name: "graph", TopK: 512, PageSize: 64, Seqs: topkDecode(r, 8, 3, 5000), PadRows: 2}
	c, err := mlatest.NewTopKCase(s, r.Uint64())
	require.NoError(t, err)
	c.Shape.ScratchEntries += 4 * 8 * 2048 // room for the later plans
	alloc := func(data []byte) mla.Buffer {
		buf, err := b.Alloc(len(data))
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Free(buf) })
		require.NoError(t, b.Write(buf, 0, data))
		return buf
	}
	a := &mla.TopKArgs{TopKShape: c.Shape}
	a.Q, a.W, a.Cache = alloc(c.Q), alloc(c.W), alloc(c.Cache)
	a.Plan = alloc(make([]byte, c.Shape.PlanBytes()))
	a.Scratch = alloc(make([]byte, 4*c.Shape.ScratchEntries))
	a.Out = alloc(make([]byte, 4*c.Shape.Rows*c.Shape.TopK))
	write := func() {
		plan, err := c.Plan.Encode(&c.Shape)
		require.NoError(t, err)
		require.NoError(t, b.Write(a.Plan, 0, plan))
		require.NoError(t, b.Write(a.Q, 0, c.Q))
		require.NoError(t, b.Write(a.W, 0, c.W))
		require.NoError(t, b.Fill(a.Out, 0, a.Out.Len(), 0x5A))
	}
	write()
	ctx := context.Background()
	g, err := b.Capture(func() error { return b.IndexerTopK(ctx, a) })
	require.NoError(t, err)
	defer g.Close()
	for it := range 4 {
		if it > 0 {
			// The next iteration: positions move (some rows cross pages),
			// fresh queries and weights.
			for i := range c.Plan.Seqs {
				// Within the pages of the sequence's table: its last
				// token sees at most len(Table)*PageSize entries.
				q := &c.Plan.Seqs[i]
				last := len(q.Table)*s.PageSize*4 - q.Rows
				q.Start = max(0, min(last, q.Start+r.IntN(200)-150))
			}
			for i := range c.Q {
				c.Q[i] = byte(r.Uint32())
			}
			for i := 0; i < len(c.W); i += 2 {
				binary.LittleEndian.PutUint16(c.W[i:], uint16(0x3C00+r.IntN(0x400))|uint16(r.IntN(2))<<15)
			}
			for i := 64; i < len(c.Q); i += mla.IndexerEntryBytes {
				for j := range 4 {
					c.Q[i+j] = byte(124 + r.IntN(7))
				}
			}
		}
		write()
		require.NoError(t, g.Launch())
		require.NoError(t, b.Synchronize(ctx))
		raw := make([]byte, a.Out.Len())
		require.NoError(t, b.Read(raw, a.Out, 0))
		got := make([]int32, len(raw)/4)
		for i := range got {
			got[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		want, err := c.Run(host)
		require.NoError(t, err)
		require.NoError(t, c.Compare(got, want), "replay %d", it)
	}
}

// BenchmarkCUDATopK times the selection of a layer: decode b=32 MTP 3
// (128 query rows) at 8K, 64K, 128K and 1M context a sequence (scale
// bytes drawn in [124, 130], and V4-Flash's with the narrow scales of
// rotated vectors), prefill from position 0 at 16K and 4K and a 1K chunk
// at 3K, V4-Flash's and V4-Pro's index_topk, each score kernel (the dp4a
// one at 8K and 64K only; "+select4n", "+select5e" name a select kernel, a
// name without "+" the default select, cudatune's rule included): the
// device time per call, the score and
// select kernels alone, and two floors: the indexer cache bytes the batch
// reads at the device-to-device copy rate measured here, and the score's
// multiply-adds at the H200's nominal dense int8 tensor-core rate (1979
// TOPS, not measured).
func BenchmarkCUDATopK(bm *testing.B) {
	if err := cuda.Available(); err != nil {
		bm.Skipf("CUDA backend unavailable: %v", err)
	}
	b, err := cuda.New(cuda.Options{})
	require.NoError(bm, err)
	defer b.Close()
	require.NoError(bm, b.LoadTopK())
	copyRate := measureCopyRate(bm, b)
	bm.Logf("device-to-device copy: %.0f GB/s moved (read and written)", copyRate/1e9)
	type benchCase struct {
		name    string
		topk    int
		kernels []string
		seqs    func(r *rand.Rand) []mlatest.TopKSeqSpec
		keys    mlatest.TopKKeys
	}
	var cases []benchCase
	for _, ctxLen := range []int{8 << 10, 64 << 10, 128 << 10, 1 << 20} {
		kernels := []string{"dp4a", "mma4x", "mma4x+select4n"}
		if ctxLen > 64<<10 {
			kernels = []string{"mma4x", "mma4x+select4n"}
		}
		for _, topk := range []int{512, 1024} {
			cases = append(cases, benchCase{fmt.Sprintf("decode-b32-mtp3/ctx=%dK/topk=%d", ctxLen>>10, topk), topk, kernels,
				func(r *rand.Rand) []mlatest.TopKSeqSpec { return topkDecode(r, 32, 3, ctxLen) }, mlatest.KeysRandom})
		}
		// The scales of rotated vectors (each row's four within 2), which
		// topk_score_mma4's exact path takes.
		cases = append(cases, benchCase{fmt.Sprintf("decode-b32-mtp3-narrow/ctx=%dK/topk=512", ctxLen>>10), 512, []string{"mma4x", "mma4x+select4n"},
			func(r *rand.Rand) []mlatest.TopKSeqSpec { return topkDecode(r, 32, 3, ctxLen) }, mlatest.KeysNarrow})
	}
	// Prefill from 0 and a chunk at a cached offset: launches of 16,384,
	// 4,096 and 1,024 rows of at most 4,096 keys (Knobs.TopKSelectNarrowAt's
	// threshold between them and decode's 128).
	for _, pc := range []struct {
		name        string
		start, rows int
	}{{"prefill=16K", 0, 16 << 10}, {"prefill=4K", 0, 4 << 10}, {"chunk=1K-at-3K", 3 << 10, 1 << 10}} {
		for _, topk := range []int{512, 1024} {
			cases = append(cases, benchCase{fmt.Sprintf("%s/topk=%d", pc.name, topk), topk, []string{"mma4x", "mma4x+select5e", "mma4x+select4n"},
				func(*rand.Rand) []mlatest.TopKSeqSpec { return []mlatest.TopKSeqSpec{{Start: pc.start, Rows: pc.rows}} }, mlatest.KeysRandom})
		}
	}
	// Prefill 16K in an engine sized for the 1M-token context (a block
	// table of 4,097 pages of 64 entries: 262,208 keys a row), the select
	// sized by the table, then by the plan's longest row (TopKArgs.MaxRowKeys,
	// as the engine's eager iterations pass it).
	type tableCase struct {
		stride  int
		rowKeys bool
	}
	tables := map[string]tableCase{}
	for _, hint := range []bool{false, true} {
		name := fmt.Sprintf("prefill=16K-table=1M/rowkeys=%t/topk=1024", hint)
		tables[name] = tableCase{(mla.MaxTopKPositions/mla.TopKRatio+63)/64 + 1, hint}
		cases = append(cases, benchCase{name, 1024, []string{"mma4x"},
			func(*rand.Rand) []mlatest.TopKSeqSpec { return []mlatest.TopKSeqSpec{{Start: 0, Rows: 16 << 10}} }, mlatest.KeysRandom})
	}
	// Decode b=32 MTP 3 at 8K in that table, as a graph captures it (no
	// MaxRowKeys).
	name := "decode-b32-mtp3-table=1M/ctx=8K/topk=512"
	tables[name] = tableCase{(mla.MaxTopKPositions/mla.TopKRatio+63)/64 + 1, false}
	cases = append(cases, benchCase{name, 512, []string{"mma4x"},
		func(r *rand.Rand) []mlatest.TopKSeqSpec { return topkDecode(r, 32, 3, 8192) }, mlatest.KeysRandom})
	ctx := context.Background()
	for _, bc := range cases {
		// The case is drawn inside its sub-benchmark, so that -test.bench
		// skips building the ones it does not run.
		bm.Run(bc.name, func(bm *testing.B) {
			r := rand.New(rand.NewPCG(uint64(len(bc.name)), uint64(bc.topk)))
			s := mlatest.TopKScenario{Name: bc.name, TopK: bc.topk, PageSize: 64, Seqs: bc.seqs(r), Keys: bc.keys}
			c, err := mlatest.NewTopKCase(s, 7)
			require.NoError(bm, err)
			var bufs []mla.Buffer
			alloc := func(data []byte) mla.Buffer {
				buf, err := b.Alloc(len(data))
				require.NoError(bm, err)
				bufs = append(bufs, buf)
				require.NoError(bm, b.Write(buf, 0, data))
				return buf
			}
			tc, wide := tables[bc.name]
			if wide {
				c.Shape.PageStride = tc.stride
			}
			plan, err := c.Plan.Encode(&c.Shape)
			require.NoError(bm, err)
			a := &mla.TopKArgs{TopKShape: c.Shape}
			if tc.rowKeys {
				a.MaxRowKeys = c.Plan.MaxRowKeys(c.Shape.TopK)
			}
			a.Q, a.W, a.Cache, a.Plan = alloc(c.Q), alloc(c.W), alloc(c.Cache), alloc(plan)
			a.Scratch = alloc(make([]byte, 4*c.Shape.ScratchEntries))
			a.Out = alloc(make([]byte, 4*c.Shape.Rows*c.Shape.TopK))
			entries, pairs := 0, 0
			for _, q := range c.Plan.Seqs {
				entries += mla.TopKVisible(q.Start + q.Rows - 1)
				for i := range q.Rows {
					pairs += mla.TopKVisible(q.Start + i)
				}
			}
			cacheFloor := float64(entries*mla.IndexerEntryBytes) / copyRate
			mmaFloor := float64(pairs) * 64 * 128 * 2 / 1979e12
			for _, kernel := range bc.kernels {
				bm.Run(kernel, func(bm *testing.B) {
					score, sel, _ := strings.Cut(kernel, "+")
					// (The parent benchmark's log is not printed.)
					bm.Logf("kernel %s: %s", score, b.TopKKernelResources(score))
					if sel != "" {
						bm.Logf("kernel %s: %s", sel, b.TopKKernelResources(sel))
					}
					b.SetTopKScore(kernel)
					defer b.SetTopKScore("default")
					const reps = 10
					timed := func(f func() error) float64 {
						d, err := b.Time(ctx, func() error {
							for range reps {
								if err := f(); err != nil {
									return err
								}
							}
							return nil
						})
						require.NoError(bm, err)
						return d.Seconds() / reps
					}
					whole := func() error { return b.IndexerTopK(ctx, a) }
					timed(whole) // warm
					bm.ResetTimer()
					best := 0.0
					for i := 0; i < bm.N; i++ {
						if d := timed(whole); i == 0 || d < best {
							best = d
						}
					}
					bm.StopTimer()
					scoreT := timed(func() error { return b.TopKStage(ctx, a, true) })
					selectT := timed(func() error { return b.TopKStage(ctx, a, false) })
					bm.ReportMetric(best*1e6, "us/layer")
					bm.ReportMetric(selectT*1e6, "us-select")
					bm.ReportMetric(cacheFloor*1e6, "us-cache-floor")
					bm.ReportMetric(mmaFloor*1e6, "us-int8-floor")
					bm.Logf("%s %s: %.1f us a layer (score alone %.1f, select alone %.1f); floors: cache %d bytes %.2f us, int8 %.2f us (%d row-entry pairs)",
						bc.name, kernel, best*1e6, scoreT*1e6, selectT*1e6, entries*mla.IndexerEntryBytes, cacheFloor*1e6, mmaFloor*1e6, pairs)
				})
			}
			for _, buf := range bufs {
				_ = b.Free(buf)
			}
		})
	}
}

// measureCopyRate times a 1 GiB device-to-device copy (the best of three
// after one warm-up) in bytes moved a second: a copy reads and writes each
// byte, so a kernel that only reads its bytes may read them at this rate.
func measureCopyRate(bm *testing.B, b *cuda.Backend) float64 {
	const n = 1 << 30
	src, err := b.Alloc(n)
	require.NoError(bm, err)
	defer b.Free(src)
	dst, err := b.Alloc(n)
	require.NoError(bm, err)
	defer b.Free(dst)
	var best time.Duration
	for i := range 4 {
		require.NoError(bm, b.Synchronize(context.Background()))
		start := time.Now()
		require.NoError(bm, b.Context().DtoD(dst.(*cuda.Buffer).Ptr(), src.(*cuda.Buffer).Ptr(), n))
		require.NoError(bm, b.Context().Synchronize())
		if d := time.Since(start); i > 0 && (best == 0 || d < best) {
			best = d
		}
	}
	return 2 * n / best.Seconds()
}
