package metadata_test

import (
	"fmt"

	"github.com/dsv4mla/prologue/metadata"
)

// A mixed batch: a new prompt, then two decode steps with one MTP draft.
// The cache is a map here; in the engine it is the paged KV cache.
func ExampleNewPlan() {
	cached := map[uint64]int{20: 63, 21: 9}
	lookup := func(seq uint64) (int, bool, error) {
		n, ok := cached[seq]
		return n, ok, nil
	}
	reqs := []metadata.Request{
		{Seq: 10, Phase: metadata.Context, NewTokens: 3},
		{Seq: 20, Phase: metadata.Generation, MTP: 1},
		{Seq: 21, Phase: metadata.Generation, MTP: 1},
	}
	params := metadata.Params{
		Heads:        64,
		PageSize:     64,
		MaxPositions: 1 << 20,
		PadTokensTo:  8,
		Scheduler:    metadata.DefaultSchedulerParams(),
	}
	plan, err := metadata.NewPlan(reqs, lookup, params)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The cache grows each sequence to its Need before Build.
	for _, n := range plan.Needs() {
		fmt.Printf("seq %d needs %d tokens (create %v)\n", n.Seq, n.Length, n.Create)
	}
	pages := map[uint64][]int32{10: {0}, 20: {1, 2}, 21: {3}}
	m, err := plan.Build(func(seq uint64) ([]int32, error) { return pages[seq], nil })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("cu_q:", m.CuQ, "cu_kv:", m.CuKV, "cu_q_rows:", m.CuQRows)
	fmt.Println("block tables:", m.BlockTables)
	fmt.Println("positions:", m.Positions())
	fmt.Println("slots:", m.Slots())
	// Output:
	// seq 10 needs 3 tokens (create true)
	// seq 20 needs 65 tokens (create false)
	// seq 21 needs 11 tokens (create false)
	// cu_q: [0 3 5 7] cu_kv: [0 3 68 79] cu_q_rows: [0 192 320 448]
	// block tables: [0 -1 1 2 3 -1]
	// positions: [0 1 2 63 64 9 10 0]
	// slots: [0 1 2 127 128 201 202 -1]
}

func ExampleMetadata_Row() {
	lookup := func(uint64) (int, bool, error) { return 6, true, nil }
	params := metadata.Params{Heads: 1, PageSize: 4, MaxPositions: 4096, PadTokensTo: 4, Scheduler: metadata.DefaultSchedulerParams()}
	plan, err := metadata.NewPlan([]metadata.Request{{Seq: 1, Phase: metadata.Generation, MTP: 2}}, lookup, params)
	if err != nil {
		fmt.Println(err)
		return
	}
	m, err := plan.Build(func(uint64) ([]int32, error) { return []int32{5, 8, 2}, nil })
	if err != nil {
		fmt.Println(err)
		return
	}
	for t := range m.PaddedTokens {
		b, pos, ok := m.Row(t)
		fmt.Printf("row %d: seq index %d position %d real %v slot %d\n", t, b, pos, ok, m.Slot(t))
	}
	// Output:
	// row 0: seq index 0 position 6 real true slot 34
	// row 1: seq index 0 position 7 real true slot 35
	// row 2: seq index 0 position 8 real true slot 8
	// row 3: seq index 0 position 0 real false slot -1
}

func ExampleComputeSchedulerScalars() {
	p := metadata.DefaultSchedulerParams()
	p.KVDeq = 2
	s := metadata.ComputeSchedulerScalars(p)
	fmt.Println(s.TileCounter, s.BMM1[0], s.BMM1[1], s.BMM2)
	// Output: 0 0.088388346 0.12751743 2
}

func ExampleParsePhase() {
	p, err := metadata.ParsePhase("generation")
	fmt.Println(p, err)
	_, err = metadata.ParsePhase("decode")
	fmt.Println(err)
	// Output:
	// generation <nil>
	// metadata: unknown phase "decode" (want "context" or "generation")
}
