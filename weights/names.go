package weights

import (
	"fmt"

	"github.com/dsv4mla/prologue/model/dsv4"
)

// The one name map. Every tensor the loader reads is a module under a
// layer's attention prefix.
//
// On disk, DeepSeek-V4 is published in one spelling, DeepSeek's own:
// layers.{i}.attn.<module>.weight with FP8 block scales in
// <module>.scale, and mtp.{j}.attn.* for MTP layer j (layer index
// num_hidden_layers+j). That is the only on-disk format of a released DSv4
// checkpoint (every V4-Flash and V4-Pro revision, 0731's mtp.0..2 too).
//
// The other spellings are other engines' in-memory module names, what their
// loaders rename DeepSeek's tensors to: vLLM's (model.layers.{i}.attn.*,
// scales .weight_scale_inv) and HF transformers' DeepseekV4 port
// (model.layers.{i}.self_attn.* with its own module names, below). They
// reach a disk only when a loaded model is saved again (save_pretrained, a
// re-quantizing tool), which is why the loader accepts them; the
// DeepSeek-V3-style column is the HF layout DeepSeek's V3 release used on
// disk, applied to V4's modules by such conversions. Accepted, in any
// combination: layer prefixes layers.{i}.attn. (DeepSeek), mtp.{j}.attn.
// (DeepSeek, MTP layers), model.layers.{i}.attn. (vLLM),
// model.layers.{i}.self_attn. (HF) and layers.{i}.self_attn.
//
// Modules:
//
//	DeepSeek (on disk), vLLM   HF DeepseekV4 (in memory)                 DeepSeek-V3-style HF
//	wq_a                       q_a_proj                                  q_a_proj
//	wkv                        kv_proj                                   kv_a_proj_with_mqa
//	wq_b                       q_b_proj                                  q_b_proj
//	q_norm                     q_a_norm                                  q_a_layernorm
//	kv_norm                    kv_norm                                   kv_a_layernorm
//	compressor.wkv             compressor.kv_proj                        (as HF)
//	compressor.wgate           compressor.gate_proj                      (as HF)
//	compressor.ape             compressor.position_bias                  (as HF)
//	compressor.norm            compressor.kv_norm                        (as HF)
//	indexer.wq_b               compressor.indexer.q_b_proj               (as HF)
//	indexer.weights_proj       compressor.indexer.scorer.weights_proj    (as HF)
//	indexer.compressor.wkv     compressor.indexer.kv_proj                (as HF)
//	indexer.compressor.wgate   compressor.indexer.gate_proj              (as HF)
//	indexer.compressor.ape     compressor.indexer.position_bias          (as HF)
//	indexer.compressor.norm    compressor.indexer.kv_norm                (as HF)
//
// Values: <module>.weight, except ape, a bare parameter <module>. FP8 block
// scales: <module>.scale (DeepSeek, on disk), <module>.weight_scale_inv
// (vLLM's and HF's FP8 in-memory name; DeepSeek-V3's on-disk one) or
// <module>.weight_scale. Exactly one spelling of each tensor may be present
// in the index; two are refused as ambiguous.
type module struct {
	key   string // DeepSeek's module path (the release and vLLM), the canonical name
	hf    string // HF transformers' DeepseekV4 port
	v3    string // DeepSeek-V3-style HF name, where one exists; else hf
	param bool   // a bare parameter (ape): no ".weight" suffix
}

var (
	modWQA       = module{key: "wq_a", hf: "q_a_proj", v3: "q_a_proj"}
	modWKV       = module{key: "wkv", hf: "kv_proj", v3: "kv_a_proj_with_mqa"}
	modWQB       = module{key: "wq_b", hf: "q_b_proj", v3: "q_b_proj"}
	modQNorm     = module{key: "q_norm", hf: "q_a_norm", v3: "q_a_layernorm"}
	modKVNorm    = module{key: "kv_norm", hf: "kv_norm", v3: "kv_a_layernorm"}
	modCompWKV   = module{key: "compressor.wkv", hf: "compressor.kv_proj", v3: "compressor.kv_proj"}
	modCompWGate = module{key: "compressor.wgate", hf: "compressor.gate_proj", v3: "compressor.gate_proj"}
	modCompAPE   = module{key: "compressor.ape", hf: "compressor.position_bias", v3: "compressor.position_bias", param: true}
	modCompNorm  = module{key: "compressor.norm", hf: "compressor.kv_norm", v3: "compressor.kv_norm"}

	// The lightning indexer of a ratio-4 layer. HF's port nests it in the
	// compressor and its head weights in a scorer.
	modIdxWQB       = module{key: "indexer.wq_b", hf: "compressor.indexer.q_b_proj", v3: "compressor.indexer.q_b_proj"}
	modIdxProj      = module{key: "indexer.weights_proj", hf: "compressor.indexer.scorer.weights_proj", v3: "compressor.indexer.scorer.weights_proj"}
	modIdxCompWKV   = module{key: "indexer.compressor.wkv", hf: "compressor.indexer.kv_proj", v3: "compressor.indexer.kv_proj"}
	modIdxCompWGate = module{key: "indexer.compressor.wgate", hf: "compressor.indexer.gate_proj", v3: "compressor.indexer.gate_proj"}
	modIdxCompAPE   = module{key: "indexer.compressor.ape", hf: "compressor.indexer.position_bias", v3: "compressor.indexer.position_bias", param: true}
	modIdxCompNorm  = module{key: "indexer.compressor.norm", hf: "compressor.indexer.kv_norm", v3: "compressor.indexer.kv_norm"}
)

