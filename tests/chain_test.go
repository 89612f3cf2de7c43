package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// faultyChain is the cpu backend with one deliberate fault in the chain's
// steps before the prologue, as a broken GPU kernel would have: after its
// target-th GEMM (or act_quant) it changes one output value.
type faultyChain struct {
	*cpu.Backend
	fault  string // "gemm-ulp", "gemm-scale" or "act-quant"
	target int
	rng    *rand.Rand
	calls  int
	hit    bool
}

func (f *faultyChain) Name() string { return "faulty-" + f.fault }

func (f *faultyChain) GEMM(ctx context.Context, a *mla.GEMMArgs) error {
	if err := f.Backend.GEMM(ctx, a); err != nil || !strings.HasPrefix(f.fault, "gemm") {
		return err
	}
	if f.calls++; f.calls-1 != f.target {
		return nil
	}
	// The row's largest value: doubling it is far outside the bound, which
	// allows about a per cent of a typical value.
	r := f.rng.IntN(a.X.Rows)
	row := cpu.Bytes(a.Y)[a.YOffset+2*r*a.YStride:]
	c := 0
	for i := range a.W.N {
		if math.Abs(float64(numerics.F32FromBF16(binary.LittleEndian.Uint16(row[2*i:])))) > math.Abs(float64(numerics.F32FromBF16(binary.LittleEndian.Uint16(row[2*c:])))) {
			c = i
		}
	}
	y := row[2*c:]
	v := binary.LittleEndian.Uint16(y)
	if f.fault == "gemm-ulp" {
		v ^= 1 // one bf16 ulp: inside the bound
	} else {
		v += 0x80 // the exponent + 1: doubles the value, outside the bound
	}
	binary.LittleEndian.PutUint16(y, v)
	f.hit = true
	return nil
}

func (f *faultyChain) ActQuant(ctx context.Context, a *mla.ActQuantArgs) error {
	if err := f.Backend.ActQuant(ctx, a); err != nil || f.fault != "act-quant" {
		return err
	}
	if f.calls++; f.calls-1 != f.target {
		return nil
	}
	cpu.Bytes(a.Out.Data)[f.rng.IntN(a.Out.Rows*a.Out.K)] ^= 1 << f.rng.IntN(7)
	f.hit = true
	return nil
}

var faulty struct {
	sync.Mutex
	last   map[string]*faultyChain
	target int
	seed   uint64
}

func init() {
	faulty.last = map[string]*faultyChain{}
	for _, fault := range []string{"gemm-ulp", "gemm-scale", "act-quant"} {
		engine.RegisterBackend("faulty-"+fault, func(engine.Options) (mla.Backend, error) {
			faulty.Lock()
			defer faulty.Unlock()
			f := &faultyChain{Backend: cpu.New(0), fault: fault, target: faulty.target, rng: rand.New(rand.NewPCG(faulty.seed, uint64(faulty.target)))}
			faulty.last[fault] = f
			return f, nil
		}, func() error { return nil })
	}
}

// chainOptions replays steps through the hidden-state chain on the tiny
// checkpoint model (hidden 256, q_lora_rank 256, 4 heads), synthetic
// weights from seed, two layers.
func chainOptions(steps []trace.Step, backend string, seed uint64) replay.Options {
	m := weights.TinyConfig()
	m.NumHeads = 4
	st := trace.Summarize(steps)
	return replay.Options{
		Engine: engine.Config{
			Model:            m,
			Cache:            kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 64, NumPages: 16},
			Backend:          backend,
			Layers:           2,
			MaxSeqs:          st.MaxSeqs,
			MaxTokens:        st.MaxTokens,
			Input:            engine.InputHidden,
			SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
			FullCache:        true,
			Compressor:       engine.CompressorConfig{Off: true},
			Eager:            true,
		},
		Seed:   seed,
		Verify: true,
	}
}

