// Package cpu is the pure-Go backend of the MLA prologue: the bit-exact
// reference that every GPU kernel is held to, parallel across cores.
//
// Its buffers are host byte slices; it reads the iteration's metadata from
// the same encoded buffer a GPU kernel reads, so the upload path is tested
// too. Besides the prologue it runs the chain's steps, the compressor's
// step (for the main compressor and the indexer's: CompressStep) and the
// indexer's query (IndexerQuery), each through the same packages numerics
// and compressor that define the bytes.
package cpu
