// Command mkcheckpoint writes a synthetic DeepSeek-V4 checkpoint directory
// (config.json, model.safetensors.index.json, shards) holding the attention
// weights the prologue chain loads, deterministic from a seed, with trained
// magnitudes (weights.WriteSynthetic), in DeepSeek's published layout: per
// layer wq_a, wkv, wq_b (e4m3 + block scales), q_norm, kv_norm, the
// compressor of a ratio-4 or ratio-128 layer and the lightning indexer of a
// ratio-4 layer (layers.{i}.attn.indexer.*), mtp.{j}.attn.* for the MTP
// layers.
//
//	go run ./cmd/mkcheckpoint --model tiny --out /tmp/ck
//	go run ./cmd/mkcheckpoint --model flash --layers 2,3 --scale-format e8m0 --out /tmp/flash2
//	go run ./cmd/mkcheckpoint --model pro --layers 0-3,61 --naming hf --out /tmp/pro4
//
// --layers takes "all" (every layer, MTP layers included) or a comma list of
// indices and ranges a-b (inclusive); MTP layers follow the main ones.
package main
