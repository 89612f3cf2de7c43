package engine_test

import (
	"context"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/metadata"
)

// topkConfig is indexerConfig with index_topk 8, so that a few dozen
// tokens already see more entries than the selection keeps.
func topkConfig(seed uint64) engine.Config {
	cfg := indexerConfig(seed)
	cfg.Model.IndexTopK = 8
	return cfg
}

// recomputeTopK selects, independently of the engine's buffers, what the
// ratio-4 layer's indices must be after its RunLayer: the CPU backend's
// selection on fresh memory, from the debug reads of this iteration's
// query, head weights, the layer's indexer cache and the ratio-4 block
// tables, with a plan built from the metadata's rows.
func recomputeTopK(t *testing.T, e *engine.Engine, it *engine.Iteration, layer int) []int32 {
	t.Helper()
	d := it.Debug()
	q, w, err := d.ReadIndexerQuery()
	require.NoError(t, err)
	cache, err := e.Debug().ReadIndexerCache(layer)
	require.NoError(t, err)
	tables, err := d.CompressedBlockTables(4)
	require.NoError(t, err)
	m := it.Metadata()
	var plan mla.TopKPlan
	stride := 1
	for b := range m.NumSeqs {
		plan.Seqs = append(plan.Seqs, mla.TopKPlanSeq{Row: int(m.CuQ[b]), Rows: int(m.CuQ[b+1] - m.CuQ[b]), Start: int(m.KVLen[b]) - int(m.CuQ[b+1]-m.CuQ[b]), Table: tables[b]})
		stride = max(stride, len(tables[b]))
	}
	k := e.IndexTopK()
	shape := mla.TopKShape{TopK: k, Rows: it.Tokens(), MaxSeqs: m.NumSeqs, PageStride: stride, PageSize: engine.CompressedPageSize,
		NumPages: len(cache) / mla.IndexerPageBytes(engine.CompressedPageSize), ScratchEntries: int(plan.ScratchEntries(k))}
	raw, err := plan.Encode(&shape)
	require.NoError(t, err)
	b := cpu.New(1)
	a := &mla.TopKArgs{TopKShape: shape}
	out := make([]byte, 4*shape.Rows*k)
	for i := range out {
		out[i] = 0x5A // poisoned
	}
	for _, u := range []struct {
		buf  *mla.Buffer
		data []byte
	}{{&a.Q, q}, {&a.W, w}, {&a.Cache, cache}, {&a.Plan, raw}, {&a.Scratch, make([]byte, 4*max(1, shape.ScratchEntries))}, {&a.Out, out}} {
		*u.buf, err = b.Alloc(len(u.data))
		require.NoError(t, err)
		require.NoError(t, b.Write(*u.buf, 0, u.data))
	}
	require.NoError(t, b.IndexerTopK(context.Background(), a))
	require.NoError(t, b.Read(out, a.Out, 0))
	got := make([]int32, len(out)/4)
	for i := range got {
		got[i] = int32(binary.LittleEndian.Uint32(out[4*i:]))
	}
	return got
}

// TestIndexerTopK runs chunked prefill of two sequences, an MTP step whose
// rejected drafts crossed a ratio-4 boundary (Accept), the step that
// redoes those positions, and decode; after each iteration's ratio-4 layer
// the engine's indices equal, element for element, a selection recomputed
// from the debug reads, and the hand-off names the same buffer. On the
// graph path the generation-only iterations replay the layer's captured
// graph (the selection with it, over the padded rows: those are all -1).
func TestIndexerTopK(t *testing.T) {
	for _, graphs := range []bool{false, true} {
		name := "eager"
		if graphs {
			name = "graphs"
		}
		t.Run(name, func(t *testing.T) { testIndexerTopK(t, graphs) })
	}
}

