package cpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/numerics"
)

// BF16GEMM implements mla.BF16GEMMBackend: each output is the float32 sum
// of float32 products over ascending k (gemm.DotBF16, the arithmetic of
// compressor.Projection.Project, so its K and G rows come out bit for bit),
// the outputs spread over the backend's workers. A refused call writes
// nothing.
func (b *Backend) BF16GEMM(ctx context.Context, a *mla.BF16GEMMArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if a.Rows == 0 {
		return nil
	}
	xn, wn, yn := a.Extents() // Validate bounded them
	xb, err := span(a.X, a.XOffset, int(xn))
	if err != nil {
		return err
	}
	w, err := span(a.W, 0, int(wn))
	if err != nil {
		return err
	}
	y, err := span(a.Y, a.YOffset, int(yn))
	if err != nil {
		return err
	}
	// X widened once (exact); W is read in place.
	x := make([]float32, a.Rows*a.K)
	for r := 0; r < a.Rows; r++ {
		row := xb[2*r*a.XStride:]
		for k := range a.K {
			x[r*a.K+k] = numerics.F32FromBF16(binary.LittleEndian.Uint16(row[2*k:]))
		}
	}
	return b.parallel(ctx, a.Rows*a.N, func(i int) {
		r, n := i/a.N, i%a.N
		v := dotBF16Bytes(x[r*a.K:(r+1)*a.K], w[2*n*a.K:2*(n+1)*a.K])
		binary.LittleEndian.PutUint32(y[4*(r*a.YStride+n):], math.Float32bits(v))
	})
}

// dotBF16Bytes is gemm.DotBF16 over little-endian bf16 bytes: sum fl(x_k *
// w_k) over ascending k, accumulated in float32.
func dotBF16Bytes(x []float32, w []byte) float32 {
	var acc float32
	for k := range x {
		wk := math.Float32frombits(uint32(binary.LittleEndian.Uint16(w[2*k:])) << 16)
		acc = float32(acc + float32(x[k]*wk))
	}
	return acc
}

var _ mla.BF16GEMMBackend = (*Backend)(nil)
