package cuda

import (
	"context"
	"errors"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The indexer's top-k selection on the device (DESIGN.md section 9,
// "Selection"): topk_score then topk_select of kernels/cuda/topk.cu,
// bit-identical to the CPU backend's IndexerTopK. The module is compiled
// and loaded at first use (LoadTopK).

// topkState is the top-k module.
type topkState struct {
	mod                                 *driver.Module
	score, scoreMMA, scoreMMA4, select_ *driver.Function
	scoreMMA4P, scoreMMA4Q              *driver.Function
	scoreMMA4T, scoreMMA4U, scoreMMA4V  *driver.Function
	scoreMMA4W, scoreMMA4X              *driver.Function
	select2, select3, select4           *driver.Function
	select4n, select5, select5n         *driver.Function
	select6                             *driver.Function
	err                                 error // a failed load, returned by every later call
	// kernel is the score kernel the backend launches; every one writes
	// the same keys.
	kernel topkScore
	// sel is the select kernel; every one gives the same indices.
	sel topkSelect
}

// topkSelect names a select kernel of topk.cu.
type topkSelect int

const (
	topkSelectDefault  topkSelect = iota // topkDefaultSelect
	topkSelectRadix                      // topk_select
	topkSelect2                          // topk_select2, the keys in shared memory where they fit
	topkSelect2Global                    // topk_select2 without shared memory: every row reads its keys from global memory
	topkSelect3                          // topk_select3: topk_select2, a sampled candidate sweep where the keys do not fit
	topkSelect3Small                     // topk_select3 with topkSelect3SmallBytes: the rows of a 64K context take the sweep
	topkSelect4                          // topk_select4: topk_select3 with a row's fixed cost cut
	topkSelect4Small                     // topk_select4 with topkSelect3SmallBytes
	topkSelect4Global                    // topk_select4 without shared memory: every row reads its keys from global memory
	topkSelect4N                         // topk_select4n: topk_select4 in blocks of abi.TopKSelect4NThreads
	topkSelect4NSmall                    // topk_select4n with topkSelect3SmallBytes
	topkSelect4NGlobal                   // topk_select4n without shared memory
	topkSelect5                          // topk_select5: topk_select4 with three radix passes where the keys fit
	topkSelect5Small                     // topk_select5 with topkSelect3SmallBytes
	topkSelect5N                         // topk_select5n: topk_select5 in blocks of abi.TopKSelect4NThreads
	topkSelect6                          // topk_select6: topk_select5 with a short row's keys in registers
)

// topkDefaultSelect is the select kernel IndexerTopK launches unless a
// test picks another or Knobs.TopKSelectNarrowAt sends the launch to
// topkNarrowSelect: topk_select5, the same indices as topk_select4 on the
// H200 in every top-k test (conformance, graph, large with the 1M-token
// scenarios and its candidate sweep) and, with topk_score_mma4u at decode
// b=32 MTP 3, faster at 8K (us a layer: 36.0-36.4 against 36.8-37.1; the
// select alone 6.9-7.1 against 7.6-7.7) and 64K (170.1-170.2 against
// 174.3-174.5; alone 16.6-16.9 against 21.2-21.9;
// bench/results/2026-12-02-h200-i/topkp/call1). Its rows past shared memory
// (past 128K context) take topk_select4's way. topk_select6 (the keys in
// registers) was no faster (7.1-7.2 and 17.0 alone).
const topkDefaultSelect = topkSelect5

// topkNarrowSelect is the select kernel of a launch that
// Knobs.TopKSelectNarrowAt sends to blocks of abi.TopKSelect4NThreads:
// topk_select4n, which at prefill 16K (16,384 rows of up to 4,096 keys)
// takes 295.9-298.8 us against topk_select4's 755.2-755.3, and
// topk_select5n's 306.8-308.5 (its histograms' 24 KiB keep fewer blocks a
// multiprocessor; bench/results/2026-12-02-h200-i/topkp/call1).
const topkNarrowSelect = topkSelect4N

// topkSelect2Keys caps topk_select2's dynamic shared memory: the keys of
// a row at 128K context (32,768 entries, 128 KiB); a row with more reads
// its keys from global memory.
const topkSelect2Keys = 32768

// topkSelect3SmallBytes is the shared memory a test gives topk_select3 so
// that a row of 16K keys (64K context) takes its candidate sweep, with
// room for 3,072 candidates (twice V4-Pro's index_topk and more).
const topkSelect3SmallBytes = 40 << 10

// topkScore names a score kernel of topk.cu.
type topkScore int

const (
	topkScoreDefault topkScore = iota // topkKnobScore(Knobs.TopKScore)
	topkScoreMMA                      // topk_score_mma: one row a block, int8 mma.sync block dots
	topkScoreDP4A                     // topk_score: one row a block, one entry a thread, dp4a
	topkScoreMMA4                     // topk_score_mma4: four rows of a sequence a block, mma.sync
	topkScoreMMA4P                    // topk_score_mma4p: topk_score_mma4 with its loads pipelined
	topkScoreMMA4Q                    // topk_score_mma4q: topk_score_mma4p with a shorter nibble decode
	topkScoreMMA4T                    // topk_score_mma4t: topk_score_mma4q, its exact path two head pairs a step block by block, no C copies
	topkScoreMMA4U                    // topk_score_mma4u: topk_score_mma4t with four head pairs a step
	topkScoreMMA4V                    // topk_score_mma4v: topk_score_mma4t with mma4u's fast path, a tile's entries copied in 16-byte chunks
	topkScoreMMA4W                    // topk_score_mma4w: topk_score_mma4v with the block's values permuted along k (a key word decoded once)
	topkScoreMMA4X                    // topk_score_mma4x: topk_score_mma4w in blocks of 8 warps, fewer loads and multiplies a head pair
)

// topkKnobScore is the score kernel IndexerTopK launches unless a test
// picks another: the one cudatune.Knobs.TopKScore names (SM90.Knobs says
// why it is the default). Every one computes the same keys.
func topkKnobScore(k cudatune.TopKScore) topkScore {
	switch k {
	case cudatune.TopKScoreMMA4T:
		return topkScoreMMA4T
	case cudatune.TopKScoreMMA4U:
		return topkScoreMMA4U
	case cudatune.TopKScoreMMA4V:
		return topkScoreMMA4V
	case cudatune.TopKScoreMMA4W:
		return topkScoreMMA4W
	case cudatune.TopKScoreMMA4X:
		return topkScoreMMA4X
	}
	return topkScoreMMA4Q
}

// topkTileBlocksPerSM sets topk_score's and topk_score_mma's grid: about
// this many blocks a multiprocessor over the launch's rows (each block
// loops over the tiles of its row), so that a decode batch fills the
// device whatever its context and a prefill batch's many rows take one
// block each.
const topkTileBlocksPerSM = 16

// topkMMA4BlocksPerSM is topk_score_mma4's resident blocks a
// multiprocessor (its __launch_bounds__ minimum): its grid is at most one
// wave of them over the launch's row groups, so that each block scores
// many tiles for the one decoding of its rows' queries.
const topkMMA4BlocksPerSM = 4

// topkMMA4XBlocksPerSM is topk_score_mma4x's (blocks of
// abi.TopKScore4XThreads).
const topkMMA4XBlocksPerSM = 2

// LoadTopK compiles (or loads from the cache) the top-k module if it is
// not loaded yet. IndexerTopK calls it; an engine calls it at setup so
// that no module loads during a graph capture.
func (b *Backend) LoadTopK() error {
	s := &b.topk
	if s.mod != nil || s.err != nil {
		return s.err
	}
	mod, err := b.load(topkProgram)
	if err != nil {
		s.err = fmt.Errorf("cuda: top-k kernels: %w", err)
		return s.err
	}
	score, err := mod.Function(kernels.TopKScoreKernel)
	if err != nil {
		s.err = errors.Join(fmt.Errorf("cuda: top-k kernels: %w", err), mod.Unload())
		return s.err
	}
	scoreMMA, err := mod.Function(kernels.TopKScoreMMAKernel)
	if err != nil {
		s.err = errors.Join(fmt.Errorf("cuda: top-k kernels: %w", err), mod.Unload())
		return s.err
	}
	scoreMMA4, err := mod.Function(kernels.TopKScoreMMA4Kernel)
	if err != nil {
		s.err = errors.Join(fmt.Errorf("cuda: top-k kernels: %w", err), mod.Unload())
		return s.err
	}
	var pipelined [7]*driver.Function
	for i, name := range []string{kernels.TopKScoreMMA4PKernel, kernels.TopKScoreMMA4QKernel, kernels.TopKScoreMMA4TKernel, kernels.TopKScoreMMA4UKernel,
		kernels.TopKScoreMMA4VKernel, kernels.TopKScoreMMA4WKernel, kernels.TopKScoreMMA4XKernel} {
		fn, err := mod.Function(name)
		if err == nil {
			// Their dynamic shared memory is past the default 48 KiB; four
			// blocks a multiprocessor (mma4x: two) need the whole carveout
			// as shared memory.
			shared := abi.TopKScore4PShared
			if name == kernels.TopKScoreMMA4XKernel {
				shared = abi.TopKScore4XShared
			}
			err = errors.Join(fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, shared),
				fn.SetAttribute(driver.FuncPreferredSharedCarveout, 100))
		}
		if err != nil {
			s.err = errors.Join(fmt.Errorf("cuda: top-k kernels: %w", err), mod.Unload())
			return s.err
		}
		pipelined[i] = fn
	}
	sel, err := mod.Function(kernels.TopKSelectKernel)
	if err != nil {
		s.err = errors.Join(fmt.Errorf("cuda: top-k kernels: %w", err), mod.Unload())
		return s.err
	}
	var sels [7]*driver.Function
	for i, name := range []string{kernels.TopKSelect2Kernel, kernels.TopKSelect3Kernel, kernels.TopKSelect4Kernel, kernels.TopKSelect4NKernel,
		kernels.TopKSelect5Kernel, kernels.TopKSelect5NKernel, kernels.TopKSelect6Kernel} {
		fn, err := mod.Function(name)
		if err == nil {
			err = fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, 4*topkSelect2Keys)
		}
		if err != nil {
			s.err = errors.Join(fmt.Errorf("cuda: top-k kernels: %w", err), mod.Unload())
			return s.err
		}
		sels[i] = fn
	}
	sel2 := sels[0]
	s.mod, s.score, s.scoreMMA, s.scoreMMA4, s.select_, s.select2 = mod, score, scoreMMA, scoreMMA4, sel, sel2
	s.scoreMMA4P, s.scoreMMA4Q, s.select3, s.select4 = pipelined[0], pipelined[1], sels[1], sels[2]
	s.scoreMMA4T, s.scoreMMA4U, s.scoreMMA4V, s.scoreMMA4W, s.scoreMMA4X = pipelined[2], pipelined[3], pipelined[4], pipelined[5], pipelined[6]
	s.select4n, s.select5, s.select5n, s.select6 = sels[3], sels[4], sels[5], sels[6]
	return nil
}

