package gemm_test

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// TestBoundCatchesLayoutMistakes computes outputs the way a buggy backend
// would (activation scales transposed, a weight scale block off by one,
// a scale left out) and checks that CheckBound refuses every one of them,
// while it accepts the exact float64 result.
func TestBoundCatchesLayoutMistakes(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct{ m, n, k int }{{3, 256, 512}, {16, 384, 1024}, {33, 128, 4096}} {
		x := mlatest.RandomActivations(r, c.m, c.k, c.m)
		w := mlatest.RandomFP8Weight(r, c.n, c.k)
		ref, err := gemm.Reference(x, w)
		require.NoError(t, err)
		require.NoError(t, gemm.CheckBound(x, w, ref, exact(x, w)))

		kb := c.k / 128
		mistakes := map[string]func(x *gemm.Activations, w *weights.FP8Matrix){
			// The backend reads [Rows][K/128] where the layout is [K/128][ScaleStride].
			"activation scales transposed": func(x *gemm.Activations, _ *weights.FP8Matrix) {
				tr := slices.Clone(x.Scale)
				for row := 0; row < x.Rows; row++ {
					for b := 0; b < kb; b++ {
						tr[b*x.ScaleStride+row] = x.Scale[row*kb+b]
					}
				}
				x.Scale = tr
			},
			"activation scales missing": func(x *gemm.Activations, _ *weights.FP8Matrix) {
				for i := range x.Scale {
					x.Scale[i] = 1
				}
			},
			"activation scale of the next row": func(x *gemm.Activations, _ *weights.FP8Matrix) {
				x.Scale = append(x.Scale[1:], x.Scale[0])
			},
			"weight scales off by one block": func(_ *gemm.Activations, w *weights.FP8Matrix) {
				w.Scale = append(w.Scale[1:], w.Scale[0])
			},
			// The backend reads [K/128][N/128] where the layout is [N/128][K/128].
			"weight scales transposed": func(_ *gemm.Activations, w *weights.FP8Matrix) {
				rows, cols := w.ScaleRows(), w.ScaleCols()
				tr := slices.Clone(w.Scale)
				for nb := 0; nb < rows; nb++ {
					for b := 0; b < cols; b++ {
						tr[nb*cols+b] = w.Scale[b*rows+nb]
					}
				}
				w.Scale = tr
			},
			"weight scales missing": func(_ *gemm.Activations, w *weights.FP8Matrix) {
				for i := range w.Scale {
					w.Scale[i] = 1
				}
			},
		}
		for name, mistake := range mistakes {
			bx := *x
			bx.Scale = slices.Clone(x.Scale)
			bw := *w
			bw.Scale = slices.Clone(w.Scale)
			mistake(&bx, &bw)
			if slices.Equal(bx.Scale, x.Scale) && slices.Equal(bw.Scale, w.Scale) {
				continue // the mistake changes nothing at this shape (one block)
			}
			bad, err := gemm.Reference(&bx, &bw)
			require.NoError(t, err)
			err = gemm.CheckBound(x, w, ref, bad)
			require.Error(t, err, "m%d n%d k%d: %s passed", c.m, c.n, c.k, name)
			t.Logf("m%d n%d k%d %s: %v", c.m, c.n, c.k, name, err)
		}

		// One element of one row off by its own size fails alone.
		bad := slices.Clone(ref)
		i := r.IntN(len(bad))
		bad[i] = numerics.BF16FromF32(2 * numerics.F32FromBF16(bad[i]))
		if math.Abs(float64(numerics.F32FromBF16(ref[i]))) > 0 {
			cmp, err := gemm.Compare(x, w, ref, bad)
			require.NoError(t, err)
			if cmp.Allowed < math.Abs(float64(numerics.F32FromBF16(ref[i]))) {
				require.Equal(t, 1, cmp.Violations, "%v", cmp)
				require.Equal(t, i/c.n, cmp.Row)
				require.Equal(t, i%c.n, cmp.Col)
			}
		}
		// A one-ulp bf16 flip everywhere is allowed.
		flip := slices.Clone(ref)
		for j, v := range flip {
			if v&0x7F80 != 0x7F80 && v&0x7FFF != 0 {
				flip[j] = v ^ 1
			}
		}
		require.NoError(t, gemm.CheckBound(x, w, ref, flip))
	}
}
