package kvcache_test

import (
	"errors"
	"fmt"

	"github.com/dsv4mla/prologue/kvcache"
)

func ExampleCache() {
	cache, err := kvcache.New(kvcache.Config{PageSize: 64, NumPages: 4})
	if err != nil {
		panic(err)
	}
	// One iteration: a new 70-token prompt (sequence 1) and a decode step of
	// sequence 2, admitted together or not at all.
	r, err := cache.Reserve([]kvcache.Need{
		{ID: 1, NewLength: 70, Create: true},
		{ID: 2, NewLength: 1, Create: true},
	})
	if err != nil {
		panic(err)
	}
	// The metadata pass reads block tables and slots before the commit.
	table, _ := cache.BlockTable(1)
	slot, _ := cache.Slot(1, 64) // page 1, offset 0
	fmt.Println("block table:", table, "slot of position 64:", slot)
	if err := r.Commit(); err != nil {
		panic(err)
	}

	// A batch that does not fit is refused whole.
	_, err = cache.Reserve([]kvcache.Need{{ID: 1, NewLength: 300}})
	fmt.Println(errors.Is(err, kvcache.ErrCacheFull), err)

	if err := cache.Finish(1); err != nil {
		panic(err)
	}
	_, err = cache.Lookup(1)
	fmt.Println(err)
	fmt.Println("free pages:", cache.FreePages())
	// Output:
	// block table: [0 1] slot of position 64: 64
	// true kvcache: cache full: need 3 pages, 1 free of 4
	// kvcache: finished sequence 1
	// free pages: 3
}

func ExampleEncodeToken() {
	const pageSize = 64
	format := kvcache.FormatFP8UE8M0
	page := make([]byte, format.PageBytes(pageSize))
	var y [512]float32
	y[0], y[1] = 448, -0.5 // group 0: amax 448, scale exponent 127
	y[448] = 1             // first rope value, stored as bf16
	if err := kvcache.EncodeToken(format, page, pageSize, 3, &y, 1); err != nil {
		fmt.Println(err)
		return
	}

	v, s := format.ValueOffset(pageSize, 3), format.ScaleOffset(pageSize, 3)
	fmt.Printf("values at %d: % x, rope % x\n", v, page[v:v+2], page[v+448:v+450])
	fmt.Printf("scales at %d: %d\n", s, page[s:s+7])
	back, err := kvcache.DecodeToken(format, page, pageSize, 3, 1)
	fmt.Println(back[0], back[1], back[448], err)
	fmt.Println(kvcache.EncodeToken(format, page, pageSize, pageSize, &y, 1))
	// Output:
	// values at 1728: 7e b0, rope 80 3f
	// scales at 36888: [127 105 105 105 105 105 105]
	// 448 -0.5 1 <nil>
	// kvcache: EncodeToken: in-page offset 64 out of range [0, 64)
}

func ExampleParseFormat() {
	f, err := kvcache.ParseFormat("bf16")
	fmt.Println(f, f.BytesPerToken(), f.PageBytes(64), err)
	_, err = kvcache.ParseFormat("int8")
	fmt.Println(err)
	// Output:
	// bf16 1024 65536 <nil>
	// kvcache: unknown format "int8" (want fp8_ue8m0, bf16 or fp8_pertensor)
}

// A Finish the server accepted for a sequence whose creation then rolled
// back is applied with Retire: the id is refused afterwards, as if it had
// been created and finished.
func ExampleCache_Retire() {
	cache, err := kvcache.New(kvcache.Config{PageSize: 64, NumPages: 4})
	if err != nil {
		panic(err)
	}
	r, err := cache.Reserve([]kvcache.Need{{ID: 7, NewLength: 10, Create: true}})
	if err != nil {
		panic(err)
	}
	// The iteration fails: the creation rolls back, the id is unknown.
	if err := r.Rollback(); err != nil {
		panic(err)
	}
	_, err = cache.Lookup(7)
	fmt.Println(errors.Is(err, kvcache.ErrUnknownSequence), err)
	if err := cache.Retire(7); err != nil {
		panic(err)
	}
	_, err = cache.Reserve([]kvcache.Need{{ID: 7, NewLength: 10, Create: true}})
	fmt.Println(errors.Is(err, kvcache.ErrFinishedSequence), err)
	// Output:
	// true kvcache: unknown sequence 7
	// true kvcache: finished sequence 7: needs[0] cannot create it again
}

// A DSv4 cache model: the SWA pages, the ratio-4 entries with the
// indexer's keys on their table, and the state slots, reserved as one. An
// MTP step committed with its accepted length drops the entries past it;
// a batch that does not fit one pool is refused naming it, nothing changed.
func ExampleModel() {
	m, err := kvcache.NewModel(kvcache.DSv4Layout(kvcache.DSv4Pools{
		SWA: kvcache.Config{PageSize: 64, NumPages: 8, Window: kvcache.DSv4Window}, Layers: 3,
		RatioLayers: map[int]int{4: 1}, RatioPages: map[int]int{4: 2}, StateBytes: map[int]int64{4: 64 << 10},
		Live: 2, Slots: 3, InPlace: 4, IndexerStateBytes: 16 << 10,
	}))
	if err != nil {
		fmt.Println(err)
		return
	}
	step := func(b *kvcache.Batch, accepted map[uint64]int) {
		r, err := m.Reserve(b)
		if err != nil {
			fmt.Println("refused:", err)
			return
		}
		if err := r.CommitLengths(accepted); err != nil {
			fmt.Println(err)
		}
	}
	step(&kvcache.Batch{Needs: []kvcache.Need{{ID: 1, NewLength: 130, Create: true}}, Cached: []int{0}}, nil)
	// 1 + 3 drafts, one accepted: 131 tokens, 32 entries.
	step(&kvcache.Batch{Needs: []kvcache.Need{{ID: 1, NewLength: 134}}, Cached: []int{130}}, map[uint64]int{1: 131})
	n, _ := m.Pool(1).(*kvcache.EntryCache).Cache().Lookup(1)
	fmt.Println("ratio-4 entries:", n)
	step(&kvcache.Batch{Needs: []kvcache.Need{{ID: 2, NewLength: 260, Create: true}}, Cached: []int{0}}, nil)
	for _, u := range m.Usage() {
		fmt.Printf("%s %d/%d free\n", u.Name, u.Free, u.Pages)
	}
	// Output:
	// ratio-4 entries: 32
	// refused: ratio-4 compressed pool and indexer pool: kvcache: cache full: need 2 pages, 1 free of 2
	// swa 5/8 free
	// ratio-4 1/2 free
	// indexer 1/2 free
	// state-4 1/2 free
	// indexer-state 1/2 free
}
