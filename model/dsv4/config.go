package dsv4

import (
	"errors"
	"fmt"
	"math"
)

// Bounds of rms_norm_eps: a normal float32 (as the kernels add it), and no
// larger than any RMSNorm uses (1e-5 and 1e-6 in practice).
const (
	minEps = 0x1p-126
	maxEps = 1e-2
)

// Dimensions the prologue is built for. A checkpoint with other values is
// refused by Validate rather than run with a kernel that assumes these.
const (
	headDim    = 512 // latent row and per-head Q row, nope + rope
	ropeDim    = 64  // rotated tail of each row
	ropePairs  = ropeDim / 2
	kvLoraRank = headDim - ropeDim // 448 nope values
	numKVHeads = 1
)

// Config holds the DSv4 hyperparameters the prologue depends on. Field
// comments name the config.json key each one comes from.
type Config struct {
	Name                  string  // _name_or_path, else model_type; "" when neither is present
	HiddenSize            int     // hidden_size
	NumLayers             int     // num_hidden_layers (not counting MTP layers)
	NumHeads              int     // num_attention_heads
	QLoraRank             int     // q_lora_rank
	KVLoraRank            int     // kv_lora_rank: the nope part of the latent row, 448
	HeadDim               int     // head_dim (or qk_nope_head_dim + qk_rope_head_dim), 512
	QKRopeHeadDim         int     // qk_rope_head_dim, 64
	NumKVHeads            int     // num_key_value_heads, 1
	RMSNormEps            float64 // rms_norm_eps
	RopeTheta             float64 // rope_theta: base of plain-RoPE layers
	CompressRopeTheta     float64 // compress_rope_theta: base of YaRN layers
	RopeScaling           RopeScaling
	MaxPositionEmbeddings int   // max_position_embeddings
	NumMTPLayers          int   // num_nextn_predict_layers
	CompressRatios        []int // compress_ratios, one per layer, optionally followed by one per MTP layer

	// The lightning indexer of the ratio-4 layers (DESIGN.md section 9).
	// Required when a layer has compress_ratio 4; 0 when no layer does.
	IndexNHeads  int // index_n_heads: the indexer's query heads, 64
	IndexHeadDim int // index_head_dim: width of an indexer head and key, 128 (64 nope + 64 rope, rope last)
	IndexTopK    int // index_topk: compressed entries one query selects, 512 (V4-Flash) or 1024 (V4-Pro)

	Quant Quantization // quantization_config
}

// Quantization is config.json's quantization_config: how the checkpoint's
// FP8 weights are stored and how activations are quantized for them.
// Validate accepts only what the kernels implement: DeepSeek-V4's FP8
// scheme (e4m3 weights, 128x128 block scales, UE8M0 activation scales).
// The block size is a field, not a constant, because later releases change
// it (DeepSeek-V4.1's 32x32 blocks); such a config is refused by name
// rather than misread.
type Quantization struct {
	Method           string // quant_method: "fp8"
	Fmt              string // fmt: the weights' FP8 format, "e4m3"
	ScaleFmt         string // scale_fmt: "ue8m0" (activation block scales rounded up to a power of two, DESIGN.md section 7)
	ActivationScheme string // activation_scheme: "dynamic" (scales computed per row block at run time)
	BlockRows        int    // weight_block_size[0]: rows of one weight scale block, 128
	BlockCols        int    // weight_block_size[1]: columns of one weight scale block, 128
}

// FP8 is DeepSeek-V4's quantization_config, the only one the kernels
// implement; Parse also takes it for a config.json without one (and for
// each key a quantization_config leaves out).
func FP8() Quantization {
	return Quantization{Method: "fp8", Fmt: "e4m3", ScaleFmt: "ue8m0", ActivationScheme: "dynamic", BlockRows: 128, BlockCols: 128}
}

func (q Quantization) validate() []error {
	want := FP8()
	var errs []error
	for _, f := range []struct{ field, got, want, why string }{
		{"quant_method", q.Method, want.Method, "the weights are read as FP8"},
		{"fmt", q.Fmt, want.Fmt, "the GEMMs read e4m3 weights"},
		{"scale_fmt", q.ScaleFmt, want.ScaleFmt, "act_quant rounds every activation scale up to a power of two (DESIGN.md section 7)"},
		{"activation_scheme", q.ActivationScheme, want.ActivationScheme, "activation scales are computed per 128-value block at run time"},
	} {
		if f.got != f.want {
			errs = append(errs, fieldErr("quantization_config."+f.field, f.got, "must be %q: %s", f.want, f.why))
		}
	}
	if q.BlockRows != want.BlockRows || q.BlockCols != want.BlockCols {
		errs = append(errs, fieldErr("quantization_config.weight_block_size", rawText(fmt.Sprintf("[%d, %d]", q.BlockRows, q.BlockCols)),
			"must be [128, 128]: the GEMMs and the loader apply one scale per 128x128 weight block"))
	}
	return errs
}

