package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// refusalEngine holds live sequences 1 (100 tokens), 2 (70) and 4 (200) in
// 25 of 32 pages of 16 tokens, and finished sequence 3. The RoPE table
// (256 positions) is shorter than the pool (512 tokens) so that a position
// past the table is not also a full pool.
func refusalEngine(t *testing.T, rng *rand.Rand) *engine.Engine {
	cfg := smallConfig()
	cfg.RopePositions = 256
	cfg.Layers = 2
	e := newEngine(t, cfg)
	step(t, rng, e, ctxReq(1, 64), ctxReq(2, 70), ctxReq(3, 10))
	step(t, rng, e, ctxReq(1, 36), ctxReq(4, 200))
	require.NoError(t, e.Finish(3))
	require.Equal(t, 7, e.FreePages())
	return e
}

func TestRefusedBatchLeavesCacheUntouched(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	many := make([]metadata.Request, 9)
	for i := range many {
		many[i] = ctxReq(uint64(100+i), 1)
	}
	for _, c := range []struct {
		name string
		reqs []metadata.Request
		want error // errors.Is target
	}{
		{"generation on an unknown sequence", []metadata.Request{ctxReq(9, 5), genReq(1, 3), genReq(77, 3)}, kvcache.ErrUnknownSequence},
		{"generation on a finished sequence", []metadata.Request{genReq(1, 1), genReq(3, 1)}, kvcache.ErrFinishedSequence},
		{"context on a finished sequence", []metadata.Request{ctxReq(3, 4)}, kvcache.ErrFinishedSequence},
		{"batch beyond the free pages", []metadata.Request{ctxReq(9, 200), genReq(1, 3), genReq(2, 3)}, engine.ErrCacheFull},
		{"prompt past the RoPE table", []metadata.Request{ctxReq(9, 3), ctxReq(1, 200)}, kvcache.ErrPositionOutOfRange},
		{"new prompt past the RoPE table", []metadata.Request{ctxReq(9, 257)}, kvcache.ErrPositionOutOfRange},
		{"more tokens than MaxTokens", []metadata.Request{ctxReq(9, 200), ctxReq(10, 100)}, engine.ErrBatchTooLarge},
		{"more sequences than MaxSeqs", many, engine.ErrBatchTooLarge},
		{"context after generation", []metadata.Request{genReq(1, 0), ctxReq(9, 4)}, nil},
		{"generation lengths differ", []metadata.Request{genReq(1, 0), genReq(2, 1)}, nil},
		{"sequence twice", []metadata.Request{genReq(1, 0), genReq(1, 0)}, nil},
		{"empty batch", nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := refusalEngine(t, rng)
			ids := []uint64{1, 2, 3, 4, 9, 10, 77}
			before := takeSnapshot(t, e, ids...)
			it, err := e.Begin(context.Background(), c.reqs)
			require.Error(t, err)
			require.Nil(t, it)
			t.Logf("refused: %v", err)
			if c.want != nil {
				require.ErrorIs(t, err, c.want)
			}
			requireSameSnapshot(t, before, takeSnapshot(t, e, ids...))

			// No iteration was left open, and the cache still works.
			it, err = e.Begin(context.Background(), []metadata.Request{genReq(1, 3), genReq(2, 3), genReq(4, 3)})
			require.NoError(t, err)
			it.Abort()
			requireSameSnapshot(t, before, takeSnapshot(t, e, ids...))
		})
	}
}

func TestBeginWithCancelledContext(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	e := refusalEngine(t, rng)
	before := takeSnapshot(t, e, 1, 2, 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.Begin(ctx, []metadata.Request{genReq(1, 1)})
	require.ErrorIs(t, err, context.Canceled)
	requireSameSnapshot(t, before, takeSnapshot(t, e, 1, 2, 4))
}

// A layer run under a cancelled context fails, and End rolls the iteration
// back: no page is kept, no length grows.
func TestCancelledLayerRollsBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 3))
	e := refusalEngine(t, rng)
	before := takeSnapshot(t, e, 1, 2, 4, 9)
	it, err := e.Begin(context.Background(), []metadata.Request{ctxReq(9, 40), genReq(1, 3), genReq(2, 3)})
	require.NoError(t, err)
	require.Less(t, e.FreePages(), before.free, "Begin reserves pages")
	f, q := inputs(rng, e, it)
	require.NoError(t, it.SetInputs(0, f, q))
	require.NoError(t, it.RunLayer(context.Background(), 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, it.SetInputs(1, f, q))
	require.ErrorIs(t, it.RunLayer(ctx, 1), context.Canceled)
	err = it.End(context.Background())
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, it.End(context.Background()), engine.ErrIterationDone)

	after := takeSnapshot(t, e, 1, 2, 4, 9)
	require.Equal(t, before.free, after.free)
	require.Equal(t, before.tables, after.tables)
	require.Equal(t, before.lengths, after.lengths)
	// Layer 0 wrote the new tokens' slots, in pages the rollback freed or
	// past the committed lengths; the committed tokens' bytes are intact.
	requireCommittedBytesSame(t, e, before, map[uint64]int{1: 100, 2: 70, 4: 200})
}

