package metadata

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// TestPlannerMatchesNewPlan: one Planner and one reused Metadata, batch
// after batch of growing and shrinking sizes, give exactly what NewPlan and
// Build give fresh, whether the pages are appended into the row or, for a
// table longer than the row, elsewhere.
func TestPlannerMatchesNewPlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	var pr Planner
	var reuse *Metadata
	for i := range 300 {
		rb := genRandomBatch(rng)
		lookup := func(s uint64) (int, bool, error) { c, ok := rb.cached[s]; return c, ok, nil }
		want, err := NewPlan(rb.reqs, lookup, rb.params)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		got, err := pr.Plan(rb.reqs, lookup, rb.params)
		if err != nil {
			t.Fatalf("batch %d: Planner: %v", i, err)
		}
		if !reflect.DeepEqual(got.Needs(), want.Needs()) {
			t.Fatalf("batch %d: Planner needs %v, NewPlan %v", i, got.Needs(), want.Needs())
		}
		if n := got.AppendNeeds([]Need{{Seq: 1}}); len(n) != len(rb.reqs)+1 || !reflect.DeepEqual(n[1:], want.Needs()) {
			t.Fatalf("batch %d: AppendNeeds %v", i, n)
		}
		wantM, err := want.Build(func(s uint64) ([]int32, error) { return rb.pages[s], nil })
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		calls := 0
		gotM, err := got.BuildAppend(reuse, func(dst []int32, b int, s uint64) ([]int32, error) {
			if b != calls || s != rb.reqs[b].Seq {
				t.Fatalf("batch %d: call %d asked for index %d, seq %d", i, calls, b, s)
			}
			calls++
			return append(dst, rb.pages[s]...), nil
		})
		if err != nil {
			t.Fatalf("batch %d: BuildAppend: %v", i, err)
		}
		if reuse != nil && gotM != reuse {
			t.Fatalf("batch %d: BuildAppend did not reuse the metadata", i)
		}
		if !reflect.DeepEqual(gotM, wantM) {
			t.Fatalf("batch %d: reused metadata\n%+v\nfresh\n%+v", i, gotM, wantM)
		}
		reuse = gotM
	}
}

// TestBuildAppendRefusesBadEntries: the fast check lets no bad entry
// through, and flags no good one, next to a page bound (MaxInt32).
func TestBuildAppendRefusesBadEntries(t *testing.T) {
	p := defaultParams() // 4-token pages
	lookup := func(uint64) (int, bool, error) { return 8, true, nil }
	tests := []struct {
		name  string
		pages []int32 // kv_len 9: 3 pages, 2 behind the cached positions
		bad   string
	}{
		{"real pages", []int32{0, 1, 2}, ""},
		{"freed behind", []int32{-1, -1, 2}, ""},
		{"largest page", []int32{2147483647, 2147483647, 2147483647}, ""},
		{"below -1 behind", []int32{-2, 1, 2}, "block table entry 0 is page -2"},
		{"freed new page", []int32{0, 1, -1}, "block table entry 2 is page -1"},
		{"most negative", []int32{0, -2147483648, 2}, "block table entry 1 is page -2147483648"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan := mustPlan(t, []Request{{Seq: 3, Phase: Generation}}, lookup, p)
			m, err := plan.BuildAppend(nil, func(dst []int32, _ int, _ uint64) ([]int32, error) { return append(dst, tt.pages...), nil })
			if tt.bad == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(m.BlockTables, tt.pages) {
					t.Fatalf("block table %v, want %v", m.BlockTables, tt.pages)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.bad) {
				t.Fatalf("error %v, want one saying %q", err, tt.bad)
			}
		})
	}
}

// TestSeqIndex: the duplicate index agrees with a map on ids that are
// consecutive, strided by powers of two (which a weak hash would pile into
// one bucket) and random, reused across sizes.
func TestSeqIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	var x seqIndex
	gens := map[string]func(i int) uint64{
		"consecutive": func(i int) uint64 { return uint64(i) },
		"stride 2^32": func(i int) uint64 { return uint64(i) << 32 },
		"stride 2^54": func(i int) uint64 { return uint64(i) << 54 },
		"random":      func(int) uint64 { return rng.Uint64N(512) },
	}
	for name, gen := range gens {
		for _, n := range []int{1, 2, 7, 256, 1000, 3} {
			x.reset(n)
			seen := map[uint64]int{}
			for i := range n {
				id := gen(i)
				j, dup := x.insert(id, i)
				wantJ, wantDup := seen[id]
				if dup != wantDup || (dup && j != wantJ) {
					t.Fatalf("%s n=%d: insert(%d, %d) = %d, %v; want %d, %v", name, n, id, i, j, dup, wantJ, wantDup)
				}
				if !dup {
					seen[id] = i
				}
			}
		}
	}
}

