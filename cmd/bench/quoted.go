package main

// quotedFigure is a serving engine's kernel time quoted in issue 11 ("Decode
// latency: ahead of the serving engines' own kernels"), measured on one H200
// before 2026-11-30 in the setting of LayerGraph: each layer its own inputs and
// cache, a CUDA graph of all layers, median of 50 replays. It is only the
// fallback: bench/engines.py times the engines' kernels, built from their
// source, in the same device call as this benchmark (bench/report.py --engines
// puts those figures in the tables); the plots show the quotes beside ours,
// labelled as quoted.
type quotedFigure struct {
	Peer string
	// What is "layer" (the whole Q + KV job of one layer: a decode
	// iteration's graph time over its layers), "q" or "kv" (one kernel).
	What   string
	Model  string
	Tokens int
	Us     float64
	Note   string
}

// quotedSource is the provenance printed with every quoted figure.
const quotedSource = "quoted from issue 11, measured on one H200 before 2026-11-30, not in this call"

// quotedFigures are issue 11's numbers. The per-kernel and context figures
// are V4-Flash's (the issue gives them under that heading); the context
// ones are taken as per kernel in the same graph setting.
func quotedFigures() []quotedFigure {
	const (
		sglang = "SGLang fused_q_norm_rope + fused_k_norm_rope_flashmla"
		vllm   = "vLLM fused Q+KV kernel"
	)
	return []quotedFigure{
		{sglang, "layer", "flash", 128, 315.0 / 43, "b=32 MTP 3: 315 us for 43 layers; bf16 Q"},
		{vllm, "layer", "flash", 128, 573.0 / 43, "b=32 MTP 3: 573 us for 43 layers; its KV norm runs elsewhere"},
		{sglang, "layer", "pro", 128, 710.0 / 61, "b=32 MTP 3: 710 us for 61 layers; bf16 Q"},
		{vllm, "layer", "pro", 128, 1275.0 / 61, "b=32 MTP 3: 1275 us for 61 layers; its KV norm runs elsewhere"},
		{"SGLang fused_q_norm_rope", "q", "flash", 128, 5.4, "bf16 Q"},
		{"SGLang fused_k_norm_rope_flashmla", "kv", "flash", 128, 1.3, ""},
		{"vLLM KV-norm kernel", "kv", "flash", 128, 2.6, "the whole KV job from the strided latent"},
		{"SGLang fused_q_norm_rope", "q", "flash", 65536, 2027, "context, bf16 Q"},
		{"vLLM KV-norm kernel", "kv", "flash", 16384, 16.9, "context"},
		{"vLLM KV-norm kernel", "kv", "flash", 65536, 53, "context"},
	}
}
