package engine_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/weights"
)

// countingCPU is the cpu backend recording the shape of every bf16 GEMM
// it runs and counting its live buffers.
type countingCPU struct {
	*cpu.Backend
	mu    sync.Mutex
	gemms []mla.BF16GEMMArgs
	live  int
}

func (c *countingCPU) Alloc(n int) (mla.Buffer, error) {
	b, err := c.Backend.Alloc(n)
	if err == nil {
		c.mu.Lock()
		c.live++
		c.mu.Unlock()
	}
	return b, err
}

func (c *countingCPU) Free(b mla.Buffer) error {
	c.mu.Lock()
	c.live--
	c.mu.Unlock()
	return c.Backend.Free(b)
}

func (c *countingCPU) BF16GEMM(ctx context.Context, a *mla.BF16GEMMArgs) error {
	c.mu.Lock()
	c.gemms = append(c.gemms, *a)
	c.mu.Unlock()
	return c.Backend.BF16GEMM(ctx, a)
}

// take returns the GEMMs recorded since the last take.
func (c *countingCPU) take() []mla.BF16GEMMArgs {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.gemms
	c.gemms = nil
	return g
}

var (
	countingOn   atomic.Bool // available only inside the test that uses it, so "auto" never picks it
	countingLast atomic.Pointer[countingCPU]
)

func init() {
	engine.RegisterBackend("test-bf16-count", func(engine.Options) (mla.Backend, error) {
		b := &countingCPU{Backend: cpu.New(1)}
		countingLast.Store(b)
		return b, nil
	}, func() error {
		if countingOn.Load() {
			return nil
		}
		return errors.New("test backend: switched off")
	})
}

