package engine_test

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// TestIndexerPools: with index_n_heads > 0 every ratio-4 layer holds an
// indexer cache (Ratio4Pages pages of 64 68-byte entries, on the ratio-4
// page ids) and indexer states at the compressor's slots; Pools,
// Footprint and SequenceMemory count them, and a model without the
// indexer has none of them.
func TestIndexerPools(t *testing.T) {
	cfg := compConfig() // layer 2 is the one ratio-4 layer
	require.True(t, cfg.IndexerEnabled())
	e := newEngine(t, cfg)
	rc := e.Config()
	slots := kvcache.SlotsFor(rc.Compressor.MaxSequences, 1+rc.Compressor.MaxDrafts, rc.MaxSeqs, rc.MaxTokens)
	stateBytes := (8 + rc.Compressor.MaxDrafts + 1) * 2 * 256 * 4
	byName := map[string]engine.PoolUsage{}
	for _, p := range e.Pools() {
		byName[p.Name] = p
	}
	require.Equal(t, engine.PoolUsage{Name: "indexer", Layers: 1, Pages: 24, PageBytes: 64 * 68, Free: 24}, byName["indexer"])
	live := rc.Compressor.MaxSequences // the slots a scheduler admits sequences to (the moves' are kept aside)
	require.Equal(t, engine.PoolUsage{Name: "indexer-state", Layers: 1, Pages: live, PageBytes: stateBytes, Free: live, Slots: true}, byName["indexer-state"])
	fp, err := cfg.Footprint()
	require.NoError(t, err)
	require.Equal(t, int64(24*64*68), fp.Indexer)
	require.Equal(t, int64(slots*stateBytes), fp.IdxStates)
	m, err := cfg.SequenceMemory(1000) // 250 ratio-4 entries: 4 pages
	require.NoError(t, err)
	require.Equal(t, int64(4*64*68), m.Indexer)
	require.Equal(t, int64(stateBytes), m.IndexerState)
	require.Equal(t, m.SWA+m.Ratio[4]+m.Ratio[128]+m.State+m.Indexer+m.IndexerState, m.Total())
	cache, ring := engine.IndexerBuffers(e, 2)
	require.Equal(t, 24*64*68, cache.Len())
	require.Equal(t, slots*stateBytes, ring.Len())
	for _, l := range []int{0, 1, 3} {
		c, r := engine.IndexerBuffers(e, l)
		require.Nil(t, c, "layer %d", l)
		require.Nil(t, r, "layer %d", l)
		_, ok := engine.IndexerStepArgs(e, l)
		require.False(t, ok)
	}

	// A model without the indexer (index_n_heads 0: dsv4 then refuses
	// ratio-4 layers, so its compressed layers are ratio 128).
	off := compConfig()
	off.Model.IndexNHeads, off.Model.IndexHeadDim, off.Model.IndexTopK = 0, 0, 0
	off.Model.CompressRatios = slices.Clone(off.Model.CompressRatios)
	for i, r := range off.Model.CompressRatios {
		if r == 4 {
			off.Model.CompressRatios[i] = 128
		}
	}
	off.Compressor.Ratio4Pages = 0
	require.False(t, off.IndexerEnabled())
	fp, err = off.Footprint()
	require.NoError(t, err)
	require.Zero(t, fp.Indexer)
	require.Zero(t, fp.IdxStates)
	m, err = off.SequenceMemory(1000)
	require.NoError(t, err)
	require.Zero(t, m.Indexer+m.IndexerState)
	eo := newEngine(t, off)
	for _, p := range eo.Pools() {
		require.NotContains(t, []string{"indexer", "indexer-state"}, p.Name)
	}
	c, _ := engine.IndexerBuffers(eo, 2)
	require.Nil(t, c)
	_, err = eo.Debug().ReadIndexerCache(2)
	require.ErrorContains(t, err, "the indexer is off")
	_, err = e.Debug().ReadIndexerCache(3)
	require.ErrorContains(t, err, "layer 3 has compress ratio 128: no indexer")
}

// TestIndexerRefusal: the indexer's keys are reserved with the ratio-4
// entries whose page ids they use: a batch that does not fit is refused
// naming both pools, and nothing changes.
func TestIndexerRefusal(t *testing.T) {
	seed := testSeed(t)
	cfg := compConfig()
	cfg.Compressor.Ratio4Pages = 2 // 128 entries: 512 tokens
	e := newEngine(t, cfg)
	runComp(t, seed, e, nil, ctxReq(1, 300))
	pools := e.Pools()
	_, err := e.Begin(t.Context(), []metadata.Request{ctxReq(2, 260)})
	require.ErrorIs(t, err, engine.ErrCacheFull)
	require.ErrorContains(t, err, "ratio-4 compressed pool and indexer pool: kvcache: cache full")
	require.Equal(t, pools, e.Pools())
	require.NoError(t, e.Debug().CheckInvariants())
}

