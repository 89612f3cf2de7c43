package gemm

import (
	"errors"
	"fmt"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"

	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// BlockSize is the width of a scale block along K (and along N for weights).
const BlockSize = 128

// Activations are quantized rows on the host: Data is [Rows][K] e4m3
// row-major, Scale is [K/128][ScaleStride] float32: for each 128-wide block
// of K the scales of all rows contiguous (the M-major layout cuBLASLt's
// VEC128_32F mode reads, as mla.FP8Activations). ScaleStride >= Rows.
type Activations struct {
	Rows, K     int
	Data        []byte
	Scale       []float32
	ScaleStride int
}

// Validate checks the shape against the slices.
func (a *Activations) Validate() error {
	switch {
	case a == nil:
		return errors.New("gemm: activations are nil")
	case a.Rows < 0:
		return fmt.Errorf("gemm: Activations.Rows = %d is negative", a.Rows)
	case a.K <= 0 || a.K%BlockSize != 0:
		return fmt.Errorf("gemm: Activations.K = %d must be a positive multiple of %d", a.K, BlockSize)
	case a.ScaleStride < a.Rows:
		return fmt.Errorf("gemm: Activations.ScaleStride = %d is less than Rows = %d", a.ScaleStride, a.Rows)
	case len(a.Data) < a.Rows*a.K:
		return fmt.Errorf("gemm: Activations.Data has %d bytes, [Rows=%d][K=%d] needs %d", len(a.Data), a.Rows, a.K, a.Rows*a.K)
	}
	if a.Rows > 0 {
		if need := (a.K/BlockSize-1)*a.ScaleStride + a.Rows; len(a.Scale) < need {
			return fmt.Errorf("gemm: Activations.Scale has %d values, [K/128=%d][ScaleStride=%d] needs %d", len(a.Scale), a.K/BlockSize, a.ScaleStride, need)
		}
	}
	return nil
}

// ScaleAt is the scale of row r in K block b.
func (a *Activations) ScaleAt(r, b int) float32 { return a.Scale[b*a.ScaleStride+r] }

// ValidateWeight checks an FP8 weight's shape against its slices.
func ValidateWeight(w *weights.FP8Matrix) error {
	switch {
	case w == nil:
		return errors.New("gemm: weight is nil")
	case w.N <= 0 || w.K <= 0:
		return fmt.Errorf("gemm: weight shape N = %d, K = %d must be positive", w.N, w.K)
	case len(w.Data) < w.N*w.K:
		return fmt.Errorf("gemm: weight Data has %d bytes, [N=%d][K=%d] needs %d", len(w.Data), w.N, w.K, w.N*w.K)
	case len(w.Scale) < w.ScaleRows()*w.ScaleCols():
		return fmt.Errorf("gemm: weight Scale has %d values, [%d][%d] needs %d", len(w.Scale), w.ScaleRows(), w.ScaleCols(), w.ScaleRows()*w.ScaleCols())
	}
	return nil
}

// e4m3Table decodes every e4m3 byte.
var e4m3Table = func() (t [256]float32) {
	for i := range t {
		t[i] = numerics.F32FromE4M3(uint8(i))
	}
	return t
}()

// Weight is an FP8 weight dequantized once for the host GEMM: [N][K]
// float32, each value its e4m3 value times its block's scale (one float32
// rounding, none when the scale is a power of two).
type Weight struct {
	N, K   int
	values []float32
}

// Dequantize expands w to float32.
func Dequantize(w *weights.FP8Matrix) (*Weight, error) {
	if err := ValidateWeight(w); err != nil {
		return nil, err
	}
	d := &Weight{N: w.N, K: w.K, values: make([]float32, w.N*w.K)}
	cols := w.ScaleCols()
	for n := 0; n < w.N; n++ {
		row := w.Data[n*w.K : (n+1)*w.K]
		out := d.values[n*w.K : (n+1)*w.K]
		scales := w.Scale[(n/BlockSize)*cols : (n/BlockSize+1)*cols]
		for k, q := range row {
			out[k] = float32(e4m3Table[q] * scales[k/BlockSize])
		}
	}
	return d, nil
}

// Values is the dequantized [N][K] matrix (shared; do not modify).
func (w *Weight) Values() []float32 { return w.values }

// dequantizeActivations expands x to float32 [Rows][K].
func dequantizeActivations(x *Activations) []float32 {
	out := make([]float32, x.Rows*x.K)
	for r := 0; r < x.Rows; r++ {
		row := x.Data[r*x.K : (r+1)*x.K]
		dst := out[r*x.K : (r+1)*x.K]
		for k, q := range row {
			dst[k] = float32(e4m3Table[q] * x.ScaleAt(r, k/BlockSize))
		}
	}
	return out
}

// MultiplyF32 computes dequant(x) . w^T in float32 (gonum's blas32.Gemm,
// float32 accumulation): [x.Rows][w.N] row-major.
func MultiplyF32(x *Activations, w *Weight) ([]float32, error) {
	if err := x.Validate(); err != nil {
		return nil, err
	}
	if w == nil {
		return nil, errors.New("gemm: weight is nil")
	}
	if x.K != w.K {
		return nil, fmt.Errorf("gemm: activations have K = %d, the weight K = %d", x.K, w.K)
	}
	c := make([]float32, x.Rows*w.N)
	if x.Rows == 0 {
		return c, nil
	}
	a := blas32.General{Rows: x.Rows, Cols: x.K, Stride: x.K, Data: dequantizeActivations(x)}
	b := blas32.General{Rows: w.N, Cols: w.K, Stride: w.K, Data: w.values}
	blas32.Gemm(blas.NoTrans, blas.Trans, 1, a, b, 0, blas32.General{Rows: x.Rows, Cols: w.N, Stride: w.N, Data: c})
	return c, nil
}

// Multiply computes dequant(x) . w^T in float32 and rounds it to bf16
// (nearest even, canonical NaN): row r's w.N values go to y[r*yStride:].
// Nothing is written when the arguments are refused.
func Multiply(x *Activations, w *Weight, y []uint16, yStride int) error {
	if w != nil && x != nil && x.Rows > 0 {
		if yStride < w.N {
			return fmt.Errorf("gemm: yStride = %d is less than N = %d", yStride, w.N)
		}
		if need := (x.Rows-1)*yStride + w.N; len(y) < need {
			return fmt.Errorf("gemm: y has %d values, %d rows of stride %d need %d", len(y), x.Rows, yStride, need)
		}
	}
	c, err := MultiplyF32(x, w)
	if err != nil {
		return err
	}
	for r := 0; r < x.Rows; r++ {
		src := c[r*w.N : (r+1)*w.N]
		dst := y[r*yStride : r*yStride+w.N]
		for i, v := range src {
			dst[i] = numerics.BF16FromF32(v)
		}
	}
	return nil
}

// Reference dequantizes w and multiplies: dense [x.Rows][w.N] bf16.
func Reference(x *Activations, w *weights.FP8Matrix) ([]uint16, error) {
	d, err := Dequantize(w)
	if err != nil {
		return nil, err
	}
	y := make([]uint16, x.Rows*w.N)
	return y, Multiply(x, d, y, w.N)
}
