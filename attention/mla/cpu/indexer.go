package cpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/numerics"
)

// IndexerQuery implements mla.IndexerQuerier on the host: per (token, head),
// RoPE of dims [64, 128), Hadamard128 and MXFP4 (package compressor and
// numerics), and the head weight bf16(fl(bf16(W) * c)); or, with
// mla.IndexerQueryFP8, the row as e4m3 with its UE8M0 scale (numerics.UE8M0)
// folded into the float32 head weight.
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
	const heads, dim = mla.IndexerHeads, mla.IndexerDim
	eb, wb, fp8 := a.Format.RowBytes(), a.Format.WeightBytes(), a.Format == mla.IndexerQueryFP8
	return c.parallel(ctx, l.Rows*heads, func(unit int) {
		local, h := unit/heads, unit%heads
		t := l.RowBegin + local
		out := qout[(t*heads+h)*eb : (t*heads+h+1)*eb]
		wo := wout[(t*heads+h)*wb : (t*heads+h+1)*wb]
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
		wv := numerics.F32sFromBytes(w[a.WOffset+(t*a.WStride+h)*4 : a.WOffset+(t*a.WStride+h+1)*4])[0]
		ws := float32(numerics.RoundBF16(wv) * mla.IndexerWeightScale)
		if !fp8 {
			numerics.QuantizeMXFP4(out, v[:])
			binary.LittleEndian.PutUint16(wo, numerics.BF16FromF32(ws))
			return
		}
		e, inv := numerics.UE8M0(numerics.GroupAbsMax(v[:]))
		for i, x := range v {
			out[i] = numerics.E4M3FromF32(float32(x * inv))
		}
		binary.LittleEndian.PutUint32(wo, math.Float32bits(numerics.CanonicalF32(ws*numerics.UE8M0Scale(e))))
	})
}

var _ mla.IndexerQuerier = (*Backend)(nil)
