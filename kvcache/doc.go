// Package kvcache owns the layout and the bookkeeping of the DSv4 MLA paged
// KV cache (docs/DESIGN.md sections 3, 5 and 6).
//
// Layout. A [Format] fixes how one 512-value latent row (448 nope + 64 rope
// values) is stored: its bytes per token, the bytes of one page of P tokens,
// and the byte offsets of a token's values and (for fp8_ue8m0) its scale
// exponents inside the page. [EncodeToken] and [DecodeToken] are the
// reference encoder and decoder; GPU kernels must write the same bytes.
//
// Bookkeeping. A [Cache] hands out pages of a pool of Config.NumPages pages
// to sequences and maps a sequence position to a slot
// (page*P + pos&(P-1)). It does not hold the page memory: that lives in a
// backend buffer of [Config.PoolBytes] bytes. Growth goes through a
// [Reservation] so that a batch is either admitted whole or not at all:
// [Cache.Reserve] takes every page the batch needs or fails with
// [ErrCacheFull] and changes nothing; [Reservation.Commit] makes the new
// lengths permanent and [Reservation.Rollback] puts everything back.
// Finished ids are refused for good; they are remembered as runs of
// consecutive ids, so a server numbering sequences with a counter runs
// forever in flat memory ([MaxFinishedRuns] states the rule and its bound).
//
// Errors. [ErrUnknownSequence] and [ErrPositionOutOfRange] are shared with
// the metadata pass and the engine: errors.Is finds them whichever package
// refused. [MaxPageSize] is the one page-size bound of every package.
//
// A Cache is safe for concurrent use. Built with -tags invariants it checks
// its own invariants after every mutation and panics if one breaks.
package kvcache
