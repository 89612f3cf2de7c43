package cpu

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/numerics"
)

// IndexerQuery implements mla.IndexerQuerier on the host: per (token, head),
// RoPE of dims [64, 128), Hadamard128 and MXFP4 (package compressor and
// numerics), and the head weight bf16(fl(bf16(W) * c)).
func (c *Backend) IndexerQuery(ctx context.Context, l mla.Launch, a *mla.IndexerQueryArgs) error {
	if err := a.Validate(l.RowBegin + l.Rows); err != nil {
		return err
	}
	for _, b := range []mla.Buffer{a.Q, a.W, a.QOut, a.WOut, a.Rope, a.Meta.Buf} {
		if _, ok := b.(*Buffer); !ok {
			return fmt.Errorf("cpu: indexer query: buffer of type %T is not a CPU buffer", b)
		}
	}
	m := meta{b: Bytes(a.Meta.Buf), mb: a.Meta}
	l = m.withHeader(l)
	q, w, qout, wout, rope := Bytes(a.Q), Bytes(a.W), Bytes(a.QOut), Bytes(a.WOut), Bytes(a.Rope)
	const heads, dim, eb = mla.IndexerHeads, mla.IndexerDim, mla.IndexerEntryBytes
	return c.parallel(ctx, l.Rows*heads, func(unit int) {
		local, h := unit/heads, unit%heads
		t := l.RowBegin + local
		out := qout[(t*heads+h)*eb : (t*heads+h+1)*eb]
		wo := wout[(t*heads+h)*2 : (t*heads+h+1)*2]
		_, pos, ok := m.rowPosition(l, local)
		if !ok || pos < 0 || pos >= a.RopePositions {
			clear(out)
			clear(wo)
			return
		}
		src := q[a.QOffset+(t*a.QStride+h*dim)*2:]
		var v [dim]float32
		for i := range v {
			v[i] = numerics.F32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
		}
		compressor.RopeIndexerRow(v[:], numerics.F32sFromBytes(rope[pos*numerics.RopeDim*4:(pos+1)*numerics.RopeDim*4]))
		var y [dim]uint16
		for i := range v {
			y[i] = numerics.BF16FromF32(v[i])
		}
		numerics.Hadamard128(y[:], y[:])
		for i := range v {
			v[i] = numerics.F32FromBF16(y[i])
		}
		numerics.QuantizeMXFP4(out, v[:])
		wv := numerics.F32sFromBytes(w[a.WOffset+(t*a.WStride+h)*4 : a.WOffset+(t*a.WStride+h+1)*4])[0]
		binary.LittleEndian.PutUint16(wo, numerics.BF16FromF32(float32(numerics.RoundBF16(wv)*mla.IndexerWeightScale)))
	})
}

var _ mla.IndexerQuerier = (*Backend)(nil)
