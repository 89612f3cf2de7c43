package tests

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// projectionN is a ratio-4 layer's one bf16 projection GEMM with the
// indexer: the compressor's [wkv; wgate], the indexer compressor's and
// weights_proj (DESIGN.md's appendix).
const projectionN = 2*1024 + 2*256 + 64

// faultyProjection is the cpu backend with one deliberate fault in the
// first ratio-4 projection GEMM it runs, as a broken GPU GEMM would have:
// the largest value of columns [col, col+n) of row 0 doubled (outside
// package gemm's bound) or one float32 ulp off (inside it).
type faultyProjection struct {
	*cpu.Backend
	col, n int
	double bool
	hit    bool
}

func (f *faultyProjection) BF16GEMM(ctx context.Context, a *mla.BF16GEMMArgs) error {
	if err := f.Backend.BF16GEMM(ctx, a); err != nil || a.N != projectionN || f.hit {
		return err
	}
	row := numerics.F32sFromBytes(cpu.Bytes(a.Y)[a.YOffset : a.YOffset+4*a.N])
	c := f.col
	for i := f.col; i < f.col+f.n; i++ {
		if math.Abs(float64(row[i])) > math.Abs(float64(row[c])) {
			c = i
		}
	}
	v := math.Float32bits(row[c])
	if f.double {
		v += 1 << 23 // the exponent + 1
	} else {
		v ^= 1
	}
	copy(cpu.Bytes(a.Y)[a.YOffset+4*c:], numerics.F32Bytes([]float32{math.Float32frombits(v)}))
	f.hit = true
	return nil
}

var faultyProj struct {
	sync.Mutex
	on     atomic.Bool // available only inside the test, so "auto" never picks it
	col, n int
	double bool
	last   *faultyProjection
}

func init() {
	engine.RegisterBackend("faulty-projection", func(engine.Options) (mla.Backend, error) {
		faultyProj.Lock()
		defer faultyProj.Unlock()
		f := &faultyProjection{Backend: cpu.New(0), col: faultyProj.col, n: faultyProj.n, double: faultyProj.double}
		faultyProj.last = f
		return f, nil
	}, func() error {
		if faultyProj.on.Load() {
			return nil
		}
		return errors.New("test backend: switched off")
	})
}

// TestVerifyProjectionColumns: --verify checks the ratio-4 layer's one
// projection GEMM consumer by consumer. A value of the compressor's, the
// indexer compressor's or weights_proj's columns doubled stops the replay
// with a GEMMError naming that consumer's tensor at the layer and
// iteration; one ulp off passes (the bound allows it), and the reference
// continues from the engine's own output, so everything after the GEMM
// still compares byte for byte.
func TestVerifyProjectionColumns(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	faultyProj.on.Store(true)
	defer faultyProj.on.Store(false)
	steps, err := trace.Parse(strings.NewReader(`
{"context":[{"seq":1,"tokens":23},{"seq":2,"tokens":6}]}
{"context":[{"seq":2,"tokens":5}],"generation":{"mtp":3,"seqs":[1],"accept":[2]}}
`))
	require.NoError(t, err)
	m := weights.TinyConfig() // layer 1 is the ratio-4 layer
	m.IndexTopK = 4
	for i, c := range []struct {
		col, n int
		double bool
		gemm   string
	}{
		{0, 2048, true, "compressor"},
		{2048, 512, true, engine.TensorIndexerKG.String()},
		{2560, 64, true, engine.TensorIndexerWeightsProj.String()},
		{2560, 64, false, ""},
		{0, 2048, false, ""},
	} {
		if !raceSample(i, seed) {
			continue
		}
		faultyProj.Lock()
		faultyProj.col, faultyProj.n, faultyProj.double = c.col, c.n, c.double
		faultyProj.Unlock()
		r, err := replay.New(context.Background(), replay.Options{
			Engine: engine.Config{
				Model: m, Cache: kvcache.Config{PageSize: 16, NumPages: 64, Window: 32},
				Backend: "faulty-projection", Layers: 3, MaxSeqs: 4, MaxTokens: 64, RopePositions: 256,
				Compressor:       engine.CompressorConfig{Ratio4Pages: 4, Ratio128Pages: 2, MaxDrafts: 3},
				Input:            engine.InputHidden,
				SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
				Eager:            true,
			},
			Seed: seed, Verify: true,
		})
		require.NoError(t, err)
		require.True(t, r.Engine().RunsIndexer(1))
		_, err = r.Run(context.Background(), steps, nil)
		require.NoError(t, r.Close())
		faultyProj.Lock()
		hit := faultyProj.last.hit
		faultyProj.Unlock()
		require.True(t, hit, "%+v: the fault was never injected", c)
		if c.gemm == "" {
			require.NoError(t, err, "%+v: a one-ulp difference is inside the bound", c)
			continue
		}
		var ge *replay.GEMMError
		require.ErrorAs(t, err, &ge, "%+v", c)
		t.Logf("%+v: %v", c, err)
		require.Equal(t, c.gemm, ge.GEMM)
		require.Equal(t, 0, ge.Iteration)
		require.Equal(t, 1, ge.Layer)
		require.Equal(t, 1, ge.Comparison.Violations)
	}
}
