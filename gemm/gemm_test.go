package gemm_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 7))
}

// exact is the slow scalar reference: every product and sum in float64
// (e4m3 x float32 scale is exact in float64, and K float64 additions stay
// far below float32's resolution), rounded once to bf16.
func exact(x *gemm.Activations, w *weights.FP8Matrix) []uint16 {
	y := make([]uint16, x.Rows*w.N)
	for r := 0; r < x.Rows; r++ {
		for n := 0; n < w.N; n++ {
			var s float64
			for k := 0; k < x.K; k++ {
				xv := float64(numerics.F32FromE4M3(x.Data[r*x.K+k])) * float64(x.ScaleAt(r, k/128))
				wv := float64(numerics.F32FromE4M3(w.Data[n*w.K+k])) * float64(w.Scale[(n/128)*w.ScaleCols()+k/128])
				s += xv * wv
			}
			y[r*w.N+n] = numerics.BF16FromF32(float32(s))
		}
	}
	return y
}

func TestMultiplyMatchesExact(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct{ m, n, k, ss int }{
		{1, 128, 128, 1}, {3, 128, 128, 3}, {127, 128, 128, 130}, {2, 384, 256, 2},
		{5, 200, 512, 9}, // N not a multiple of 128: the last scale row is partial
		{17, 256, 1024, 17},
	} {
		x := mlatest.RandomActivations(r, c.m, c.k, c.ss)
		w := mlatest.RandomFP8Weight(r, c.n, c.k)
		got, err := gemm.Reference(x, w)
		require.NoError(t, err)
		want := exact(x, w)
		cmp, err := gemm.Compare(x, w, want, got)
		require.NoError(t, err)
		require.Zero(t, cmp.Violations, "m%d n%d k%d: %v", c.m, c.n, c.k, cmp)
		// One side is exact: the float32 difference stays within one
		// side's rounding depth, far inside the two-sided bound.
		require.LessOrEqual(t, cmp.AccumRel, float64(c.k+8)/(1<<24)*1.01, "m%d n%d k%d: %v", c.m, c.n, c.k, cmp)
		t.Logf("m%d n%d k%d: worst %.3g of the bound, accumulation %.3g S", c.m, c.n, c.k, cmp.Worst, cmp.AccumRel)
	}
}

func TestMultiplyStrided(t *testing.T) {
	r := newRand(t)
	x := mlatest.RandomActivations(r, 4, 256, 6)
	w := mlatest.RandomFP8Weight(r, 128, 256)
	d, err := gemm.Dequantize(w)
	require.NoError(t, err)
	const stride = 136
	y := make([]uint16, 3*stride+127)
	for i := range y {
		y[i] = 0xA5A5
	}
	require.Error(t, gemm.Multiply(x, d, y, stride), "4 rows do not fit")
	require.True(t, slices.Equal(y, slices.Repeat([]uint16{0xA5A5}, len(y))), "a refused Multiply wrote y")
	y = append(y, make([]uint16, 6)...)
	for i := range y {
		y[i] = 0xA5A5
	}
	require.NoError(t, gemm.Multiply(x, d, y, stride))
	dense, err := gemm.Reference(x, w)
	require.NoError(t, err)
	for i, v := range y {
		r, c := i/stride, i%stride
		if r < 4 && c < 128 {
			require.Equal(t, dense[r*128+c], v, "[%d][%d]", r, c)
		} else {
			require.Equal(t, uint16(0xA5A5), v, "padding at %d", i)
		}
	}
}

