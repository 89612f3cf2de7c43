package cpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/race"
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
	// A task is a group of bf16Lanes weight rows against every X row: the
	// group's weights (the large operand) stay in cache across the rows,
	// and its independent sums interleave. Each output is still one
	// ascending-k sum, so the bits are those of gemm.DotBF16. Validate
	// requires N to be a multiple of 8, so the groups are whole.
	return b.parallel(ctx, a.N/bf16Lanes, func(g int) {
		n0 := g * bf16Lanes
		wg := w[2*n0*a.K : 2*(n0+bf16Lanes)*a.K]
		race.Read(wg)
		for r := 0; r < a.Rows; r++ {
			xr := x[r*a.K : (r+1)*a.K]
			race.Read(xr)
			v := dotBF16Bytes4(xr, wg)
			out := y[4*(r*a.YStride+n0):]
			for j, vj := range v {
				binary.LittleEndian.PutUint32(out[4*j:], math.Float32bits(vj))
			}
		}
	})
}

// bf16Lanes is how many outputs dotBF16Bytes4 sums side by side.
const bf16Lanes = 4

// dotBF16Bytes4 is gemm.DotBF16 of x against four consecutive weight rows
// of len(x) little-endian bf16 values each (w holds all four): four
// independent float32 sums of fl(x_k * w_k) over ascending k, in one pass
// over x.
//
// The race detector does not instrument it (the caller reports its reads
// of x and w as whole ranges), nor checkptr its Float32frombits: under
// -race those per-element checks made it ten times slower and the
// hidden-state tests' largest cost.
//
//go:norace
//go:nocheckptr
func dotBF16Bytes4(x []float32, w []byte) [bf16Lanes]float32 {
	k := len(x)
	w0, w1, w2, w3 := w[:2*k], w[2*k:4*k], w[4*k:6*k], w[6*k:8*k]
	var a0, a1, a2, a3 float32
	for i, xi := range x {
		b0 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(w0[2*i:])) << 16)
		b1 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(w1[2*i:])) << 16)
		b2 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(w2[2*i:])) << 16)
		b3 := math.Float32frombits(uint32(binary.LittleEndian.Uint16(w3[2*i:])) << 16)
		a0 = float32(a0 + float32(xi*b0))
		a1 = float32(a1 + float32(xi*b1))
		a2 = float32(a2 + float32(xi*b2))
		a3 = float32(a3 + float32(xi*b3))
	}
	return [bf16Lanes]float32{a0, a1, a2, a3}
}

var _ mla.BF16GEMMBackend = (*Backend)(nil)
