package gemm_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
)

// randomBF16 is n normal values (scaled) rounded to bf16, none of them zero.
func randomBF16(r *rand.Rand, n int, scale float64) []uint16 {
	v := make([]uint16, n)
	for i := range v {
		for v[i]&0x7FFF == 0 {
			v[i] = numerics.BF16FromF32(float32(r.NormFloat64() * scale))
		}
	}
	return v
}

// randomOperands makes X with a row stride past K whose gaps hold NaN (a
// read of the gap would show), and W.
func randomOperands(r *rand.Rand, rows, n, k, xStride int) *gemm.BF16Operands {
	x := randomBF16(r, max(0, (rows-1)*xStride+k), 1)
	for row := 0; row < rows-1; row++ {
		for i := row*xStride + k; i < (row+1)*xStride; i++ {
			x[i] = 0x7FC0
		}
	}
	return &gemm.BF16Operands{Rows: rows, N: n, K: k, X: x, XStride: xStride, W: randomBF16(r, n*k, 0.05)}
}

// sumIn computes every output in float64 from the products taken in the
// order of ks (each product exact), rounded once: ks = nil is ascending.
func sumIn(o *gemm.BF16Operands, order func(k int) []int) []float32 {
	y := make([]float32, o.Rows*o.N)
	ks := order(o.K)
	for r := 0; r < o.Rows; r++ {
		for n := 0; n < o.N; n++ {
			var s float64
			for _, k := range ks {
				s += float64(numerics.F32FromBF16(o.X[r*o.XStride+k])) * float64(numerics.F32FromBF16(o.W[n*o.K+k]))
			}
			y[r*o.N+n] = float32(s)
		}
	}
	return y
}

// blockedF32 accumulates like a split-K kernel: float32 sums of 64-value
// chunks from zero, the chunk sums added in reverse order.
func blockedF32(o *gemm.BF16Operands) []float32 {
	y := make([]float32, o.Rows*o.N)
	for r := 0; r < o.Rows; r++ {
		for n := 0; n < o.N; n++ {
			var parts []float32
			for lo := 0; lo < o.K; lo += 64 {
				var p float32
				for k := lo; k < min(lo+64, o.K); k++ {
					p = float32(p + float32(numerics.F32FromBF16(o.X[r*o.XStride+k])*numerics.F32FromBF16(o.W[n*o.K+k])))
				}
				parts = append(parts, p)
			}
			var acc float32
			for i := len(parts) - 1; i >= 0; i-- {
				acc = float32(acc + parts[i])
			}
			y[r*o.N+n] = acc
		}
	}
	return y
}

func ascending(k int) []int {
	ks := make([]int, k)
	for i := range ks {
		ks[i] = i
	}
	return ks
}

// TestBF16BoundAcceptsReorderedSums: the ascending float32 reference,
// the exact sum and a blocked, reversed float32 accumulation are all
// within the bound of each other, and the reference is DotBF16 row by row.
func TestBF16BoundAcceptsReorderedSums(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct{ rows, n, k, xStride int }{
		{1, 8, 8, 8}, {3, 64, 1024, 1032}, {16, 40, 4096, 4096}, {5, 16, 7168, 7200},
	} {
		o := randomOperands(r, c.rows, c.n, c.k, c.xStride)
		ref, err := gemm.ReferenceBF16(o)
		require.NoError(t, err)
		for i, v := range ref {
			row, n := i/c.n, i%c.n
			x := make([]float32, c.k)
			for k := range x {
				x[k] = numerics.F32FromBF16(o.X[row*c.xStride+k])
			}
			require.Equal(t, math.Float32bits(gemm.DotBF16(x, o.W[n*c.k:(n+1)*c.k])), math.Float32bits(v), "[%d][%d]", row, n)
			require.False(t, math.IsNaN(float64(v)), "[%d][%d] read the stride's gap", row, n)
		}
		exact := sumIn(o, ascending)
		for name, got := range map[string][]float32{"exact": exact, "blocked": blockedF32(o)} {
			cmp, err := gemm.CompareF32(o, ref, got)
			require.NoError(t, err)
			require.Zero(t, cmp.Violations, "%v: %s: %v", c, name, cmp)
			require.LessOrEqual(t, cmp.AccumRel, gemm.BoundBF16(c.k))
			t.Logf("%v %s: %v", c, name, cmp)
		}
		require.NoError(t, gemm.CheckBoundF32(o, exact, ref))
	}
}

