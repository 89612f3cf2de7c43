package mla_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/internal/bytediff"
	"github.com/dsv4mla/prologue/metadata"
)

// TestMetadataLayoutBounds: sizes that would overflow, or pass the int32
// offsets of the device, are refused before anything is allocated; sizes
// within the bound are laid out exactly.
func TestMetadataLayoutBounds(t *testing.T) {
	for _, c := range []struct {
		name                string
		maxSeqs, pageStride int
		ok                  bool
	}{
		{"one sequence, one page", 1, 1, true},
		{"a server's capacity", 256, 16384, true},
		{"int32 offsets exceeded", 1 << 16, 1 << 16, false},
		{"product overflows int64", 1 << 40, 1 << 40, false},
		{"max int sequences", math.MaxInt, 1, false},
		{"max int stride", 1, math.MaxInt, false},
		{"zero", 0, 1, false},
		{"negative stride", 1, -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mb, err := mla.MetadataLayout(c.maxSeqs, c.pageStride)
			if !c.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.LessOrEqual(t, mb.Size, mla.MaxMetadataBytes)
			require.Equal(t, mb.OffBlockTables+((c.maxSeqs*c.pageStride*4+15)&^15), mb.OffScheduler)
			require.Equal(t, mb.OffScheduler+mla.SchedulerBytes, mb.Size)
		})
	}
	// The largest capacity of a 64Ki-wide table that fits stays under the bound.
	s := (mla.MaxMetadataBytes - 256) / 4 / (1<<16 + 7)
	mb, err := mla.MetadataLayout(s, 1<<16)
	require.NoError(t, err)
	require.LessOrEqual(t, mb.Size, mla.MaxMetadataBytes)
	_, err = mla.MetadataLayout(s+1, 1<<16)
	require.ErrorContains(t, err, "the buffer would pass 2147483647 bytes")
}

// randomMetadata builds a batch of up to maxSeqs sequences with random
// lengths and random block tables (some entries -1, as a window leaves
// them) drawn from a pool of numPages pages.
func randomMetadata(t *testing.T, rng *rand.Rand, maxSeqs, maxPages, numPages int) *metadata.Metadata {
	t.Helper()
	const pageSize = 4
	n := 1 + rng.IntN(maxSeqs)
	reqs := make([]metadata.Request, n)
	cached := map[uint64]int{}
	nctx := rng.IntN(n + 1)
	mtp := rng.IntN(3)
	for i := range reqs {
		seq := uint64(i + 1 + rng.IntN(3)*100)
		if i < nctx {
			reqs[i] = metadata.Request{Seq: seq, Phase: metadata.Context, NewTokens: 1 + rng.IntN(pageSize*2)}
		} else {
			reqs[i] = metadata.Request{Seq: seq, Phase: metadata.Generation, MTP: mtp}
		}
		cached[seq] = rng.IntN(pageSize*(maxPages-3) + 1)
	}
	plan, err := metadata.NewPlan(reqs, func(s uint64) (int, bool, error) { c, ok := cached[s]; return c, ok, nil },
		metadata.Params{Heads: 2, PageSize: pageSize, MaxPositions: pageSize * maxPages, Scheduler: metadata.DefaultSchedulerParams()})
	require.NoError(t, err)
	m, err := plan.Build(func(s uint64) ([]int32, error) {
		pages := make([]int32, maxPages)
		for j := range pages {
			pages[j] = int32(rng.IntN(numPages))
		}
		if c := cached[s]; c >= pageSize && rng.IntN(3) == 0 {
			for j := range rng.IntN(c/pageSize) + 1 {
				pages[j] = -1
			}
		}
		return pages, nil
	})
	require.NoError(t, err)
	return m
}