func testIndexerTopK(t *testing.T, graphs bool) {
	seed := testSeed(t)
	cfg := topkConfig(seed)
	var e *engine.Engine
	if graphs {
		cfg.Backend, cfg.Eager = "test-graphs", false
		testGraphsOn.Store(true)
		e = newEngine(t, cfg)
		testGraphsOn.Store(false)
		t.Cleanup(func() { *testGraphs = graphCPU{Backend: testGraphs.Backend} })
	} else {
		e = newEngine(t, cfg)
	}
	const layer = 2
	require.True(t, e.RunsIndexer(layer))
	k := e.IndexTopK()
	require.Equal(t, cfg.Model.IndexTopK, k)
	h := e.Handoff()
	require.Equal(t, "indices", h.Indices[layer].Name)
	require.Equal(t, e.IndexerTopK(layer), h.Indices[layer].Buffer)
	require.Equal(t, []int{cfg.MaxTokens, k}, h.Indices[layer].Shape)
	for l := range e.Layers() {
		if l != layer {
			require.Nil(t, h.Indices[l].Buffer, "layer %d", l)
			require.Nil(t, e.IndexerTopK(l))
		}
	}
	ctx := context.Background()
	steps := []struct {
		name     string
		reqs     []metadata.Request
		accepted map[uint64]int
	}{
		{"prefill chunks", []metadata.Request{ctxReq(1, 45), ctxReq(2, 21)}, nil},
		{"prefill after a cached chunk", []metadata.Request{ctxReq(1, 25), ctxReq(2, 16)}, nil},
		// Sequence 1 at 70: drafts 71, 72, 73; 71 = 4*17+3 emits entry 17,
		// rejected with them.
		{"MTP, drafts rejected", []metadata.Request{genReq(1, 3), genReq(2, 3)}, map[uint64]int{1: 1, 2: 4}},
		{"MTP over the rejected positions", []metadata.Request{genReq(1, 2), genReq(2, 2)}, map[uint64]int{1: 2}},
		{"decode", []metadata.Request{genReq(1, 0), genReq(2, 0)}, nil},
		{"mixed", []metadata.Request{ctxReq(3, 50), genReq(1, 1), genReq(2, 1)}, nil},
	}
	scored, padded, replayed, padRows, hinted := 0, 0, 0, 0, 0
	for _, s := range steps {
		it, err := e.Begin(ctx, s.reqs)
		require.NoError(t, err, s.name)
		for l := range e.Layers() {
			require.NoError(t, it.SetHidden(l, indexerHidden(seed, e, it, l)))
			require.NoError(t, it.RunLayer(ctx, l))
			if l != layer {
				continue
			}
			got, err := it.Debug().ReadIndexerTopK(layer)
			require.NoError(t, err)
			want := recomputeTopK(t, e, it, layer)
			require.Len(t, got, it.Tokens()*k)
			for i := range want {
				require.Equal(t, want[i], got[i], "%s: row %d slot %d", s.name, i/k, i%k)
			}
			m := it.Metadata()
			if graphs {
				// The select's size hint: the plan's own bound in an eager
				// iteration, none in a graph's (its capture serves longer
				// contexts later).
				want := 0
				if !it.Debug().GraphPath() {
					for b := range m.NumSeqs {
						want = max(want, mla.TopKStride(int(m.Cached[b]), int(m.QLen[b]), k))
					}
					if want > 0 {
						hinted++
					}
				}
				require.NotEmpty(t, testGraphs.rowKeys, s.name)
				require.Equal(t, want, testGraphs.rowKeys[len(testGraphs.rowKeys)-1], "%s: TopKArgs.MaxRowKeys", s.name)
			}
			if it.Debug().GraphPath() {
				replayed++
				padRows += it.Rows() - it.Tokens()
				all := make([]byte, 4*it.Rows()*k)
				require.NoError(t, e.Backend().Read(all, e.IndexerTopK(layer), 0))
				for i := 4 * it.Tokens() * k; i < len(all); i++ {
					require.Equal(t, byte(0xFF), all[i], "%s: padding row %d", s.name, i/(4*k))
				}
			}
			for r := range it.Tokens() {
				_, pos, _ := m.Row(r)
				row := got[r*k : (r+1)*k]
				n := min(k, mla.TopKVisible(pos))
				require.False(t, slices.Contains(row[:n], -1), "%s: row %d (position %d) selects %d entries", s.name, r, pos, n)
				for j := n; j < k; j++ {
					require.Equal(t, int32(-1), row[j], "%s: row %d", s.name, r)
				}
				require.True(t, slices.IsSorted(row[:n]), "%s: row %d", s.name, r)
				if n > 0 && row[n-1] >= int32(mla.TopKVisible(pos)) {
					t.Fatalf("%s: row %d (position %d) selects entry %d, it sees %d", s.name, r, pos, row[n-1], mla.TopKVisible(pos))
				}
				if mla.TopKVisible(pos) > k {
					scored++
				} else if n < k {
					padded++
				}
			}
		}
		if s.accepted != nil {
			require.NoError(t, it.Accept(s.accepted))
		}
		require.NoError(t, it.End(ctx))
	}
	require.Positive(t, scored, "no row saw more entries than index_topk")
	require.Positive(t, padded, "no row saw fewer entries than index_topk")
	if graphs {
		require.Positive(t, replayed, "no iteration replayed a graph")
		require.Positive(t, padRows, "no graph iteration had padding rows")
		require.Positive(t, testGraphs.launches, "no graph replayed")
		require.Positive(t, hinted, "no eager iteration had a row that scores")
	}
}