// TestVerifyChainFaults checks what --verify makes of a broken chain step:
// a GEMM output one bf16 ulp off passes (the documented bound allows it), a
// doubled GEMM output stops the replay with a GEMMError naming the GEMM, the
// iteration and the layer, and one flipped act_quant byte stops it with a
// VerifyError at that buffer.
func TestVerifyChainFaults(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	steps, err := trace.Parse(strings.NewReader(verifyTrace))
	require.NoError(t, err)
	for i, c := range []struct {
		fault  string
		target int // GEMM (two per layer) or act_quant (one per layer) to corrupt, counting every layer
		gemm   string
		iter   int
		layer  int
	}{
		{"gemm-ulp", 1, "", -1, -1},
		{"gemm-scale", 0, "fused A", 0, 0},
		{"gemm-scale", 3, "wq_b", 0, 1},
		{"gemm-scale", 6, "fused A", 1, 1},
		{"gemm-scale", 7, "wq_b", 1, 1},
		{"act-quant", 2, "", 1, 0},
	} {
		if !raceSample(i, seed) {
			continue
		}
		faulty.Lock()
		faulty.target, faulty.seed = c.target, seed
		faulty.Unlock()
		r, err := replay.New(context.Background(), chainOptions(steps, "faulty-"+c.fault, seed))
		require.NoError(t, err)
		_, err = r.Run(context.Background(), steps, nil)
		require.NoError(t, r.Close())
		faulty.Lock()
		f := faulty.last[c.fault]
		faulty.Unlock()
		require.True(t, f.hit, "%+v: the fault was never injected", c)
		if c.iter < 0 {
			require.NoError(t, err, "%+v: a one-ulp GEMM difference is inside the bound", c)
			continue
		}
		require.Error(t, err, "%+v: the fault went unnoticed", c)
		t.Logf("%+v: %v", c, err)
		if c.gemm != "" {
			var ge *replay.GEMMError
			require.ErrorAs(t, err, &ge)
			require.Equal(t, c.gemm, ge.GEMM)
			require.Equal(t, c.iter, ge.Iteration)
			require.Equal(t, c.layer, ge.Layer)
			require.Equal(t, 1, ge.Comparison.Violations)
		} else {
			var ve *replay.VerifyError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, "hidden_fp8", ve.Buffer)
			require.Equal(t, c.iter, ve.Iteration)
			require.Equal(t, c.layer, ve.Layer)
			require.Equal(t, 1, ve.Differ)
		}
	}
}

func requireCUDA(t *testing.T, gpus int) {
	t.Helper()
	if err := cuda.Available(); err != nil {
		t.Skipf("no CUDA: %v", err)
	}
	n, err := driver.DeviceCount()
	require.NoError(t, err)
	if n < gpus {
		t.Skipf("%d GPUs, the test needs %d", n, gpus)
	}
}

// TestChainCUDAVerify runs the hidden-state chain on the GPU and verifies
// every layer as cmd/decode --verify does: act_quant and q_norm byte for
// byte, the GEMMs within package gemm's bound of the CPU's, Q and the cache
// byte for byte from the GPU's own GEMM outputs; through CUDA graphs (the
// whole chain captured per layer and bucket, the KV prologue on the second
// stream) and launch by launch, on the tiny model and on a V4-Flash and a
// V4-Pro layer with synthetic weights.
func TestChainCUDAVerify(t *testing.T) {
	requireCUDA(t, 1)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	steps, err := trace.Parse(strings.NewReader(`{"context":[{"seq":3,"tokens":5}]}` + "\n" + verifyTrace +
		`{"context":[{"seq":4,"tokens":1}],"generation":{"mtp":0,"seqs":[3]}}` + "\n" + `{"generation":{"mtp":1,"seqs":[3,4]}}` + "\n"))
	require.NoError(t, err)
	for _, model := range []string{"tiny", "flash", "pro"} {
		for _, graphs := range []bool{true, false} {
			t.Run(model+map[bool]string{true: "-graphs", false: "-eager"}[graphs], func(t *testing.T) {
				opts := chainOptions(steps, "cuda", seed)
				switch model {
				case "flash":
					opts.Engine.Model, opts.Engine.Layers = dsv4.Flash(), 1
				case "pro":
					opts.Engine.Model, opts.Engine.Layers = dsv4.Pro(), 1
				}
				opts.Engine.Eager = !graphs
				opts.Engine.MaxTokens = 256
				r, err := replay.New(context.Background(), opts)
				require.NoError(t, err)
				defer r.Close()
				rep, err := r.Run(context.Background(), steps, nil)
				require.NoError(t, err)
				require.Equal(t, len(steps), rep.Summary.Verified)
			})
		}
	}
}