func TestRefusals(t *testing.T) {
	r := newRand(t)
	x := mlatest.RandomActivations(r, 2, 256, 2)
	w := mlatest.RandomFP8Weight(r, 128, 256)
	bad := map[string]func() error{
		"K not 128-aligned": func() error {
			x2 := *x
			x2.K = 200
			_, err := gemm.Reference(&x2, w)
			return err
		},
		"K mismatch": func() error {
			w2 := mlatest.RandomFP8Weight(r, 128, 384)
			_, err := gemm.Reference(x, w2)
			return err
		},
		"short scales": func() error {
			x2 := *x
			x2.Scale = x2.Scale[:3]
			_, err := gemm.Reference(&x2, w)
			return err
		},
		"ScaleStride < Rows": func() error {
			x2 := *x
			x2.ScaleStride = 1
			_, err := gemm.Reference(&x2, w)
			return err
		},
		"short weight": func() error {
			w2 := *w
			w2.Data = w2.Data[:100]
			_, err := gemm.Dequantize(&w2)
			return err
		},
		"short weight scales": func() error {
			w2 := *w
			w2.Scale = w2.Scale[:1]
			_, err := gemm.Dequantize(&w2)
			return err
		},
	}
	for name, f := range bad {
		err := f()
		require.Error(t, err, name)
		t.Logf("%s: %v", name, err)
	}
}

// TestNaN: a NaN byte in a row of X makes that row NaN, one in a row of W
// that column; both are the canonical 0x7FFF. An infinite scale gives
// infinities.
func TestNaNAndInf(t *testing.T) {
	r := newRand(t)
	x := mlatest.RandomActivations(r, 4, 256, 4)
	w := mlatest.RandomFP8Weight(r, 256, 256)
	x.Data[1*256+17] = 0xFF
	w.Data[130*256+200] = 0x7F
	y, err := gemm.Reference(x, w)
	require.NoError(t, err)
	for i, v := range y {
		row, col := i/256, i%256
		if row == 1 || col == 130 {
			require.Equal(t, uint16(numerics.BF16NaN), v, "[%d][%d]", row, col)
		} else {
			require.False(t, math.IsNaN(float64(numerics.F32FromBF16(v))), "[%d][%d]", row, col)
		}
	}
	require.NoError(t, gemm.CheckBound(x, w, y, y))

	x = mlatest.RandomActivations(r, 2, 128, 2)
	w = mlatest.RandomFP8Weight(r, 128, 128)
	for k := range 128 {
		x.Data[k] = 0x38 // 1.0: row 0 all positive
	}
	for i := range w.Data {
		w.Data[i] = 0x38
	}
	x.Scale[0] = float32(math.Inf(1))
	y, err = gemm.Reference(x, w)
	require.NoError(t, err)
	for n := range 128 {
		require.Equal(t, uint16(0x7F80), y[n], "row 0 col %d is +Inf", n)
	}
	// A NaN where the reference has a number, or the other infinity, fails.
	bad := slices.Clone(y)
	bad[0] = 0xFF80
	require.Error(t, gemm.CheckBound(x, w, y, bad))
	bad = slices.Clone(y)
	bad[200] = numerics.BF16NaN
	require.Error(t, gemm.CheckBound(x, w, y, bad))
}

func TestULPBF16(t *testing.T) {
	for _, c := range []struct{ v, ulp float64 }{
		{1, 1.0 / 128}, {1.999, 1.0 / 128}, {2, 1.0 / 64}, {-3, 1.0 / 64}, {0x1p-126, 0x1p-133}, {0, 0x1p-133}, {0x1p-140, 0x1p-133}, {448, 2},
	} {
		require.Equal(t, c.ulp, gemm.ULPBF16(c.v), "ulp(%g)", c.v)
	}
}

func BenchmarkMultiply(b *testing.B) {
	for _, c := range []struct {
		name    string
		m, n, k int
	}{
		{"flash-wqa-wkv/m16", 16, 1536, 4096},
		{"flash-wqb/m16", 16, 32768, 1024},
		{"flash-wqa-wkv/m128", 128, 1536, 4096},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			x := mlatest.RandomActivations(r, c.m, c.k, c.m)
			w, err := gemm.Dequantize(mlatest.RandomFP8Weight(r, c.n, c.k))
			require.NoError(b, err)
			y := make([]uint16, c.m*c.n)
			b.SetBytes(int64(c.n * c.k))
			for b.Loop() {
				if err := gemm.Multiply(x, w, y, c.n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(2*c.m*c.n*c.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
