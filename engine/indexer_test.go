package engine_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// indexerConfig is compConfig on the hidden-state path with small hidden
// rows and q_lora_rank (one and two 128-wide scale blocks: the indexer's
// 8192-wide query GEMM and the compressor projections were these tests'
// cost under -race, and no cache or window edge depends on either width):
// layer 2 is the ratio-4 layer, so the indexer runs there.
func indexerConfig(seed uint64) engine.Config {
	cfg := compConfig()
	cfg.Input = engine.InputHidden
	cfg.Model.HiddenSize = 128
	cfg.Model.QLoraRank = 256
	cfg.SyntheticWeights = &engine.SyntheticWeights{Seed: seed}
	cfg.Compressor.Ratio4Pages, cfg.Compressor.Ratio128Pages = 4, 1
	return cfg
}

// indexerHidden is the hidden rows of an iteration's tokens, keyed by
// (seed, sequence, position, layer): the same token gets the same row in
// any chunking.
func indexerHidden(seed uint64, e *engine.Engine, it *engine.Iteration, layer int) []byte {
	m := it.Metadata()
	var out []byte
	for row := range it.Tokens() {
		b, pos, _ := m.Row(row)
		rng := rand.New(rand.NewPCG(seed^m.Seqs[b], uint64(pos)<<16|uint64(layer)))
		out = append(out, randomBF16(rng, e.HiddenSize())...)
	}
	return out
}

type indexerStep struct {
	req      metadata.Request
	accepted int // 0: every token
}

// runIndexer runs the steps of sequence 1 through every layer.
func runIndexer(t *testing.T, seed uint64, e *engine.Engine, steps []indexerStep) {
	ctx := context.Background()
	for _, s := range steps {
		it, err := e.Begin(ctx, []metadata.Request{s.req})
		require.NoError(t, err)
		for l := range e.Layers() {
			require.NoError(t, it.SetHidden(l, indexerHidden(seed, e, it, l)))
			require.NoError(t, it.RunLayer(ctx, l))
		}
		if s.accepted > 0 {
			require.NoError(t, it.Accept(map[uint64]int{1: s.accepted}))
		}
		require.NoError(t, it.End(ctx))
	}
}

// indexerEntries returns sequence 1's first n indexer entries of layer 2,
// through its ratio-4 block table.
func indexerEntries(t *testing.T, e *engine.Engine, n int) [][]byte {
	cache, err := e.Debug().ReadIndexerCache(2)
	require.NoError(t, err)
	table, err := e.Debug().CompressedBlockTable(4, 1)
	require.NoError(t, err)
	out := make([][]byte, n)
	for i := range out {
		at := int(table[i/64])*64*68 + i%64*68
		out[i] = cache[at : at+68]
	}
	return out
}

