package metadata

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dsv4mla/prologue/kvcache"
)

func mustPlan(t *testing.T, reqs []Request, lookup LengthLookup, p Params) *Plan {
	t.Helper()
	plan, err := NewPlan(reqs, lookup, p)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

func defaultParams() Params {
	return Params{Heads: 4, PageSize: 4, MaxPositions: 1 << 20, Scheduler: DefaultSchedulerParams()}
}

func TestBuildIsRepeatableAndDoesNotAlias(t *testing.T) {
	cache := map[uint64]int{2: 5}
	pages := map[uint64][]int32{1: {7}, 2: {3, 4}}
	lookup := func(s uint64) (int, bool, error) { c, ok := cache[s]; return c, ok, nil }
	plan := mustPlan(t, []Request{{Seq: 1, NewTokens: 2}, {Seq: 2, Phase: Generation, MTP: 1}}, lookup, defaultParams())

	needs := plan.Needs()
	needs[0].Length = 999
	if plan.Needs()[0].Length != 2 {
		t.Fatal("Needs shares memory with the plan")
	}

	bt := func(s uint64) ([]int32, error) { return pages[s], nil }
	m1, err := plan.Build(bt)
	if err != nil {
		t.Fatal(err)
	}
	pages[2][0] = 100 // the cache reuses its slice after Build returned
	m1.KVLen[0], m1.CuQ[1] = 50, 50
	m2, err := plan.Build(bt)
	if err != nil {
		t.Fatal(err)
	}
	if m1.BlockTables[m1.MaxPages] != 3 {
		t.Fatalf("Build kept the caller's page slice: %v", m1.BlockTables)
	}
	if m2.BlockTables[m2.MaxPages] != 100 {
		t.Fatalf("second Build did not read the block table again: %v", m2.BlockTables)
	}
	if m2.KVLen[0] != 2 || m2.CuQ[1] != 2 {
		t.Fatalf("second Build sees the first Metadata's edits: kv %v cu_q %v", m2.KVLen, m2.CuQ)
	}
}

// A refused batch reports nothing to create and never calls lookup past the
// failing request, so the caller has nothing to undo.
func TestRefusalStopsAtTheFailingRequest(t *testing.T) {
	var looked []uint64
	lookup := func(s uint64) (int, bool, error) {
		looked = append(looked, s)
		return 4, true, nil
	}
	reqs := []Request{
		{Seq: 1, Phase: Generation},
		{Seq: 2, Phase: Generation, MTP: 1},
		{Seq: 3, Phase: Generation},
	}
	plan, err := NewPlan(reqs, lookup, defaultParams())
	if err == nil || plan != nil {
		t.Fatalf("NewPlan = %v, %v; want a refusal", plan, err)
	}
	if !slices.Equal(looked, []uint64{1}) {
		t.Fatalf("lookups %v, want [1]", looked)
	}
}

func TestNilCallbacks(t *testing.T) {
	if _, err := NewPlan([]Request{{Seq: 1, NewTokens: 1}}, nil, defaultParams()); err == nil {
		t.Error("nil lookup accepted")
	}
	plan := mustPlan(t, []Request{{Seq: 1, NewTokens: 1}}, func(uint64) (int, bool, error) { return 0, false, nil }, defaultParams())
	if _, err := plan.Build(nil); err == nil {
		t.Error("nil blockTable accepted")
	}
}

func TestZeroSchedulerParamsRefused(t *testing.T) {
	p := defaultParams()
	p.Scheduler = SchedulerParams{}
	_, err := NewPlan([]Request{{Seq: 1, NewTokens: 1}}, func(uint64) (int, bool, error) { return 0, false, nil }, p)
	if err == nil {
		t.Fatal("zero SchedulerParams accepted")
	}
}

// Lengths whose sums overflow the int32 device arrays are refused, not
// wrapped.
func TestInt32Overflow(t *testing.T) {
	const maxPos = math.MaxInt32
	lookup := func(uint64) (int, bool, error) { return maxPos - 1, true, nil }
	for _, c := range []struct {
		name  string
		reqs  []Request
		heads int
	}{
		{"cu_kv", []Request{{Seq: 1, Phase: Generation}, {Seq: 2, Phase: Generation}}, 1},
		{"cu_q_rows", []Request{{Seq: 1, NewTokens: 1 << 24}}, 256},
		{"cu_q", []Request{{Seq: 1, NewTokens: 1 << 30}, {Seq: 2, NewTokens: 1 << 30}, {Seq: 3, NewTokens: 1 << 30}}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Params{Heads: c.heads, PageSize: 64, MaxPositions: maxPos, Scheduler: DefaultSchedulerParams()}
			l := lookup
			if c.name != "cu_kv" {
				l = func(uint64) (int, bool, error) { return 0, false, nil }
			}
			if _, err := NewPlan(c.reqs, l, p); err == nil {
				t.Fatal("overflow accepted")
			}
		})
	}
}

