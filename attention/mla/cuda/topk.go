package cuda

import (
	"context"
	"errors"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The indexer's top-k selection on the device (DESIGN.md section 9,
// "Selection"): a score kernel then a select kernel of kernels/cuda/topk.cu,
// bit-identical to the CPU backend's IndexerTopK. The module is compiled
// and loaded at first use (LoadTopK).

// topkState is the top-k module.
type topkState struct {
	mod                *driver.Module
	score, mma4x       *driver.Function
	select4n, select5e *driver.Function
	err                error // a failed load, returned by every later call
	// kernel is the score kernel the backend launches; every one writes
	// the same keys.
	kernel topkScore
	// sel is the select kernel; every one gives the same indices.
	sel topkSelect
}

// topkSelect names a select kernel of topk.cu (and, for tests, a shared
// memory that sends its rows another way).
type topkSelect int

const (
	topkSelectDefault  topkSelect = iota // topkDefaultSelect, or topkNarrowSelect by Knobs.TopKSelectNarrowAt
	topkSelect4N                         // topk_select4n: a radix select of 4 passes in blocks of abi.TopKSelect4NThreads
	topkSelect4NSmall                    // topk_select4n with topkSelectSmallBytes: the rows of a 64K context take its candidate sweep
	topkSelect4NGlobal                   // topk_select4n without shared memory: every row reads its keys from global memory
	topkSelect5E                         // topk_select5e: up to three radix passes where the keys fit, in blocks of abi.TopKSelectThreads
	topkSelect5ESmall                    // topk_select5e with topkSelectSmallBytes
)

// topkDefaultSelect is the select kernel IndexerTopK launches unless a
// test picks another or Knobs.TopKSelectNarrowAt sends the launch to
// topkNarrowSelect: topk_select5e, topk_select5 (three radix passes of 11,
// 11 and 10 bits where the keys fit shared memory; a candidate sweep past
// 128K context) ending at the first pass whose bin's keys are all taken:
// the same indices on the H200 in every top-k test (conformance, graph,
// large with the 1M-token scenarios; memcheck 0 errors, racecheck 0
// hazards) and, with topk_score_mma4x, faster at decode 8K (b=32 MTP 3,
// us a layer: 29.2-29.4 against topk_select5's 29.9-30.4; the select alone
// 6.6-6.7 against 7.1-8.2; narrow scales 25.1-25.2 against 25.8-26.1;
// index_topk 1024 29.3-29.6 against 30.1-30.5; in a 1M-token block table
// 29.2-29.3 against 30.0-30.8) and at prefill 16K in a 1M-token table
// (2574.7-2588.0 against 2664.1-2664.8), the same from 64K to 1M (64K
// 157.8-158.3 against 158.1-158.8, 1M 2264.9-2283.5 against
// 2284.1-2285.3; bench/results/2026-12-02-h200-k/tsel/call2). topk_select5
// was the default since 2026-12-02-h200-i/topkp (faster than topk_select4,
// its four passes of 8 bits, at 8K and 64K).
const topkDefaultSelect = topkSelect5E

// topkNarrowSelect is the select kernel of a launch that
// Knobs.TopKSelectNarrowAt sends to blocks of abi.TopKSelect4NThreads:
// topk_select4n, which at prefill 16K (16,384 rows of up to 4,096 keys)
// takes 295.9-298.8 us against topk_select4's 755.2-755.3 (the same kernel
// in blocks of 1024), and topk_select5n's 306.8-308.5 (its histograms' 24
// KiB keep fewer blocks a multiprocessor;
// bench/results/2026-12-02-h200-i/topkp/call1).
const topkNarrowSelect = topkSelect4N

// topkSelectKeys caps a select kernel's dynamic shared memory: the keys of
// a row at 128K context (32,768 entries, 128 KiB); a row with more takes
// the candidate sweep.
const topkSelectKeys = 32768

// topkSelectSmallBytes is the shared memory a test gives a select kernel
// so that a row of 16K keys (64K context) takes its candidate sweep, with
// room for 3,072 candidates (twice V4-Pro's index_topk and more).
const topkSelectSmallBytes = 40 << 10

// topkScore names a score kernel of topk.cu.
type topkScore int

const (
	// topkScoreMMA4X is topk_score_mma4x, the default: bit-exact with the
	// CPU backend in every top-k test (conformance, graph, large with the
	// 1M-token scenarios; compute-sanitizer memcheck and racecheck over
	// the conformance in bench/results/2026-12-02-h200-j/tscore/call2) and
	// faster than every kernel before it at every shape measured
	// (.../tscore/call1, decode b=32 MTP 3, index_topk 512, score alone,
	// us, against topk_score_mma4u: 23.2-23.6 / 29.8 at 8K, 142.0-144.5 /
	// 154.2-154.4 at 64K, 276.0 / 296.6-297.7 at 128K; with narrow scales
	// 20.0-20.4 / 25.6-26.1, 84.6-85.4 / 105.3-105.7, 155.0-155.9 /
	// 192.6-193.1; prefill 16K 2128-2130 / 2229-2249).
	topkScoreMMA4X topkScore = iota
	// topkScoreDP4A is topk_score: one row a block, one entry a thread,
	// dp4a (no tensor cores); the tests' second implementation.
	topkScoreDP4A
)

// topkTileBlocksPerSM sets topk_score's grid: about this many blocks a
// multiprocessor over the launch's rows (each block loops over the tiles
// of its row), so that a decode batch fills the device whatever its
// context and a prefill batch's many rows take one block each.
const topkTileBlocksPerSM = 16

// topkMMA4XBlocksPerSM is topk_score_mma4x's resident blocks a
// multiprocessor (its __launch_bounds__ minimum): its grid is at most one
// wave of them over the launch's row groups, so that each block scores
// many tiles for the one decoding of its rows' queries.
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
	var fns [4]*driver.Function
	for i, name := range []string{kernels.TopKScoreKernel, kernels.TopKScoreMMA4XKernel, kernels.TopKSelect4NKernel, kernels.TopKSelect5EKernel} {
		fn, err := mod.Function(name)
		if err == nil && i == 1 {
			// Past the default 48 KiB of dynamic shared memory; two blocks
			// a multiprocessor need the whole carveout as shared memory.
			err = errors.Join(fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, abi.TopKScore4XShared),
				fn.SetAttribute(driver.FuncPreferredSharedCarveout, 100))
		} else if err == nil && i > 1 {
			err = fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, 4*topkSelectKeys)
		}
		if err != nil {
			s.err = errors.Join(fmt.Errorf("cuda: top-k kernels: %w", err), mod.Unload())
			return s.err
		}
		fns[i] = fn
	}
	s.mod = mod
	s.score, s.mma4x, s.select4n, s.select5e = fns[0], fns[1], fns[2], fns[3]
	return nil
}