// requireCommittedBytesSame compares, in every layer, the bytes of every
// committed token of the sequences (length given) between a snapshot and now.
func requireCommittedBytesSame(t *testing.T, e *engine.Engine, before snapshot, lengths map[uint64]int) {
	t.Helper()
	cc := e.Config().Cache
	pb := cc.PageBytes()
	for l := range e.Layers() {
		now, err := e.Debug().ReadPool(l)
		require.NoError(t, err)
		for seq, n := range lengths {
			table := before.tables[seq]
			for pos := range n {
				page, off := int(table[pos/cc.PageSize]), pos%cc.PageSize
				vo := cc.Format.ValueOffset(cc.PageSize, off)
				span := [][2]int{{vo, vo + cc.Format.BytesPerToken()}}
				if so := cc.Format.ScaleOffset(cc.PageSize, off); so >= 0 {
					span = [][2]int{{vo, vo + kvcache.UE8M0ValueBytes}, {so, so + kvcache.UE8M0ScaleBytes}}
				}
				for _, s := range span {
					a, b := before.pools[l][page*pb+s[0]:page*pb+s[1]], now[page*pb+s[0]:page*pb+s[1]]
					require.Equal(t, a, b, "layer %d seq %d pos %d", l, seq, pos)
				}
			}
		}
	}
}

func TestEndCancelledRollsBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 4))
	e := refusalEngine(t, rng)
	before := takeSnapshot(t, e, 1, 2, 4)
	it, err := e.Begin(context.Background(), []metadata.Request{genReq(1, 3), genReq(2, 3)})
	require.NoError(t, err)
	for l := range e.Layers() {
		f, q := inputs(rng, e, it)
		require.NoError(t, it.SetInputs(l, f, q))
		require.NoError(t, it.RunLayer(context.Background(), l))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, it.End(ctx), context.Canceled)
	after := takeSnapshot(t, e, 1, 2, 4)
	require.Equal(t, before.lengths, after.lengths)
	require.Equal(t, before.tables, after.tables)
	require.Equal(t, before.free, after.free)
	requireCommittedBytesSame(t, e, before, map[uint64]int{1: 100, 2: 70, 4: 200})
}

func TestEndRequiresEveryLayer(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 5))
	e := refusalEngine(t, rng)
	before := takeSnapshot(t, e, 1, 2, 4)
	it, err := e.Begin(context.Background(), []metadata.Request{genReq(1, 0)})
	require.NoError(t, err)
	f, q := inputs(rng, e, it)
	require.NoError(t, it.SetInputs(0, f, q))
	require.NoError(t, it.RunLayer(context.Background(), 0))
	err = it.End(context.Background())
	require.ErrorContains(t, err, "layer 1 did not run")
	after := takeSnapshot(t, e, 1, 2, 4)
	require.Equal(t, before.lengths, after.lengths)
	require.Equal(t, before.free, after.free)
}

func TestIterationMisuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 6))
	e := refusalEngine(t, rng)
	ctx := context.Background()
	it, err := e.Begin(ctx, []metadata.Request{genReq(1, 1), genReq(2, 1)})
	require.NoError(t, err)
	defer it.Abort()

	_, err = e.Begin(ctx, []metadata.Request{genReq(4, 0)})
	require.ErrorIs(t, err, engine.ErrIterationOpen)
	require.ErrorIs(t, e.SetLayerWeight(0, engine.SyntheticLayerWeight(1, 0)), engine.ErrIterationOpen)

	f, q := inputs(rng, e, it)
	for _, c := range []struct {
		name string
		err  error
	}{
		{"short fusedA", it.SetInputs(0, f[:len(f)-2], q)},
		{"long q", it.SetInputs(0, f, append(q, 0, 0))},
		{"layer out of range", it.SetInputs(2, f, q)},
		{"negative layer", it.RunLayer(ctx, -1)},
	} {
		require.Error(t, c.err, c.name)
		t.Logf("%s: %v", c.name, c.err)
	}
	require.NoError(t, it.SetInputs(1, f, q))
	require.ErrorContains(t, it.RunLayer(ctx, 0), "hold layer 1's inputs")
	it.Abort()
	require.ErrorIs(t, it.RunLayer(ctx, 1), engine.ErrIterationDone)
	require.ErrorIs(t, it.SetInputs(1, f, q), engine.ErrIterationDone)
}

func TestFinishErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 7))
	e := refusalEngine(t, rng)
	require.ErrorIs(t, e.Finish(3), kvcache.ErrFinishedSequence)
	require.ErrorIs(t, e.Finish(55), kvcache.ErrUnknownSequence)
	require.NoError(t, e.Close())
	require.ErrorIs(t, e.Finish(1), engine.ErrClosed)
	_, err := e.Begin(context.Background(), []metadata.Request{genReq(1, 0)})
	require.True(t, errors.Is(err, engine.ErrClosed), "%v", err)
}