// Indexer dimensions the prologue is built for (DESIGN.md section 9).
const (
	indexHeadDim = 128 // Hadamard(128); RoPE on dims [64, 128)
)

// HasIndexer reports whether some layer has compress_ratio 4, and so the
// lightning indexer whose dimensions the index_* fields give.
func (c Config) HasIndexer() bool {
	for l := range min(c.NumLayers, len(c.CompressRatios)) {
		if c.CompressRatios[l] == 4 {
			return true
		}
	}
	return false
}

// RopeScaling is config.json's rope_scaling object. Only YaRN is supported.
//
// MScale and MScaleAllDim are kept for inspection only: the DeepSeek-V4
// reference builds its tables with amplitude 1 (torch.polar of ones) whatever
// they say, and so does NewRopeTable. They are 0 when absent.
type RopeScaling struct {
	Type                          string  // type or rope_type; must be "yarn"
	Factor                        float64 // factor
	OriginalMaxPositionEmbeddings int     // original_max_position_embeddings
	BetaFast                      float64 // beta_fast
	BetaSlow                      float64 // beta_slow
	MScale                        float64 // mscale
	MScaleAllDim                  float64 // mscale_all_dim
}

// FieldError reports a config value that is missing, of the wrong type or out
// of range. Field is the config.json key (nested keys joined with '.', list
// entries as key[i]); Value is the offending value as written, "" if missing.
type FieldError struct {
	Field   string
	Value   string
	Problem string
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("dsv4: config field %q: %s", e.Field, e.Problem)
	}
	return fmt.Sprintf("dsv4: config field %q = %s: %s", e.Field, e.Value, e.Problem)
}

// rawText is a value quoted as it appears in the JSON text.
type rawText string

func fieldErr(field string, value any, format string, args ...any) *FieldError {
	v := ""
	switch x := value.(type) {
	case nil:
	case rawText:
		v = string(x)
		if len(v) > 64 {
			v = v[:61] + "..."
		}
	case string:
		v = fmt.Sprintf("%q", x)
	default:
		v = fmt.Sprint(x)
	}
	return &FieldError{Field: field, Value: v, Problem: fmt.Sprintf(format, args...)}
}

// flashCompressRatios is V4-Flash's published compress_ratios: [0,0] +
// [4,128]x20 + [4,0], 44 entries for 43 layers and the MTP layer.
func flashCompressRatios() []int { return compressPattern(0, 20) }

// proCompressRatios is V4-Pro's compress_ratios as public copies of its
// config.json give it: [128,128] + [4,128]x29 + [4,0], 62 entries for 61
// layers and the MTP layer. No main layer is SWA-only; layers 0 and 1 are
// ratio 128 and so use the YaRN table.
func proCompressRatios() []int { return compressPattern(128, 29) }

// compressPattern is [first, first] + [4,128]x pairs + [4] for the main
// layers, then 0 for the MTP layer (always uncompressed).
func compressPattern(first, pairs int) []int {
	r := []int{first, first}
	for range pairs {
		r = append(r, 4, 128)
	}
	return append(r, 4, mtpCompressRatio)
}

// mtpCompressRatio is every MTP layer's compress_ratio: DSv4's MTP block
// keeps only the sliding window, whatever the last main layer is.
const mtpCompressRatio = 0

// Flash returns the DeepSeek-V4-Flash configuration of docs/DESIGN.md section 2.
func Flash() Config {
	c := common()
	c.Name = "DeepSeek-V4-Flash"
	c.HiddenSize = 4096
	c.NumLayers = 43
	c.NumHeads = 64
	c.QLoraRank = 1024
	c.CompressRatios = flashCompressRatios()
	return c
}

// Pro returns the DeepSeek-V4-Pro configuration of docs/DESIGN.md section 2, its
// compress_ratios as public copies of its config.json give them:
// [128,128] + [4,128]x29 + [4,0].
func Pro() Config {
	c := common()
	c.Name = "DeepSeek-V4-Pro"
	c.HiddenSize = 7168
	c.NumLayers = 61
	c.NumHeads = 128
	c.QLoraRank = 1536
	c.CompressRatios = proCompressRatios()
	c.IndexTopK = 1024
	return c
}