// TestUploadMatchesEncode: after every upload of a random series of
// batches (growing and shrinking in sequences and width, rows changing in
// a few entries or not at all, a refused batch between them), the device
// holds exactly Encode's bytes, with the scheduler region untouched. On a
// backend whose copies land late (mlatest.Async), the copy is still queued
// when Upload returns, and Upload never rewrites its staging words while
// one is, whether or not the device was waited for between uploads.
func TestUploadMatchesEncode(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "cpu", true: "async"}[async], func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			testUploadMatchesEncode(t, rand.New(rand.NewPCG(seed, 7)), async)
		})
	}
}

func testUploadMatchesEncode(t *testing.T, rng *rand.Rand, async bool) {
	const maxSeqs, stride, numPages = 9, 12, 40
	host := cpu.New(1)
	var b mla.Backend = host
	var ab *mlatest.Async
	if async {
		ab = mlatest.NewAsync(host)
		b = ab
	}
	defer b.Close()
	ctx := context.Background()
	mb, err := mla.NewMetadataBuffers(b, maxSeqs, stride)
	require.NoError(t, err)
	device := cpu.Bytes(mb.Buf)
	var prev *metadata.Metadata
	queued := 0 // uploads whose copy was still queued when Upload returned
	for step := range 400 {
		m := randomMetadata(t, rng, maxSeqs, stride, numPages)
		if prev != nil && rng.IntN(2) == 0 {
			// The last batch again, with a few entries changed.
			m = prev
			for range rng.IntN(3) {
				m.BlockTables[rng.IntN(len(m.BlockTables))] = int32(rng.IntN(numPages))
			}
			m.KVLen[0] += int32(rng.IntN(2))
		}
		if rng.IntN(10) == 0 {
			bad := *m
			bad.BlockTables = append([]int32(nil), m.BlockTables...)
			bad.BlockTables[rng.IntN(len(bad.BlockTables))] = numPages
			require.NoError(t, b.Synchronize(ctx))
			before := append([]byte(nil), device...)
			require.ErrorContains(t, mb.Upload(b, &bad, numPages), "outside the pool", "step %d", step)
			require.NoError(t, b.Synchronize(ctx))
			require.Equal(t, before, device, "step %d: a refused upload wrote", step)
		}
		if rng.IntN(40) == 0 {
			require.NoError(t, b.Fill(mb.Buf, 0, mb.OffScheduler, byte(rng.IntN(256))))
			mb.Invalidate()
		}
		want, err := mb.Encode(m, numPages)
		require.NoError(t, err)
		require.NoError(t, mb.Upload(b, m, numPages), "step %d", step)
		if async && ab.Pending() > 0 {
			queued++
		}
		// Most steps wait for the device, as an iteration's end does; the
		// others leave the copy queued for the next Upload to wait for.
		if async && rng.IntN(3) == 0 {
			prev = m
			continue
		}
		require.NoError(t, b.Synchronize(ctx))
		if i := bytediff.First(want, device[:mb.OffScheduler]); i >= 0 {
			t.Fatalf("step %d: device byte %d = %#x, Encode says %#x", step, i, device[i], want[i])
		}
		for i, v := range device[mb.OffScheduler:] {
			require.Equal(t, byte(0xFF), v, "step %d: scheduler byte %d", step, i)
		}
		prev = m
	}
	if async {
		require.Empty(t, ab.Violations(), "staging words rewritten while a copy was queued")
		require.Greater(t, queued, 100, "uploads went out as queued copies")
		require.Greater(t, ab.Waits(), 10, "uploads found an earlier copy queued and waited for it")
		t.Logf("%d copies, %d queued at Upload's return, %d waits", ab.Copies(), queued, ab.Waits())
	}
}