// TestBF16BoundCatchesMistakes computes outputs the way a buggy backend
// would and checks that the bound refuses them by a large factor, at most
// elements.
func TestBF16BoundCatchesMistakes(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct{ rows, n, k int }{{2, 64, 1024}, {9, 32, 4096}, {4, 16, 7168}} {
		o := randomOperands(r, c.rows, c.n, c.k, c.k)
		ref, err := gemm.ReferenceBF16(o)
		require.NoError(t, err)
		half := c.n / 2
		mistakes := map[string]func() *gemm.BF16Operands{
			"weight row off by one": func() *gemm.BF16Operands {
				b := *o
				b.W = append(slices.Clone(o.W[c.k:]), o.W[:c.k]...)
				return &b
			},
			// The ratio-4 compressor's two halves (or K and G) swapped.
			"halves swapped": func() *gemm.BF16Operands {
				b := *o
				b.W = append(slices.Clone(o.W[half*c.k:]), o.W[:half*c.k]...)
				return &b
			},
			"another weight (wgate for wkv)": func() *gemm.BF16Operands {
				b := *o
				b.W = randomBF16(r, c.n*c.k, 0.05)
				return &b
			},
			"activation row off by one": func() *gemm.BF16Operands {
				b := *o
				b.X = append(slices.Clone(o.X[c.k:]), o.X[:c.k]...)
				return &b
			},
			"K read transposed in 8-value groups": func() *gemm.BF16Operands {
				b := *o
				b.X = slices.Clone(o.X)
				for i := 0; i+16 <= len(b.X); i += 16 {
					copy(b.X[i:i+8], o.X[i+8:i+16])
					copy(b.X[i+8:i+16], o.X[i:i+8])
				}
				return &b
			},
		}
		for name, mistake := range mistakes {
			bad, err := gemm.ReferenceBF16(mistake())
			require.NoError(t, err)
			cmp, err := gemm.CompareF32(o, ref, bad)
			require.NoError(t, err)
			require.Greater(t, cmp.Worst, 10.0, "%v: %s: %v", c, name, cmp)
			require.Greater(t, cmp.Violations, cmp.Elements/2, "%v: %s: %v", c, name, cmp)
			require.Error(t, gemm.CheckBoundF32(o, ref, bad))
			t.Logf("%v %s: worst %.0fx, %d of %d elements", c, name, cmp.Worst, cmp.Violations, cmp.Elements)
		}

		// One element off by its own size fails alone, where it is.
		bad := slices.Clone(ref)
		i := r.IntN(len(bad))
		bad[i] *= 2
		cmp, err := gemm.CompareF32(o, ref, bad)
		require.NoError(t, err)
		if cmp.Allowed < math.Abs(float64(ref[i])) {
			require.Equal(t, 1, cmp.Violations, "%v", cmp)
			require.Equal(t, [2]int{i / c.n, i % c.n}, [2]int{cmp.Row, cmp.Col})
		}
	}
}

// TestCompareF32Specials: NaN meets NaN, an infinity the same infinity; an
// exact zero S allows no difference.
func TestCompareF32Specials(t *testing.T) {
	o := &gemm.BF16Operands{Rows: 1, N: 2, K: 8, XStride: 8,
		X: []uint16{0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80}, // 1.0
		W: make([]uint16, 16)}
	for i := range 8 {
		o.W[i] = 0x3F80 // row 0: ones (S = 8); row 1: zeros (S = 0)
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		name       string
		a, b       []float32
		violations int
	}{
		{"equal", []float32{8, 0}, []float32{8, 0}, 0},
		{"NaN meets NaN", []float32{nan, 0}, []float32{nan, 0}, 0},
		{"NaN against a number", []float32{nan, 0}, []float32{8, 0}, 1},
		{"same infinity", []float32{inf, 0}, []float32{inf, 0}, 0},
		{"opposite infinities", []float32{inf, 0}, []float32{-inf, 0}, 1},
		{"signed zeros", []float32{8, 0}, []float32{8, float32(math.Copysign(0, -1))}, 0},
		{"S = 0 allows nothing", []float32{8, 0}, []float32{8, 1e-30}, 1},
		{"within 2^-10 S", []float32{8, 0}, []float32{8 + 1.0/256, 0}, 0},
		{"past the bound", []float32{8, 0}, []float32{8.02, 0}, 1},
	} {
		cmp, err := gemm.CompareF32(o, c.a, c.b)
		require.NoError(t, err)
		require.Equal(t, c.violations, cmp.Violations, "%s: %v", c.name, cmp)
		// CompareF32Sums with S given is the same comparison.
		sums, err := gemm.AbsSumsBF16(o)
		require.NoError(t, err)
		again, err := gemm.CompareF32Sums(o, sums, c.a, c.b)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(cmp), fmt.Sprint(again), c.name)
	}
	_, err := gemm.CompareF32(o, []float32{1}, []float32{1, 2})
	require.ErrorContains(t, err, "outputs have 1 and 2 values")
	_, err = gemm.CompareF32Sums(o, []float64{1}, []float32{8, 0}, []float32{8, 0})
	require.ErrorContains(t, err, "1 sums, [Rows=1][N=2] is 2")
}

