package dsv4

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/dsv4mla/prologue/internal/regularfile"
)

// ErrNotRegular is a config.json that is not a regular file (a FIFO, a
// device, a directory): reading one could block or never end.
var ErrNotRegular = regularfile.ErrNotRegular

// maxConfigBytes bounds the config.json read into memory; a real one is a
// few kB.
const maxConfigBytes = 16 << 20

// Load reads and parses a checkpoint's config.json. It never blocks on
// what the path names: anything but a regular file (a symbolic link is
// followed) is refused before it is opened, with ErrNotRegular.
func Load(path string) (Config, error) {
	data, err := readRegular(path)
	if err != nil {
		return Config{}, fmt.Errorf("dsv4: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// readRegular reads a regular file of at most maxConfigBytes, never
// blocking (regularfile.Open).
func readRegular(path string) ([]byte, error) {
	f, _, err := regularfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s: larger than the %d-byte limit", path, maxConfigBytes)
	}
	return data, nil
}

// Parse reads a HuggingFace config.json and validates the result. Keys it
// does not use are ignored; a null value counts as missing.
//
// Required: hidden_size, num_hidden_layers, num_attention_heads, q_lora_rank,
// qk_rope_head_dim, head_dim or qk_nope_head_dim, rms_norm_eps, rope_theta,
// compress_rope_theta, rope_scaling (type or rope_type, factor,
// original_max_position_embeddings, beta_fast, beta_slow),
// max_position_embeddings, compress_ratios, and, when a layer has
// compress_ratio 4, index_n_heads, index_head_dim and index_topk. Optional:
// kv_lora_rank (defaults to head_dim - qk_rope_head_dim; DeepSeek-V4-Flash's
// config.json omits it), num_key_value_heads (1), num_nextn_predict_layers
// (0), rope_scaling.mscale and mscale_all_dim (0), quantization_config and
// each of its keys (DeepSeek-V4's, FP8; Validate refuses any other value).
//
// The MTP layer count is num_nextn_predict_layers, or the number of entries
// compress_ratios lists past num_hidden_layers when that is larger
// (V4-Flash-0731 lists three MTP layers).
//
// Every problem found is reported, joined; each is a *FieldError naming the
// key and the value.
func Parse(data []byte) (Config, error) {
	top, err := object(data)
	if err != nil {
		return Config{}, err
	}
	p := parser{}
	var c Config
	if s, ok := p.optString(top, "_name_or_path", ""); ok {
		c.Name = s
	} else if s, ok := p.optString(top, "model_type", ""); ok {
		c.Name = s
	}
	c.HiddenSize = p.reqInt(top, "hidden_size", "")
	c.NumLayers = p.reqInt(top, "num_hidden_layers", "")
	c.NumHeads = p.reqInt(top, "num_attention_heads", "")
	c.QLoraRank = p.reqInt(top, "q_lora_rank", "")
	c.QKRopeHeadDim = p.reqInt(top, "qk_rope_head_dim", "")

	headDimV, hasHead := p.optInt(top, "head_dim", "")
	nope, hasNope := p.optInt(top, "qk_nope_head_dim", "")
	switch {
	case hasHead && hasNope && headDimV != nope+c.QKRopeHeadDim:
		p.add(fieldErr("head_dim", headDimV, "must equal qk_nope_head_dim (%d) + qk_rope_head_dim (%d)", nope, c.QKRopeHeadDim))
	case hasHead:
		c.HeadDim = headDimV
	case hasNope:
		c.HeadDim = nope + c.QKRopeHeadDim
	default:
		p.add(fieldErr("head_dim", nil, "missing (and no qk_nope_head_dim to derive it from)"))
	}
	if v, ok := p.optInt(top, "kv_lora_rank", ""); ok {
		c.KVLoraRank = v
	} else {
		c.KVLoraRank = c.HeadDim - c.QKRopeHeadDim
	}
	c.NumKVHeads = numKVHeads
	if v, ok := p.optInt(top, "num_key_value_heads", ""); ok {
		c.NumKVHeads = v
	}

	c.RMSNormEps = p.reqFloat(top, "rms_norm_eps", "")
	c.RopeTheta = p.reqFloat(top, "rope_theta", "")
	c.CompressRopeTheta = p.reqFloat(top, "compress_rope_theta", "")
	c.MaxPositionEmbeddings = p.reqInt(top, "max_position_embeddings", "")
	nextn, hasNextn := p.optInt(top, "num_nextn_predict_layers", "")
	c.CompressRatios = p.reqIntList(top, "compress_ratios")
	// The MTP layer count: num_nextn_predict_layers, or more when
	// compress_ratios lists more layers past the main ones (V4-Flash-0731
	// lists three, mtp.0..2); every listed layer is one the checkpoint
	// holds. Validate refuses a listed MTP entry that is not 0.
	c.NumMTPLayers = max(nextn, len(c.CompressRatios)-c.NumLayers)
	if hasNextn && nextn < 0 {
		c.NumMTPLayers = nextn // refused by Validate, naming the field
	}

	hasIndexer := false
	for l, r := range c.CompressRatios {
		hasIndexer = hasIndexer || (l < c.NumLayers && r == 4)
	}
	for _, f := range []struct {
		key string
		dst *int
	}{{"index_n_heads", &c.IndexNHeads}, {"index_head_dim", &c.IndexHeadDim}, {"index_topk", &c.IndexTopK}} {
		if v, ok := p.optInt(top, f.key, ""); ok {
			*f.dst = v
		} else if _, present := present(top, f.key); !present && hasIndexer {
			p.add(fieldErr(f.key, nil, "missing: the ratio-4 layers' lightning indexer needs it"))
		}
	}

	c.Quant = FP8()
	if raw, ok := present(top, "quantization_config"); ok {
		if q, ok := p.nested(raw, "quantization_config"); ok {
			c.Quant = p.quantization(q)
		}
	}

	if raw, ok := present(top, "rope_scaling"); !ok {
		p.add(fieldErr("rope_scaling", nil, "missing"))
	} else if rs, ok := p.nested(raw, "rope_scaling"); ok {
		c.RopeScaling = p.ropeScaling(rs)
	}

	if len(p.errs) > 0 {
		return Config{}, errors.Join(p.errs...)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// quantization reads quantization_config; a key it leaves out takes
// DeepSeek-V4's value (FP8).
func (p *parser) quantization(q map[string]json.RawMessage) Quantization {
	const pre = "quantization_config."
	out := FP8()
	for _, f := range []struct {
		key string
		dst *string
	}{{"quant_method", &out.Method}, {"fmt", &out.Fmt}, {"scale_fmt", &out.ScaleFmt}, {"activation_scheme", &out.ActivationScheme}} {
		if v, ok := p.optString(q, f.key, pre); ok {
			*f.dst = v
		}
	}
	if raw, ok := present(q, "weight_block_size"); ok {
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil || len(items) != 2 {
			p.add(fieldErr(pre+"weight_block_size", rawText(bytes.TrimSpace(raw)), "must be an array of two integers [rows, cols]"))
		} else {
			out.BlockRows, _ = p.toInt(items[0], pre+"weight_block_size[0]")
			out.BlockCols, _ = p.toInt(items[1], pre+"weight_block_size[1]")
		}
	}
	return out
}

func (p *parser) ropeScaling(rs map[string]json.RawMessage) RopeScaling {
	const pre = "rope_scaling."
	var s RopeScaling
	typ, hasType := p.optString(rs, "type", pre)
	rtyp, hasRopeType := p.optString(rs, "rope_type", pre)
	switch {
	case hasType && hasRopeType && typ != rtyp:
		p.add(fieldErr(pre+"rope_type", rtyp, "disagrees with rope_scaling.type %q", typ))
	case hasType:
		s.Type = typ
	case hasRopeType:
		s.Type = rtyp
	default:
		p.add(fieldErr(pre+"type", nil, "missing (and no rope_scaling.rope_type)"))
	}
	s.Factor = p.reqFloat(rs, "factor", pre)
	s.OriginalMaxPositionEmbeddings = p.reqInt(rs, "original_max_position_embeddings", pre)
	s.BetaFast = p.reqFloat(rs, "beta_fast", pre)
	s.BetaSlow = p.reqFloat(rs, "beta_slow", pre)
	s.MScale, _ = p.optFloat(rs, "mscale", pre)
	s.MScaleAllDim, _ = p.optFloat(rs, "mscale_all_dim", pre)
	return s
}

// object decodes a JSON object without decoding its values, so that each
// value's type can be checked and reported by key. A key given twice is
// refused (ErrDuplicateKey): encoding/json would keep the last one
// silently, and config.json is the checkpoint's truth.
func object(data []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, fmt.Errorf("dsv4: config is not a JSON object (found %s)", typeErr.Value)
		}
		return nil, fmt.Errorf("dsv4: config is not valid JSON: %w", err)
	}
	if m == nil {
		return nil, errors.New("dsv4: config is not a JSON object (found null)")
	}
	// Unmarshal checked the syntax; count each key.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.Token() // '{'
	seen := make(map[string]bool, len(m))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("dsv4: config is not valid JSON: %w", err)
		}
		key, _ := tok.(string)
		if seen[key] {
			return nil, &duplicateKeyError{key}
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, fmt.Errorf("dsv4: config is not valid JSON: %w", err)
		}
	}
	return m, nil
}

