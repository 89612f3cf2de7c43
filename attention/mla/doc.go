// Package mla is the DSv4 MLA attention prologue: the backend interface its
// kernels implement, and the dispatcher that turns one iteration's metadata
// into launches.
//
// The data path is batch -> metadata -> dispatch -> kernels -> cache. A batch
// holds context sequences first, then generation sequences; Plan turns its
// metadata into at most two launches (one per phase) over disjoint token-row
// ranges of the same buffers, and RunLayer issues, for every launch, the KV
// norm-RoPE-store kernel and then the fused Q norm/RoPE/quant kernel.
//
// Backends (package mla/cpu, package mla/cuda) differ only in where the
// buffers live and how the rows are scheduled; they produce the same bytes,
// which the shared conformance suite in package mla/mlatest checks.
package mla
