package cuda

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/numerics"
)

// Launch shapes of compress_step and compress_step_finish (kernels/cuda/abi,
// the one source the kernels read too).
const (
	// compressStepThreads is a compress_step block.
	compressStepThreads = abi.CompressStepThreads
	// compressFinishWarps is the warps of a compress_step_finish block, one
	// entry each.
	compressFinishWarps = abi.CompressFinishWarps
	// compressStoreRows is the kept rows of one store item (CSTEP_STORE_ROWS).
	compressStoreRows = abi.CompressStoreRows
)

// CompressStep implements mla.CompressStepper: compress_step then
// compress_step_finish of kernels/cuda/compress.cu, and for the indexer's
// entries indexer_step of indexer.cu alone (one launch; Knobs.IndexerKeys
// IndexerKeysSplit: compress_step then indexer_step_finish) on the
// backend's current
// stream (the main stream, or the side stream inside Side), with
// programmatic dependent launch like the other kernels. The grids depend on
// the capacities (MaxJobs, MaxSeqs, RingRows) only, so a CUDA graph
// captures them once for every plan; the kernels read the counts from the
// plan.
func (b *Backend) CompressStep(ctx context.Context, a *mla.CompressStepArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if err := b.LoadCompressor(); err != nil {
		return err
	}
	fused := a.Entry == mla.EntryIndexer && b.knobs.IndexerKeys == cudatune.IndexerKeysFused
	jobBlocks := int(b.chainGrid(a.MaxJobs * abi.CompressStepTilesDim(a.Ratio, a.Entry.Dim())))
	if fused {
		jobBlocks = int(b.chainGrid(a.MaxJobs)) // one entry a block
	}
	step, finish, err := compressStepParams(a, jobBlocks)
	if err != nil {
		return err
	}
	// The blocks that write the ring rows, a chunk of compressStoreRows rows
	// of one sequence at a time, capped by the architecture description.
	storeBlocks := min(a.MaxSeqs*((a.RingRows+compressStoreRows-1)/compressStoreRows), b.arch.CompressStoreBlocksPerSM*b.arch.SMs)
	if fused {
		// indexer_step: the pooling, the entries and the kept rows in one
		// launch (both parameter structs; the finish's scratch unused).
		return b.launchShared(b.comp.istep, driver.Dim3{uint32(jobBlocks + storeBlocks), 1, 1}, driver.Dim3{abi.IndexerStepThreads, 1, 1}, 0,
			driver.Bytes(step), driver.Bytes(finish))
	}
	if err := b.launchShared(b.comp.step, driver.Dim3{uint32(jobBlocks + storeBlocks), 1, 1}, driver.Dim3{compressStepThreads, 1, 1}, 0,
		driver.Bytes(step)); err != nil {
		return err
	}
	fn := b.comp.finish
	if a.Entry == mla.EntryIndexer {
		fn = b.comp.ifinish
	}
	finishBlocks := b.chainGrid((a.MaxJobs + compressFinishWarps - 1) / compressFinishWarps)
	return b.launchShared(fn, driver.Dim3{finishBlocks, 1, 1}, driver.Dim3{32 * compressFinishWarps, 1, 1}, 0, driver.Bytes(finish))
}

