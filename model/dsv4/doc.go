// Package dsv4 describes a DeepSeek-V4 model to the MLA prologue: the
// dimensions of docs/DESIGN.md section 2, read from a HuggingFace checkpoint's
// config.json (Parse, Load) or taken from the embedded defaults (Flash, Pro),
// and the per-layer RoPE tables.
//
// The RoPE tables are part of the bit-exact contract: every backend reads the
// same float32 (cos, sin) pairs, so they are computed once on the host, here,
// in one of two modes (docs/DESIGN.md section 2): RopeReference, the
// default, with float32 frequencies and angles as DeepSeek's reference code
// computes them, and RopeExact, in float64 rounded once. Layers whose
// compress_ratio is above 1 use YaRN with compress_rope_theta; the others
// (and the MTP layer, always ratio 0) use plain RoPE with rope_theta. Each
// kind of table is built once and shared by every layer of that kind
// (Config.RopeTables and RopeTableSet.ForLayer; the engine does the same).
//
// The package depends on the standard library only, so that tools which just
// inspect a checkpoint need not pull in the numerics or the backends.
package dsv4