// topkGrid is topk_score's tile blocks a row for a launch of rows rows:
// at least 1, at most the tiles of a row at MaxTopKEntries.
func topkGrid(sms, rows int) int {
	maxTiles := (mla.MaxTopKEntries + abi.TopKScoreThreads - 1) / abi.TopKScoreThreads
	return max(1, min(maxTiles, (topkTileBlocksPerSM*sms+rows-1)/max(rows, 1)))
}

// topkGrid4 is topk_score_mma4's grid for a launch of rows rows: a block
// for each group of TopKScore4Rows rows, and tile blocks a group so that
// all of them are resident at once (at least 1, at most the tiles of a row
// at MaxTopKEntries).
func topkGrid4(sms, rows int) (groups, tiles int) {
	return topkGrid4For(sms, rows, abi.TopKScore4Threads, topkMMA4BlocksPerSM)
}

// topkGrid4For is topkGrid4 for a kernel of threads entries a tile and
// perSM resident blocks a multiprocessor.
func topkGrid4For(sms, rows, threads, perSM int) (groups, tiles int) {
	groups = (rows + abi.TopKScore4Rows - 1) / abi.TopKScore4Rows
	maxTiles := (mla.MaxTopKEntries + threads - 1) / threads
	return groups, max(1, min(maxTiles, perSM*sms/max(groups, 1)))
}

