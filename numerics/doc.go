// Package numerics holds the bit-exact arithmetic of the DSv4 MLA prologue
// (docs/DESIGN.md section 4): bf16 and e4m3 conversions, the canonical
// sum-of-squares order, the RMS scale, RoPE on one pair, and UE8M0 group
// quantization; and the lightning indexer's (section 9): the canonical
// Hadamard(128) and MXFP4 (e2m1 nibbles with one UE8M0 scale byte per 32
// values), whose decoding the top-k selection shares.
//
// Every backend (the pure-Go CPU backend and every GPU kernel) must produce
// the same bytes as these functions. Each float32 operation is written as an
// explicit float32() conversion so that the Go compiler never fuses a
// multiply and an add: a fused multiply-add rounds once where the contract
// rounds twice.
package numerics
