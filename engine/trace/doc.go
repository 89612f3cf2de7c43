// Package trace reads and writes batch traces: JSON Lines files, one
// serving iteration per line, that a replayer (cmd/decode) feeds to the
// engine the way a server's scheduler would.
//
// A line is one JSON object with any of three fields, for example
//
//	{"context":[{"seq":7,"tokens":2048}],"generation":{"mtp":3,"seqs":[1,2,3]},"finish":[2]}
//
// The fields:
//
//   - context: prefill chunks, one per sequence. A chunk for a sequence the
//     cache does not hold creates it; a later chunk for the same sequence
//     continues its prompt at the cached offset (chunked prefill).
//   - generation: one decode step for every listed sequence, each running
//     1 + mtp tokens (the token and its MTP drafts). An optional "accept"
//     list, parallel to "seqs", says how many of them verification kept
//     (each in [1, 1 + mtp]; absent: all), as in
//     {"generation":{"mtp":3,"seqs":[1,2],"accept":[4,2]}}; the replay
//     reports it to the engine (Iteration.Accept) before the step ends.
//   - finish: sequences finished after this line's batch; their pages are
//     freed and the ids cannot come back.
//
// A line with context or generation is one iteration (context sequences
// first, then generation sequences, as the engine batches them). Blank
// lines and lines whose first non-blank character is '#' are skipped.
// Unknown fields, keys in another case ("SEQ") and keys given twice are
// errors, so a typo cannot silently drop or replace work; a null field is
// the same as an absent one, and a line must be an object. The
// package checks each line on its own (ParseLine); whether a sequence
// exists, or a batch fits the pool, is the engine's to decide when the line
// is replayed.
//
// Default is the embedded default trace, produced by Generate with
// DefaultGenParams (go run ./cmd/decode/gentrace).
package trace
