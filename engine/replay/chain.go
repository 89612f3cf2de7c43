package replay

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// HiddenStates synthesizes one layer's hidden-state rows (Config.Input =
// hidden): [tokens][hidden] bf16, like a residual stream: N(0, 1) values
// scaled per 128-value block by 2^j, j in [-3, 3] (so act_quant's blocks of
// a row get different scales), plus one outlier channel per row of about
// 30x the typical value. Row t draws from math/rand/v2's PCG seeded with
// (seed, a mix of iteration, layer and t), like Activations.
func HiddenStates(seed uint64, iteration, layer, tokens, hidden int) []byte {
	out := make([]byte, tokens*hidden*2)
	for t := range tokens {
		rng := rand.New(rand.NewPCG(seed^0x68696464656e, rowStream(iteration, layer, t)))
		row := out[t*hidden*2 : (t+1)*hidden*2]
		scale := float32(1)
		for i := range hidden {
			if i%numerics.ActQuantBlockSize == 0 {
				scale = numerics.Pow2(rng.IntN(7) - 3)
			}
			binary.LittleEndian.PutUint16(row[2*i:], numerics.BF16FromF32(float32(rng.NormFloat64())*scale))
		}
		o := rng.IntN(hidden)
		binary.LittleEndian.PutUint16(row[2*o:], numerics.BF16FromF32(float32(30*rng.NormFloat64())))
	}
	return out
}

// GEMMError is a GEMM output of the engine outside package gemm's bound
// around the cpu reference's GEMM on the same inputs.
type GEMMError struct {
	Iteration, Layer int
	Backend          string
	GEMM             string // "fused A" or "wq_b"
	Comparison       gemm.Comparison
}

func (e *GEMMError) Error() string {
	return fmt.Sprintf("verify: iteration %d layer %d: the %s GEMM output of %s is outside the bound around the cpu reference: %v",
		e.Iteration, e.Layer, e.GEMM, e.Backend, e.Comparison)
}

// chainWeights returns the reference engine's GEMM weights of a layer,
// read once.
func (r *Replayer) chainWeights(layer int) (*[2]weights.FP8Matrix, error) {
	if w, ok := r.weights[layer]; ok {
		return w, nil
	}
	f, q, err := r.ref.Debug().ChainWeights(layer)
	if err != nil {
		return nil, fmt.Errorf("reference engine: %w", err)
	}
	w := &[2]weights.FP8Matrix{f, q}
	r.weights[layer] = w
	return w, nil
}

