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
// [Reservation.CommitLengths] commits shorter lengths instead (an MTP
// verify step whose drafts were partly rejected): pages holding only
// rejected positions go back.
//
// Sliding window. With Config.Window = W (DSv4Window for DeepSeek-V4), a
// commit also gives back every page of a sequence whose positions all lie
// below its committed length minus W: no query reads them again. Block
// tables stay indexed by absolute position; a freed page's entry becomes
// -1 (so a stray read is visible) and Slot refuses its positions. A
// reservation takes a chunk's pages whole, however long, so a prefilling
// sequence holds chunk + W positions until its commit. Between iterations a
// sequence holds at most ceil(W/P) + 1 pages ([Config.LivePages]).
//
// The cache model. Every pool a DSv4 sequence holds (DESIGN.md sections 8
// and 9: the SWA pages, each ratio's compressed entries, the indexer's
// keys, the compressor state slots) is one row of a [Layout]; a [Model]
// keeps them all behind one [Model.Reserve] (every pool or none, a refusal
// naming the pool), [ModelReservation.CommitLengths] (the accepted lengths
// of an MTP step: each pool drops what lies past them) and
// [ModelReservation.Rollback], and one [Model.Finish]. The bookkeeping of a
// row is a [Pool]: the page cache by position ([Cache]), a cache whose
// lengths are derived, floor(n/r) entries ([EntryCache]), or the state
// slots ([SlotPool]); a shared row (the indexer's keys on the ratio-4
// block table) reuses another row's. [DSv4Layout] is DeepSeek-V4's table,
// the one place its entry sizes and pages live; footprints and memory per
// sequence are sums over the rows.
//
// Finished ids are refused for good; they are remembered as runs of
// consecutive ids, so a server numbering sequences with a counter runs
// forever in flat memory ([MaxFinishedRuns] states the rule and its bound).
//
// Errors. [ErrUnknownSequence] and [ErrPositionOutOfRange] are shared with
// the metadata pass and the engine: errors.Is finds them whichever package
// refused. [MaxPageSize] is the one page-size bound of every package.
//
// A Cache is safe for concurrent use. Built with -tags invariants it checks
// its own invariants after every mutation and panics if one breaks; so do
// a SlotPool and a Model (every pool against the live sequences, whenever
// no reservation is pending).
package kvcache
