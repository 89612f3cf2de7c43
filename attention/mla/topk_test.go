package mla_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/metadata"
)

// TestTopKPlanFromMetadata: the plan SetFromMetadata builds puts every row
// of a mixed batch at the sequence and position metadata.Metadata.Row
// gives it, and leaves the padding rows invalid.
func TestTopKPlanFromMetadata(t *testing.T) {
	// Two context sequences (5 tokens after 4096 cached, 3 from 0), two
	// generation sequences of 1 + 3 MTP tokens, 2 padding rows.
	m := &metadata.Metadata{
		NumSeqs: 4, NumCtx: 2, NumGen: 2, CtxTokens: 8, GenTokens: 8, Tokens: 16, PaddedTokens: 18, GenSeqLen: 4,
		QLen:   []int32{5, 3, 4, 4},
		KVLen:  []int32{4101, 3, 4100, 2053},
		Cached: []int32{4096, 0, 4096, 2049},
		CuQ:    []int32{0, 5, 8, 12, 16},
	}
	tables := make([][]int32, m.NumSeqs)
	for b := range tables {
		for j := range (int(m.KVLen[b])/4 + 63) / 64 {
			tables[b] = append(tables[b], int32(10*b+j))
		}
	}
	p := &mla.TopKPlan{Seqs: make([]mla.TopKPlanSeq, 0, 8)}
	require.Error(t, p.SetFromMetadata(m, tables[:3]))
	require.NoError(t, p.SetFromMetadata(m, tables))
	// The most keys a row scores: 1028 (1025 visible, rounded up to 4) at
	// index_topk 512 or 1024; the 513 of the last sequence count at 512
	// only; nothing is scored at 2048.
	require.Equal(t, 1028, p.MaxRowKeys(512))
	require.Equal(t, 1028, p.MaxRowKeys(1024))
	require.Equal(t, 516, (&mla.TopKPlan{Seqs: p.Seqs[3:]}).MaxRowKeys(512))
	require.Zero(t, (&mla.TopKPlan{Seqs: p.Seqs[3:]}).MaxRowKeys(1024))
	require.Zero(t, p.MaxRowKeys(2048))
	shape := mla.TopKShape{TopK: 512, Rows: m.PaddedTokens, MaxSeqs: 4, PageStride: 17, PageSize: 64, NumPages: 64, ScratchEntries: 1 << 16}
	enc, err := p.Encode(&shape)
	require.NoError(t, err)
	words := make([]int32, len(enc)/4)
	for i := range words {
		words[i] = int32(binary.LittleEndian.Uint32(enc[4*i:]))
	}
	for r := range m.PaddedTokens {
		got := mla.ResolveTopKRow(words, &shape, r)
		b, pos, ok := m.Row(r)
		require.Equal(t, ok, got.Valid, "row %d", r)
		if !ok {
			continue
		}
		require.Equal(t, b, got.Seq, "row %d", r)
		require.Equal(t, pos, got.Position, "row %d", r)
		require.Equal(t, (pos+1)/4, got.Visible, "row %d", r)
		if len(tables[b]) > 0 {
			require.Equal(t, int(tables[b][len(tables[b])-1]), mla.TopKPage(words, &shape, b, 64*(len(tables[b])-1)), "row %d", r)
		}
	}
}