// TestChainTwoGPUs is head-sharded tensor parallelism with one engine per
// GPU: heads [0, H/2) on device 0 and [H/2, H) on device 1, the same hidden
// states. Each shard's Q and cache are verified against the CPU reference
// of its head range, and the two GPUs' caches are identical.
func TestChainTwoGPUs(t *testing.T) {
	requireCUDA(t, 2)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	m := dsv4.Flash()
	ctx := context.Background()
	var shards, refs []*engine.Engine
	for d := range 2 {
		cfg := engine.Config{
			Model: m, Cache: kvcache.Config{PageSize: 64, NumPages: 8}, Backend: "cuda", Device: d,
			Layers: 2, MaxSeqs: 4, MaxTokens: 128, Input: engine.InputHidden, SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
			HeadBegin: d * m.NumHeads / 2, HeadEnd: (d + 1) * m.NumHeads / 2,
			FullCache:  true,
			Compressor: engine.CompressorConfig{Off: true},
		}
		e, err := engine.New(ctx, cfg)
		require.NoError(t, err)
		defer e.Close()
		cfg.Backend, cfg.Device = engine.BackendCPU, 0
		ref, err := engine.New(ctx, cfg)
		require.NoError(t, err)
		defer ref.Close()
		shards, refs = append(shards, e), append(refs, ref)
	}
	for _, reqs := range [][]metadata.Request{
		{{Seq: 1, Phase: metadata.Context, NewTokens: 70}, {Seq: 2, Phase: metadata.Context, NewTokens: 3}},
		{{Seq: 1, Phase: metadata.Generation, MTP: 3}, {Seq: 2, Phase: metadata.Generation, MTP: 3}},
	} {
		its, rits := make([]*engine.Iteration, 2), make([]*engine.Iteration, 2)
		for d, e := range shards {
			var err error
			its[d], err = e.Begin(ctx, reqs)
			require.NoError(t, err)
			rits[d], err = refs[d].Begin(ctx, reqs)
			require.NoError(t, err)
		}
		for l := range 2 {
			hidden := replay.HiddenStates(seed, its[0].Index(), l, its[0].Tokens(), m.HiddenSize)
			for d, it := range its {
				require.NoError(t, it.SetHidden(l, hidden))
				require.NoError(t, it.RunLayer(ctx, l))
				rit := rits[d]
				require.NoError(t, rit.SetHidden(l, hidden))
				for _, s := range []engine.Stage{engine.StageActQuant, engine.StageFusedGEMM} {
					require.NoError(t, rit.Debug().RunStage(ctx, l, s))
				}
				fused, err := it.Debug().ReadChain(engine.TensorFusedA)
				require.NoError(t, err)
				require.NoError(t, rit.Debug().WriteChain(l, engine.TensorFusedA, fused))
				for _, s := range []engine.Stage{engine.StageQNorm, engine.StageQGEMM} {
					require.NoError(t, rit.Debug().RunStage(ctx, l, s))
				}
				for _, tn := range []engine.ChainTensor{engine.TensorHiddenFP8, engine.TensorQNormFP8} {
					got, err := it.Debug().ReadChain(tn)
					require.NoError(t, err)
					want, err := rit.Debug().ReadChain(tn)
					require.NoError(t, err)
					require.True(t, bytes.Equal(want, got), "device %d layer %d: %v differs", d, l, tn)
				}
				qIn, err := it.Debug().ReadChain(engine.TensorQIn)
				require.NoError(t, err)
				require.NoError(t, rit.Debug().WriteChain(l, engine.TensorQIn, qIn))
				require.NoError(t, rit.Debug().RunStage(ctx, l, engine.StagePrologue))
				got, err := it.Debug().ReadQ()
				require.NoError(t, err)
				want, err := rit.Debug().ReadQ()
				require.NoError(t, err)
				real := len(want)
				require.True(t, bytes.Equal(want, got[:real]), "device %d layer %d: Q differs from the CPU given the GPU's GEMM outputs", d, l)
				require.Equal(t, make([]byte, len(got)-real), got[real:], "device %d layer %d: Q padding rows", d, l)
			}
		}
		for d, it := range its {
			require.NoError(t, it.End(ctx))
			require.NoError(t, rits[d].End(ctx))
		}
		for l := range 2 {
			a, err := shards[0].Debug().ReadPool(l)
			require.NoError(t, err)
			b, err := shards[1].Debug().ReadPool(l)
			require.NoError(t, err)
			require.True(t, bytes.Equal(a, b), "layer %d: the two GPUs' caches differ", l)
			want, err := refs[0].Debug().ReadPool(l)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, a), "layer %d: the GPU cache differs from the CPU's given the GPU's GEMM outputs", l)
		}
	}
}