// compressStepParams packs a validated step's compress_step parameters
// (CompressStepParams, with jobBlocks blocks pooling entries) and those of
// its finish kernel (CompressFinishParams: compress_step_finish, or
// indexer_step_finish for the indexer's entries, which reads hscale).
func compressStepParams(a *mla.CompressStepArgs, jobBlocks int) (step, finish []byte, err error) {
	w := a.Width()
	var kg, ape driver.DevicePtr
	if a.KGRows > 0 {
		if kg, err = span(a.KG, a.KGOffset, int(a.KGBytes())); err != nil {
			return nil, nil, fmt.Errorf("cuda: compress step: KG: %w", err)
		}
	}
	if a.APE != nil {
		if ape, err = span(a.APE, 0, a.Ratio*w*4); err != nil {
			return nil, nil, fmt.Errorf("cuda: compress step: APE: %w", err)
		}
	}
	ring, err := span(a.Ring, 0, a.Slots*a.RingRows*2*w*4)
	if err != nil {
		return nil, nil, fmt.Errorf("cuda: compress step: Ring: %w", err)
	}
	plan, err := span(a.Plan, a.PlanOffset, mla.CompressPlanBytes(a.MaxSeqs, a.MaxJobs))
	if err != nil {
		return nil, nil, fmt.Errorf("cuda: compress step: Plan: %w", err)
	}
	dim := a.Entry.Dim()
	norm, err := span(a.NormWeight, 0, 4*dim)
	if err != nil {
		return nil, nil, err
	}
	rope, err := span(a.Rope, 0, a.RopePositions*numerics.RopeDim*4)
	if err != nil {
		return nil, nil, err
	}
	pageBytes := a.PoolPageBytes()
	pool, err := span(a.Pool, 0, a.NumPages*pageBytes)
	if err != nil {
		return nil, nil, err
	}
	scratch, err := span(a.Scratch, 0, a.MaxJobs*dim*4)
	if err != nil {
		return nil, nil, fmt.Errorf("cuda: compress step: Scratch: %w", err)
	}
	p := abi.CompressStepParams.Pack()
	p.Ptr(abi.CStepKG, uint64(kg))
	p.Ptr(abi.CStepAPE, uint64(ape))
	p.Ptr(abi.CStepRing, uint64(ring))
	p.Ptr(abi.CStepPlan, uint64(plan))
	p.Ptr(abi.CStepScratch, uint64(scratch))
	p.I32(abi.CStepKGRows, int32(a.KGRows))
	p.I32(abi.CStepKGStride, int32(a.KGRowStride()))
	p.I32(abi.CStepRingRows, int32(a.RingRows))
	p.I32(abi.CStepSlots, int32(a.Slots))
	p.I32(abi.CStepMaxSeqs, int32(a.MaxSeqs))
	p.I32(abi.CStepMaxJobs, int32(a.MaxJobs))
	p.I32(abi.CStepRatio, int32(a.Ratio))
	p.I32(abi.CStepWidth, int32(w))
	p.I32(abi.CStepDim, int32(dim))
	p.I32(abi.CStepRopePositions, int32(a.RopePositions))
	p.I32(abi.CStepPageSize, int32(a.PageSize))
	p.I32(abi.CStepNumPages, int32(a.NumPages))
	p.I32(abi.CStepJobBlocks, int32(jobBlocks))
	if step, err = p.Bytes(); err != nil {
		return nil, nil, err
	}
	f := abi.CompressFinishParams.Pack()
	f.Ptr(abi.CFinScratch, uint64(scratch))
	f.Ptr(abi.CFinPlan, uint64(plan))
	f.Ptr(abi.CFinNorm, uint64(norm))
	f.Ptr(abi.CFinRope, uint64(rope))
	f.Ptr(abi.CFinPool, uint64(pool))
	f.U64(abi.CFinPageBytes, uint64(pageBytes))
	f.I32(abi.CFinMaxSeqs, int32(a.MaxSeqs))
	f.I32(abi.CFinMaxJobs, int32(a.MaxJobs))
	f.I32(abi.CFinKGRows, int32(a.KGRows))
	f.I32(abi.CFinSlots, int32(a.Slots))
	f.I32(abi.CFinRatio, int32(a.Ratio))
	f.I32(abi.CFinRopePositions, int32(a.RopePositions))
	f.I32(abi.CFinPageSize, int32(a.PageSize))
	f.I32(abi.CFinNumPages, int32(a.NumPages))
	f.F32(abi.CFinEps, a.Eps)
	f.F32(abi.CFinHScale, numerics.HadamardScale)
	if finish, err = f.Bytes(); err != nil {
		return nil, nil, err
	}
	return step, finish, nil
}

// Side implements mla.SideRunner: the launches fn issues go to the side
// stream, after the work issued so far on the main stream; JoinKV makes
// later main-stream work wait for them (and for the KV prologue ForkKV puts
// after them on the same stream). Inside a CUDA graph capture this forks a
// branch, as ForkKV does.
func (b *Backend) Side(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s := &b.fork
	if err := b.ctx.Do(func() error {
		if err := s.forked.Record(b.stream); err != nil {
			return fmt.Errorf("cuda: side stream: %w", err)
		}
		if err := s.stream.WaitEvent(s.forked); err != nil {
			return fmt.Errorf("cuda: side stream: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	main := b.stream
	b.stream = s.stream
	err := fn()
	b.stream = main
	// Record the join even after a failure: a capture must end joined.
	if jerr := b.ctx.Do(func() error { return s.joined.Record(s.stream) }); jerr != nil && err == nil {
		err = fmt.Errorf("cuda: side stream: recording the join event: %w", jerr)
	}
	return err
}

var (
	_ mla.CompressStepper = (*Backend)(nil)
	_ mla.SideRunner      = (*Backend)(nil)
)
