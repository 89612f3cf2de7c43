package mla_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// A mixed batch (one prompt chunk, two decode streams with one MTP draft)
// becomes one launch per phase; RunLayer issues each launch's KV and Q
// kernels on a backend, here the CPU reference.
func Example() {
	const heads, pageSize = 2, 16
	reqs := []metadata.Request{
		{Seq: 1, Phase: metadata.Context, NewTokens: 5},
		{Seq: 2, Phase: metadata.Generation, MTP: 1},
		{Seq: 3, Phase: metadata.Generation, MTP: 1},
	}
	cached := map[uint64]int{2: 40, 3: 7}
	plan, err := metadata.NewPlan(reqs, func(s uint64) (int, bool, error) { n, ok := cached[s]; return n, ok, nil },
		metadata.Params{Heads: heads, PageSize: pageSize, MaxPositions: 64, Scheduler: metadata.DefaultSchedulerParams()})
	if err != nil {
		panic(err)
	}
	next := int32(0)
	tables := map[uint64][]int32{}
	for _, n := range plan.Needs() { // a real server asks kvcache.Cache.Reserve for these pages
		for i := 0; i < (n.Length+pageSize-1)/pageSize; i++ {
			tables[n.Seq] = append(tables[n.Seq], next)
			next++
		}
	}
	m, err := plan.Build(func(s uint64) ([]int32, error) { return tables[s], nil })
	if err != nil {
		panic(err)
	}
	launches := mla.Plan(m)
	for _, l := range launches {
		fmt.Println(l)
	}

	b := cpu.New(0)
	alloc := func(n int) mla.Buffer { buf, _ := b.Alloc(n); return buf }
	fill := func(buf mla.Buffer) mla.Buffer { // inputs: any bf16 values, here ones
		p := cpu.Bytes(buf)
		for i := 0; i+1 < len(p); i += 2 {
			binary.LittleEndian.PutUint16(p[i:], 0x3F80)
		}
		return buf
	}
	cfg := kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: pageSize, NumPages: int(next)}
	a := &mla.LayerArgs{
		Heads: heads, Latent: fill(alloc(m.Tokens * 1024)), LatentStride: 512,
		QIn: fill(alloc(m.Tokens * heads * 1024)), QOut: alloc(m.Tokens * heads * 512), QFormat: mla.QFP8, QScale: 1, Eps: 1e-6,
		KVWeight: alloc(2048), Rope: alloc(64 * 256), RopePositions: 64,
		Cache: alloc(cfg.PoolBytes()), CacheConfig: cfg, Scheduler: metadata.DefaultSchedulerParams(),
	}
	w := cpu.Bytes(a.KVWeight)
	rope := cpu.Bytes(a.Rope)
	for i := 0; i < 512; i++ {
		binary.LittleEndian.PutUint32(w[4*i:], math.Float32bits(1))
	}
	for i := 0; i < 64*32; i++ { // cos 1, sin 0: RoPE leaves the values as they are
		binary.LittleEndian.PutUint32(rope[8*i:], math.Float32bits(1))
	}
	if a.Meta, err = mla.NewMetadataBuffers(b, m.NumSeqs, m.MaxPages); err != nil {
		panic(err)
	}
	if err := a.Meta.Upload(b, m, cfg.NumPages); err != nil {
		panic(err)
	}
	if err := mla.RunLayer(context.Background(), b, launches, a); err != nil {
		panic(err)
	}
	// A row of ones normalizes to ones: e4m3 1.0 is 0x38.
	fmt.Printf("Q[0][0][0] = %#02x\n", cpu.Bytes(a.QOut)[0])
	// Output:
	// context rows [0,5) valid 5 seqs [0,1) seq_len 0
	// generation rows [5,9) valid 4 seqs [1,3) seq_len 2
	// Q[0][0][0] = 0x38
}
