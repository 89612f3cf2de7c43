package compressor

import (
	"fmt"

	"github.com/dsv4mla/prologue/numerics"
)

// The lightning indexer's compressor (DESIGN.md section 9): section 8's
// ratio-4 pooling at width IndexerDim (PoolEntryDim), then FinishIndexer.
const (
	// IndexerDim is the width of one pooled indexer row: 64 nope values,
	// then 64 rope values.
	IndexerDim = numerics.HadamardDim
	// IndexerEntryBytes is one indexer cache entry: 64 bytes of MXFP4
	// nibbles, then 4 UE8M0 scale bytes.
	IndexerEntryBytes = numerics.MXFP4RowBytes
	// IndexerRatio is the only ratio with an indexer.
	IndexerRatio = 4
)

// FinishIndexer turns the 128 pooled values of indexer entry index into its
// 68 bytes: x = bf16(E); r = the inverse RMS of x (the canonical 32 partial
// sums of 4 squares, W = 128, eps); y = bf16(fl(fl(x*r) * w)); RoPE of the
// 32 pairs of dims [64, 128) with cs, the RoPE row of position 4*index
// (32 {cos, sin} pairs); Hadamard128; MXFP4.
func FinishIndexer(pooled, norm []float32, eps float32, cs []float32) ([IndexerEntryBytes]byte, error) {
	var out [IndexerEntryBytes]byte
	if len(pooled) < IndexerDim || len(norm) < IndexerDim || len(cs) < numerics.RopeDim {
		return out, fmt.Errorf("compressor: indexer entry of %d pooled values, %d weights, %d RoPE values (want %d, %d, %d)",
			len(pooled), len(norm), len(cs), IndexerDim, IndexerDim, numerics.RopeDim)
	}
	var x [IndexerDim]float32
	for c := range x {
		x[c] = numerics.RoundBF16(pooled[c])
	}
	r := numerics.RMSInvN(numerics.SumSquaresN(x[:]), IndexerDim, eps)
	var y [IndexerDim]uint16
	var v [IndexerDim]float32
	for c := range v {
		v[c] = numerics.RoundBF16(float32(float32(x[c]*r) * norm[c]))
	}
	RopeIndexerRow(v[:], cs)
	for c := range v {
		y[c] = numerics.BF16FromF32(v[c])
	}
	numerics.Hadamard128(y[:], y[:])
	for c := range v {
		v[c] = numerics.F32FromBF16(y[c])
	}
	numerics.QuantizeMXFP4(out[:], v[:])
	return out, nil
}

// RopeIndexerRow rotates the 32 pairs of dims [64, 128) of a 128-value
// indexer row (bf16 values) in place with cs, a RoPE row of 32 {cos, sin}
// pairs (DESIGN.md section 4.4's rounding): the rope half is last in the
// indexer's head layout.
func RopeIndexerRow(y, cs []float32) {
	const nope = IndexerDim - numerics.RopeDim
	for k := range numerics.RopePairs {
		i := nope + 2*k
		y[i], y[i+1] = numerics.Rope(y[i], y[i+1], cs[2*k], cs[2*k+1])
	}
}

// StoreIndexerEntry writes an entry at in-page offset off of an indexer
// cache page of pageSize entries (entry off at byte off*IndexerEntryBytes).
// It panics on a short page or an offset outside the page.
func StoreIndexerEntry(page []byte, pageSize, off int, e *[IndexerEntryBytes]byte) {
	if len(page) < pageSize*IndexerEntryBytes || off < 0 || off >= pageSize {
		panic(fmt.Sprintf("compressor: indexer entry at offset %d of a %d-byte page of %d entries", off, len(page), pageSize))
	}
	copy(page[off*IndexerEntryBytes:], e[:])
}
