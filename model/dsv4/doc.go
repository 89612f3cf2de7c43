// Package dsv4 describes a DeepSeek-V4 model to the MLA prologue: the
// dimensions of DESIGN.md section 2, read from a HuggingFace checkpoint's
// config.json (Parse, Load) or taken from the embedded defaults (Flash, Pro),
// and the per-layer RoPE tables.
//
// The RoPE tables are part of the bit-exact contract: every backend reads the
// same float32 (cos, sin) pairs, so they are computed once on the host, here,
// in float64 and rounded to float32. Layers whose compress_ratio is above 1
// use YaRN with compress_rope_theta; the others use plain RoPE with
// rope_theta. An engine builds each kind of table once (Config.RopeTables)
// and picks one per layer (RopeTableSet.ForLayer).
//
// The package depends on the standard library only, so that tools which just
// inspect a checkpoint need not pull in the numerics or the backends.
package dsv4
