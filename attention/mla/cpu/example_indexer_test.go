package cpu_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// The indexer's query of one token at position 0 (the RoPE table's row 0
// is the identity): head 0's input is 3 at dim 0, so the Hadamard spreads
// 3/sqrt(128) (bf16 0.2656) over all 128 values and MXFP4 stores each as
// 4 (code 6, the nearest grid point of 0.2656*16) at scale 2^-4 (byte
// 0x7b); its head weight w = 2 becomes bf16(2 * 2^-6.5).
func ExampleBackend_IndexerQuery() {
	b := cpu.New(0)
	plan, err := metadata.NewPlan([]metadata.Request{{Seq: 1, Phase: metadata.Context, NewTokens: 1}},
		func(uint64) (int, bool, error) { return 0, false, nil },
		metadata.Params{Heads: 1, PageSize: 64, MaxPositions: 1, Scheduler: metadata.DefaultSchedulerParams()})
	if err != nil {
		panic(err)
	}
	m, err := plan.Build(func(uint64) ([]int32, error) { return []int32{0}, nil })
	if err != nil {
		panic(err)
	}
	alloc := func(n int) mla.Buffer { buf, _ := b.Alloc(n); return buf }
	a := &mla.IndexerQueryArgs{
		Q: alloc(mla.IndexerHeads * mla.IndexerDim * 2), QStride: mla.IndexerHeads * mla.IndexerDim,
		W: alloc(mla.IndexerHeads * 4), WStride: mla.IndexerHeads,
		QOut: alloc(mla.IndexerHeads * mla.IndexerEntryBytes), WOut: alloc(mla.IndexerHeads * 2),
		Rope: alloc(numerics.RopeDim * 4), RopePositions: 1,
	}
	binary.LittleEndian.PutUint16(cpu.Bytes(a.Q), numerics.BF16FromF32(3))
	binary.LittleEndian.PutUint32(cpu.Bytes(a.W), math.Float32bits(2))
	for k := 0; k < numerics.RopePairs; k++ { // (cos, sin) = (1, 0)
		binary.LittleEndian.PutUint32(cpu.Bytes(a.Rope)[8*k:], math.Float32bits(1))
	}
	if a.Meta, err = mla.NewMetadataBuffers(b, 1, 1); err != nil {
		panic(err)
	}
	if err := a.Meta.Upload(b, m, 1); err != nil {
		panic(err)
	}
	if err := mla.RunIndexerQuery(context.Background(), b, mla.Plan(m), a); err != nil {
		panic(err)
	}
	row := cpu.Bytes(a.QOut)[:mla.IndexerEntryBytes]
	fmt.Printf("nibbles % x ..., scales % x\n", row[:4], row[64:])
	fmt.Println("head weight", numerics.F32FromBF16(binary.LittleEndian.Uint16(cpu.Bytes(a.WOut))))
	// Output:
	// nibbles 66 66 66 66 ..., scales 7b 7b 7b 7b
	// head weight 0.022094727
}
