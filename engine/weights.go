package engine

import (
	"fmt"
	"path/filepath"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// weightSource hands out the chain weights of one layer at a time.
type weightSource interface {
	Layer(layer int) (*weights.Layer, error)
	Close()
}

// openWeightSource is the checkpoint Config.Checkpoint names, or the
// synthetic generator Config.SyntheticWeights asks for (resolve refuses
// both, and neither).
func openWeightSource(cfg Config) (weightSource, error) {
	heads := weights.HeadRange{Begin: cfg.HeadBegin, End: cfg.HeadEnd}
	if cfg.SyntheticWeights != nil {
		return &syntheticSource{cfg: cfg, heads: heads}, nil
	}
	if err := checkCheckpointConfig(cfg); err != nil {
		return nil, err
	}
	layers := make([]int, cfg.Layers)
	for l := range layers {
		layers[l] = l
	}
	ck, err := weights.Load(cfg.Checkpoint, &cfg.Model, weights.LoadOptions{Layers: layers, Heads: heads})
	if err != nil {
		return nil, fmt.Errorf("engine: Config.Checkpoint %s: %w", cfg.Checkpoint, err)
	}
	return &checkpointSource{cfg: cfg, ck: ck}, nil
}

// checkCheckpointConfig refuses a checkpoint whose config.json disagrees
// with Config.Model on a dimension the chain or the prologue depends on,
// naming the field.
func checkCheckpointConfig(cfg Config) error {
	path := filepath.Join(cfg.Checkpoint, weights.ConfigFile)
	ck, err := dsv4.Load(path)
	if err != nil {
		return fmt.Errorf("engine: Config.Checkpoint: %w", err)
	}
	m := cfg.Model
	fields := []struct {
		name      string
		ckpt, cfg int
	}{
		{"hidden_size", ck.HiddenSize, m.HiddenSize},
		{"num_attention_heads", ck.NumHeads, m.NumHeads},
		{"q_lora_rank", ck.QLoraRank, m.QLoraRank},
		{"kv_lora_rank", ck.KVLoraRank, m.KVLoraRank},
		{"head_dim", ck.HeadDim, m.HeadDim},
		{"qk_rope_head_dim", ck.QKRopeHeadDim, m.QKRopeHeadDim},
	}
	for _, f := range fields {
		if f.ckpt != f.cfg {
			return fmt.Errorf("engine: Config.Checkpoint %s: %s = %d in %s, but Config.Model (%s) has %d",
				cfg.Checkpoint, f.name, f.ckpt, path, m.Name, f.cfg)
		}
	}
	if all := ck.NumAttentionLayers(); cfg.Layers > all {
		return fmt.Errorf("engine: Config.Checkpoint %s: num_hidden_layers = %d (+%d MTP) in %s, fewer than Config.Layers = %d",
			cfg.Checkpoint, ck.NumLayers, ck.NumMTPLayers, path, cfg.Layers)
	}
	return nil
}

type checkpointSource struct {
	cfg Config
	ck  *weights.Checkpoint
}

func (s *checkpointSource) Layer(layer int) (*weights.Layer, error) {
	l := s.ck.Layer(layer)
	if l == nil {
		return nil, fmt.Errorf("engine: Config.Checkpoint %s: layer %d was not loaded", s.cfg.Checkpoint, layer)
	}
	return l, nil
}

// Close drops the host copies once they are on the backend.
func (s *checkpointSource) Close() { s.ck = nil }

// syntheticSource generates each layer with weights.SyntheticLayer, the
// generator of the synthetic checkpoint writer, so an engine on synthetic
// weights computes what one on a checkpoint written with the same seed
// computes (the writer's e8m0 scale format: power-of-two block scales, as
// DeepSeek's release stores them).
type syntheticSource struct {
	cfg   Config
	heads weights.HeadRange
}

func (s *syntheticSource) Layer(layer int) (*weights.Layer, error) {
	l, err := weights.SyntheticLayer(&s.cfg.Model, s.cfg.SyntheticWeights.Seed, layer, weights.ScaleE8M0)
	if err != nil {
		return nil, fmt.Errorf("engine: synthetic weights of layer %d: %w", layer, err)
	}
	if !s.cfg.Compresses() {
		l.Compressor = nil // not read by the chain; let it go
	}
	l.WQB = headRows(l.WQB, s.cfg.HeadBegin, s.cfg.HeadEnd)
	return l, nil
}

func (s *syntheticSource) Close() {}

// headRows cuts wq_b ([heads*512][q_lora_rank]) to the rows of heads [h0,
// h1): whole 128-row scale blocks, since a head is 512 rows.
func headRows(m weights.FP8Matrix, h0, h1 int) weights.FP8Matrix {
	if h0 == 0 && h1*numerics.HeadDim == m.N {
		return m
	}
	r0, r1 := h0*numerics.HeadDim, h1*numerics.HeadDim
	cols := m.ScaleCols()
	return weights.FP8Matrix{
		N:     r1 - r0,
		K:     m.K,
		Data:  m.Data[r0*m.K : r1*m.K],
		Scale: m.Scale[r0/128*cols : r1/128*cols],
	}
}

// uploadLayer puts one layer's chain weights on the backend: the fused
// [wq_a; wkv] matrix, the head range's wq_b, q_norm, and kv_norm as the
// layer's kv_a_layernorm weight.
func (e *Engine) uploadLayer(layer int, w *weights.Layer, alloc func(what string, n int, fill byte) (mla.Buffer, error)) (chainLayer, error) {
	var cl chainLayer
	cfg := e.cfg
	Q, H := cfg.Model.QLoraRank, cfg.Model.HiddenSize
	checks := []struct {
		what       string
		n, k       int
		wantN, wnK int
	}{
		{"wq_a", w.WQA.N, w.WQA.K, Q, H},
		{"wkv", w.WKV.N, w.WKV.K, numerics.HeadDim, H},
		{"wq_b", w.WQB.N, w.WQB.K, cfg.heads() * numerics.HeadDim, Q},
	}
	for _, c := range checks {
		if c.n != c.wantN || c.k != c.wnK {
			return cl, fmt.Errorf("engine: layer %d %s is [%d, %d], the engine needs [%d, %d]", layer, c.what, c.n, c.k, c.wantN, c.wnK)
		}
	}
	if len(w.QNorm) != Q || len(w.KVNorm) != numerics.HeadDim {
		return cl, fmt.Errorf("engine: layer %d q_norm has %d values, kv_norm %d; want %d and %d", layer, len(w.QNorm), len(w.KVNorm), Q, numerics.HeadDim)
	}
	fused, err := w.FusedA()
	if err != nil {
		return cl, fmt.Errorf("engine: %w", err)
	}
	up := func(what string, raw []byte) (mla.Buffer, error) {
		buf, err := alloc(fmt.Sprintf("layer %d %s", layer, what), len(raw), 0)
		if err != nil {
			return nil, err
		}
		if err := e.backend.Write(buf, 0, raw); err != nil {
			return nil, fmt.Errorf("engine: uploading layer %d %s: %w", layer, what, err)
		}
		return buf, nil
	}
	matrix := func(what string, m weights.FP8Matrix) (mla.FP8Weight, error) {
		fw := mla.FP8Weight{N: m.N, K: m.K}
		var err error
		if fw.Data, err = up(what, m.Data); err != nil {
			return fw, err
		}
		fw.Scale, err = up(what+" scales", numerics.F32Bytes(m.Scale))
		return fw, err
	}
	if cl.fused, err = matrix("[wq_a; wkv]", fused); err != nil {
		return cl, err
	}
	if cl.wqB, err = matrix("wq_b", w.WQB); err != nil {
		return cl, err
	}
	if cl.qNorm, err = up("q_norm weight", numerics.F32Bytes(w.QNorm)); err != nil {
		return cl, err
	}
	if err := e.setLayerWeight(layer, w.KVNorm); err != nil {
		return cl, err
	}
	return cl, nil
}