// TestUploadKeepingMatchesEncode: a decode loop's builds that keep the
// rows whose page list did not change (metadata.Plan.BuildKeeping) and
// uploads that skip them (UploadKeeping) leave the device holding exactly
// Encode's bytes after every upload, and the kept Metadata equal to a full
// build, through page lists changing, batches reordered, builds that fail
// half way, uploads refused after a successful build, and an invalidated
// mirror.
func TestUploadKeepingMatchesEncode(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	const maxSeqs, stride, numPages, pageSize = 6, 16, 64, 4
	b := cpu.New(1)
	defer b.Close()
	mb, err := mla.NewMetadataBuffers(b, maxSeqs, stride)
	require.NoError(t, err)
	device := cpu.Bytes(mb.Buf)
	params := metadata.Params{Heads: 2, PageSize: pageSize, MaxPositions: pageSize * stride, Scheduler: metadata.DefaultSchedulerParams()}
	// Each sequence's page list and its state number (a new number at
	// every change, as kvcache numbers them).
	pages := map[uint64][]int32{}
	state := map[uint64]uint64{}
	cached := map[uint64]int{}
	next := uint64(0)
	change := func(s uint64) {
		next++
		state[s] = next
		p := make([]int32, stride)
		for j := range p {
			p[j] = int32(rng.IntN(numPages))
		}
		pages[s] = p
	}
	seqs := []uint64{1, 2, 3, 4, 5, 6}
	for _, s := range seqs {
		change(s)
		cached[s] = rng.IntN(pageSize * 8)
	}
	var keeper metadata.RowKeeper
	reuse := &metadata.Metadata{}
	kept := 0
	for step := range 300 {
		n := 1 + rng.IntN(maxSeqs)
		if rng.IntN(8) == 0 {
			rng.Shuffle(len(seqs), func(i, j int) { seqs[i], seqs[j] = seqs[j], seqs[i] })
		}
		for _, s := range seqs[:n] {
			if rng.IntN(4) == 0 {
				change(s)
			}
			if rng.IntN(3) == 0 && cached[s] < pageSize*(stride-2) {
				cached[s]++
			}
		}
		reqs := make([]metadata.Request, n)
		for i, s := range seqs[:n] {
			reqs[i] = metadata.Request{Seq: s, Phase: metadata.Generation}
		}
		plan, err := metadata.NewPlan(reqs, func(s uint64) (int, bool, error) { return cached[s], true, nil }, params)
		require.NoError(t, err)
		appendTable := func(dst []int32, b int, s uint64) ([]int32, error) { return append(dst, pages[s]...), nil }
		states := make([]uint64, n)
		for i, s := range seqs[:n] {
			states[i] = state[s]
		}
		if rng.IntN(15) == 0 { // a build that fails half way
			fail := rng.IntN(n)
			failStates := append([]uint64(nil), states...)
			failStates[fail] = 0 // unknown: rebuilt, so the failing append runs
			_, err := plan.BuildKeeping(reuse, &keeper, func(dst []int32, b int, s uint64) ([]int32, error) {
				if b == fail {
					return dst, errors.New("no table")
				}
				return appendTable(dst, b, s)
			}, failStates)
			require.Error(t, err)
		}
		m, err := plan.BuildKeeping(reuse, &keeper, appendTable, states)
		require.NoError(t, err, "step %d", step)
		full, err := plan.BuildAppend(nil, appendTable)
		require.NoError(t, err)
		require.Equal(t, full, m, "step %d: the kept build differs from a full one", step)
		if _, from, rows, rebuilt := keeper.Kept(); from != 0 {
			kept += rows - len(rebuilt)
		}
		if rng.IntN(12) == 0 { // an upload refused after the build
			require.Error(t, mb.UploadKeeping(b, m, 1, &keeper), "step %d", step)
			// The next build keeps rows from this one, which the device never got.
			for _, s := range seqs[:n] {
				if rng.IntN(2) == 0 {
					change(s)
				}
			}
			continue
		}
		if rng.IntN(40) == 0 {
			mb.Invalidate()
		}
		want, err := mb.Encode(m, numPages)
		require.NoError(t, err)
		require.NoError(t, mb.UploadKeeping(b, m, numPages, &keeper), "step %d", step)
		if i := bytediff.First(want, device[:mb.OffScheduler]); i >= 0 {
			t.Fatalf("step %d: device byte %d = %#x, Encode says %#x", step, i, device[i], want[i])
		}
	}
	require.Greater(t, kept, 100, "rows kept over the steps")
	t.Logf("%d rows kept", kept)
}
