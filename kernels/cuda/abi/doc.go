// Package abi is the one source of the contract between the Go host code
// and the CUDA kernels: the parameter structs the host packs byte by byte
// and every kernel takes by value (Structs: the prologue's Params, the
// top-k, GEMM, chain and compressor kernels' own, with a Packer that lays
// them out as the device compiler does), the integer ids and layout
// constants both sides use (Constants, each taken from the Go package that
// defines it: kvcache, mla, numerics), the kernels' launch shapes and tiles
// (FP8GEMMTiles, the BF16MMA* and compressor shapes), and the names of the
// kernels the host loads (Kernels).
//
// go generate ./kernels/cuda renders the table as kernels/cuda/abi.h
// (Header), which kernels/cuda embeds and hands to NVRTC as an in-memory
// header (common.cuh, which every kernel source includes, includes it). Tests keep the checked-in header equal to Header and check that
// prologue.cu defines every kernel of Kernels with the ids of its formats,
// so that drift shows on a machine without a GPU.
package abi