// Huge field values must give errors, never wrapped arithmetic.
func TestExtremeRequestValues(t *testing.T) {
	p := defaultParams()
	p.MaxPositions = math.MaxInt32
	known := func(c int) LengthLookup {
		return func(uint64) (int, bool, error) { return c, true, nil }
	}
	for _, c := range []struct {
		name   string
		req    Request
		lookup LengthLookup
		want   error
	}{
		{"huge new tokens", Request{Seq: 1, NewTokens: math.MaxInt}, known(0), kvcache.ErrPositionOutOfRange},
		{"huge cached", Request{Seq: 1, NewTokens: 1}, known(math.MaxInt), kvcache.ErrPositionOutOfRange},
		{"huge MTP", Request{Seq: 1, Phase: Generation, MTP: math.MaxInt}, known(0), nil},
		{"min cached", Request{Seq: 1, NewTokens: 1}, known(math.MinInt), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewPlan([]Request{c.req}, c.lookup, p)
			if err == nil {
				t.Fatal("accepted")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("error %v is not %v", err, c.want)
			}
		})
	}
}

// FuzzNewPlan decodes arbitrary bytes into a batch (each 5 bytes: seq,
// phase, new tokens, MTP, cached length where 0xFF means unknown). Whatever
// NewPlan accepts must build and map every row as the naive enumeration does.
func FuzzNewPlan(f *testing.F) {
	f.Add([]byte{1, 0, 5, 0, 0xFF, 2, 1, 0, 1, 7}, uint8(2), uint8(0))
	f.Add([]byte{1, 1, 0, 2, 63, 2, 1, 3, 2, 0}, uint8(6), uint8(9))
	f.Add([]byte{1, 0, 0, 0, 0}, uint8(0), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, pageLog, pad uint8) {
		rb := randomBatch{cached: map[uint64]int{}, pages: map[uint64][]int32{}}
		rb.params = Params{Heads: 2, PageSize: 1 << (pageLog % 9), MaxPositions: 300, PadTokensTo: int(pad), Scheduler: DefaultSchedulerParams()}
		if pageLog > 200 {
			rb.params.PageSize = int(pageLog) // mostly not a power of two
		}
		for len(data) >= 5 {
			r := Request{Seq: uint64(data[0]), Phase: Phase(data[1] % 3), NewTokens: int(int8(data[2])), MTP: int(int8(data[3]))}
			if data[4] != 0xFF {
				rb.cached[r.Seq] = int(data[4])
			}
			rb.reqs = append(rb.reqs, r)
			data = data[5:]
		}
		plan, err := NewPlan(rb.reqs, rb.lookup, rb.params)
		if err != nil {
			return
		}
		// Accepted: normalise the requests as the plan read them and give
		// every sequence exactly the pages it needs.
		next := int32(0)
		for i, n := range plan.Needs() {
			if n.Create {
				rb.cached[n.Seq] = 0
			}
			if rb.reqs[i].Phase == Generation {
				rb.reqs[i].NewTokens = 1 + rb.reqs[i].MTP
			}
			pg := make([]int32, (n.Length+rb.params.PageSize-1)/rb.params.PageSize)
			for j := range pg {
				pg[j] = next
				next++
			}
			rb.pages[n.Seq] = pg
		}
		m, err := plan.Build(rb.blockTable)
		if err != nil {
			t.Fatalf("Build refused an accepted plan: %v", err)
		}
		checkAgainstNaive(t, rb, m)
	})
}

func BenchmarkPlanBuild256Generation(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const seqs, pageSize = 256, 64
	cached := make(map[uint64]int, seqs)
	tables := make(map[uint64][]int32, seqs)
	reqs := make([]Request, seqs)
	next := int32(0)
	for i := range reqs {
		seq := uint64(1000 + i)
		reqs[i] = Request{Seq: seq, Phase: Generation, MTP: 1}
		cached[seq] = 1 + rng.IntN(8000)
		pg := make([]int32, (cached[seq]+2+pageSize-1)/pageSize)
		for j := range pg {
			pg[j] = next
			next++
		}
		tables[seq] = pg
	}
	lookup := func(s uint64) (int, bool, error) { c, ok := cached[s]; return c, ok, nil }
	blockTable := func(s uint64) ([]int32, error) { return tables[s], nil }
	p := Params{Heads: 128, PageSize: pageSize, MaxPositions: 1 << 20, PadTokensTo: 512, Scheduler: DefaultSchedulerParams()}
	b.ReportAllocs()
	for b.Loop() {
		plan, err := NewPlan(reqs, lookup, p)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := plan.Build(blockTable); err != nil {
			b.Fatal(err)
		}
	}
}