// common holds the values both published sizes share.
func common() Config {
	return Config{
		KVLoraRank:        kvLoraRank,
		HeadDim:           headDim,
		QKRopeHeadDim:     ropeDim,
		NumKVHeads:        numKVHeads,
		RMSNormEps:        1e-6,
		RopeTheta:         10000,
		CompressRopeTheta: 160000,
		RopeScaling: RopeScaling{
			Type:                          "yarn",
			Factor:                        16,
			OriginalMaxPositionEmbeddings: 65536,
			BetaFast:                      32,
			BetaSlow:                      1,
		},
		MaxPositionEmbeddings: 1048576,
		NumMTPLayers:          1,
		IndexNHeads:           64,
		IndexHeadDim:          indexHeadDim,
		IndexTopK:             512,
		Quant:                 FP8(),
	}
}

// Validate checks every field and returns all problems found, joined; each
// is a *FieldError naming the config.json key and the value.
func (c Config) Validate() error {
	var errs []error
	add := func(e *FieldError) { errs = append(errs, e) }

	positive := func(field string, v int) {
		if v <= 0 {
			add(fieldErr(field, v, "must be positive"))
		}
	}
	positive("hidden_size", c.HiddenSize)
	positive("num_hidden_layers", c.NumLayers)
	positive("num_attention_heads", c.NumHeads)
	positive("q_lora_rank", c.QLoraRank)
	positive("max_position_embeddings", c.MaxPositionEmbeddings)

	if c.HeadDim != headDim {
		add(fieldErr("head_dim", c.HeadDim, "must be %d: the prologue handles 512-value rows", headDim))
	}
	if c.QKRopeHeadDim != ropeDim {
		add(fieldErr("qk_rope_head_dim", c.QKRopeHeadDim, "must be %d: the prologue rotates a 64-value tail", ropeDim))
	}
	if c.KVLoraRank+c.QKRopeHeadDim != headDim {
		add(fieldErr("kv_lora_rank", c.KVLoraRank,
			"kv_lora_rank + qk_rope_head_dim (%d) = %d, must be %d: the latent row includes its rope part",
			c.QKRopeHeadDim, c.KVLoraRank+c.QKRopeHeadDim, headDim))
	}
	if c.NumKVHeads != numKVHeads {
		add(fieldErr("num_key_value_heads", c.NumKVHeads, "must be 1: MLA stores one latent KV head"))
	}

	finitePositive := func(field string, v float64) bool {
		if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			add(fieldErr(field, v, "must be finite and positive"))
			return false
		}
		return true
	}
	if finitePositive("rms_norm_eps", c.RMSNormEps) && (c.RMSNormEps < minEps || c.RMSNormEps > maxEps) {
		add(fieldErr("rms_norm_eps", c.RMSNormEps,
			"must be in [2^-126, %g]: the kernels add it as a normal float32, and a larger eps is a misread field", maxEps))
	}
	for _, b := range []struct {
		field string
		v     float64
	}{{"rope_theta", c.RopeTheta}, {"compress_rope_theta", c.CompressRopeTheta}} {
		if math.IsNaN(b.v) || math.IsInf(b.v, 0) || b.v <= 1 {
			add(fieldErr(b.field, b.v, "must be finite and greater than 1"))
		}
	}

	errs = append(errs, c.RopeScaling.validate(c.MaxPositionEmbeddings, c.CompressRopeTheta)...)

	if c.NumMTPLayers < 0 {
		add(fieldErr("num_nextn_predict_layers", c.NumMTPLayers, "must be 0 or positive"))
	}
	if n := len(c.CompressRatios); n < c.NumLayers || n > c.NumLayers+c.NumMTPLayers {
		add(fieldErr("compress_ratios", nil,
			"has %d entries, want %d (num_hidden_layers) to %d (num_hidden_layers + num_nextn_predict_layers)",
			n, c.NumLayers, c.NumLayers+max(c.NumMTPLayers, 0)))
	}
	for i, r := range c.CompressRatios {
		switch {
		case r < 0:
			add(fieldErr(fmt.Sprintf("compress_ratios[%d]", i), r, "must be 0 or positive"))
		case i >= c.NumLayers && r != mtpCompressRatio:
			add(fieldErr(fmt.Sprintf("compress_ratios[%d]", i), r, "must be 0: MTP layer %d keeps only the sliding window", i-c.NumLayers))
		}
	}

	if c.HasIndexer() || c.IndexNHeads != 0 || c.IndexHeadDim != 0 || c.IndexTopK != 0 {
		if c.IndexNHeads <= 0 {
			add(fieldErr("index_n_heads", c.IndexNHeads, "must be positive: the ratio-4 layers' indexer has that many query heads"))
		}
		if c.IndexHeadDim != indexHeadDim {
			add(fieldErr("index_head_dim", c.IndexHeadDim, "must be %d: the indexer's Hadamard transform and RoPE tail are built for 128-value heads", indexHeadDim))
		}
		if c.IndexTopK <= 0 {
			add(fieldErr("index_topk", c.IndexTopK, "must be positive: the number of compressed entries a query selects"))
		} else if c.MaxPositionEmbeddings > 0 && c.IndexTopK > c.MaxPositionEmbeddings/4 {
			add(fieldErr("index_topk", c.IndexTopK, "must not exceed max_position_embeddings/4 (%d): a sequence has no more ratio-4 entries", c.MaxPositionEmbeddings/4))
		}
	}
	errs = append(errs, c.Quant.validate()...)
	return errors.Join(errs...)
}

