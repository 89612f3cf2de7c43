package cuda_test

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

//go:embed testdata/gemm_fp8_f16_rewrite_508f76b.cu
var rewriteSource string

var gemmRewrite = flag.Bool("gemm.rewrite", false,
	"TestCUDAGEMMChainReplay: also run the backed-out f16 rewrite (508f76b), which is expected to fail")

// chainFront is the chain's steps before the prologue with the buffers of
// one shape: act_quant of the hidden rows, the fused A GEMM, q_norm of its
// first QLora columns, the wq_b GEMM; and a second GEMM of the hidden
// activations on the side stream (as the engine forks its other work),
// in flight beside the main stream's two.
type chainFront struct {
	name                   string
	rows, hidden, qLora    int
	nFused, nQ, nSide      int
	hiddenBuf, norm        mla.Buffer
	xq, qn                 mla.FP8Activations
	wFused, wQ, wSide      *mla.FP8Weight
	hwFused, hwQ, hwSide   *weights.FP8Matrix
	fusedA, qIn, ySide     mla.Buffer
	bufs                   []mla.Buffer
	hiddenBytes, normBytes int
}

func newChainFront(t *testing.T, b *cuda.Backend, r *rand.Rand, name string, rows, hidden, qLora, nQ, nSide int) *chainFront {
	c := &chainFront{name: name, rows: rows, hidden: hidden, qLora: qLora, nFused: qLora + numerics.HeadDim, nQ: nQ, nSide: nSide}
	alloc := func(n int) mla.Buffer {
		buf, err := b.Alloc(n)
		require.NoError(t, err)
		c.bufs = append(c.bufs, buf)
		return buf
	}
	weight := func(n, k int) (*mla.FP8Weight, *weights.FP8Matrix) {
		hw := mlatest.RandomFP8Weight(r, n, k)
		w, err := mlatest.UploadFP8Weight(b, hw)
		require.NoError(t, err)
		c.bufs = append(c.bufs, w.Data, w.Scale)
		return w, hw
	}
	c.wFused, c.hwFused = weight(c.nFused, hidden)
	c.wQ, c.hwQ = weight(nQ, qLora)
	c.wSide, c.hwSide = weight(nSide, hidden)
	c.hiddenBytes = 2 * rows * hidden
	c.hiddenBuf = alloc(c.hiddenBytes)
	c.normBytes = 4 * qLora
	c.norm = alloc(c.normBytes)
	nw := make([]float32, qLora)
	for i := range nw {
		nw[i] = float32(0.5 + r.Float64())
	}
	require.NoError(t, b.Write(c.norm, 0, numerics.F32Bytes(nw)))
	act := func(k int) mla.FP8Activations {
		return mla.FP8Activations{Rows: rows, K: k, Data: alloc(rows * k), Scale: alloc(4 * k / 128 * rows), ScaleStride: rows}
	}
	c.xq, c.qn = act(hidden), act(qLora)
	c.fusedA, c.qIn, c.ySide = alloc(2*rows*c.nFused), alloc(2*rows*nQ), alloc(2*rows*nSide)
	return c
}

func (c *chainFront) free(b *cuda.Backend) {
	for _, buf := range c.bufs {
		_ = b.Free(buf)
	}
}

// hiddenRows are fresh bf16 hidden rows: Gaussian values scaled per
// 128-value block by 2^j, j in [-3, 3], so act_quant's blocks differ.
func (c *chainFront) hiddenRows(r *rand.Rand) []byte {
	out := make([]byte, c.hiddenBytes)
	scale := float32(1)
	for i := range c.rows * c.hidden {
		if i%128 == 0 {
			scale = numerics.Pow2(r.IntN(7) - 3)
		}
		binary.LittleEndian.PutUint16(out[2*i:], numerics.BF16FromF32(float32(r.NormFloat64())*scale))
	}
	return out
}

// gemmFunc runs one FP8 GEMM on the backend's stream.
type gemmFunc func(context.Context, *mla.GEMMArgs) error