// ErrDuplicateKey is a config.json object that gives one key twice.
var ErrDuplicateKey = errors.New("a key given twice")

type duplicateKeyError struct{ key string }

func (e *duplicateKeyError) Error() string {
	return fmt.Sprintf("dsv4: config gives the key %q twice", e.key)
}
func (e *duplicateKeyError) Unwrap() error { return ErrDuplicateKey }

// nested reads the object value of key (rope_scaling, quantization_config);
// ok is false, with the problem recorded, when it is not one.
func (p *parser) nested(raw json.RawMessage, key string) (map[string]json.RawMessage, bool) {
	m, err := object(raw)
	var dup *duplicateKeyError
	switch {
	case errors.As(err, &dup):
		p.add(fieldErr(key+"."+dup.key, nil, "given twice"))
		return nil, false
	case err != nil:
		p.add(fieldErr(key, nil, "must be a JSON object"))
		return nil, false
	}
	return m, true
}

// present returns the raw value of key, treating null as absent.
func present(m map[string]json.RawMessage, key string) (json.RawMessage, bool) {
	raw, ok := m[key]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, false
	}
	return raw, true
}

// parser collects every problem rather than stopping at the first, so that
// a broken config.json is fixed in one pass.
type parser struct{ errs []error }

func (p *parser) add(e *FieldError) { p.errs = append(p.errs, e) }