func (s RopeScaling) validate(maxPositions int, base float64) []error {
	var errs []error
	add := func(e *FieldError) { errs = append(errs, e) }
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

	if s.Type != "yarn" {
		add(fieldErr("rope_scaling.type", s.Type, `must be "yarn"`))
	}
	if !finite(s.Factor) || s.Factor < 1 {
		add(fieldErr("rope_scaling.factor", s.Factor, "must be finite and at least 1"))
	}
	if s.OriginalMaxPositionEmbeddings <= 0 {
		add(fieldErr("rope_scaling.original_max_position_embeddings", s.OriginalMaxPositionEmbeddings, "must be positive"))
	} else if maxPositions > 0 && s.OriginalMaxPositionEmbeddings > maxPositions {
		add(fieldErr("rope_scaling.original_max_position_embeddings", s.OriginalMaxPositionEmbeddings,
			"must not exceed max_position_embeddings (%d)", maxPositions))
	}
	betasOK := true
	for _, b := range []struct {
		field string
		v     float64
	}{{"rope_scaling.beta_fast", s.BetaFast}, {"rope_scaling.beta_slow", s.BetaSlow}} {
		if !finite(b.v) || b.v <= 0 {
			add(fieldErr(b.field, b.v, "must be finite and positive"))
			betasOK = false
		}
	}
	if betasOK && s.BetaFast <= s.BetaSlow {
		add(fieldErr("rope_scaling.beta_fast", s.BetaFast, "must exceed rope_scaling.beta_slow (%v)", s.BetaSlow))
		betasOK = false
	}
	for _, m := range []struct {
		field string
		v     float64
	}{{"rope_scaling.mscale", s.MScale}, {"rope_scaling.mscale_all_dim", s.MScaleAllDim}} {
		if !finite(m.v) || m.v < 0 {
			add(fieldErr(m.field, m.v, "must be finite and 0 or positive"))
		}
	}
	// An empty or undefined correction range would make the ramp divide by
	// a negative or NaN width; only absurd betas get here.
	if betasOK && len(errs) == 0 && finite(base) && base > 1 {
		low, high := YaRNCorrectionRange(s.BetaFast, s.BetaSlow, ropeDim, base, s.OriginalMaxPositionEmbeddings)
		if !(low <= high) {
			add(fieldErr("rope_scaling.beta_fast", s.BetaFast,
				"gives an empty YaRN correction range [%v, %v] with rope_scaling.beta_slow %v", low, high, s.BetaSlow))
		}
	}
	return errs
}

// NumAttentionLayers is the number of layers whose attention runs the
// prologue: the main layers plus the MTP layers.
func (c Config) NumAttentionLayers() int { return c.NumLayers + c.NumMTPLayers }

// CompressRatio returns the compress_ratio of a layer in
// [0, NumAttentionLayers()). An MTP layer is always 0 (DeepSeek's reference
// builds its MTP block uncompressed), listed or not; Validate refuses a
// listed MTP entry that is not 0.
func (c Config) CompressRatio(layer int) (int, error) {
	if layer < 0 || layer >= c.NumAttentionLayers() {
		return 0, fmt.Errorf("dsv4: layer %d out of range [0, %d) (%d layers + %d MTP layers)",
			layer, c.NumAttentionLayers(), c.NumLayers, c.NumMTPLayers)
	}
	if layer >= c.NumLayers {
		return mtpCompressRatio, nil
	}
	if layer >= len(c.CompressRatios) {
		return 0, fmt.Errorf("dsv4: layer %d: compress_ratios has %d entries for %d layers", layer, len(c.CompressRatios), c.NumLayers)
	}
	return c.CompressRatios[layer], nil
}

// LayerRope returns the RoPE kind of a layer: YaRN with compress_rope_theta
// when its compress_ratio is above 1, plain RoPE with rope_theta otherwise.
func (c Config) LayerRope(layer int) (RopeKind, error) {
	r, err := c.CompressRatio(layer)
	if err != nil {
		return 0, err
	}
	if r < 0 {
		return 0, fieldErr(fmt.Sprintf("compress_ratios[%d]", layer), r, "must be 0 or positive")
	}
	if r > 1 {
		return RopeYaRN, nil
	}
	return RopePlain, nil
}
