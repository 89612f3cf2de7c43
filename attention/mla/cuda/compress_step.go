package cuda

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
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
// compress_step_finish of kernels/cuda/compress.cu (indexer_step_finish of
// indexer.cu for the indexer's entries) on the backend's current
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
	w := a.Width()
	var kg, ape driver.DevicePtr
	var err error
	if a.KGRows > 0 {
		if kg, err = span(a.KG, 0, a.KGRows*2*w*4); err != nil {
			return fmt.Errorf("cuda: compress step: KG: %w", err)
		}
	}
	if a.APE != nil {
		if ape, err = span(a.APE, 0, a.Ratio*w*4); err != nil {
			return fmt.Errorf("cuda: compress step: APE: %w", err)
		}
	}
	ring, err := span(a.Ring, 0, a.Slots*a.RingRows*2*w*4)
	if err != nil {
		return fmt.Errorf("cuda: compress step: Ring: %w", err)
	}
	plan, err := span(a.Plan, a.PlanOffset, mla.CompressPlanBytes(a.MaxSeqs, a.MaxJobs))
	if err != nil {
		return fmt.Errorf("cuda: compress step: Plan: %w", err)
	}
	dim := a.Entry.Dim()
	norm, err := span(a.NormWeight, 0, 4*dim)
	if err != nil {
		return err
	}
	rope, err := span(a.Rope, 0, a.RopePositions*numerics.RopeDim*4)
	if err != nil {
		return err
	}
	pageBytes := a.PoolPageBytes()
	pool, err := span(a.Pool, 0, a.NumPages*pageBytes)
	if err != nil {
		return err
	}
	scratch, err := span(a.Scratch, 0, a.MaxJobs*dim*4)
	if err != nil {
		return fmt.Errorf("cuda: compress step: Scratch: %w", err)
	}
	jobBlocks := int(b.chainGrid(a.MaxJobs * abi.CompressStepTilesDim(a.Ratio, dim)))
	// The blocks that write the ring rows, a chunk of compressStoreRows rows
	// of one sequence at a time, capped by the architecture description.
	storeBlocks := min(a.MaxSeqs*((a.RingRows+compressStoreRows-1)/compressStoreRows), b.arch.CompressStoreBlocksPerSM*b.arch.SMs)
	if err := b.launchShared(b.comp.step, driver.Dim3{uint32(jobBlocks + storeBlocks), 1, 1}, driver.Dim3{compressStepThreads, 1, 1}, 0,
		kg, int32(a.KGRows), ape, ring, int32(a.RingRows), int32(a.Slots),
		plan, int32(a.MaxSeqs), int32(a.MaxJobs), int32(a.Ratio), int32(w), int32(dim), int32(a.RopePositions),
		int32(a.PageSize), int32(a.NumPages), scratch, int32(jobBlocks)); err != nil {
		return err
	}
	finishBlocks := b.chainGrid((a.MaxJobs + compressFinishWarps - 1) / compressFinishWarps)
	if a.Entry == mla.EntryIndexer {
		return b.launchShared(b.comp.ifinish, driver.Dim3{finishBlocks, 1, 1}, driver.Dim3{32 * compressFinishWarps, 1, 1}, 0,
			scratch, plan, int32(a.MaxSeqs), int32(a.MaxJobs), int32(a.KGRows), int32(a.Slots), int32(a.Ratio),
			norm, a.Eps, numerics.HadamardScale, rope, int32(a.RopePositions), pool, int32(a.PageSize), int32(a.NumPages))
	}
	return b.launchShared(b.comp.finish, driver.Dim3{finishBlocks, 1, 1}, driver.Dim3{32 * compressFinishWarps, 1, 1}, 0,
		scratch, plan, int32(a.MaxSeqs), int32(a.MaxJobs), int32(a.KGRows), int32(a.Slots), int32(a.Ratio),
		norm, a.Eps, rope, int32(a.RopePositions), pool, uint64(pageBytes), int32(a.PageSize), int32(a.NumPages))
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