// IndexerTopK implements mla.TopKSelector: a score kernel
// (the one Knobs.TopKScore names unless a test picks another) then a select kernel
// (topkDefaultSelect) on the backend's current stream, with programmatic
// dependent launch like the other kernels. The grids and shared memory
// depend on the shape only (Rows, PageStride, PageSize, and MaxRowKeys
// where given), so a CUDA graph captures them once for every plan; the
// kernels read the rows' sequences, positions and tables from the plan.
func (b *Backend) IndexerTopK(ctx context.Context, a *mla.TopKArgs) error {
	return b.indexerTopK(ctx, a, true, true)
}

// indexerTopK is IndexerTopK launching the score kernel, the select
// kernel or both (the benchmark times the two apart).
func (b *Backend) indexerTopK(ctx context.Context, a *mla.TopKArgs, scoring, selecting bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Rows == 0 {
		return nil
	}
	if err := b.LoadTopK(); err != nil {
		return err
	}
	ptr := func(name string, buf mla.Buffer, off, n int) (uint64, error) {
		if n == 0 {
			return 0, nil
		}
		p, err := span(buf, off, n)
		if err != nil {
			return 0, fmt.Errorf("cuda: indexer top-k: %s: %w", name, err)
		}
		return uint64(p), nil
	}
	var addr [6]uint64
	for i, f := range []struct {
		name     string
		buf      mla.Buffer
		off, len int
	}{
		{"Q", a.Q, 0, a.Rows * mla.IndexerHeads * mla.IndexerEntryBytes},
		{"W", a.W, 0, a.Rows * mla.IndexerHeads * 2},
		{"Cache", a.Cache, 0, a.NumPages * a.PageBytes()},
		{"Plan", a.Plan, a.PlanOffset, a.PlanBytes()},
		{"Scratch", a.Scratch, 0, 4 * a.ScratchEntries},
		{"Out", a.Out, 0, 4 * a.Rows * a.TopK},
	} {
		var err error
		if addr[i], err = ptr(f.name, f.buf, f.off, f.len); err != nil {
			return err
		}
	}
	p := abi.TopKParams.Pack()
	p.Ptr(abi.TopKQ, addr[0])
	p.Ptr(abi.TopKW, addr[1])
	p.Ptr(abi.TopKCache, addr[2])
	p.Ptr(abi.TopKPlan, addr[3])
	p.Ptr(abi.TopKScratch, addr[4])
	p.Ptr(abi.TopKOut, addr[5])
	p.I32(abi.TopKRows, int32(a.Rows))
	p.I32(abi.TopKTopK, int32(a.TopK))
	p.I32(abi.TopKMaxSeqs, int32(a.MaxSeqs))
	p.I32(abi.TopKPageStride, int32(a.PageStride))
	p.I32(abi.TopKPageSize, int32(a.PageSize))
	p.I32(abi.TopKNumPages, int32(a.NumPages))
	p.I32(abi.TopKScratchEntries, int32(a.ScratchEntries))
	params, err := p.Bytes()
	if err != nil {
		return err
	}
	if scoring {
		sms := b.ctx.Props().SMCount
		kernel := b.topk.kernel
		if kernel == topkScoreDefault {
			kernel = topkKnobScore(b.knobs.TopKScore)
		}
		fn, grid, block, shared := b.topk.scoreMMA, driver.Dim3{uint32(a.Rows), uint32(topkGrid(sms, a.Rows)), 1}, uint32(abi.TopKScoreThreads), 0
		switch kernel {
		case topkScoreDP4A:
			fn = b.topk.score
		case topkScoreMMA4X:
			groups, tiles := topkGrid4For(sms, a.Rows, abi.TopKScore4XThreads, topkMMA4XBlocksPerSM)
			fn, grid, block, shared = b.topk.scoreMMA4X, driver.Dim3{uint32(groups), uint32(tiles), 1}, abi.TopKScore4XThreads, abi.TopKScore4XShared
		case topkScoreMMA4, topkScoreMMA4P, topkScoreMMA4Q, topkScoreMMA4T, topkScoreMMA4U, topkScoreMMA4V, topkScoreMMA4W:
			groups, tiles := topkGrid4(sms, a.Rows)
			fn, grid, block = b.topk.scoreMMA4, driver.Dim3{uint32(groups), uint32(tiles), 1}, abi.TopKScore4Threads
			switch kernel {
			case topkScoreMMA4P:
				fn, shared = b.topk.scoreMMA4P, abi.TopKScore4PShared
			case topkScoreMMA4Q:
				fn, shared = b.topk.scoreMMA4Q, abi.TopKScore4PShared
			case topkScoreMMA4T:
				fn, shared = b.topk.scoreMMA4T, abi.TopKScore4PShared
			case topkScoreMMA4U:
				fn, shared = b.topk.scoreMMA4U, abi.TopKScore4PShared
			case topkScoreMMA4V:
				fn, shared = b.topk.scoreMMA4V, abi.TopKScore4PShared
			case topkScoreMMA4W:
				fn, shared = b.topk.scoreMMA4W, abi.TopKScore4PShared
			}
		}
		if err := b.launchShared(fn, grid, driver.Dim3{block, 1, 1}, shared, driver.Bytes(params)); err != nil {
			return fmt.Errorf("cuda: top-k score: %w", err)
		}
	}
	if !selecting {
		return nil
	}
	// The most keys a row of the launch can have: the block table's
	// entries, or the plan's own bound where the caller gives one (a
	// select kernel takes a row past its shared memory the global way, so
	// a graph captured under the bound stays right for any later plan).
	keys := a.PageStride * a.PageSize
	if a.MaxRowKeys > 0 {
		keys = min(keys, a.MaxRowKeys)
	}
	sel := b.topk.sel
	if sel == topkSelectDefault {
		sel = topkDefaultSelect
		if b.knobs.TopKSelectNarrowAt(a.Rows, keys) {
			sel = topkNarrowSelect
		}
	}
	fn, shared, threads := b.topk.select_, 0, abi.TopKSelectThreads
	switch sel {
	case topkSelect2:
		fn, shared = b.topk.select2, 4*min(topkSelect2Keys, keys)
	case topkSelect2Global:
		fn = b.topk.select2
	case topkSelect3:
		fn, shared = b.topk.select3, 4*min(topkSelect2Keys, keys)
	case topkSelect3Small:
		fn, shared = b.topk.select3, topkSelect3SmallBytes
	case topkSelect4:
		fn, shared = b.topk.select4, 4*min(topkSelect2Keys, keys)
	case topkSelect4Small:
		fn, shared = b.topk.select4, topkSelect3SmallBytes
	case topkSelect4Global:
		fn = b.topk.select4
	case topkSelect4N:
		fn, shared, threads = b.topk.select4n, 4*min(topkSelect2Keys, keys), abi.TopKSelect4NThreads
	case topkSelect4NSmall:
		fn, shared, threads = b.topk.select4n, topkSelect3SmallBytes, abi.TopKSelect4NThreads
	case topkSelect4NGlobal:
		fn, threads = b.topk.select4n, abi.TopKSelect4NThreads
	case topkSelect5:
		fn, shared = b.topk.select5, 4*min(topkSelect2Keys, keys)
	case topkSelect5Small:
		fn, shared = b.topk.select5, topkSelect3SmallBytes
	case topkSelect5N:
		fn, shared, threads = b.topk.select5n, 4*min(topkSelect2Keys, keys), abi.TopKSelect4NThreads
	case topkSelect6:
		fn, shared = b.topk.select6, 4*min(topkSelect2Keys, keys)
	}
	if err := b.launchShared(fn, driver.Dim3{uint32(a.Rows), 1, 1}, driver.Dim3{uint32(threads), 1, 1}, shared, driver.Bytes(params)); err != nil {
		return fmt.Errorf("cuda: %s: %w", fn.Name, err)
	}
	return nil
}

// closeTopK releases the top-k module.
func (b *Backend) closeTopK() error {
	if b.topk.mod == nil {
		return nil
	}
	err := b.topk.mod.Unload()
	b.topk = topkState{kernel: b.topk.kernel, sel: b.topk.sel}
	return err
}

var _ mla.TopKSelector = (*Backend)(nil)