// TestIndexerTopKScratchRefusal: a batch whose scores do not fit
// Compressor.IndexerTopKScratch is refused by Begin with mla.ErrTopKScratch,
// nothing changed, and the engine runs the next batch that fits.
func TestIndexerTopKScratchRefusal(t *testing.T) {
	seed := testSeed(t)
	cfg := topkConfig(seed)
	// Positions [32, 40) see up to 10 entries: 8 rows of 12 keys.
	cfg.Compressor.IndexerTopKScratch = 100
	e := newEngine(t, cfg)
	ctx := context.Background()
	run := func(reqs ...metadata.Request) {
		it, err := e.Begin(ctx, reqs)
		require.NoError(t, err)
		for l := range e.Layers() {
			require.NoError(t, it.SetHidden(l, indexerHidden(seed, e, it, l)))
			require.NoError(t, it.RunLayer(ctx, l))
		}
		require.NoError(t, it.End(ctx))
	}
	run(ctxReq(1, 32)) // at most 8 visible: no scores
	before := takeSnapshot(t, e, 1)
	_, err := e.Begin(ctx, []metadata.Request{ctxReq(1, 9)}) // 9 rows of 12 keys
	require.ErrorIs(t, err, mla.ErrTopKScratch)
	_, err = e.Begin(ctx, []metadata.Request{ctxReq(1, 4), ctxReq(2, 40)}) // 4*12 + 40*12
	require.ErrorIs(t, err, mla.ErrTopKScratch)
	requireSameSnapshot(t, before, takeSnapshot(t, e, 1))
	run(ctxReq(1, 8))
	n, err := e.SequenceLength(1)
	require.NoError(t, err)
	require.Equal(t, 40, n)
	require.NoError(t, e.Debug().CheckInvariants())

	bad := topkConfig(seed)
	bad.Compressor.IndexerTopKScratch = -1
	_, err = engine.New(ctx, bad)
	require.ErrorContains(t, err, "IndexerTopKScratch")
	bad = compConfig()
	bad.Compressor.IndexerTopKScratch = 16 // no indexer compute on the projected path
	_, err = engine.New(ctx, bad)
	require.ErrorContains(t, err, "IndexerTopKScratch")
}

// TestIndexerQueryFormatConfig: the fp8 query format runs the indexer
// without the top-k selection (no indices, IndexTopK 0, no selection
// memory in the footprint, the query and head-weight buffers of its row
// sizes); it is refused with a top-k scratch, without the indexer's
// compute, and an unknown format is refused, each naming the field.
func TestIndexerQueryFormatConfig(t *testing.T) {
	seed := testSeed(t)
	ctx := context.Background()
	cfg := topkConfig(seed)
	cfg.Compressor.IndexerQueryFormat = mla.IndexerQueryFP8
	e := newEngine(t, cfg)
	q, w := e.IndexerQuery()
	require.Equal(t, cfg.MaxTokens*mla.IndexerHeads*128, q.Len())
	require.Equal(t, cfg.MaxTokens*mla.IndexerHeads*4, w.Len())
	for l := range e.Layers() {
		require.Nil(t, e.IndexerTopK(l), "layer %d", l)
	}
	require.Zero(t, e.IndexTopK())
	fp, err := cfg.Footprint()
	require.NoError(t, err)
	require.Zero(t, fp.IdxTopK)
	it, err := e.Begin(ctx, []metadata.Request{ctxReq(1, 40)}) // rows seeing up to 10 > index_topk entries: no selection runs
	require.NoError(t, err)
	for l := range e.Layers() {
		require.NoError(t, it.SetHidden(l, indexerHidden(seed, e, it, l)))
		require.NoError(t, it.RunLayer(ctx, l))
	}
	require.NoError(t, it.End(ctx))

	for _, c := range []struct {
		mod  func(*engine.Config)
		want string
	}{
		{func(c *engine.Config) { c.Compressor.IndexerTopKScratch = 64 }, "Compressor.IndexerTopKScratch: 64 with IndexerQueryFormat fp8"},
		{func(c *engine.Config) { c.Input = engine.InputProjected }, "Compressor.IndexerQueryFormat: fp8 without the indexer's compute"},
		{func(c *engine.Config) { c.Compressor.IndexerQueryFormat = 9 }, "Compressor.IndexerQueryFormat: IndexerQueryFormat(9)"},
	} {
		bad := topkConfig(seed)
		bad.Compressor.IndexerQueryFormat = mla.IndexerQueryFP8
		c.mod(&bad)
		_, err := engine.New(ctx, bad)
		require.ErrorContains(t, err, c.want)
	}
}
