// Package mlatest is the conformance suite every mla.Backend runs, in the
// manner of gonum's blas/testblas: fresh random inputs (each case logs its
// seed; -mlatest.seed=N, with -run narrowed to the case, replays it), outputs
// poisoned before each run, and every byte of the Q buffer, the
// cache pool and the scheduler scalars compared with a slow scalar reference
// written straight from docs/DESIGN.md. TestActQuant, TestNormQuant and
// TestQuantRefusals do the same for the chain's bit-exact kernels
// (docs/DESIGN.md section 7 steps 1 and 3) on any backend that has them, and
// TestCompressStep for the compressor step (docs/DESIGN.md section 8,
// mla.CompressStepArgs): every byte of the ring of states and of the
// compressed pool after one step, against a scalar reference that shares
// nothing with package compressor, for the main compressor and (scenarios
// and step series named indexer/...) the indexer's (section 9: width 128,
// 68-byte MXFP4 entries). TestIndexerQuery checks the indexer's query and
// head weights (mla.IndexerQueryArgs) over every batch shape of the Q
// suite, and TestIndexerRotation that planted keys score highest only when
// both the query and the key are Hadamard-rotated (or neither). The
// indexer's reference (indexer_ref.go) shares nothing with numerics'
// Hadamard128 and MXFP4. TestTopK runs the indexer's top-k
// selection (docs/DESIGN.md section 9, mla.TopKArgs) on scenarios with
// planted keys, visibility boundaries, ties, NaN and Inf head weights and
// extreme scales, every index against a scalar reference that scores from
// the dequantized values and sorts in full.
package mlatest
