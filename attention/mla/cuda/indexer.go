package cuda

import (
	"context"
	"math/bits"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/numerics"
)

// IndexerQuery implements mla.IndexerQuerier: indexer_query of
// kernels/cuda/indexer.cu (in the compressor's module) on the backend's
// current stream, one warp per (token, head) row, with the Q prologue's
// Params (kernels/cuda/abi) for the token's position: the grid depends on
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
	wout, err := dev(a.WOut)
	if err != nil {
		return err
	}
	warps := l.Rows * mla.IndexerHeads
	blocks := b.chainGrid((warps + abi.IndexerQueryWarps - 1) / abi.IndexerQueryWarps)
	return b.launchShared(b.comp.iquery, driver.Dim3{blocks, 1, 1}, driver.Dim3{32 * abi.IndexerQueryWarps, 1, 1}, 0,
		driver.Bytes(p), wout.ptr, int32(a.WStride), numerics.HadamardScale, mla.IndexerWeightScale)
}

// indexerParams packs the Params of one indexer query launch into dst: in
// and out are the query's input (at QOffset) and output, weight the
// weights_proj output (at WOffset), in_stride the input's token stride in
// bytes; the position fields as for the Q prologue (launchParams); the
// cache and scheduler fields are unused (no scheduler write).
func indexerParams(dst []byte, l mla.Launch, a *mla.IndexerQueryArgs) ([]byte, error) {
	bufs := make([]*Buffer, 5)
	for i, buf := range []mla.Buffer{a.Meta.Buf, a.Rope, a.Q, a.QOut, a.W} {
		d, err := dev(buf)
		if err != nil {
			return nil, err
		}
		bufs[i] = d
	}
	meta, rope, q, qout, w := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]
	at := func(off int) uint64 { return uint64(meta.ptr + driver.DevicePtr(off)) }
	seqLenLog2 := int32(-1)
	if l.SeqLen > 0 && l.SeqLen&(l.SeqLen-1) == 0 {
		seqLenLog2 = int32(bits.TrailingZeros(uint(l.SeqLen)))
	}
	p := abi.Params.PackInto(dst)
	p.Ptr(abi.ParamIn, uint64(q.ptr+driver.DevicePtr(a.QOffset)))
	p.Ptr(abi.ParamOut, uint64(qout.ptr))
	p.Ptr(abi.ParamWeight, uint64(w.ptr+driver.DevicePtr(a.WOffset)))
	p.Ptr(abi.ParamRope, uint64(rope.ptr))
	p.Ptr(abi.ParamCuQ, at(a.Meta.OffCuQ))
	p.Ptr(abi.ParamCached, at(a.Meta.OffCached))
	p.Ptr(abi.ParamKVLen, at(a.Meta.OffKVLen))
	p.Ptr(abi.ParamBlockTables, at(a.Meta.OffBlockTables))
	p.Ptr(abi.ParamSched, 0)
	p.Ptr(abi.ParamHdr, at(a.Meta.OffHeader))
	p.U64(abi.ParamInStride, uint64(a.QStride)*2)
	p.I32(abi.ParamRowBegin, int32(l.RowBegin))
	p.I32(abi.ParamRows, int32(l.Rows))
	p.I32(abi.ParamValidRows, int32(l.ValidRows))
	p.I32(abi.ParamSeqBegin, int32(l.SeqBegin))
	p.I32(abi.ParamNumSeqs, int32(l.NumSeqs))
	p.I32(abi.ParamSeqLen, int32(l.SeqLen))
	p.I32(abi.ParamSeqLenLog2, seqLenLog2)
	p.I32(abi.ParamHeads, mla.IndexerHeads)
	p.I32(abi.ParamRopePositions, int32(a.RopePositions))
	p.I32(abi.ParamPageStride, int32(a.Meta.PageStride))
	p.I32(abi.ParamPageSizeLog2, 0)
	p.I32(abi.ParamPageBytes, 0)
	p.I32(abi.ParamNumPages, 0)
	p.F32(abi.ParamScale, 1)
	p.F32(abi.ParamQDeq, 0)
	p.F32(abi.ParamKVDeq, 0)
	p.F32(abi.ParamQScaling, 0)
	p.F32(abi.ParamOScale, 0)
	p.F32(abi.ParamEps, 0)
	p.Bool(abi.ParamWriteSched, false)
	p.Bool(abi.ParamFromHdr, l.FromHeader)
	return p.Bytes()
}

var _ mla.IndexerQuerier = (*Backend)(nil)