// issue enqueues the steps; sync, when set, runs after each step (the
// eager reference: nothing overlaps anything).
func (c *chainFront) issue(ctx context.Context, b *cuda.Backend, g gemmFunc, sync func() error) error {
	steps := []func() error{
		func() error {
			return b.ActQuant(ctx, &mla.ActQuantArgs{X: c.hiddenBuf, XStride: c.hidden, Out: c.xq})
		},
		func() error { return g(ctx, &mla.GEMMArgs{X: c.xq, W: c.wFused, Y: c.fusedA, YStride: c.nFused}) },
		func() error {
			return b.Side(ctx, func() error { return g(ctx, &mla.GEMMArgs{X: c.xq, W: c.wSide, Y: c.ySide, YStride: c.nSide}) })
		},
		func() error {
			return b.NormQuant(ctx, &mla.NormQuantArgs{X: c.fusedA, XStride: c.nFused, Weight: c.norm, Eps: 1e-6, Out: c.qn})
		},
		func() error { return g(ctx, &mla.GEMMArgs{X: c.qn, W: c.wQ, Y: c.qIn, YStride: c.nQ}) },
		func() error { return b.JoinKV(ctx) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
		if sync != nil {
			if err := sync(); err != nil {
				return err
			}
		}
	}
	return nil
}

// outputs names each buffer the steps write, with its row width in
// elements of elemBytes bytes (for locating a difference).
func (c *chainFront) outputs() []struct {
	name              string
	buf               mla.Buffer
	n, cols, elemSize int
} {
	return []struct {
		name              string
		buf               mla.Buffer
		n, cols, elemSize int
	}{
		{"hidden_fp8", c.xq.Data, c.rows * c.hidden, c.hidden, 1},
		{"hidden_scale", c.xq.Scale, 4 * c.hidden / 128 * c.rows, c.rows, 4},
		{"fused_a", c.fusedA, 2 * c.rows * c.nFused, c.nFused, 2},
		{"side_y", c.ySide, 2 * c.rows * c.nSide, c.nSide, 2},
		{"q_norm_fp8", c.qn.Data, c.rows * c.qLora, c.qLora, 1},
		{"q_norm_scale", c.qn.Scale, 4 * c.qLora / 128 * c.rows, c.rows, 4},
		{"q_in", c.qIn, 2 * c.rows * c.nQ, c.nQ, 2},
	}
}

// run poisons the outputs, writes the hidden rows, runs launch and reads
// every output back.
func (c *chainFront) run(t *testing.T, b *cuda.Backend, hidden []byte, launch func() error) map[string][]byte {
	ctx := context.Background()
	for _, o := range c.outputs() {
		require.NoError(t, b.Fill(o.buf, 0, o.n, 0xFF))
	}
	require.NoError(t, b.Write(c.hiddenBuf, 0, hidden))
	require.NoError(t, launch())
	require.NoError(t, b.Synchronize(ctx))
	out := map[string][]byte{}
	for _, o := range c.outputs() {
		out[o.name] = make([]byte, o.n)
		require.NoError(t, b.Read(out[o.name], o.buf, 0))
	}
	return out
}

// diff describes where got differs from want: the count of differing
// elements, the first, and the rows and the 128- and 256-column blocks
// they fall in (a split-K block of the current kernel is 128 columns, a
// block of the f16 rewrite 256).
func diff(got, want []byte, cols, elemSize int) string {
	n, first := 0, -1
	rows, b128, b256 := map[int]bool{}, map[int]bool{}, map[int]bool{}
	for e := 0; e*elemSize < len(want); e++ {
		g, w := got[e*elemSize:(e+1)*elemSize], want[e*elemSize:(e+1)*elemSize]
		if string(g) == string(w) {
			continue
		}
		if first < 0 {
			first = e
		}
		n++
		rows[e/cols], b128[e%cols/128], b256[e%cols/256] = true, true, true
	}
	if n == 0 {
		return ""
	}
	keys := func(m map[int]bool) string {
		var k []int
		for v := range m {
			k = append(k, v)
		}
		sort.Ints(k)
		if len(k) > 12 {
			return fmt.Sprintf("%v... (%d)", k[:12], len(k))
		}
		return fmt.Sprint(k)
	}
	return fmt.Sprintf("%d of %d elements differ, first [%d][%d]; rows %s; 128-column blocks %s; 256-column blocks %s",
		n, len(want)/elemSize, first/cols, first%cols, keys(rows), keys(b128), keys(b256))
}

// checkBound checks a GEMM output of the reference run against the host
// reference computed from the run's own activations.
func checkBound(t *testing.T, name string, rows, k int, xData, xScale []byte, w *weights.FP8Matrix, y []byte) {
	x := &gemm.Activations{Rows: rows, K: k, Data: xData, Scale: numerics.F32sFromBytes(xScale), ScaleStride: rows}
	want, err := gemm.Reference(x, w)
	require.NoError(t, err)
	got := make([]uint16, len(want))
	for i := range got {
		got[i] = binary.LittleEndian.Uint16(y[2*i:])
	}
	require.NoError(t, gemm.CheckBound(x, w, want, got), name)
}

// TestCUDAGEMMChainReplay is the check the f16 rewrite of the FP8 GEMM
// (5fe1622..508f76b) lacked before it reached the chain: the chain's
// steps before the prologue (act_quant, the fused A GEMM, q_norm on its
// output, the wq_b GEMM) with a second GEMM on the side stream, captured
// once in a CUDA graph and replayed with new hidden rows each time, every
// output byte compared with a run of the same steps issued one at a time
// with both streams synchronized after each (nothing overlaps: no
// programmatic dependent launch in effect, no concurrency); the reference
// run's GEMMs are within package gemm's bound of the host reference. The
// shapes are the tiny model's (hidden 256, q_lora_rank 256: K = 256, the
// fused A 768 columns, wq_b of 4 heads) at the 16-row graph bucket and
// at 5 rows, and a V4-Flash-sized front (K = 4096, 1024) at 16 rows,
// where both streams' GEMMs split K at once. With -gemm.rewrite the same
// runs go through the backed-out rewrite, with its single split-K
// workspace ("rewrite-508f76b") and with one per stream; a failure there
// names the step whose output first differs and the blocks it differs in.
func TestCUDAGEMMChainReplay(t *testing.T) {
	b := backend(t)
	require.NoError(t, b.InitGEMM())
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	ctx := context.Background()
	impls := []struct {
		name string
		load func() (gemmFunc, func(), error)
	}{{"current", func() (gemmFunc, func(), error) { return b.GEMM, func() {}, nil }}}
	if err := b.LoadWGMMA(); err == nil {
		impls = append(impls, struct {
			name string
			load func() (gemmFunc, func(), error)
		}{"wgmma", func() (gemmFunc, func(), error) { return b.WGMMAGEMM, func() {}, nil }})
	} else if !errors.Is(err, cuda.ErrWGMMAUnavailable) {
		t.Errorf("loading the wgmma kernel: %v", err)
	} else {
		t.Logf("the wgmma kernel is not run: %v", err)
	}
	if *gemmRewrite {
		// The rewrite as 508f76b ran it, then with one change each, to
		// place the failure: a split-K workspace per stream; no
		// programmatic dependent launch for its kernels; its global reads
		// through L2 (ld.global.cg) instead of the read-only path (__ldg).
		variants := []struct {
			suffix               string
			one, noPDL, coherent bool
		}{
			{"", true, false, false},
			{"-workspace-per-stream", false, false, false},
			{"-no-pdl", false, true, false},
			{"-coherent-loads", false, false, true},
		}
		for _, v := range variants {
			impls = append(impls, struct {
				name string
				load func() (gemmFunc, func(), error)
			}{"rewrite-508f76b" + v.suffix, func() (gemmFunc, func(), error) {
				src := rewriteSource
				if v.coherent {
					src = cuda.CoherentLoads(src)
				}
				rw, err := b.LoadRewriteGEMM(src)
				if err != nil {
					return nil, nil, err
				}
				rw.OneWorkspace, rw.NoPDL = v.one, v.noPDL
				return rw.GEMM, func() { _ = rw.Close() }, nil
			}})
		}
	}
	shapes := []struct {
		name                           string
		rows, hidden, qLora, nQ, nSide int
	}{
		{"tiny-bucket16", 16, 256, 256, 4 * numerics.HeadDim, 512},
		{"tiny-rows5", 5, 256, 256, 4 * numerics.HeadDim, 512},
		{"flash-front-16", 16, 4096, 1024, 4 * numerics.HeadDim, 512},
	}
	const replays = 6
	for _, s := range shapes {
		// One set of weights and buffers a shape, for every implementation.
		r := rand.New(rand.NewPCG(seed, uint64(s.rows)<<32|uint64(s.hidden)))
		c := newChainFront(t, b, r, s.name, s.rows, s.hidden, s.qLora, s.nQ, s.nSide)
		for _, impl := range impls {
			t.Run(impl.name+"/"+s.name, func(t *testing.T) {
				g, done, err := impl.load()
				require.NoError(t, err)
				defer done()
				sync := func() error { return b.Synchronize(ctx) }
				stepwise := func(hidden []byte) map[string][]byte {
					return c.run(t, b, hidden, func() error { return c.issue(ctx, b, g, sync) })
				}
				// The reference run, within the bound of the host GEMMs.
				first := c.hiddenRows(r)
				ref := stepwise(first)
				checkBound(t, "fused A", s.rows, s.hidden, ref["hidden_fp8"], ref["hidden_scale"], c.hwFused, ref["fused_a"])
				checkBound(t, "side GEMM", s.rows, s.hidden, ref["hidden_fp8"], ref["hidden_scale"], c.hwSide, ref["side_y"])
				checkBound(t, "wq_b", s.rows, s.qLora, ref["q_norm_fp8"], ref["q_norm_scale"], c.hwQ, ref["q_in"])
				// Eager without synchronizing (what the graph path's first run
				// is), then the capture, as the engine does.
				eager := c.run(t, b, first, func() error { return c.issue(ctx, b, g, nil) })
				graph, err := b.Capture(func() error { return c.issue(ctx, b, g, nil) })
				require.NoError(t, err)
				defer graph.Close()
				var failures []string
				compare := func(what string, got, want map[string][]byte) {
					for _, o := range c.outputs() {
						if d := diff(got[o.name], want[o.name], o.cols, o.elemSize); d != "" {
							failures = append(failures, fmt.Sprintf("%s: %s: %s", what, o.name, d))
							return // later steps read this one's output
						}
					}
				}
				compare("eager", eager, ref)
				for i := range replays {
					hidden := c.hiddenRows(r)
					got := c.run(t, b, hidden, graph.Launch)
					compare(fmt.Sprintf("replay %d", i), got, stepwise(hidden))
				}
				if len(failures) > 0 {
					t.Fatalf("%s on %s (seed %d):\n%s", impl.name, s.name, seed, strings.Join(failures, "\n"))
				}
			})
		}
		c.free(b)
	}
}