// TestIndexerChunks: on the hidden-state path the engine runs the
// indexer's compressor in the ratio-4 layer: a prompt of 3 mod 4 tokens
// in one chunk then decoded token by token gives the same indexer entries
// and states as the same tokens in chunks ending at 1, 2 and 3 mod 4 and
// MTP steps whose rejected drafts cross window boundaries (DESIGN.md
// section 9); the entries are not all alike.
func TestIndexerChunks(t *testing.T) {
	seed := testSeed(t)
	cfg := indexerConfig(seed)
	require.True(t, cfg.IndexerEnabled())
	one, split := newEngine(t, cfg), newEngine(t, cfg)
	plain := []indexerStep{{req: ctxReq(1, 131)}}
	for range 9 {
		plain = append(plain, indexerStep{req: genReq(1, 0)})
	}
	runIndexer(t, seed, one, plain) // 140 tokens
	runIndexer(t, seed, split, []indexerStep{
		{req: ctxReq(1, 1)}, {req: ctxReq(1, 2)}, {req: ctxReq(1, 6)}, {req: ctxReq(1, 121)}, // 130
		{req: genReq(1, 3), accepted: 1}, // 130..133 run (entry 32 at 131 is a draft), 131 kept
		{req: genReq(1, 3), accepted: 3}, // 131..134, 134 kept
		{req: genReq(1, 3), accepted: 2}, // 134..137, 136 kept
		{req: genReq(1, 3)},              // 136..139, 140 kept
	})
	a, b := indexerEntries(t, one, 35), indexerEntries(t, split, 35)
	for i := range a {
		require.Equal(t, a[i], b[i], "indexer entry %d", i)
	}
	require.NotEqual(t, a[0], a[34])
	// Entries 0 and 1 replayed from the layer's weights: the projections of
	// positions 0..7's hidden rows (the CPU backend's bf16 GEMM), ape by
	// position, then package compressor's pooling and entry.
	rc := one.Config()
	w, err := weights.SyntheticLayer(&rc.Model, seed, 2, weights.ScaleE8M0)
	require.NoError(t, err)
	ic := &w.Indexer.Compressor
	be := cpu.New(0)
	var hidden []byte
	for pos := range 8 {
		hidden = append(hidden, randomBF16(rand.New(rand.NewPCG(seed^1, uint64(pos)<<16|2)), rc.Model.HiddenSize)...)
	}
	up := func(raw []byte) mla.Buffer {
		buf, err := be.Alloc(len(raw))
		require.NoError(t, err)
		require.NoError(t, be.Write(buf, 0, raw))
		return buf
	}
	kgBuf := up(make([]byte, 8*512*4))
	require.NoError(t, be.BF16GEMM(context.Background(), &mla.BF16GEMMArgs{Rows: 8, N: 512, K: rc.Model.HiddenSize, X: up(hidden),
		XStride: rc.Model.HiddenSize, W: up(append(u16Bytes(ic.WKV.Data), u16Bytes(ic.WGate.Data)...)), Y: kgBuf, YStride: 512}))
	kg := numerics.F32sFromBytes(cpu.Bytes(kgBuf))
	src := func(pos int) (k, g []float32) {
		k, g = kg[pos*512:pos*512+256], append([]float32(nil), kg[pos*512+256:pos*512+512]...)
		for c := range g {
			g[c] = float32(g[c] + ic.APE[pos%4*256+c])
		}
		return k, g
	}
	table, err := dsv4.NewRopeTable(rc.Model, dsv4.RopeYaRN, rc.RopeMode, 8)
	require.NoError(t, err)
	for i := range 2 {
		pooled := make([]float32, 128)
		require.NoError(t, compressor.PoolEntryDim(4, 128, i, src, pooled))
		want, err := compressor.FinishIndexer(pooled, ic.Norm, float32(rc.Model.RMSNormEps), table.Row(4*i))
		require.NoError(t, err)
		require.Equal(t, want[:], a[i], "indexer entry %d against the replay", i)
	}
	ra, err := one.Debug().IndexerStateRing(2, 1)
	require.NoError(t, err)
	rb, err := split.Debug().IndexerStateRing(2, 1)
	require.NoError(t, err)
	const ringRows, rowBytes = 8 + 3 + 1, 2 * 256 * 4 // RingRows(4, MaxDrafts 3)
	for p := 136; p < 140; p++ {                      // the positions entry 35 will read
		r := p % ringRows * rowBytes
		require.Equal(t, ra[r:r+rowBytes], rb[r:r+rowBytes], "state row of position %d", p)
	}
	require.NoError(t, split.Debug().CheckInvariants())
}

// TestIndexerQueryEngine: the engine's indexer query and head weights of
// the ratio-4 layer equal the steps replayed by hand on the CPU backend
// from the layer's checkpoint weights (the indexer's wq_b on q_norm's
// activation, weights_proj on the hidden rows, the query step), every
// byte, padding rows zero; other layers leave them alone.
func TestIndexerQueryEngine(t *testing.T) {
	seed := testSeed(t)
	cfg := indexerConfig(seed)
	e := newEngine(t, cfg)
	runIndexer(t, seed, e, []indexerStep{{req: ctxReq(1, 37)}})
	ctx := context.Background()
	it, err := e.Begin(ctx, []metadata.Request{ctxReq(1, 5), ctxReq(2, 9)})
	require.NoError(t, err)
	var hidden []byte
	for l := range 3 {
		hidden = indexerHidden(seed, e, it, l)
		require.NoError(t, it.SetHidden(l, hidden))
		require.NoError(t, it.RunLayer(ctx, l))
	}
	gotQ, gotW, err := it.Debug().ReadIndexerQuery()
	require.NoError(t, err)
	qn, err := it.Debug().ReadChain(engine.TensorQNormFP8)
	require.NoError(t, err)
	qnScale, err := it.Debug().ReadChain(engine.TensorQNormScale)
	require.NoError(t, err)

	// The replay.
	rc := e.Config()
	w, err := weights.SyntheticLayer(&rc.Model, seed, 2, weights.ScaleE8M0)
	require.NoError(t, err)
	require.NotNil(t, w.Indexer)
	b := cpu.New(0)
	up := func(raw []byte) mla.Buffer {
		buf, err := b.Alloc(len(raw))
		require.NoError(t, err)
		require.NoError(t, b.Write(buf, 0, raw))
		return buf
	}
	m := it.Metadata()
	T, H, Q := m.Tokens, rc.Model.HiddenSize, rc.Model.QLoraRank
	x := mla.FP8Activations{Rows: T, K: Q, Data: up(qn), Scale: up(qnScale), ScaleStride: T}
	wq := mla.FP8Weight{N: w.Indexer.WQB.N, K: w.Indexer.WQB.K, Data: up(w.Indexer.WQB.Data), Scale: up(numerics.F32Bytes(w.Indexer.WQB.Scale))}
	qIn, wp := up(make([]byte, T*8192*2)), up(make([]byte, T*64*4))
	require.NoError(t, b.GEMM(ctx, &mla.GEMMArgs{X: x, W: &wq, Y: qIn, YStride: 8192}))
	require.NoError(t, b.BF16GEMM(ctx, &mla.BF16GEMMArgs{Rows: T, N: 64, K: H, X: up(hidden), XStride: H,
		W: up(u16Bytes(w.Indexer.WeightsProj.Data)), Y: wp, YStride: 64}))
	table, err := dsv4.NewRopeTable(rc.Model, dsv4.RopeYaRN, rc.RopeMode, rc.RopePositions)
	require.NoError(t, err)
	meta, err := mla.NewMetadataBuffers(b, m.NumSeqs, m.MaxPages+1)
	require.NoError(t, err)
	require.NoError(t, meta.Upload(b, m, rc.Cache.NumPages))
	a := &mla.IndexerQueryArgs{Q: qIn, QStride: 8192, W: wp, WStride: 64, QOut: up(make([]byte, T*64*68)), WOut: up(make([]byte, T*64*2)),
		Rope: up(table.Bytes()), RopePositions: rc.RopePositions, Meta: meta}
	require.NoError(t, mla.RunIndexerQuery(ctx, b, mla.Plan(m), a))
	wantQ, wantW := make([]byte, T*64*68), make([]byte, T*64*2)
	require.NoError(t, b.Read(wantQ, a.QOut, 0))
	require.NoError(t, b.Read(wantW, a.WOut, 0))
	require.Equal(t, wantQ, gotQ, "the indexer query")
	require.Equal(t, wantW, gotW, "the head weights")

	// Layer 3 (ratio 128) leaves the buffers as layer 2 wrote them.
	require.NoError(t, it.SetHidden(3, indexerHidden(seed, e, it, 3)))
	require.NoError(t, it.RunLayer(ctx, 3))
	q3, w3, err := it.Debug().ReadIndexerQuery()
	require.NoError(t, err)
	require.Equal(t, gotQ, q3)
	require.Equal(t, gotW, w3)
	require.NoError(t, it.End(ctx))
	qb, wb := e.IndexerQuery()
	require.Equal(t, rc.MaxTokens*64*68, qb.Len())
	require.Equal(t, rc.MaxTokens*64*2, wb.Len())
}

