package replay

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// TestIndexerVerifyAndDump: on the hidden-state path the replay verifies
// the indexer of the ratio-4 layer (its GEMMs within the bounds, its
// query, head weights, cache and states byte for byte from the engine's
// GEMM outputs) and dumps its indexer_* tensors: the query and head
// weights the engine holds, the cache pages of the ratio-4 page ids the
// iteration wrote, the states of the batch, and the top-k selection's
// indices (the verify recomputes every index on the reference engine; the
// dump's are the engine's).
func TestIndexerVerifyAndDump(t *testing.T) {
	m := weights.TinyConfig() // layers 0, 4, 128 and an MTP layer
	m.IndexTopK = 4           // the drafts of sequence 1 at 23..26 see 6 entries: scored
	steps, err := trace.Parse(strings.NewReader(`
{"context":[{"seq":1,"tokens":23},{"seq":2,"tokens":6}]}
{"context":[{"seq":2,"tokens":5}],"generation":{"mtp":3,"seqs":[1],"accept":[2]}}
`))
	require.NoError(t, err)
	dir := t.TempDir()
	r, err := New(context.Background(), Options{
		Engine: engine.Config{
			Model: m, Cache: kvcache.Config{PageSize: 16, NumPages: 64, Window: 32},
			Backend: engine.BackendCPU, Layers: 3, MaxSeqs: 4, MaxTokens: 64, RopePositions: 256,
			Compressor:       engine.CompressorConfig{Ratio4Pages: 4, Ratio128Pages: 2, MaxDrafts: 3},
			Input:            engine.InputHidden,
			SyntheticWeights: &engine.SyntheticWeights{Seed: 5},
		},
		Seed: 9, Verify: true, DumpDir: dir, DumpLayer: func(l int) bool { return l >= 1 },
	})
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Run(context.Background(), steps, nil)
	require.NoError(t, err)
	e := r.Engine()
	require.True(t, e.RunsIndexer(1))
	raw, err := os.ReadFile(filepath.Join(dir, DumpFileName(1, 1)))
	require.NoError(t, err)
	tensors, _, err := safetensors.Read(raw)
	require.NoError(t, err)
	byName := map[string]safetensors.Tensor{}
	for _, tn := range tensors {
		byName[tn.Name] = tn
	}
	q, w := byName["indexer_query"], byName["indexer_weights"]
	tokens := 5 + 4
	require.Equal(t, []int{tokens, mla.IndexerHeads, mla.IndexerEntryBytes}, q.Shape)
	require.Equal(t, []int{tokens, mla.IndexerHeads}, w.Shape)
	require.NotEqual(t, make([]byte, len(q.Data)), q.Data)
	ids := readI32s(byName["comp_page_ids"].Data)
	require.NotEmpty(t, ids)
	cache, err := e.Debug().ReadIndexerCache(1)
	require.NoError(t, err)
	pb := engine.CompressedPageSize * mla.IndexerEntryBytes
	pages := byName["indexer_pages"].Data
	require.Len(t, pages, len(ids)*pb)
	for j, p := range ids {
		require.Equal(t, cache[int(p)*pb:(int(p)+1)*pb], pages[j*pb:(j+1)*pb], "page %d", p)
	}
	topk := byName["indexer_topk"]
	require.Equal(t, "I32", topk.DType)
	require.Equal(t, []int{tokens, 4}, topk.Shape)
	held := make([]byte, tokens*4*4)
	require.NoError(t, e.Backend().Read(held, e.IndexerTopK(1), 0))
	require.Equal(t, held, topk.Data)
	idx := readI32s(topk.Data)
	// Row 5 is sequence 1's token at 23 (after sequence 2's 5 context
	// rows): 6 visible entries, 4 selected; row 0 (sequence 2 at 6) sees 1.
	require.NotContains(t, idx[5*4:6*4], int32(-1))
	require.Equal(t, []int32{0, -1, -1, -1}, idx[0:4])
	st := byName["indexer_states"]
	require.Equal(t, []int{2, 8 + 3 + 1, 2, 256}, st.Shape)
	raw, err = os.ReadFile(filepath.Join(dir, DumpFileName(1, 2))) // the ratio-128 layer
	require.NoError(t, err)
	tensors, _, err = safetensors.Read(raw)
	require.NoError(t, err)
	for _, tn := range tensors {
		require.NotContains(t, tn.Name, "indexer", "a ratio-128 layer has no indexer")
	}
}