func TestBF16OperandsValidate(t *testing.T) {
	good := func() *gemm.BF16Operands {
		return &gemm.BF16Operands{Rows: 2, N: 8, K: 16, XStride: 24, X: make([]uint16, 24+16), W: make([]uint16, 8*16)}
	}
	require.NoError(t, good().Validate())
	for _, c := range []struct {
		name   string
		mutate func(o *gemm.BF16Operands)
		want   string
	}{
		{"nil", nil, "nil"},
		{"rows", func(o *gemm.BF16Operands) { o.Rows = -1 }, "Rows = -1"},
		{"n", func(o *gemm.BF16Operands) { o.N = 0 }, "N = 0"},
		{"stride", func(o *gemm.BF16Operands) { o.XStride = 15 }, "XStride = 15"},
		{"short W", func(o *gemm.BF16Operands) { o.W = o.W[:127] }, "W has 127 values"},
		{"short X", func(o *gemm.BF16Operands) { o.X = o.X[:39] }, "X has 39 values"},
	} {
		o := good()
		if c.mutate == nil {
			o = nil
		} else {
			c.mutate(o)
		}
		require.ErrorContains(t, o.Validate(), c.want, c.name)
		_, err := gemm.ReferenceBF16(o)
		require.ErrorContains(t, err, c.want, c.name)
	}
}

// TestCompareWhere pins the box of the violations: their rows counted,
// the smallest row and column ranges holding them, -1 without any.
func TestCompareWhere(t *testing.T) {
	const rows, n, k = 5, 6, 8
	o := &gemm.BF16Operands{Rows: rows, N: n, K: k, XStride: k, X: make([]uint16, rows*k), W: make([]uint16, n*k)}
	for i := range o.X {
		o.X[i] = 0x3F80
	}
	for i := range o.W {
		o.W[i] = 0x3F80 // every S = 8
	}
	want := make([]float32, rows*n)
	for i := range want {
		want[i] = 8
	}
	for _, c := range []struct {
		name                    string
		bad                     [][2]int
		badRows, r0, r1, c0, c1 int
	}{
		{"none", nil, 0, -1, -1, -1, -1},
		{"one", [][2]int{{2, 3}}, 1, 2, 2, 3, 3},
		{"two rows", [][2]int{{1, 5}, {1, 3}, {4, 2}}, 2, 1, 4, 2, 5},
	} {
		got := append([]float32(nil), want...)
		for _, b := range c.bad {
			got[b[0]*n+b[1]] = -4080
		}
		cmp, err := gemm.CompareF32(o, want, got)
		require.NoError(t, err)
		require.Equal(t, len(c.bad), cmp.Violations, c.name)
		require.Equal(t, [5]int{c.badRows, c.r0, c.r1, c.c0, c.c1}, [5]int{cmp.BadRows, cmp.RowLo, cmp.RowHi, cmp.ColLo, cmp.ColHi}, "%s: %v", c.name, cmp)
		if len(c.bad) > 0 {
			require.Contains(t, cmp.String(), fmt.Sprintf("in %d rows, within rows %d-%d, columns %d-%d", c.badRows, c.r0, c.r1, c.c0, c.c1))
		}
	}
}
