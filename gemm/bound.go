package gemm

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"

	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// The bound between two implementations a and b of the GEMM, per output
// element y = sum_k x_k w_k (x, w the dequantized operands, S = sum_k
// |x_k||w_k|):
//
//	|y_a - y_b| <= Bound(K) * S + ulp_bf16(max(|y_a|, |y_b|))
//	Bound(K)     = 2 * gamma(K + 8) + TensorCoreRel,  gamma(n) = n u / (1 - n u), u = 2^-24
//
// Derivation. Let y* be the exact value. Each implementation computes a
// float32 value a with |a - y*| <= gamma(d) S, d its longest chain of
// float32 roundings on the way from the inputs to a (Higham, Accuracy and
// Stability of Numerical Algorithms, 3.1): the host reference rounds the
// dequantized x and w (2), their product (1) and adds up to K terms (K - 1);
// a block-scaled GPU kernel forms exact e4m3 x e4m3 products, sums a
// 128-block (at most 127), multiplies by x_scale * w_scale (2) and adds K/128
// block sums and split-K partials: both stay under K + 8 for every K >= 128.
// FP8 tensor cores add more: inside one 128-block, before the sum is
// promoted to float32, Hopper's FP8 MMA keeps only about 14 bits of the
// accumulator (DeepSeek-V3 report, section 3.3.2): TensorCoreRel allows 2^-11
// of S for each side that uses them. Then a - b is at most (2 gamma(K+8) +
// TensorCoreRel) S, and rounding each to bf16 adds at most half an ulp of
// each, which is at most one ulp of the larger rounded value (rounding never
// moves a value into a lower binade). So a 1-ulp bf16 flip is always allowed.
//
// For K = 4096 the first term is 7.5e-4 S; random rows have |y| near
// 0.64 sqrt(K) times smaller than S, so the bound is a few per cent of a
// typical |y|, while a wrong scale layout, a missing scale or a scale block
// off by one moves outputs by their own size.

// TensorCoreRel is the allowance for reduced-precision FP8 tensor-core
// accumulation inside the 128-blocks, both sides together.
const TensorCoreRel = 1.0 / 1024

const unitRoundoff = 1.0 / (1 << 24)

func gamma(n int) float64 { return float64(n) * unitRoundoff / (1 - float64(n)*unitRoundoff) }

// Bound is the coefficient of S in the per-element bound for depth K.
func Bound(k int) float64 { return 2*gamma(k+8) + TensorCoreRel }

// ULPBF16 is the spacing of bf16 values at |v|: 2^(e-7) for |v| in
// [2^e, 2^(e+1)), the subnormal spacing 2^-133 below 2^-126.
func ULPBF16(v float64) float64 {
	v = math.Abs(v)
	if v < 0x1p-126 {
		return 0x1p-133
	}
	_, e := math.Frexp(v) // v = f * 2^e, f in [0.5, 1)
	return math.Ldexp(1, e-1-7)
}

// Comparison is the element-by-element comparison of two GEMM outputs
// against the bound (Compare: bf16 outputs; CompareF32: float32 outputs of
// the bf16 GEMM, whose bound has no ulp term).
type Comparison struct {
	K          int
	Elements   int
	Violations int
	// Worst is the largest |y_a - y_b| / allowed (within the bound <= 1;
	// +Inf for a NaN or infinity that the other side lacks), at Row, Col.
	Worst    float64
	Row, Col int
	A, B     float32
	Allowed  float64
	S        float64 // sum_k |x_k||w_k| at the worst element
	// AccumRel is the largest (|y_a - y_b| - ulp) / S seen (no ulp for
	// CompareF32): the accumulation difference in units of S, to compare
	// with Bound(K) (= BoundBF16(K)).
	AccumRel float64
	// BadRows is how many rows hold a violation, and [RowLo, RowHi] x
	// [ColLo, ColHi] the smallest box holding them all (-1 without one):
	// whether a wrong output is some rows, some column tiles or everything
	// tells a race on the input from one on the output or a wrong operand.
	BadRows                    int
	RowLo, RowHi, ColLo, ColHi int
}

// String describes the comparison and its worst element.
func (c Comparison) String() string {
	where := ""
	if c.Violations > 0 {
		where = fmt.Sprintf(" (in %d rows, within rows %d-%d, columns %d-%d)", c.BadRows, c.RowLo, c.RowHi, c.ColLo, c.ColHi)
	}
	return fmt.Sprintf("%d of %d elements outside the bound%s; worst [%d][%d]: %g vs %g, |diff| %g, allowed %g (%.3g x, S = %g); largest accumulation difference %.3g S, bound %.3g S",
		c.Violations, c.Elements, where, c.Row, c.Col, c.A, c.B, math.Abs(float64(c.A)-float64(c.B)), c.Allowed, c.Worst, c.S, c.AccumRel, Bound(c.K))
}

