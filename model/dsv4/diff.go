package dsv4

import (
	"errors"
	"fmt"
	"strings"
)

// ErrMismatch is what a *MismatchError wraps: two configs that should
// describe the same model (a --model preset and a checkpoint's config.json)
// disagree.
var ErrMismatch = errors.New("dsv4: configs disagree")

// Mismatch is one field on which two configs disagree: Field is the
// config.json key (nested keys joined with '.', list entries as key[i]), A
// and B the two values as Go prints them.
type Mismatch struct {
	Field string
	A, B  string
}

// MismatchError lists every field on which Diff's two configs disagree, in
// Config's field order.
type MismatchError struct{ Fields []Mismatch }

func (e *MismatchError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, m := range e.Fields {
		parts[i] = fmt.Sprintf("%s (%s vs %s)", m.Field, m.A, m.B)
	}
	return "dsv4: configs disagree on " + strings.Join(parts, ", ")
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

// Diff compares two configs on every field the prologue, the caches and the
// loader depend on (all of Config but Name) and returns nil when they agree,
// else a *MismatchError naming each field that differs. Floats compare
// exactly: a config.json that writes rope_theta as 1e4 and one that writes
// 10000 agree. Compress ratios compare per layer, so a list that leaves the
// MTP layers out agrees with one that lists them as 0.
func Diff(a, b Config) error {
	var ms []Mismatch
	add := func(field string, x, y any) {
		if x != y {
			ms = append(ms, Mismatch{Field: field, A: fmt.Sprint(x), B: fmt.Sprint(y)})
		}
	}
	add("hidden_size", a.HiddenSize, b.HiddenSize)
	add("num_hidden_layers", a.NumLayers, b.NumLayers)
	add("num_attention_heads", a.NumHeads, b.NumHeads)
	add("q_lora_rank", a.QLoraRank, b.QLoraRank)
	add("kv_lora_rank", a.KVLoraRank, b.KVLoraRank)
	add("head_dim", a.HeadDim, b.HeadDim)
	add("qk_rope_head_dim", a.QKRopeHeadDim, b.QKRopeHeadDim)
	add("num_key_value_heads", a.NumKVHeads, b.NumKVHeads)
	add("rms_norm_eps", a.RMSNormEps, b.RMSNormEps)
	add("rope_theta", a.RopeTheta, b.RopeTheta)
	add("compress_rope_theta", a.CompressRopeTheta, b.CompressRopeTheta)
	ra, rb := a.RopeScaling, b.RopeScaling
	add("rope_scaling.type", ra.Type, rb.Type)
	add("rope_scaling.factor", ra.Factor, rb.Factor)
	add("rope_scaling.original_max_position_embeddings", ra.OriginalMaxPositionEmbeddings, rb.OriginalMaxPositionEmbeddings)
	add("rope_scaling.beta_fast", ra.BetaFast, rb.BetaFast)
	add("rope_scaling.beta_slow", ra.BetaSlow, rb.BetaSlow)
	add("rope_scaling.mscale", ra.MScale, rb.MScale)
	add("rope_scaling.mscale_all_dim", ra.MScaleAllDim, rb.MScaleAllDim)
	add("max_position_embeddings", a.MaxPositionEmbeddings, b.MaxPositionEmbeddings)
	add("num_nextn_predict_layers", a.NumMTPLayers, b.NumMTPLayers)
	for l := range min(a.NumAttentionLayers(), b.NumAttentionLayers()) {
		x, errA := a.CompressRatio(l)
		y, errB := b.CompressRatio(l)
		if errA != nil || errB != nil {
			add(fmt.Sprintf("compress_ratios[%d]", l), ratioText(x, errA), ratioText(y, errB))
			continue
		}
		add(fmt.Sprintf("compress_ratios[%d]", l), x, y)
	}
	add("index_n_heads", a.IndexNHeads, b.IndexNHeads)
	add("index_head_dim", a.IndexHeadDim, b.IndexHeadDim)
	add("index_topk", a.IndexTopK, b.IndexTopK)
	qa, qb := a.Quant, b.Quant
	add("quantization_config.quant_method", qa.Method, qb.Method)
	add("quantization_config.fmt", qa.Fmt, qb.Fmt)
	add("quantization_config.scale_fmt", qa.ScaleFmt, qb.ScaleFmt)
	add("quantization_config.activation_scheme", qa.ActivationScheme, qb.ActivationScheme)
	add("quantization_config.weight_block_size", fmt.Sprintf("[%d, %d]", qa.BlockRows, qa.BlockCols), fmt.Sprintf("[%d, %d]", qb.BlockRows, qb.BlockCols))
	if len(ms) == 0 {
		return nil
	}
	return &MismatchError{Fields: ms}
}

func ratioText(r int, err error) string {
	if err != nil {
		return "unlisted"
	}
	return fmt.Sprint(r)
}
