package cuda

import (
	"context"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/numerics"
)

// IndexerQuery implements mla.IndexerQuerier: the kernel of
// kernels/cuda/indexer.cu that Knobs.IndexerQueryAt names for the launch's
// rows (in the compressor's module; indexer_query, indexer_query_early,
// indexer_query_lean, indexer_query_wide, indexer_query_stream or
// indexer_query_lane, all the same bytes) on the backend's
// current stream, one warp per abi.IndexerQueryRows (token, head) rows
// (abi.IndexerQueryWideRows for the wide and stream kernels, 32 for the
// lane kernel) in a's Format, with the
// Q prologue's Params (kernels/cuda/abi) for the token's position and its
// own IndexerQueryParams (the head weights, the format): the grid depends on
// the launch's Rows only, so a CUDA graph replays it for any batch of its
// padded size (FromHeader launches).
func (b *Backend) IndexerQuery(ctx context.Context, l mla.Launch, a *mla.IndexerQueryArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(l.RowBegin + l.Rows); err != nil {
		return err
	}
	if l.Rows == 0 {
		return nil
	}
	if err := b.LoadCompressor(); err != nil {
		return err
	}
	p, err := indexerParams(make([]byte, abi.Params.Size()), l, a)
	if err != nil {
		return err
	}
	iq, err := indexerQueryParams(a)
	if err != nil {
		return err
	}
	// rowsWarp (token, head) rows a warp, warpsBlock warps a block, at most
	// perSM blocks a multiprocessor (MaxBlocks overrides): the warp
	// kernels loop over their units, so a smaller grid writes the same
	// bytes.
	fn, rowsWarp, warpsBlock, perSM := b.comp.iquery, abi.IndexerQueryRows, abi.IndexerQueryWarps, chainBlocksPerSM
	if n := b.knobs.IndexerQueryBlocksPerSM; n > 0 {
		perSM = min(perSM, n)
	}
	switch b.knobs.IndexerQueryAt(l.Rows) {
	case cudatune.IndexerQueryEarly:
		fn = b.comp.iqearly
	case cudatune.IndexerQueryLean:
		fn = b.comp.iqlean
	case cudatune.IndexerQueryWide:
		fn, rowsWarp = b.comp.iqwide, abi.IndexerQueryWideRows
	case cudatune.IndexerQueryStream:
		fn, rowsWarp = b.comp.iqstrm, abi.IndexerQueryWideRows
	case cudatune.IndexerQueryTok:
		// One wave, each warp a contiguous run of units.
		fn, rowsWarp, perSM = b.comp.iqtok, abi.IndexerQueryWideRows, max(b.knobs.IndexerQueryTokBlocksPerSM, 1)
	case cudatune.IndexerQueryLane:
		// 32 rows a warp; one wave of the blocks its launch bounds promise
		// a multiprocessor, each warp looping over units.
		fn, rowsWarp, warpsBlock, perSM = b.comp.iqlane, 32, abi.IndexerQueryLaneWarps, abi.IndexerQueryLaneBlocksPerSM
	}
	warps := l.Rows * mla.IndexerHeads / rowsWarp
	blocks := b.waveGrid((warps+warpsBlock-1)/warpsBlock, perSM)
	return b.launchShared(fn, driver.Dim3{blocks, 1, 1}, driver.Dim3{32 * uint32(warpsBlock), 1, 1}, 0,
		driver.Bytes(p), driver.Bytes(iq))
}

// indexerQueryParams packs indexer_query's IndexerQueryParams: the head
// weights' output, the weights_proj output's token stride, the scales and
// the format.
func indexerQueryParams(a *mla.IndexerQueryArgs) ([]byte, error) {
	wout, err := dev(a.WOut)
	if err != nil {
		return nil, err
	}
	p := abi.IndexerQueryParams.Pack()
	p.Ptr(abi.IQWOut, uint64(wout.ptr))
	p.I32(abi.IQWStride, int32(a.WStride))
	p.F32(abi.IQHScale, numerics.HadamardScale)
	p.F32(abi.IQWScale, mla.IndexerWeightScale)
	p.Bool(abi.IQFP8, a.Format == mla.IndexerQueryFP8)
	return p.Bytes()
}

// indexerParams packs the Params of one indexer query launch into dst: in
// and out are the query's input (at QOffset) and output, weight the
// weights_proj output (at WOffset), in_stride the input's token stride in
// bytes; the position fields as for the Q prologue (packParams); the cache
// and scheduler fields are unused (no scheduler write: an indexer launch
// never has WriteScheduler).
func indexerParams(dst []byte, l mla.Launch, a *mla.IndexerQueryArgs) ([]byte, error) {
	bufs := make([]*Buffer, 4)
	for i, buf := range []mla.Buffer{a.Rope, a.Q, a.QOut, a.W} {
		d, err := dev(buf)
		if err != nil {
			return nil, err
		}
		bufs[i] = d
	}
	rope, q, qout, w := bufs[0], bufs[1], bufs[2], bufs[3]
	l.WriteScheduler = false
	return packParams(dst, l, a.Meta, paramFields{
		in: q.ptr + driver.DevicePtr(a.QOffset), out: qout.ptr, weight: w.ptr + driver.DevicePtr(a.WOffset), rope: rope.ptr,
		inStride: uint64(a.QStride) * 2, heads: mla.IndexerHeads, ropePositions: a.RopePositions, scale: 1,
	})
}

var _ mla.IndexerQuerier = (*Backend)(nil)
