package metadata

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/dsv4mla/prologue/kvcache"
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
// the prefix a batch repeats of its last successful one, and plans a
// repeated decode batch in a pass of its own (PlanLookedUp); batches that
// repeat, extend, cut, or reuse an id of the last one, change a request's
// fields or meet a lookup that refuses, does not know the sequence or
// reports a length past MaxPositions (also after a refused batch) are
// refused or planned exactly as NewPlan does, through Plan and through
// PlanLookedUp.
func TestPlannerRepeatedBatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	p := defaultParams()
	p.MaxPositions = 1 << 12
	type batch struct {
		reqs   []Request
		cached map[uint64]int // absent: unknown; negative: the lookup fails
	}
	lookupOf := func(b batch) LengthLookup {
		return func(s uint64) (int, bool, error) {
			c, ok := b.cached[s]
			if c < 0 {
				return 0, false, errors.New("lookup refused")
			}
			return c, ok, nil
		}
	}
	lookedUp := func(b batch) []kvcache.SequenceLookup {
		out := make([]kvcache.SequenceLookup, len(b.reqs))
		for i, r := range b.reqs {
			out[i].ID = r.Seq
			switch c, ok := b.cached[r.Seq]; {
			case !ok:
				out[i].Err = fmt.Errorf("kvcache: %w %d", kvcache.ErrUnknownSequence, r.Seq)
			case c < 0:
				out[i].Err = errors.New("lookup refused")
			default:
				out[i].Length = c
			}
		}
		return out
	}
	gen := func(ids ...uint64) batch {
		b := batch{cached: map[uint64]int{}}
		for _, id := range ids {
			b.reqs = append(b.reqs, Request{Seq: id, Phase: Generation, MTP: 1})
			b.cached[id] = int(id % 7)
		}
		return b
	}
	fixed := [][]uint64{
		{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 1}, {1, 2, 3, 4}, {1, 2, 3, 4, 2},
		{1, 2, 3, 4, 5}, {1, 2}, {1, 2, 1}, {2, 2}, {1, 2, 3, 4, 5, 6, 5}, {1, 2, 3},
		{3, 2, 3}, {1, 2, 3},
	}
	var viaLookup, viaLookedUp Planner
	last := gen(1)
	for i := range 600 {
		var b batch
		if i < len(fixed) {
			b = gen(fixed[i]...)
		} else {
			b = batch{reqs: append([]Request(nil), last.reqs...), cached: maps.Clone(last.cached)}
			j := rng.IntN(len(b.reqs))
			switch rng.IntN(12) {
			case 0: // an id of the batch again, somewhere
				b.reqs[j].Seq = b.reqs[rng.IntN(len(b.reqs))].Seq
			case 1: // grown by a fresh or an existing id
				id := 1000 + uint64(i)
				if rng.IntN(2) == 0 {
					id = b.reqs[j].Seq
				}
				b.reqs = append(b.reqs, Request{Seq: id, Phase: Generation, MTP: b.reqs[0].MTP})
				b.cached[id] = rng.IntN(50)
			case 2: // cut
				b.reqs = b.reqs[:1+j]
			case 3: // another MTP, for one request or all
				mtp := rng.IntN(3)
				if rng.IntN(2) == 0 {
					b.reqs[j].MTP = mtp
				} else {
					for k := range b.reqs {
						b.reqs[k].MTP = mtp
					}
				}
			case 4: // NewTokens given, right or wrong
				b.reqs[j].NewTokens = 1 + b.reqs[j].MTP + rng.IntN(2)
			case 5: // a context chunk first, of a new sequence or not
				b.reqs[0] = Request{Seq: b.reqs[j].Seq, Phase: Context, NewTokens: 1 + rng.IntN(5)}
				if rng.IntN(2) == 0 {
					b.reqs[0].Seq = 2000 + uint64(i)
				}
			case 7, 8: // every request generating again (a created sequence holds its chunk)
				for k, r := range b.reqs {
					if _, ok := b.cached[r.Seq]; !ok {
						b.cached[r.Seq] = r.NewTokens
					}
					b.reqs[k] = Request{Seq: r.Seq, Phase: Generation, MTP: 1}
				}
			case 6: // unknown, refused, or too long for MaxPositions
				switch rng.IntN(3) {
				case 0:
					delete(b.cached, b.reqs[j].Seq)
				case 1:
					b.cached[b.reqs[j].Seq] = -1
				case 2:
					b.cached[b.reqs[j].Seq] = p.MaxPositions - rng.IntN(3)
				}
			default: // a decode step: every sequence one token longer (a created one holds its chunk)
				for _, r := range b.reqs {
					if c, ok := b.cached[r.Seq]; !ok {
						b.cached[r.Seq] = r.NewTokens
					} else if c >= 0 && c < 100 {
						b.cached[r.Seq] = c + 1
					}
				}
			}
		}
		want, wantErr := NewPlan(b.reqs, lookupOf(b), p)
		for _, via := range []struct {
			name string
			plan func() (*Plan, error)
		}{
			{"Plan", func() (*Plan, error) { return viaLookup.Plan(b.reqs, lookupOf(b), p) }},
			{"PlanLookedUp", func() (*Plan, error) { return viaLookedUp.PlanLookedUp(b.reqs, lookedUp(b), p) }},
		} {
			got, err := via.plan()
			if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("batch %d %+v: %s error %v, NewPlan %v", i, b.reqs, via.name, err, wantErr)
			}
			if err != nil {
				continue
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("batch %d %+v: %s plan\n%+v\nNewPlan\n%+v", i, b.reqs, via.name, got, want)
			}
		}
		if wantErr == nil {
			last = b
		}
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