// TestIndexerFP8QueryFormat: with Compressor.IndexerQueryFormat fp8 the
// replay of TestIndexerVerifyAndDump's trace (its first two layers)
// verifies (query, head weights, cache, states), the engine runs no top-k selection (no indices buffer,
// no indexer_topk tensor), and the dump's indexer_query is [T, 64, 128]
// e4m3 bytes with float32 indexer_weights. Against the same run in the
// MXFP4 format: each fp8 head weight is the MXFP4 one times a power of two
// s (to bf16 rounding), and the fp8 values times s approximate the MXFP4
// values (within MXFP4's own rounding of its block): the scale is folded,
// and both formats quantize the same rotated query.
func TestIndexerFP8QueryFormat(t *testing.T) {
	m := weights.TinyConfig()
	m.IndexTopK = 4
	steps, err := trace.Parse(strings.NewReader(`
{"context":[{"seq":1,"tokens":23},{"seq":2,"tokens":6}]}
{"context":[{"seq":2,"tokens":5}],"generation":{"mtp":3,"seqs":[1],"accept":[2]}}
`))
	require.NoError(t, err)
	dump := map[mla.IndexerQueryFormat]map[string]safetensors.Tensor{}
	for _, f := range []mla.IndexerQueryFormat{mla.IndexerQueryMXFP4, mla.IndexerQueryFP8} {
		dir := t.TempDir()
		r, err := New(context.Background(), Options{
			Engine: engine.Config{
				Model: m, Cache: kvcache.Config{PageSize: 16, NumPages: 64, Window: 32},
				Backend: engine.BackendCPU, Layers: 2, MaxSeqs: 4, MaxTokens: 64, RopePositions: 256,
				Compressor:       engine.CompressorConfig{Ratio4Pages: 4, MaxDrafts: 3, IndexerQueryFormat: f},
				Input:            engine.InputHidden,
				SyntheticWeights: &engine.SyntheticWeights{Seed: 5},
			},
			// The MXFP4 run's verify is TestIndexerVerifyAndDump's.
			Seed: 9, Verify: f == mla.IndexerQueryFP8, DumpDir: dir, DumpLayer: func(l int) bool { return l == 1 },
		})
		require.NoError(t, err, "%v", f)
		_, err = r.Run(context.Background(), steps, nil)
		require.NoError(t, err, "%v", f)
		require.True(t, r.Engine().RunsIndexer(1))
		require.Equal(t, f == mla.IndexerQueryMXFP4, r.Engine().IndexerTopK(1) != nil, "%v", f)
		raw, err := os.ReadFile(filepath.Join(dir, DumpFileName(1, 1)))
		require.NoError(t, err)
		tensors, _, err := safetensors.Read(raw)
		require.NoError(t, err)
		dump[f] = map[string]safetensors.Tensor{}
		for _, tn := range tensors {
			dump[f][tn.Name] = tn
		}
		require.NoError(t, r.Close())
	}
	const tokens = 5 + 4
	fq, fw := dump[mla.IndexerQueryFP8]["indexer_query"], dump[mla.IndexerQueryFP8]["indexer_weights"]
	require.Equal(t, []int{tokens, mla.IndexerHeads, 128}, fq.Shape)
	require.Equal(t, "F32", fw.DType)
	require.Equal(t, []int{tokens, mla.IndexerHeads}, fw.Shape)
	require.NotContains(t, dump[mla.IndexerQueryFP8], "indexer_topk")
	require.Contains(t, dump[mla.IndexerQueryMXFP4], "indexer_topk")
	require.Equal(t, dump[mla.IndexerQueryMXFP4]["indexer_pages"].Data, dump[mla.IndexerQueryFP8]["indexer_pages"].Data, "the keys do not depend on the query's format")
	mq, mw := dump[mla.IndexerQueryMXFP4]["indexer_query"].Data, dump[mla.IndexerQueryMXFP4]["indexer_weights"].Data
	ws := numerics.F32sFromBytes(fw.Data)
	checked := 0
	for row := range tokens * mla.IndexerHeads {
		wm := numerics.F32FromBF16(binary.LittleEndian.Uint16(mw[2*row:]))
		if wm == 0 || math.IsInf(float64(wm), 0) || math.IsNaN(float64(wm)) {
			continue
		}
		// s = 2^round(log2(w' / wm)); w' / s rounds to wm in bf16.
		k := int(math.Round(math.Log2(float64(ws[row]) / float64(wm))))
		s := math.Ldexp(1, k)
		require.Equal(t, wm, numerics.RoundBF16(float32(float64(ws[row])/s)), "row %d: fp8 weight %g, mxfp4 %g", row, ws[row], wm)
		mx := make([]float32, 128)
		numerics.DequantizeMXFP4(mx, mq[row*68:(row+1)*68])
		for b := range 4 {
			var amax float64
			for _, v := range mx[32*b : 32*b+32] {
				amax = max(amax, math.Abs(float64(v)))
			}
			for i := 32 * b; i < 32*b+32; i++ {
				v := float64(numerics.F32FromE4M3(fq.Data[row*128+i])) * s
				// MXFP4 is off by at most a quarter of its block's
				// largest value (e2m1's coarsest step at 4..6 is 2),
				// e4m3 by 1/16 of the value.
				require.InDelta(t, float64(mx[i]), v, amax/3+math.Abs(v)/16+1e-30, "row %d value %d", row, i)
			}
		}
		checked++
	}
	require.Greater(t, checked, tokens*mla.IndexerHeads/2)
}
