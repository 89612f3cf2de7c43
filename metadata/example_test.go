package metadata_test

import (
	"fmt"

	"github.com/dsv4mla/prologue/kvcache"
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

// Decode steps over one reused Metadata: a row is copied again only when
// its page list changed (a new state number, as kvcache's
// Reservation.AppendTableStates gives it).
func ExamplePlan_BuildKeeping() {
	cached := map[uint64]int{1: 14, 2: 40}
	pages := map[uint64][]int32{1: {7}, 2: {3, 4, 5}}
	state := map[uint64]uint64{1: 1, 2: 2}
	params := metadata.Params{Heads: 1, PageSize: 16, MaxPositions: 1024, Scheduler: metadata.DefaultSchedulerParams()}
	var keeper metadata.RowKeeper
	m := &metadata.Metadata{}
	for step := range 3 {
		reqs := []metadata.Request{{Seq: 1, Phase: metadata.Generation}, {Seq: 2, Phase: metadata.Generation}}
		plan, err := metadata.NewPlan(reqs, func(s uint64) (int, bool, error) { return cached[s], true, nil }, params)
		if err != nil {
			fmt.Println(err)
			return
		}
		if step == 2 { // sequence 1 reaches position 16: a second page
			pages[1], state[1] = []int32{7, 9}, 3
		}
		m, err = plan.BuildKeeping(m, &keeper,
			func(dst []int32, b int, seq uint64) ([]int32, error) { return append(dst, pages[seq]...), nil },
			[]uint64{state[1], state[2]})
		if err != nil {
			fmt.Println(err)
			return
		}
		_, _, _, rebuilt := keeper.Kept()
		fmt.Println("step", step, "block tables:", m.BlockTables, "rebuilt rows:", rebuilt)
		for s := range cached {
			cached[s]++
		}
	}
	// Output:
	// step 0 block tables: [7 -1 -1 3 4 5] rebuilt rows: [0 1]
	// step 1 block tables: [7 -1 -1 3 4 5] rebuilt rows: []
	// step 2 block tables: [7 9 -1 3 4 5] rebuilt rows: [0]
}

// A server's step loop plans each batch with one Planner, after looking up
// the whole batch in the paged cache under one lock (kvcache.LookupAll); a
// sequence the cache does not know yet is created by the plan.
func ExamplePlanner_PlanLookedUp() {
	cache, err := kvcache.New(kvcache.Config{PageSize: 64, NumPages: 8})
	if err != nil {
		panic(err)
	}
	r, err := cache.Reserve([]kvcache.Need{{ID: 7, NewLength: 100, Create: true}})
	if err != nil {
		panic(err)
	}
	if err := r.Commit(); err != nil {
		panic(err)
	}
	reqs := []metadata.Request{
		{Seq: 8, Phase: metadata.Context, NewTokens: 5},
		{Seq: 7, Phase: metadata.Generation, MTP: 3},
	}
	lookups := []kvcache.SequenceLookup{{ID: 8}, {ID: 7}}
	cache.LookupAll(lookups)
	params := metadata.Params{Heads: 64, PageSize: 64, MaxPositions: 4096, Scheduler: metadata.DefaultSchedulerParams()}
	var planner metadata.Planner
	plan, err := planner.PlanLookedUp(reqs, lookups, params)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, n := range plan.Needs() {
		fmt.Printf("seq %d needs %d tokens (create %v)\n", n.Seq, n.Length, n.Create)
	}
	// Output:
	// seq 8 needs 5 tokens (create true)
	// seq 7 needs 104 tokens (create false)
}