// AbsSums returns S = sum_k |x_k||w_k| for every output element, [Rows][N],
// an upper bound (float32 sums inflated by their own worst relative error).
func AbsSums(x *Activations, w *weights.FP8Matrix) ([]float64, error) {
	if err := x.Validate(); err != nil {
		return nil, err
	}
	d, err := Dequantize(w)
	if err != nil {
		return nil, err
	}
	if x.K != w.K {
		return nil, fmt.Errorf("gemm: activations have K = %d, the weight K = %d", x.K, w.K)
	}
	ax := dequantizeActivations(x)
	for i, v := range ax {
		ax[i] = float32(math.Abs(float64(v)))
	}
	aw := make([]float32, len(d.values))
	for i, v := range d.values {
		aw[i] = float32(math.Abs(float64(v)))
	}
	return absSums(x.Rows, w.N, x.K, ax, aw), nil
}

// absSums is S = |X| . |W|^T for rows x k absolute values ax and n x k aw,
// summed in float32 (gonum's BLAS) and inflated by the sums' own worst
// relative error, so an upper bound.
func absSums(rows, n, k int, ax, aw []float32) []float64 {
	c := make([]float32, rows*n)
	if rows > 0 {
		blas32.Gemm(blas.NoTrans, blas.Trans, 1,
			blas32.General{Rows: rows, Cols: k, Stride: k, Data: ax},
			blas32.General{Rows: n, Cols: k, Stride: k, Data: aw},
			0, blas32.General{Rows: rows, Cols: n, Stride: n, Data: c})
	}
	inflate := 1 + 2*gamma(k+4)
	s := make([]float64, len(c))
	for i, v := range c {
		s[i] = float64(v) * inflate
	}
	return s
}

// Compare checks yA against yB (dense [x.Rows][w.N] bf16) element by element.
// A NaN must meet a NaN (any encoding), an infinity the same infinity;
// finite values must be within the bound.
func Compare(x *Activations, w *weights.FP8Matrix, yA, yB []uint16) (Comparison, error) {
	s, err := AbsSums(x, w)
	if err != nil {
		return Comparison{}, err
	}
	if len(yA) != len(s) || len(yB) != len(s) {
		return Comparison{}, fmt.Errorf("gemm: outputs have %d and %d values, [Rows=%d][N=%d] is %d", len(yA), len(yB), x.Rows, w.N, len(s))
	}
	return compare(x.K, w.N, s, Bound(x.K), func(i int) (a, b float32, ulp float64) {
		a, b = numerics.F32FromBF16(yA[i]), numerics.F32FromBF16(yB[i])
		return a, b, ULPBF16(math.Max(math.Abs(float64(a)), math.Abs(float64(b))))
	}), nil
}

// compare checks each element i of two outputs with n columns, whose
// values and rounding allowance (one output ulp; 0 for float32 outputs)
// at returns, against eps*s[i] + ulp. A NaN must meet a NaN, an infinity
// the same infinity.
func compare(k, n int, s []float64, eps float64, at func(i int) (a, b float32, ulp float64)) Comparison {
	c := Comparison{K: k, Elements: len(s), Row: -1, Col: -1, RowLo: -1, RowHi: -1, ColLo: -1, ColHi: -1}
	lastBadRow := -1
	for i := range s {
		a, b, ulp := at(i)
		fa, fb := float64(a), float64(b)
		var ratio, allowed float64
		switch {
		case math.IsNaN(fa) || math.IsNaN(fb):
			if !(math.IsNaN(fa) && math.IsNaN(fb)) {
				ratio = math.Inf(1)
			}
		case math.IsInf(fa, 0) || math.IsInf(fb, 0):
			if fa != fb {
				ratio = math.Inf(1)
			}
		default:
			diff := math.Abs(fa - fb)
			allowed = eps*s[i] + ulp
			switch {
			case diff == 0:
			case allowed == 0:
				ratio = math.Inf(1)
			default:
				ratio = diff / allowed
			}
			if s[i] > 0 {
				c.AccumRel = math.Max(c.AccumRel, (diff-ulp)/s[i])
			}
		}
		if ratio > 1 {
			c.Violations++
			r, col := i/n, i%n
			if r != lastBadRow {
				c.BadRows, lastBadRow = c.BadRows+1, r
			}
			if c.RowLo < 0 {
				c.RowLo, c.ColLo, c.ColHi = r, col, col
			}
			c.RowHi, c.ColLo, c.ColHi = r, min(c.ColLo, col), max(c.ColHi, col)
		}
		if ratio > c.Worst || c.Row < 0 {
			c.Worst, c.Row, c.Col, c.A, c.B, c.Allowed, c.S = ratio, i/n, i%n, a, b, allowed, s[i]
		}
	}
	return c
}

// CheckBound compares a reference output with another implementation's
// (both dense [x.Rows][w.N] bf16) and reports the worst element when any is
// outside the bound.
func CheckBound(x *Activations, w *weights.FP8Matrix, yRef, yGot []uint16) error {
	c, err := Compare(x, w, yRef, yGot)
	if err != nil {
		return err
	}
	if c.Violations > 0 {
		return errors.New("gemm: " + c.String())
	}
	return nil
}
