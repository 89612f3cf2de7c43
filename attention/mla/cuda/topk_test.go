package cuda_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

func TestCUDATopKConformance(t *testing.T) { mlatest.TestTopK(t, backend(t)) }

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
// context for both models' index_topk, a 256-token prefill chunk at a
// cached offset of 8K, a mixed batch, and one sequence at the model's
// 1M-token limit (262,144 entries, pages shuffled).
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
		{Name: "mixed/flash", TopK: 512, PageSize: 64, PadRows: 5,
			Seqs: append([]mlatest.TopKSeqSpec{{Start: 3000, Rows: 100}, {Start: 0, Rows: 64}}, topkDecode(r, 8, 1, 6000)...)},
		{Name: "1M/pro", TopK: 1024, PageSize: 64, Seqs: []mlatest.TopKSeqSpec{{Start: mla.MaxTopKPositions - 2, Rows: 2}}},
		{Name: "1M-planted/flash", TopK: 512, PageSize: 64, Planted: true, Seqs: []mlatest.TopKSeqSpec{{Start: mla.MaxTopKPositions - 1, Rows: 1}}},
	}
	for _, s := range scenarios {
		t.Run(s.Name, func(t *testing.T) {
			if testing.Short() && s.Seqs[0].Start > 100_000 {
				t.Skip("-short: the 1M-token context")
			}
			c, err := mlatest.NewTopKCase(s, r.Uint64())
			require.NoError(t, err)
			got, err := c.Run(b)
			require.NoError(t, err)
			want, err := c.Run(host)
			require.NoError(t, err)
			require.NoError(t, c.Compare(got, want))
			require.NoError(t, c.CheckPlanted(got))
		})
	}
}

// TestCUDATopKGraph captures one selection in a CUDA graph and replays it
// after rewriting the plan, the queries and the weights in their buffers
// (the shape unchanged): each replay's indices equal the CPU backend's on
// that iteration's inputs.
func TestCUDATopKGraph(t *testing.T) {
	b := backend(t)
	require.NoError(t, b.LoadTopK())
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
				q := &c.Plan.Seqs[i]
				q.Start = max(0, q.Start+r.IntN(200)-150)
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

// BenchmarkCUDATopK times the selection of a decode batch, b=32 MTP 3
// (128 query rows), at 8K and 64K context a sequence, both models'
// index_topk: the device time per call (a layer's selection), the score
// kernel alone, and two floors: the indexer cache bytes the batch reads
// at the device-to-device copy rate measured here, and the score's
// multiply-adds at the H200's nominal dense int8 tensor-core rate
// (1979 TOPS, not measured).
func BenchmarkCUDATopK(bm *testing.B) {
	if err := cuda.Available(); err != nil {
		bm.Skipf("CUDA backend unavailable: %v", err)
	}
	b, err := cuda.New(cuda.Options{})
	require.NoError(bm, err)
	defer b.Close()
	require.NoError(bm, b.LoadTopK())
	copyRate := measureCopyRate(bm, b)
	bm.Logf("device-to-device copy: %.0f GB/s", copyRate/1e9)
	for _, ctxLen := range []int{8192, 65536} {
		for _, topk := range []int{512, 1024} {
			bm.Run(fmt.Sprintf("ctx=%dK/topk=%d", ctxLen/1024, topk), func(bm *testing.B) {
				r := rand.New(rand.NewPCG(uint64(ctxLen), uint64(topk)))
				s := mlatest.TopKScenario{Name: "bench", TopK: topk, PageSize: 64, Seqs: topkDecode(r, 32, 3, ctxLen)}
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
				defer func() {
					for _, buf := range bufs {
						_ = b.Free(buf)
					}
				}()
				plan, err := c.Plan.Encode(&c.Shape)
				require.NoError(bm, err)
				a := &mla.TopKArgs{TopKShape: c.Shape}
				a.Q, a.W, a.Cache, a.Plan = alloc(c.Q), alloc(c.W), alloc(c.Cache), alloc(plan)
				a.Scratch = alloc(make([]byte, 4*c.Shape.ScratchEntries))
				a.Out = alloc(make([]byte, 4*c.Shape.Rows*c.Shape.TopK))
				ctx := context.Background()
				entries, pairs := 0, 0
				for _, q := range c.Plan.Seqs {
					entries += mla.TopKVisible(q.Start + q.Rows - 1)
					for i := range q.Rows {
						pairs += mla.TopKVisible(q.Start + i)
					}
				}
				const reps = 20
				run := func() error {
					for range reps {
						if err := b.IndexerTopK(ctx, a); err != nil {
							return err
						}
					}
					return nil
				}
				require.NoError(bm, run()) // warm
				bm.ResetTimer()
				var best time.Duration
				for i := 0; i < bm.N; i++ {
					d, err := b.Time(ctx, run)
					require.NoError(bm, err)
					if i == 0 || d < best {
						best = d
					}
				}
				per := best.Seconds() / reps
				cacheFloor := float64(entries*mla.IndexerEntryBytes) / copyRate
				mmaFloor := float64(pairs) * 64 * 128 * 2 / 1979e12
				bm.ReportMetric(per*1e6, "us/layer")
				bm.ReportMetric(cacheFloor*1e6, "us-cache-floor")
				bm.ReportMetric(mmaFloor*1e6, "us-int8-floor")
				bm.Logf("ctx %d topk %d: %.1f us a layer (best of %d x %d calls); floors: cache %d bytes %.2f us, int8 MMA %.2f us (%d row-entry pairs)",
					ctxLen, topk, per*1e6, bm.N, reps, entries*mla.IndexerEntryBytes, cacheFloor*1e6, mmaFloor*1e6, pairs)
			})
		}
	}
}

// measureCopyRate times a 1 GiB device-to-device copy (the best of three
// after one warm-up) in bytes read a second.
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
	return n / best.Seconds()
}