// kind names a JSON value's type for error messages.
func kind(raw json.RawMessage) string {
	switch t := bytes.TrimSpace(raw); {
	case len(t) == 0:
		return "nothing"
	case t[0] == '"':
		return "a string"
	case t[0] == '{':
		return "an object"
	case t[0] == '[':
		return "an array"
	case t[0] == 't' || t[0] == 'f':
		return "a boolean"
	case t[0] == 'n':
		return "null"
	default:
		return "a number"
	}
}

// number returns a value's JSON number text; ok is false (and an error is
// recorded) when the value has another type.
func (p *parser) number(raw json.RawMessage, field string) (string, bool) {
	if k := kind(raw); k != "a number" {
		p.add(fieldErr(field, rawText(bytes.TrimSpace(raw)), "must be a number, found %s", k))
		return "", false
	}
	return string(bytes.TrimSpace(raw)), true
}

// toInt accepts integral JSON numbers that fit in an int32, including
// forms like 4096.0 or 4.096e3 that some exporters write.
func (p *parser) toInt(raw json.RawMessage, field string) (int, bool) {
	s, ok := p.number(raw, field)
	if !ok {
		return 0, false
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		if v < math.MinInt32 || v > math.MaxInt32 {
			p.add(fieldErr(field, rawText(s), "out of range [%d, %d]", math.MinInt32, math.MaxInt32))
			return 0, false
		}
		return int(v), true
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil || math.IsInf(f, 0):
		p.add(fieldErr(field, rawText(s), "out of range [%d, %d]", math.MinInt32, math.MaxInt32))
		return 0, false
	case f != math.Trunc(f):
		p.add(fieldErr(field, rawText(s), "must be an integer"))
		return 0, false
	case f < math.MinInt32 || f > math.MaxInt32:
		p.add(fieldErr(field, rawText(s), "out of range [%d, %d]", math.MinInt32, math.MaxInt32))
		return 0, false
	}
	return int(f), true
}

func (p *parser) toFloat(raw json.RawMessage, field string) (float64, bool) {
	s, ok := p.number(raw, field)
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) {
		p.add(fieldErr(field, rawText(s), "out of the float64 range"))
		return 0, false
	}
	return f, true
}

func (p *parser) reqInt(m map[string]json.RawMessage, key, prefix string) int {
	raw, ok := present(m, key)
	if !ok {
		p.add(fieldErr(prefix+key, nil, "missing"))
		return 0
	}
	v, _ := p.toInt(raw, prefix+key)
	return v
}

// optInt reports ok only for a present, well-formed value; a malformed one
// records an error.
func (p *parser) optInt(m map[string]json.RawMessage, key, prefix string) (int, bool) {
	raw, ok := present(m, key)
	if !ok {
		return 0, false
	}
	return p.toInt(raw, prefix+key)
}

func (p *parser) reqFloat(m map[string]json.RawMessage, key, prefix string) float64 {
	raw, ok := present(m, key)
	if !ok {
		p.add(fieldErr(prefix+key, nil, "missing"))
		return 0
	}
	v, _ := p.toFloat(raw, prefix+key)
	return v
}

func (p *parser) optFloat(m map[string]json.RawMessage, key, prefix string) (float64, bool) {
	raw, ok := present(m, key)
	if !ok {
		return 0, false
	}
	return p.toFloat(raw, prefix+key)
}

func (p *parser) optString(m map[string]json.RawMessage, key, prefix string) (string, bool) {
	raw, ok := present(m, key)
	if !ok {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		p.add(fieldErr(prefix+key, rawText(bytes.TrimSpace(raw)), "must be a string, found %s", kind(raw)))
		return "", false
	}
	return s, true
}

func (p *parser) reqIntList(m map[string]json.RawMessage, key string) []int {
	raw, ok := present(m, key)
	if !ok {
		p.add(fieldErr(key, nil, "missing"))
		return nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		p.add(fieldErr(key, nil, "must be an array of integers, found %s", kind(raw)))
		return nil
	}
	out := make([]int, len(items))
	for i, it := range items {
		out[i], _ = p.toInt(it, fmt.Sprintf("%s[%d]", key, i))
	}
	return out
}
