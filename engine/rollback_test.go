package engine_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/internal/bytediff"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// tokenBytes marks, in a pool of cc, the bytes of the slots of an
// iteration's real tokens: each slot's value row and, for fp8_ue8m0, the 7
// scale bytes the kernels write.
func tokenBytes(cc kvcache.Config, m *metadata.Metadata) []bool {
	own := make([]bool, cc.PoolBytes())
	pb := cc.PageBytes()
	for _, slot := range m.Slots()[:m.Tokens] {
		page, off := int(slot)/cc.PageSize, int(slot)%cc.PageSize
		vo := cc.Format.ValueOffset(cc.PageSize, off)
		n := cc.Format.BytesPerToken()
		if so := cc.Format.ScaleOffset(cc.PageSize, off); so >= 0 {
			n = kvcache.UE8M0ValueBytes
			for i := range kvcache.UE8M0ScaleBytes - 1 {
				own[page*pb+so+i] = true
			}
		}
		for i := range n {
			own[page*pb+vo+i] = true
		}
	}
	return own
}

// TestRollbackChangesOnlyItsOwnSlots pins the engine's rollback promise,
// every pool byte compared: an iteration rolled back after a layer ran
// changed, in that layer's pool, only the bytes of its own tokens' slots
// (none of which holds a committed token), and nothing in the layers that
// did not run. Running the same batch again then leaves every pool byte as
// an engine that never saw the aborted attempt, for each way an iteration
// rolls back.
func TestRollbackChangesOnlyItsOwnSlots(t *testing.T) {
	seed := testSeed(t)
	batch := []metadata.Request{ctxReq(9, 40), ctxReq(2, 7), genReq(1, 3), genReq(4, 3)}
	for _, how := range []string{"abort", "end without every layer", "cancelled layer"} {
		t.Run(how, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 10))
			e := refusalEngine(t, rng)
			rngRef := rand.New(rand.NewPCG(seed, 10))
			ref := refusalEngine(t, rngRef)
			before := takeSnapshot(t, e, 1, 2, 4, 9)

			it, err := e.Begin(context.Background(), batch)
			require.NoError(t, err)
			own := tokenBytes(e.Config().Cache, it.Metadata())
			f, q := inputs(rng, e, it)
			require.NoError(t, it.SetInputs(0, f, q))
			require.NoError(t, it.RunLayer(context.Background(), 0))
			switch how {
			case "abort":
				it.Abort()
			case "end without every layer":
				require.ErrorContains(t, it.End(context.Background()), "layer 1 did not run")
			case "cancelled layer":
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				require.NoError(t, it.SetInputs(1, f, q))
				require.ErrorIs(t, it.RunLayer(ctx, 1), context.Canceled)
				require.ErrorIs(t, it.End(context.Background()), context.Canceled)
			}
			after := takeSnapshot(t, e, 1, 2, 4, 9)
			require.Equal(t, before.free, after.free)
			require.Equal(t, before.tables, after.tables)
			require.Equal(t, before.lengths, after.lengths)
			changed := 0
			for l := range e.Layers() {
				for i := range before.pools[l] {
					if before.pools[l][i] == after.pools[l][i] {
						continue
					}
					require.True(t, l == 0 && own[i], "layer %d pool byte %d changed outside the aborted iteration's slots", l, i)
					changed++
				}
			}
			require.Positive(t, changed, "layer 0 ran: some of its slots must have changed, or this test proves nothing")
			requireCommittedBytesSame(t, e, before, map[uint64]int{1: 100, 2: 70, 4: 200})

			// The same batch again, on this engine and on one that never
			// saw the aborted attempt: every pool byte equal.
			for _, x := range []struct {
				e   *engine.Engine
				rng *rand.Rand
			}{{e, rand.New(rand.NewPCG(seed, 11))}, {ref, rand.New(rand.NewPCG(seed, 11))}} {
				step(t, x.rng, x.e, batch...)
			}
			for l := range e.Layers() {
				a, err := e.Debug().ReadPool(l)
				require.NoError(t, err)
				b, err := ref.Debug().ReadPool(l)
				require.NoError(t, err)
				require.Equal(t, -1, bytediff.First(a, b), "layer %d: the retried batch left a different pool", l)
			}
		})
	}
}

// TestFinishOfARolledBackCreationIsApplied: a Finish accepted (deferred)
// for a sequence that the open iteration creates is not lost when that
// iteration rolls back: the id ends finished, as it would had the
// iteration committed.
func TestFinishOfARolledBackCreationIsApplied(t *testing.T) {
	for _, how := range []string{"abort", "end rolls back"} {
		t.Run(how, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(testSeed(t), 12))
			e := refusalEngine(t, rng)
			free := e.FreePages()
			it, err := e.Begin(context.Background(), []metadata.Request{ctxReq(9, 20), genReq(1, 0)})
			require.NoError(t, err)
			require.NoError(t, e.Finish(9), "deferred until the iteration ends")
			require.NoError(t, e.Finish(1), "deferred until the iteration ends")
			require.ErrorIs(t, e.Finish(9), kvcache.ErrFinishedSequence, "a second finish is refused")
			if how == "abort" {
				it.Abort()
			} else {
				require.ErrorContains(t, it.End(context.Background()), "layer 0 did not run")
			}
			for _, seq := range []uint64{9, 1} {
				_, err = e.SequenceLength(seq)
				require.ErrorIs(t, err, kvcache.ErrFinishedSequence, "seq %d", seq)
			}
			_, err = e.Begin(context.Background(), []metadata.Request{ctxReq(9, 5)})
			require.ErrorIs(t, err, kvcache.ErrFinishedSequence, "the finished id cannot be created again")
			require.Equal(t, free+7, e.FreePages(), "seq 1's 7 pages are back, seq 9 took none")
		})
	}
}

// TestOneErrorWhicheverPackage: a server tests an unknown sequence and a
// position out of range with errors.Is against the kvcache errors, whether
// the cache, the metadata pass or the engine refused.
func TestOneErrorWhicheverPackage(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 13))
	e := refusalEngine(t, rng)
	ctx := context.Background()
	_, err := e.Begin(ctx, []metadata.Request{genReq(77, 0)}) // the metadata pass refuses
	require.ErrorIs(t, err, kvcache.ErrUnknownSequence)
	require.ErrorIs(t, e.Finish(77), kvcache.ErrUnknownSequence) // the cache refuses
	_, err = e.Debug().BlockTable(77)
	require.ErrorIs(t, err, kvcache.ErrUnknownSequence)
	_, err = e.Begin(ctx, []metadata.Request{ctxReq(1, 200)}) // past the RoPE table: metadata
	require.ErrorIs(t, err, kvcache.ErrPositionOutOfRange)

	c, err := kvcache.New(kvcache.Config{PageSize: 16, NumPages: 2})
	require.NoError(t, err)
	_, err = c.Slot(5, 0)
	require.ErrorIs(t, err, kvcache.ErrUnknownSequence)
	r, err := c.Reserve([]kvcache.Need{{ID: 5, NewLength: 3, Create: true}})
	require.NoError(t, err)
	_, err = c.Slot(5, 3) // past the reserved length: the cache
	require.ErrorIs(t, err, kvcache.ErrPositionOutOfRange)
	require.NoError(t, r.Rollback())
}