// TestIndexerFootprint: the indexer's weights and buffers are counted, and
// an engine on the projected path (no indexer compute) has neither.
func TestIndexerFootprint(t *testing.T) {
	cfg := indexerConfig(1)
	fp, err := cfg.Footprint()
	require.NoError(t, err)
	tokens := int64(cfg.MaxTokens)
	require.Equal(t, tokens*(64*128*2+64*68+64*2), fp.IdxBuffers)
	// The projection rows hold the ratio-4 layer's one GEMM output, 2*1024
	// + 2*256 + 64 values, where the projected path (no indexer compute,
	// the same cache) holds the compressor's 2*1024.
	projected := cfg
	projected.Input = engine.InputProjected
	fpp, err := projected.Footprint()
	require.NoError(t, err)
	require.Equal(t, tokens*(2*256+64)*4, fp.CompBuffers-fpp.CompBuffers)
	hidden, q := int64(cfg.Model.HiddenSize), int64(cfg.Model.QLoraRank)
	require.Equal(t, 8192*q+64*(q/128)*4+64*hidden*2+512*hidden*2+4*256*4+128*4, fp.IdxWeights)
	// The top-k plan (header, MaxSeqs sequences of 8 words and 4 table
	// entries: Ratio4Pages), no scratch (at 2048 positions no token sees
	// more than index_topk = 512 entries), layer 2's indices.
	plan := int64(4 * (4 + cfg.MaxSeqs*(8+4)))
	require.Equal(t, plan+tokens*512*4, fp.IdxTopK)
	small := cfg
	small.Model.IndexTopK = 8 // now the last position's 512 entries need keys, every row
	fp, err = small.Footprint()
	require.NoError(t, err)
	require.Equal(t, plan+4*tokens*512+tokens*8*4, fp.IdxTopK)
	small.Compressor.IndexerTopKScratch = 100
	fp, err = small.Footprint()
	require.NoError(t, err)
	require.Equal(t, plan+4*100+tokens*8*4, fp.IdxTopK)
	proj := compConfig()
	fp, err = proj.Footprint()
	require.NoError(t, err)
	require.Zero(t, fp.IdxBuffers+fp.IdxWeights+fp.IdxTopK)
	e := newEngine(t, proj)
	qb, wb := e.IndexerQuery()
	require.Nil(t, qb)
	require.Nil(t, wb)
}

func u16Bytes(v []uint16) []byte {
	out := make([]byte, 0, 2*len(v))
	for _, x := range v {
		out = binary.LittleEndian.AppendUint16(out, x)
	}
	return out
}
