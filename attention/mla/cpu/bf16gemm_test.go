package cpu_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
)

// TestBF16GEMM: every output of the CPU backend's projection GEMM is the
// ascending-k reference bit for bit, whatever the workers, strides and
// offsets; bytes outside Y's rows and X's gaps are neither written nor read.
func TestBF16GEMM(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	ctx := context.Background()
	for _, workers := range []int{1, 3, 0} {
		b := cpu.New(workers)
		for _, c := range mlatest.BF16GEMMCases {
			t.Run(fmt.Sprintf("w%d/%v", workers, c), func(t *testing.T) {
				o := mlatest.RandomBF16Operands(r, c)
				x, w, err := mlatest.UploadBF16Operands(b, o, c.XOffset)
				require.NoError(t, err)
				got, err := mlatest.RunBF16GEMM(ctx, b, c, x, w)
				require.NoError(t, err)
				want, err := gemm.ReferenceBF16(o)
				require.NoError(t, err)
				require.Len(t, got, len(want))
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("[%d][%d]: %g (%#08x), want %g (%#08x)", i/c.N, i%c.N, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
					}
				}
			})
		}
	}
}

func TestBF16GEMMRefusals(t *testing.T) {
	mlatest.TestBF16GEMMRefusals(t, cpu.New(0))
}

// TestBF16GEMMIsTheProjection: one GEMM over [wkv; wgate] gives
// compressor.Projection.Project's K bit for bit, and its G once ape is
// added in float32, for both ratios.
func TestBF16GEMMIsTheProjection(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 12))
	ctx := context.Background()
	for _, c := range []struct{ ratio, hidden, tokens, start int }{{4, 136, 6, 5}, {128, 64, 3, 126}, {4, 512, 1, 0}} {
		t.Run(fmt.Sprintf("r%d-h%d-t%d", c.ratio, c.hidden, c.tokens), func(t *testing.T) {
			p := &compressor.Projection{Ratio: c.ratio, Hidden: c.hidden}
			out := p.Out()
			bc := mlatest.BF16GEMMCase{Rows: c.tokens, N: 2 * out, K: c.hidden, XStride: c.hidden + 8, YStride: 2*out + 4}
			o := mlatest.RandomBF16Operands(r, bc)
			p.WKV, p.WGate = o.W[:out*c.hidden], o.W[out*c.hidden:]
			p.APE = make([]float32, c.ratio*out)
			for i := range p.APE {
				p.APE[i] = float32(r.NormFloat64())
			}
			dense := make([]uint16, c.tokens*c.hidden)
			for row := range c.tokens {
				copy(dense[row*c.hidden:(row+1)*c.hidden], o.X[row*bc.XStride:])
			}
			K, G, err := p.Project(dense, c.start)
			require.NoError(t, err)

			b := cpu.New(0)
			x, w, err := mlatest.UploadBF16Operands(b, o, 0)
			require.NoError(t, err)
			y, err := mlatest.RunBF16GEMM(ctx, b, bc, x, w)
			require.NoError(t, err)
			for tok := range c.tokens {
				ape := p.APE[(c.start+tok)%c.ratio*out:]
				for n := range out {
					k, g := y[tok*2*out+n], y[tok*2*out+out+n]
					require.Equal(t, math.Float32bits(K[tok][n]), math.Float32bits(k), "K[%d][%d]", tok, n)
					require.Equal(t, math.Float32bits(G[tok][n]), math.Float32bits(float32(g+ape[n])), "G[%d][%d]", tok, n)
				}
			}
		})
	}
}

// BenchmarkBF16GEMM times the CPU projection at V4-Flash's ratio-4 shape
// ([wkv; wgate]: 2048 outputs from hidden 4096) for a decode batch.
func BenchmarkBF16GEMM(bm *testing.B) {
	b := cpu.New(0)
	c := mlatest.BF16GEMMCase{Rows: 4, N: 2048, K: 4096}
	o := mlatest.RandomBF16Operands(rand.New(rand.NewPCG(1, 2)), c)
	x, w, err := mlatest.UploadBF16Operands(b, o, 0)
	require.NoError(bm, err)
	y, err := b.Alloc(mlatest.BF16GEMMYBytes(c))
	require.NoError(bm, err)
	a := mlatest.BF16GEMMArgs(c, x, w, y)
	ctx := context.Background()
	bm.SetBytes(int64(2 * c.N * c.K))
	for bm.Loop() {
		if err := b.BF16GEMM(ctx, a); err != nil {
			bm.Fatal(err)
		}
	}
}

// ExampleBackend_BF16GEMM projects one token of 8 hidden values onto 8
// outputs: output n is the token's dot product with weight row n.
func ExampleBackend_BF16GEMM() {
	b := cpu.New(0)
	x, _ := b.Alloc(2 * 8)
	w, _ := b.Alloc(2 * 8 * 8)
	y, _ := b.Alloc(4 * 8)
	xs := make([]byte, 2*8)
	ws := make([]byte, 2*8*8)
	for k := range 8 {
		binary.LittleEndian.PutUint16(xs[2*k:], numerics.BF16FromF32(float32(k+1))) // 1..8
		for n := range 8 {
			binary.LittleEndian.PutUint16(ws[2*(n*8+k):], numerics.BF16FromF32(float32(n)/4))
		}
	}
	_ = b.Write(x, 0, xs)
	_ = b.Write(w, 0, ws)
	err := b.BF16GEMM(context.Background(), &mla.BF16GEMMArgs{Rows: 1, N: 8, K: 8, X: x, XStride: 8, W: w, Y: y, YStride: 8})
	fmt.Println(err, numerics.F32sFromBytes(cpu.Bytes(y)))
	// Output: <nil> [0 9 18 27 36 45 54 63]
}