// topkGrid is topk_score's tile blocks a row for a launch of rows rows:
// at least 1, at most the tiles of a row at MaxTopKEntries.
func topkGrid(sms, rows int) int {
	maxTiles := (mla.MaxTopKEntries + abi.TopKScoreThreads - 1) / abi.TopKScoreThreads
	return max(1, min(maxTiles, (topkTileBlocksPerSM*sms+rows-1)/max(rows, 1)))
}

// topkGrid4X is topk_score_mma4x's grid for a launch of rows rows: a block
// for each group of TopKScore4Rows rows, and tile blocks a group so that
// all of them are resident at once (at least 1, at most the tiles of a row
// at MaxTopKEntries).
func topkGrid4X(sms, rows int) (groups, tiles int) {
	groups = (rows + abi.TopKScore4Rows - 1) / abi.TopKScore4Rows
	maxTiles := (mla.MaxTopKEntries + abi.TopKScore4XThreads - 1) / abi.TopKScore4XThreads
	return groups, max(1, min(maxTiles, topkMMA4XBlocksPerSM*sms/max(groups, 1)))
}

// IndexerTopK implements mla.TopKSelector: topk_score_mma4x (unless a
// test picks topk_score) then a select kernel (topkDefaultSelect, or
// topkNarrowSelect by the knobs' rule) on the backend's current stream,
// with programmatic dependent launch like the other kernels. The grids and shared memory depend on the shape only (Rows,
// PageStride, PageSize, and MaxRowKeys where given), so a CUDA graph
// captures them once for every plan; the kernels read the rows' sequences,
// positions and tables from the plan.
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
	// The most keys a row of the launch can have: the block table's
	// entries, or the plan's own bound where the caller gives one (a
	// select kernel takes a row past its shared memory the global way, so
	// a graph captured under the bound stays right for any later plan).
	keys := a.PageStride * a.PageSize
	if a.MaxRowKeys > 0 {
		keys = min(keys, a.MaxRowKeys)
	}
	sms := b.ctx.Props().SMCount
	if scoring {
		fn, grid, block, shared := b.topk.mma4x, driver.Dim3{}, uint32(abi.TopKScore4XThreads), abi.TopKScore4XShared
		if b.topk.kernel == topkScoreDP4A {
			fn, grid, block, shared = b.topk.score, driver.Dim3{uint32(a.Rows), uint32(topkGrid(sms, a.Rows)), 1}, abi.TopKScoreThreads, 0
		} else {
			groups, tiles := topkGrid4X(sms, a.Rows)
			grid = driver.Dim3{uint32(groups), uint32(tiles), 1}
		}
		if err := b.launchShared(fn, grid, driver.Dim3{block, 1, 1}, shared, driver.Bytes(params)); err != nil {
			return fmt.Errorf("cuda: top-k score: %w", err)
		}
	}
	if !selecting {
		return nil
	}
	sel := b.topk.sel
	if sel == topkSelectDefault {
		sel = topkDefaultSelect
		if b.knobs.TopKSelectNarrowAt(a.Rows, keys) {
			sel = topkNarrowSelect
		}
	}
	fn, shared, threads := b.topk.select5e, 4*min(topkSelectKeys, keys), abi.TopKSelectThreads
	switch sel {
	case topkSelect4N:
		fn, threads = b.topk.select4n, abi.TopKSelect4NThreads
	case topkSelect4NSmall:
		fn, shared, threads = b.topk.select4n, topkSelectSmallBytes, abi.TopKSelect4NThreads
	case topkSelect4NGlobal:
		fn, shared, threads = b.topk.select4n, 0, abi.TopKSelect4NThreads
	case topkSelect5ESmall:
		shared = topkSelectSmallBytes
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
