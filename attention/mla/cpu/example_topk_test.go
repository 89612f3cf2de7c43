package cpu_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
)

// The indexer's top-k selection of two query tokens: one at position 19
// sees entries 0..4 and keeps the best two (entry i's values are scaled
// by 2^i, so the last two), one at position 6 sees only entry 0.
func ExampleBackend_IndexerTopK() {
	b := cpu.New(1)
	shape := mla.TopKShape{TopK: 2, Rows: 2, MaxSeqs: 2, PageStride: 1, PageSize: 8, NumPages: 1, ScratchEntries: 8}
	row := func(nibbles byte, scale byte) []byte {
		r := slices.Repeat([]byte{nibbles}, 64)
		return append(r, scale, scale, scale, scale)
	}
	q := slices.Repeat(row(0x22, 127), 2*mla.IndexerHeads) // every value 1.0
	w := make([]byte, 2*2*mla.IndexerHeads)
	for i := 0; i < len(w); i += 2 {
		binary.LittleEndian.PutUint16(w[i:], 0x3F80) // bf16 1.0
	}
	var cache []byte
	for i := range shape.PageSize {
		cache = append(cache, row(0x11, byte(120+i))...) // entry i: 0.5 * 2^(i-7)
	}
	plan, err := (&mla.TopKPlan{Seqs: []mla.TopKPlanSeq{
		{Row: 0, Rows: 1, Start: 19, Table: []int32{0}},
		{Row: 1, Rows: 1, Start: 6, Table: []int32{0}},
	}}).Encode(&shape)
	if err != nil {
		panic(err)
	}
	a := &mla.TopKArgs{TopKShape: shape}
	for _, u := range []struct {
		buf  *mla.Buffer
		data []byte
	}{{&a.Q, q}, {&a.W, w}, {&a.Cache, cache}, {&a.Plan, plan}, {&a.Scratch, make([]byte, 4*shape.ScratchEntries)}, {&a.Out, make([]byte, 4*2*2)}} {
		*u.buf, _ = b.Alloc(len(u.data))
		_ = b.Write(*u.buf, 0, u.data)
	}
	if err := b.IndexerTopK(context.Background(), a); err != nil {
		panic(err)
	}
	out := make([]byte, 16)
	_ = b.Read(out, a.Out, 0)
	for r := range 2 {
		fmt.Println(int32(binary.LittleEndian.Uint32(out[8*r:])), int32(binary.LittleEndian.Uint32(out[8*r+4:])))
	}
	// Output:
	// 3 4
	// 0 -1
}