// compressorModules are the four tensors of a compressor: the main one's or
// the indexer's.
type compressorModules struct{ wkv, wgate, ape, norm module }

var (
	mainCompressor    = compressorModules{modCompWKV, modCompWGate, modCompAPE, modCompNorm}
	indexerCompressor = compressorModules{modIdxCompWKV, modIdxCompWGate, modIdxCompAPE, modIdxCompNorm}
)

// paths lists the module's distinct spellings, DeepSeek's first.
func (m module) paths() []string {
	out := []string{m.key}
	for _, p := range []string{m.hf, m.v3} {
		if p != out[len(out)-1] && p != m.key {
			out = append(out, p)
		}
	}
	return out
}

var scaleSuffixes = []string{".scale", ".weight_scale_inv", ".weight_scale"}

// layerPrefixes lists the attention prefixes of layer i, DeepSeek's first.
func layerPrefixes(cfg *dsv4.Config, i int) []string {
	var p []string
	if i >= cfg.NumLayers {
		p = append(p, fmt.Sprintf("mtp.%d.attn.", i-cfg.NumLayers))
	}
	return append(p,
		fmt.Sprintf("layers.%d.attn.", i),
		fmt.Sprintf("model.layers.%d.attn.", i),
		fmt.Sprintf("model.layers.%d.self_attn.", i),
		fmt.Sprintf("layers.%d.self_attn.", i))
}

// candidates lists every accepted name of the module's values (scale false)
// or FP8 block scales (scale true) in layer i, DeepSeek's spelling first.
func (m module) candidates(cfg *dsv4.Config, i int, scale bool) []string {
	var out []string
	for _, p := range layerPrefixes(cfg, i) {
		for _, path := range m.paths() {
			switch {
			case scale:
				for _, s := range scaleSuffixes {
					out = append(out, p+path+s)
				}
			case m.param:
				out = append(out, p+path)
			default:
				out = append(out, p+path+".weight")
			}
		}
	}
	return out
}

// Naming selects the spelling WriteSynthetic writes (the loader accepts
// all). Only NamingDeepSeek is a published on-disk format; the others
// stand for checkpoints re-saved from those engines' in-memory names.
type Naming int

const (
	NamingDeepSeek Naming = iota // layers.{i}.attn.wq_a.weight / .scale, mtp.{j}.attn.*: the release, DSv4's only on-disk format
	NamingVLLM                   // model.layers.{i}.attn.wq_a.weight / .weight_scale_inv: vLLM's in-memory names
	NamingHF                     // model.layers.{i}.self_attn.q_a_proj.weight / .weight_scale_inv, q_a_norm, kv_proj, compressor.kv_proj ...: HF's in-memory names
	NamingHFV3                   // as NamingHF with DeepSeek-V3's names: q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm
)

func (n Naming) String() string {
	switch n {
	case NamingDeepSeek:
		return "deepseek"
	case NamingVLLM:
		return "vllm"
	case NamingHF:
		return "hf"
	case NamingHFV3:
		return "hf-v3"
	}
	return fmt.Sprintf("Naming(%d)", int(n))
}

// ParseNaming is the inverse of Naming.String.
func ParseNaming(s string) (Naming, error) {
	for n := NamingDeepSeek; n <= NamingHFV3; n++ {
		if n.String() == s {
			return n, nil
		}
	}
	return 0, fmt.Errorf("weights: naming %q: want deepseek, vllm, hf or hf-v3", s)
}

// name spells the values (scale false) or scales of module m in layer i.
func (n Naming) name(cfg *dsv4.Config, i int, m module, scale bool) string {
	path := m.key
	var prefix string
	switch n {
	case NamingDeepSeek:
		prefix = fmt.Sprintf("layers.%d.attn.", i)
		if i >= cfg.NumLayers {
			prefix = fmt.Sprintf("mtp.%d.attn.", i-cfg.NumLayers)
		}
	case NamingVLLM:
		prefix = fmt.Sprintf("model.layers.%d.attn.", i)
	case NamingHF:
		prefix, path = fmt.Sprintf("model.layers.%d.self_attn.", i), m.hf
	default:
		prefix, path = fmt.Sprintf("model.layers.%d.self_attn.", i), m.v3
	}
	switch {
	case scale && n == NamingDeepSeek:
		return prefix + path + ".scale"
	case scale:
		return prefix + path + ".weight_scale_inv"
	case m.param:
		return prefix + path
	}
	return prefix + path + ".weight"
}
