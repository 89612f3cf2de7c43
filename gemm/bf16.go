package gemm

import (
	"errors"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/numerics"
)

// The compressor's projections (DESIGN.md section 8, mla.BF16GEMMArgs) are
// a GEMM too: bf16 operands, float32 products and accumulation, float32
// output (no rounding). Its bound between two implementations a and b, per
// output element (S = sum_k |x_k||w_k|):
//
//	|y_a - y_b| <= BoundBF16(K) * S
//	BoundBF16(K) = 2 * gamma(K + 8) + TensorCoreRel
//
// Bound's derivation without its last step: a bf16 x bf16 product is exact
// in float32 (8-bit significands), so each side's depth is its chain of
// additions (K - 1 on the host, a tensor-core tile, split-K partials and
// their reduction on a GPU: under K + 8), and tensor cores may keep fewer
// accumulator bits inside a tile (TensorCoreRel, both sides together). The
// output is not rounded further, so there is no ulp term: a result off by
// one float32 ulp where S is far smaller than |y| is a real difference.

// BoundBF16 is the coefficient of S in the per-element bound of the bf16
// GEMM with float32 output at depth K.
func BoundBF16(k int) float64 { return 2*gamma(k+8) + TensorCoreRel }

// BF16Operands are the operands of a bf16 GEMM with float32 output on the
// host: X has Rows rows of K values, row r at X[r*XStride:]; W is [N][K]
// row-major.
type BF16Operands struct {
	Rows, N, K int
	X          []uint16
	XStride    int
	W          []uint16
}

// Validate checks the shape against the slices.
func (o *BF16Operands) Validate() error {
	switch {
	case o == nil:
		return errors.New("gemm: bf16 operands are nil")
	case o.Rows < 0:
		return fmt.Errorf("gemm: BF16Operands.Rows = %d is negative", o.Rows)
	case o.N <= 0 || o.K <= 0:
		return fmt.Errorf("gemm: BF16Operands.N = %d and K = %d must be positive", o.N, o.K)
	case o.XStride < o.K:
		return fmt.Errorf("gemm: BF16Operands.XStride = %d is less than K = %d", o.XStride, o.K)
	case len(o.W) < o.N*o.K:
		return fmt.Errorf("gemm: BF16Operands.W has %d values, [N=%d][K=%d] needs %d", len(o.W), o.N, o.K, o.N*o.K)
	}
	if o.Rows > 0 {
		if need := (o.Rows-1)*o.XStride + o.K; len(o.X) < need {
			return fmt.Errorf("gemm: BF16Operands.X has %d values, %d rows of stride %d need %d", len(o.X), o.Rows, o.XStride, need)
		}
	}
	return nil
}

// row is X's row r widened to float32 (exact).
func (o *BF16Operands) row(r int) []float32 {
	x := make([]float32, o.K)
	for k, b := range o.X[r*o.XStride : r*o.XStride+o.K] {
		x[k] = numerics.F32FromBF16(b)
	}
	return x
}

// DotBF16 is sum fl(x_k * w_k) over ascending k, accumulated in float32,
// w widened from bf16: the order of compressor.Projection.Project and of
// the CPU backend.
func DotBF16(x []float32, w []uint16) float32 {
	var acc float32
	for k, b := range w {
		acc = float32(acc + float32(x[k]*math.Float32frombits(uint32(b)<<16)))
	}
	return acc
}

// ReferenceBF16 computes Y = X . W^T with DotBF16 (ascending k): dense
// [Rows][N] float32. It runs on one goroutine; the CPU backend's
// BF16GEMM is the parallel form of the same arithmetic.
func ReferenceBF16(o *BF16Operands) ([]float32, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	y := make([]float32, o.Rows*o.N)
	for r := 0; r < o.Rows; r++ {
		x := o.row(r)
		for n := 0; n < o.N; n++ {
			y[r*o.N+n] = DotBF16(x, o.W[n*o.K:(n+1)*o.K])
		}
	}
	return y, nil
}

// AbsSumsBF16 returns S = sum_k |x_k||w_k| for every output element,
// [Rows][N], an upper bound (float32 sums of exact products, inflated by
// their own worst relative error).
func AbsSumsBF16(o *BF16Operands) ([]float64, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	ax := make([]float32, o.Rows*o.K)
	for r := 0; r < o.Rows; r++ {
		for k, v := range o.row(r) {
			ax[r*o.K+k] = float32(math.Abs(float64(v)))
		}
	}
	aw := make([]float32, o.N*o.K)
	for i, b := range o.W[:o.N*o.K] {
		aw[i] = math.Float32frombits(uint32(b&0x7FFF) << 16)
	}
	return absSums(o.Rows, o.N, o.K, ax, aw), nil
}

// CompareF32 checks yA against yB (dense [Rows][N] float32, outputs of the
// bf16 GEMM of o) element by element against BoundBF16. A NaN must meet a
// NaN, an infinity the same infinity; finite values must be within
// BoundBF16(K) * S. AccumRel is |y_a - y_b| / S at its largest.
func CompareF32(o *BF16Operands, yA, yB []float32) (Comparison, error) {
	s, err := AbsSumsBF16(o)
	if err != nil {
		return Comparison{}, err
	}
	return CompareF32Sums(o, s, yA, yB)
}

// CompareF32Sums is CompareF32 with S given (AbsSumsBF16(o)): several
// outputs of one GEMM are compared for the cost of one S.
func CompareF32Sums(o *BF16Operands, s []float64, yA, yB []float32) (Comparison, error) {
	if len(s) != o.Rows*o.N {
		return Comparison{}, fmt.Errorf("gemm: %d sums, [Rows=%d][N=%d] is %d", len(s), o.Rows, o.N, o.Rows*o.N)
	}
	if len(yA) != len(s) || len(yB) != len(s) {
		return Comparison{}, fmt.Errorf("gemm: outputs have %d and %d values, [Rows=%d][N=%d] is %d", len(yA), len(yB), o.Rows, o.N, len(s))
	}
	return compare(o.K, o.N, s, BoundBF16(o.K), func(i int) (a, b float32, ulp float64) { return yA[i], yB[i], 0 }), nil
}

// CheckBoundF32 compares a reference output of the bf16 GEMM with another
// implementation's (both dense [Rows][N] float32) and reports the worst
// element when any is outside the bound.
func CheckBoundF32(o *BF16Operands, yRef, yGot []float32) error {
	c, err := CompareF32(o, yRef, yGot)
	if err != nil {
		return err
	}
	if c.Violations > 0 {
		return errors.New("gemm: " + c.String())
	}
	return nil
}
