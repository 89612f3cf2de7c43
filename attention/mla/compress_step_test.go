package mla_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
)

// A compressor step's plan for one iteration: a sequence at position 126
// adding a 4-token MTP step in place (it completes ratio-4 entry 31 and
// ratio-128 entry 0), and a new sequence's 9-token prompt (ratio-4 entries
// 0 and 1). The engine writes one such plan per ratio at Begin; the
// device's compress_step reads it.
func ExampleCompressPlan() {
	for _, ratio := range []int{4, 128} {
		p := &mla.CompressPlan{Seqs: []mla.CompressPlanSeq{
			{Row: 0, Rows: 4, Start: 126, From: 3, To: 3},
			{Row: 4, Rows: 9, Start: 0, From: 7, To: 7},
		}}
		table := []int32{5, 6} // the ratio's compressed pages of each sequence, 64 entries a page
		for b, s := range p.Seqs {
			if err := p.PlanEntries(b, ratio, s.Start, s.Rows, table, 64, 8); err != nil {
				panic(err)
			}
		}
		raw, err := p.Encode(2, mla.MaxCompressJobs(ratio, 2, 16))
		if err != nil {
			panic(err)
		}
		fmt.Printf("ratio %d: %d bytes, jobs %+v\n", ratio, len(raw), p.Jobs)
	}
	// Output:
	// ratio 4: 176 bytes, jobs [{Index:31 Seq:0 Page:5 Offset:31} {Index:0 Seq:1 Page:5 Offset:0} {Index:1 Seq:1 Page:5 Offset:1}]
	// ratio 128: 112 bytes, jobs [{Index:0 Seq:0 Page:5 Offset:0}]
}

// TestCompressPlanRoundTrip: Encode and DecodeCompressPlan are inverses;
// a plan over the capacity and a short buffer are refused.
func TestCompressPlanRoundTrip(t *testing.T) {
	p := &mla.CompressPlan{
		Seqs: []mla.CompressPlanSeq{{Row: 3, Rows: 130, Start: 257, From: 1, To: 9}, {Row: 0, Rows: 3, Start: 0, From: 2, To: 2}},
		Jobs: []mla.CompressPlanJob{{Index: 64, Seq: 0, Page: 7, Offset: 0}, {Index: 65, Seq: 0, Page: 7, Offset: 1}},
	}
	raw, err := p.Encode(4, 5)
	require.NoError(t, err)
	require.Len(t, raw, mla.CompressPlanBytes(4, 5))
	got, err := mla.DecodeCompressPlan(raw, 4, 5)
	require.NoError(t, err)
	require.Equal(t, p, got)
	_, err = p.Encode(1, 5)
	require.ErrorContains(t, err, "exceeds its capacity")
	_, err = mla.DecodeCompressPlan(raw[:len(raw)-1], 4, 5)
	require.ErrorContains(t, err, "needs")
}

// TestPlanEntriesRefusesMissingPage: an entry whose page the block table
// lacks (or outside the pool) is refused, naming it.
func TestPlanEntriesRefusesMissingPage(t *testing.T) {
	p := &mla.CompressPlan{}
	require.ErrorContains(t, p.PlanEntries(0, 4, 250, 12, []int32{0}, 64, 4), "entry 64")
	require.ErrorContains(t, p.PlanEntries(0, 4, 0, 4, []int32{4}, 64, 4), "pool of 4 pages")
	require.NoError(t, p.PlanEntries(0, 4, 0, 3, nil, 64, 4), "no entry completed: no page needed")
}

// FuzzDecodeCompressPlan: any bytes decode without a panic, and a decoded
// plan encodes and decodes to itself.
func FuzzDecodeCompressPlan(f *testing.F) {
	p := &mla.CompressPlan{Seqs: []mla.CompressPlanSeq{{Row: 1, Rows: 2, Start: 3, From: 0, To: 1}},
		Jobs: []mla.CompressPlanJob{{Index: 0, Seq: 0, Page: 2, Offset: 3}}}
	raw, err := p.Encode(2, 3)
	require.NoError(f, err)
	f.Add(raw)
	f.Add(make([]byte, mla.CompressPlanBytes(2, 3)))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := mla.DecodeCompressPlan(b, 2, 3)
		if err != nil {
			return
		}
		again, err := d.Encode(2, 3)
		require.NoError(t, err)
		d2, err := mla.DecodeCompressPlan(again, 2, 3)
		require.NoError(t, err)
		require.Equal(t, d, d2)
	})
}
