// Command gentrace writes a synthetic batch trace (see package
// engine/trace). With no flags it writes the embedded default trace
// byte for byte, with -chain the embedded chain trace (the default of
// cmd/decode --input hidden):
//
//	go run ./cmd/decode/gentrace -o engine/trace/default.jsonl
//	go run ./cmd/decode/gentrace -chain -o engine/trace/chain.jsonl
package main