// TestIndexerStepArgs: the accessor's arguments are a valid step over the
// engine's buffers, and a step run with them (the CPU backend's, on random
// projections) writes exactly the entries the iteration completes, at the
// pages and offsets of the sequence's ratio-4 block table, and the
// sequence's state slot; Accept then drops the indexer entries past
// floor(len/4) with the compressed ones, and Finish returns their pages.
func TestIndexerStepArgs(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 23))
	cfg := compConfig()
	e := newEngine(t, cfg)
	be := e.Backend()
	step, ok := be.(mla.CompressStepper)
	require.True(t, ok)
	const layer, width = 2, 256
	runComp(t, seed, e, nil, ctxReq(9, 70)) // another sequence holds pages first
	ctx := context.Background()
	for _, c := range []struct {
		reqs     []metadata.Request
		accepted map[uint64]int
	}{
		{[]metadata.Request{ctxReq(1, 261)}, nil},                // entries 0..64: two pages
		{[]metadata.Request{genReq(1, 3)}, map[uint64]int{1: 2}}, // 261 -> 265 run, 263 kept: entry 65 dropped
		{[]metadata.Request{genReq(1, 3), genReq(9, 3)}, nil},    // entries 65, and 17 of seq 9
		{[]metadata.Request{ctxReq(1, 20), genReq(9, 0)}, nil},   // a chunk that moves to a fresh slot
		{[]metadata.Request{genReq(1, 2)}, map[uint64]int{1: 1}}, // nothing dropped
	} {
		it, err := e.Begin(ctx, c.reqs)
		require.NoError(t, err)
		a, ok := engine.IndexerStepArgs(e, layer)
		require.True(t, ok)
		m := it.Metadata()
		var kg []byte
		for range m.Tokens * 2 * width {
			kg = binary.LittleEndian.AppendUint32(kg, math.Float32bits(float32(rng.NormFloat64())))
		}
		kgBuf, err := be.Alloc(len(kg))
		require.NoError(t, err)
		require.NoError(t, be.Write(kgBuf, 0, kg))
		norm := make([]float32, 128)
		for i := range norm {
			norm[i] = numerics.RoundBF16(float32(1 + rng.Float64()/4))
		}
		normBuf, err := be.Alloc(len(norm) * 4)
		require.NoError(t, err)
		require.NoError(t, be.Write(normBuf, 0, numerics.F32Bytes(norm)))
		a.KG, a.KGRows, a.NormWeight = kgBuf, m.Tokens, normBuf
		require.NoError(t, a.Validate())
		before, err := e.Debug().ReadIndexerCache(layer)
		require.NoError(t, err)
		require.NoError(t, step.CompressStep(ctx, &a))
		after, err := e.Debug().ReadIndexerCache(layer)
		require.NoError(t, err)
		// Exactly the entries [floor(cached/4), floor(kv_len/4)) of each
		// sequence change, at their table's pages.
		want := append([]byte(nil), before...)
		for b := range m.NumSeqs {
			table, err := e.Debug().CompressedBlockTable(4, m.Seqs[b]) // the reservation's, pending
			require.NoError(t, err)
			for i := int(m.Cached[b]) / 4; i < int(m.KVLen[b])/4; i++ {
				at := int(table[i/64])*64*68 + i%64*68
				require.NotEqual(t, before[at:at+68], after[at:at+68], "seq %d entry %d", m.Seqs[b], i)
				copy(want[at:at+68], after[at:at+68])
			}
			st, err := it.Debug().ReadIndexerSlot(layer, m.Seqs[b])
			require.NoError(t, err)
			require.NotEqual(t, make([]byte, len(st)), st, "seq %d: its state slot", m.Seqs[b])
		}
		require.Equal(t, want, after, "nothing else of the indexer cache changes")
		require.NoError(t, be.Free(kgBuf))
		require.NoError(t, be.Free(normBuf))
		for l := range e.Layers() {
			f, q := positionInputs(seed, e, it, l)
			require.NoError(t, it.SetInputs(l, f, q))
			if e.CompressorWidth(l) > 0 {
				k, g := compRows(seed, e, it, l)
				require.NoError(t, it.SetCompressorInputs(l, k, g))
			}
			require.NoError(t, it.RunLayer(ctx, l))
		}
		if c.accepted != nil {
			require.NoError(t, it.Accept(c.accepted))
		}
		require.NoError(t, it.End(ctx))
		for _, seq := range []uint64{1, 9} {
			n, err := e.SequenceLength(seq)
			require.NoError(t, err)
			entries, err := e.Debug().CompressedEntries(4, seq)
			require.NoError(t, err)
			require.Equal(t, n/4, entries, "seq %d: indexer and compressed entries follow the accepted length", seq)
		}
		require.NoError(t, e.Debug().CheckInvariants())
	}
	require.NoError(t, e.Finish(1))
	require.NoError(t, e.Finish(9))
	for _, p := range e.Pools() {
		require.Equal(t, p.Pages, p.Free, "pool %s", p.Name)
	}
}