// TestPlannerRepeatedBatches: a Planner skips the duplicate search over
// the prefix a batch repeats of its last successful one; batches that
// repeat, extend, cut, or reuse an id of the last one (also after a
// refused batch) are refused or planned exactly as NewPlan does.
func TestPlannerRepeatedBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	lookup := func(s uint64) (int, bool, error) { return int(s % 7), true, nil }
	p := defaultParams()
	gen := func(ids ...uint64) []Request {
		reqs := make([]Request, len(ids))
		for i, id := range ids {
			reqs[i] = Request{Seq: id, Phase: Generation, MTP: 1}
		}
		return reqs
	}
	fixed := [][]uint64{
		{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 1}, {1, 2, 3, 4}, {1, 2, 3, 4, 2},
		{1, 2, 3, 4, 5}, {1, 2}, {1, 2, 1}, {2, 2}, {1, 2, 3, 4, 5, 6, 5}, {1, 2, 3},
		{3, 2, 3}, {1, 2, 3},
	}
	var pr Planner
	last := []uint64{1}
	for i := range 400 {
		var ids []uint64
		if i < len(fixed) {
			ids = fixed[i]
		} else {
			ids = append([]uint64(nil), last...)
			switch rng.IntN(4) {
			case 0: // an id of the batch again, somewhere
				ids[rng.IntN(len(ids))] = ids[rng.IntN(len(ids))]
			case 1: // grown by a fresh or an existing id
				if rng.IntN(2) == 0 {
					ids = append(ids, 1000+uint64(i))
				} else {
					ids = append(ids, ids[rng.IntN(len(ids))])
				}
			case 2: // cut
				ids = ids[:1+rng.IntN(len(ids))]
			}
		}
		reqs := gen(ids...)
		want, wantErr := NewPlan(reqs, lookup, p)
		got, err := pr.Plan(reqs, lookup, p)
		if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
			t.Fatalf("batch %d %v: Planner error %v, NewPlan %v", i, ids, err, wantErr)
		}
		if err != nil {
			continue
		}
		if !reflect.DeepEqual(got.Needs(), want.Needs()) {
			t.Fatalf("batch %d %v: Planner needs %v, NewPlan %v", i, ids, got.Needs(), want.Needs())
		}
		last = ids
	}
}

// TestBuildKeepingStatesLength: states of another length than the batch
// are refused, and the keeper then forgets its rows: the next build keeps
// none.
func TestBuildKeepingStatesLength(t *testing.T) {
	lookup := func(uint64) (int, bool, error) { return 5, true, nil }
	plan := mustPlan(t, []Request{{Seq: 1, Phase: Generation}, {Seq: 2, Phase: Generation}}, lookup, defaultParams())
	appendTable := func(dst []int32, b int, _ uint64) ([]int32, error) { return append(dst, int32(2*b), int32(2*b+1)), nil }
	var k RowKeeper
	m, err := plan.BuildKeeping(&Metadata{}, &k, appendTable, []uint64{7, 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, states := range [][]uint64{{7}, {7, 8, 9}, {}} {
		if _, err := plan.BuildKeeping(m, &k, appendTable, states); err == nil || !strings.Contains(err.Error(), "page-list states for a batch of 2") {
			t.Fatalf("states %v: error %v, want one about their count", states, err)
		}
	}
	if _, err := plan.BuildKeeping(m, &k, appendTable, []uint64{7, 8}); err != nil {
		t.Fatal(err)
	}
	if _, from, rows, rebuilt := k.Kept(); from != 0 || rows != 2 || !reflect.DeepEqual(rebuilt, []int32{0, 1}) {
		t.Fatalf("after a refused build: from %d, %d rows, rebuilt %v; want 0, 2, all", from, rows, rebuilt)
	}
}