func u16sFrom(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// verifyChain checks one layer of the chain the engine ran (it) on the cpu
// reference (rit), step by step: act_quant byte for byte; the fused A GEMM
// within package gemm's bound of the reference's; then the reference
// continues from the engine's own fused A output: q_norm byte for byte, the
// wq_b GEMM within the bound; and from the engine's wq_b output the
// prologue, whose Q and cache pages compare later byte for byte.
func (r *Replayer) verifyChain(ctx context.Context, it, rit *engine.Iteration, layer int, hidden []byte) error {
	ref := func(err error) error { return fmt.Errorf("reference engine: %w", err) }
	if err := rit.SetHidden(layer, hidden); err != nil {
		return ref(err)
	}
	read := func(x *engine.Iteration, t engine.ChainTensor) ([]byte, error) {
		b, err := x.Debug().ReadChain(t)
		if err != nil && x == rit {
			return nil, ref(err)
		}
		return b, err
	}
	// exact compares a bit-exact step's outputs.
	exact := func(t engine.ChainTensor) ([]byte, error) {
		got, err := read(it, t)
		if err != nil {
			return nil, err
		}
		want, err := read(rit, t)
		if err != nil {
			return nil, err
		}
		if off, n := compareBytes(got, want); off >= 0 {
			return nil, &VerifyError{Iteration: it.Index(), Layer: layer, Backend: r.eng.Backend().Name(), Buffer: t.String(),
				Offset: off, Where: fmt.Sprintf("byte %d of %d", off, len(want)), Got: window(got, off), Want: window(want, off), Differ: n, Size: len(want)}
		}
		return want, nil
	}
	// bounded checks a GEMM output against the reference's, then makes the
	// reference continue from the engine's output.
	bounded := func(name string, fp8, scale, out engine.ChainTensor, w *weights.FP8Matrix) error {
		data, err := read(rit, fp8)
		if err != nil {
			return err
		}
		sb, err := read(rit, scale)
		if err != nil {
			return err
		}
		x := &gemm.Activations{Rows: it.Tokens(), K: w.K, Data: data, Scale: numerics.F32sFromBytes(sb), ScaleStride: it.Tokens()}
		got, err := read(it, out)
		if err != nil {
			return err
		}
		want, err := read(rit, out)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			c, err := gemm.Compare(x, w, u16sFrom(want), u16sFrom(got))
			if err != nil {
				return fmt.Errorf("verify: %s GEMM: %w", name, err)
			}
			if c.Violations > 0 {
				return &GEMMError{Iteration: it.Index(), Layer: layer, Backend: r.eng.Backend().Name(), GEMM: name, Comparison: c}
			}
		}
		if err := rit.Debug().WriteChain(layer, out, got); err != nil {
			return ref(err)
		}
		return nil
	}
	w, err := r.chainWeights(layer)
	if err != nil {
		return err
	}
	steps := []func() error{
		func() error { return rit.Debug().RunStage(ctx, layer, engine.StageActQuant) },
		func() error { _, err := exact(engine.TensorHiddenFP8); return err },
		func() error { _, err := exact(engine.TensorHiddenScale); return err },
		func() error { return rit.Debug().RunStage(ctx, layer, engine.StageFusedGEMM) },
		func() error {
			return bounded("fused A", engine.TensorHiddenFP8, engine.TensorHiddenScale, engine.TensorFusedA, &w[0])
		},
		func() error { return rit.Debug().RunStage(ctx, layer, engine.StageQNorm) },
		func() error { _, err := exact(engine.TensorQNormFP8); return err },
		func() error { _, err := exact(engine.TensorQNormScale); return err },
		func() error { return rit.Debug().RunStage(ctx, layer, engine.StageQGEMM) },
		func() error {
			return bounded("wq_b", engine.TensorQNormFP8, engine.TensorQNormScale, engine.TensorQIn, &w[1])
		},
		func() error { return rit.Debug().RunStage(ctx, layer, engine.StageCompressorGEMM) },
		func() error { return r.verifyCompressorGEMM(it, rit, layer, hidden) },
		func() error { return rit.Debug().RunStage(ctx, layer, engine.StageIndexerGEMMs) },
		func() error { return r.verifyIndexerGEMMs(it, rit, layer, hidden) },
		func() error { return rit.Debug().RunStage(ctx, layer, engine.StagePrologue) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// verifyCompressorGEMM checks a compressed layer's compressor projections
// (K and G before ape, float32) within package gemm's bf16 bound of the
// reference's, then makes the reference continue from the engine's.
func (r *Replayer) verifyCompressorGEMM(it, rit *engine.Iteration, layer int, hidden []byte) error {
	if r.ref.CompressorWidth(layer) == 0 {
		return nil
	}
	got, err := it.Debug().ReadChain(engine.TensorCompressorKG)
	if err != nil {
		return err
	}
	want, err := rit.Debug().ReadChain(engine.TensorCompressorKG)
	if err != nil {
		return fmt.Errorf("reference engine: %w", err)
	}
	if !bytes.Equal(got, want) {
		p, ok := r.projections[layer]
		if !ok {
			if p, err = r.ref.Debug().CompressorProjection(layer); err != nil {
				return fmt.Errorf("reference engine: %w", err)
			}
			r.projections[layer] = p
		}
		o := &gemm.BF16Operands{Rows: it.Tokens(), N: 2 * p.Out(), K: p.Hidden, X: u16sFrom(hidden), XStride: p.Hidden,
			W: append(append(make([]uint16, 0, 2*len(p.WKV)), p.WKV...), p.WGate...)}
		c, err := gemm.CompareF32(o, numerics.F32sFromBytes(want), numerics.F32sFromBytes(got))
		if err != nil {
			return fmt.Errorf("verify: compressor GEMM: %w", err)
		}
		if c.Violations > 0 {
			return &GEMMError{Iteration: it.Index(), Layer: layer, Backend: r.eng.Backend().Name(), GEMM: "compressor", Comparison: c}
		}
	}
	if err := rit.Debug().WriteChain(layer, engine.TensorCompressorKG, got); err != nil {
		return fmt.Errorf("reference engine: %w", err)
	}
	return nil
}

// verifyIndexerGEMMs checks a ratio-4 layer's indexer GEMM outputs within
// package gemm's bounds of the reference's (wq_b: FP8, from the q_norm
// activation; weights_proj and the indexer compressor's projection: bf16,
// from the hidden rows), then makes the reference continue from the
// engine's, so the indexer's query, head weights, entries and states
// compare byte for byte.
func (r *Replayer) verifyIndexerGEMMs(it, rit *engine.Iteration, layer int, hidden []byte) error {
	if !r.eng.RunsIndexer(layer) {
		return nil
	}
	ref := func(err error) error { return fmt.Errorf("reference engine: %w", err) }
	wqB, wproj, wkvg, err := r.ref.Debug().IndexerWeights(layer)
	if err != nil {
		return ref(err)
	}
	T, H := it.Tokens(), r.ref.HiddenSize()
	for _, s := range []engine.ChainTensor{engine.TensorIndexerQIn, engine.TensorIndexerWeightsProj, engine.TensorIndexerKG} {
		got, err := it.Debug().ReadChain(s)
		if err != nil {
			return err
		}
		want, err := rit.Debug().ReadChain(s)
		if err != nil {
			return ref(err)
		}
		if !bytes.Equal(got, want) {
			var c gemm.Comparison
			switch s {
			case engine.TensorIndexerQIn:
				data, err := rit.Debug().ReadChain(engine.TensorQNormFP8)
				if err != nil {
					return ref(err)
				}
				sb, err := rit.Debug().ReadChain(engine.TensorQNormScale)
				if err != nil {
					return ref(err)
				}
				x := &gemm.Activations{Rows: T, K: wqB.K, Data: data, Scale: numerics.F32sFromBytes(sb), ScaleStride: T}
				c, err = gemm.Compare(x, &wqB, u16sFrom(want), u16sFrom(got))
				if err != nil {
					return fmt.Errorf("verify: indexer wq_b GEMM: %w", err)
				}
			default:
				w := wproj
				if s == engine.TensorIndexerKG {
					w = wkvg
				}
				o := &gemm.BF16Operands{Rows: T, N: len(w) / H, K: H, X: u16sFrom(hidden), XStride: H, W: w}
				c, err = gemm.CompareF32(o, numerics.F32sFromBytes(want), numerics.F32sFromBytes(got))
				if err != nil {
					return fmt.Errorf("verify: %v GEMM: %w", s, err)
				}
			}
			if c.Violations > 0 {
				return &GEMMError{Iteration: it.Index(), Layer: layer, Backend: r.eng.Backend().Name(), GEMM: s.String(), Comparison: c}
			}
		}
		if err := rit.Debug().WriteChain(layer, s, got); err != nil {
			return ref(err)
		}
	}
	return nil
}