// TestProjectionGEMMFused: a ratio-4 layer with the indexer projects its
// hidden rows with ONE bf16 GEMM, of the compressor's [wkv; wgate], the
// indexer compressor's [wkv; wgate] and weights_proj (2*1024 + 2*256 + 64
// outputs a row), and each consumer's tensor is its columns: the
// compressor's K and G, the indexer's K and G and weights_proj's output
// equal the per-matrix GEMMs of the checkpoint's host weights byte for
// byte (the CPU GEMM's per-element order does not depend on N). The
// ratio-128 layer keeps its single 2*512 projection, the other layers run
// none, and the projected path runs no GEMM at all.
func TestProjectionGEMMFused(t *testing.T) {
	countingOn.Store(true)
	defer countingOn.Store(false)
	seed := testSeed(t)
	cfg := indexerConfig(seed)
	cfg.Backend = "test-bf16-count"
	e := newEngine(t, cfg)
	b := countingLast.Load()
	b.mu.Lock()
	require.Positive(t, b.live, "the engine's buffers are counted")
	b.mu.Unlock()
	ctx := context.Background()
	it, err := e.Begin(ctx, []metadata.Request{ctxReq(1, 7), ctxReq(2, 5)})
	require.NoError(t, err)
	defer it.Abort()
	H := cfg.Model.HiddenSize
	wantN := map[int]int{2: 2*1024 + 2*256 + 64, 3: 2 * 512}
	for l := range e.Layers() {
		hidden := indexerHidden(seed, e, it, l)
		require.NoError(t, it.SetHidden(l, hidden))
		b.take()
		require.NoError(t, it.RunLayer(ctx, l))
		gemms := b.take()
		if wantN[l] == 0 {
			require.Empty(t, gemms, "layer %d has no compressor", l)
			continue
		}
		require.Len(t, gemms, 1, "layer %d: one bf16 GEMM of the hidden rows", l)
		g := gemms[0]
		require.Equal(t, wantN[l], g.N, "layer %d", l)
		require.Equal(t, wantN[l], g.YStride, "layer %d", l)
		require.Equal(t, H, g.K)
		require.Equal(t, e.HiddenInput(), g.X)
		if l != 2 {
			continue
		}
		w, err := weights.SyntheticLayer(&cfg.Model, seed, l, weights.ScaleE8M0)
		require.NoError(t, err)
		require.NotNil(t, w.Indexer)
		gemm := func(ws ...[]uint16) []byte {
			var wm []uint16
			for _, x := range ws {
				wm = append(wm, x...)
			}
			n := len(wm) / H
			c := cpu.New(1)
			up := func(raw []byte) mla.Buffer {
				buf, err := c.Alloc(len(raw))
				require.NoError(t, err)
				require.NoError(t, c.Write(buf, 0, raw))
				return buf
			}
			y := up(make([]byte, it.Tokens()*n*4))
			require.NoError(t, c.BF16GEMM(ctx, &mla.BF16GEMMArgs{Rows: it.Tokens(), N: n, K: H, X: up(hidden), XStride: H,
				W: up(u16Bytes(wm)), Y: y, YStride: n}))
			return cpu.Bytes(y)
		}
		for _, c := range []struct {
			t    engine.ChainTensor
			want []byte
		}{
			{engine.TensorCompressorKG, gemm(w.Compressor.WKV.Data, w.Compressor.WGate.Data)},
			{engine.TensorIndexerKG, gemm(w.Indexer.Compressor.WKV.Data, w.Indexer.Compressor.WGate.Data)},
			{engine.TensorIndexerWeightsProj, gemm(w.Indexer.WeightsProj.Data)},
		} {
			got, err := it.Debug().ReadChain(c.t)
			require.NoError(t, err)
			require.Equal(t, c.want, got, "%v: its columns of the one GEMM's rows", c.t)
			require.NotEqual(t, make([]byte, len(got)), got)
		}
		// The backend's weights are the host matrices, row for row.
		p, err := e.Debug().CompressorProjection(l)
		require.NoError(t, err)
		require.Equal(t, w.Compressor.WKV.Data, p.WKV)
		require.Equal(t, w.Compressor.WGate.Data, p.WGate)
		_, wproj, wkvg, err := e.Debug().IndexerWeights(l)
		require.NoError(t, err)
		require.Equal(t, w.Indexer.WeightsProj.Data, wproj)
		require.Equal(t, append(append([]uint16(nil), w.Indexer.Compressor.WKV.Data...), w.Indexer.Compressor.WGate.Data...), wkvg)
	}
	// After the ratio-128 layer the buffer holds its projections: the
	// indexer's tensors are refused, not read from another layer's rows.
	_, err = it.Debug().ReadChain(engine.TensorIndexerKG)
	require.ErrorContains(t, err, "layer 3 runs no indexer")
	require.NoError(t, it.End(ctx))

	// The projected path: the server's projections, no GEMM.
	pc := compConfig()
	pc.Backend = "test-bf16-count"
	pe := newEngine(t, pc)
	pb := countingLast.Load()
	runComp(t, seed, pe, nil, ctxReq(1, 9))
	require.Empty(t, pb.take(), "Input = projected runs no projection GEMM")
}

// TestProjectionWeightsRefused: indexer weights of another shape than the
// engine runs (index_n_heads 32: weights_proj has 32 rows, so the one
// projection matrix could not be laid out) are refused by New naming the
// tensor, before the layer's projection weight is uploaded, and every
// buffer New allocated is freed.
func TestProjectionWeightsRefused(t *testing.T) {
	countingOn.Store(true)
	defer countingOn.Store(false)
	cfg := indexerConfig(testSeed(t))
	cfg.Backend = "test-bf16-count"
	cfg.Model.IndexNHeads = 32
	_, err := engine.New(context.Background(), cfg)
	require.ErrorContains(t, err, "layer 2 indexer index_n_heads, index_head_dim is [32 128], the engine needs [64 128]")
	b := countingLast.Load()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Zero(t, b.live, "buffers left allocated by the refused New")
	require.Empty(t, b.gemms)
}
