package metadata

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"
)

var seedFlag = flag.Uint64("seed", 0, "seed for the randomized tests (0: fresh)")

func testSeed(t testing.TB) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed=%d)", s, s)
	return s
}

// randomBatch is a valid batch with its cache state and page tables.
type randomBatch struct {
	reqs   []Request
	cached map[uint64]int     // lengths the cache holds before the iteration
	pages  map[uint64][]int32 // page lists Build receives (may run past kv_len)
	params Params
}

func genRandomBatch(rng *rand.Rand) randomBatch {
	rb := randomBatch{cached: map[uint64]int{}, pages: map[uint64][]int32{}}
	pageSize := 1 << rng.IntN(8)
	rb.params = Params{
		Heads:        1 + rng.IntN(128),
		PageSize:     pageSize,
		MaxPositions: 1 << 14,
		Scheduler:    DefaultSchedulerParams(),
	}
	numCtx, numGen := rng.IntN(6), rng.IntN(9)
	if numCtx+numGen == 0 {
		numGen = 1
	}
	mtp := rng.IntN(5)
	// Sequence ids are distinct and in no particular order.
	ids := rng.Perm(1000)[:numCtx+numGen]
	nextPage := int32(0)
	for i, id := range ids {
		seq := uint64(id) * 7919
		var r Request
		var cached int
		if i < numCtx {
			r = Request{Seq: seq, Phase: Context, NewTokens: 1 + rng.IntN(200)}
			if rng.IntN(2) == 0 { // chunked-prefill continuation
				cached = rng.IntN(300)
				rb.cached[seq] = cached
			}
		} else {
			r = Request{Seq: seq, Phase: Generation, MTP: mtp}
			if rng.IntN(2) == 0 {
				r.NewTokens = 1 + mtp
			}
			cached = rng.IntN(1000)
			rb.cached[seq] = cached
		}
		q := r.NewTokens
		if r.Phase == Generation {
			q = 1 + mtp
		}
		n := (cached+q+pageSize-1)/pageSize + rng.IntN(3)
		pg := make([]int32, n)
		for j := range pg { // scattered page ids
			pg[j] = nextPage*3 + int32(rng.IntN(3))
			nextPage++
		}
		rng.Shuffle(len(pg), func(a, b int) { pg[a], pg[b] = pg[b], pg[a] })
		rb.pages[seq] = pg
		rb.reqs = append(rb.reqs, r)
	}
	return rb
}

func (rb randomBatch) lookup(seq uint64) (int, bool, error) {
	c, ok := rb.cached[seq]
	return c, ok, nil
}

func (rb randomBatch) blockTable(seq uint64) ([]int32, error) { return rb.pages[seq], nil }

// naiveRow is what one token row must map to, enumerated per sequence.
type naiveRow struct {
	b, pos int
	slot   int64
}

func naiveRows(rb randomBatch) []naiveRow {
	var rows []naiveRow
	for b, r := range rb.reqs {
		q := r.NewTokens
		if r.Phase == Generation {
			q = 1 + r.MTP
		}
		cached := rb.cached[r.Seq]
		for i := range q {
			pos := cached + i
			page := rb.pages[r.Seq][pos/rb.params.PageSize]
			rows = append(rows, naiveRow{b: b, pos: pos, slot: int64(page)*int64(rb.params.PageSize) + int64(pos%rb.params.PageSize)})
		}
	}
	return rows
}

// checkAgainstNaive compares every accessor of m with the naive enumeration.
func checkAgainstNaive(t *testing.T, rb randomBatch, m *Metadata) {
	t.Helper()
	want := naiveRows(rb)
	if m.Tokens != len(want) {
		t.Fatalf("Tokens = %d, naive count %d", m.Tokens, len(want))
	}
	if m.PaddedTokens < m.Tokens {
		t.Fatalf("PaddedTokens %d < Tokens %d", m.PaddedTokens, m.Tokens)
	}
	positions, slots := m.Positions(), m.Slots()
	for r := range m.PaddedTokens {
		b, pos, ok := m.Row(r)
		if r >= m.Tokens {
			if ok || m.Slot(r) != -1 || slots[r] != -1 || positions[r] != 0 {
				t.Fatalf("padding row %d: Row ok=%v Slot %d Slots %d Positions %d", r, ok, m.Slot(r), slots[r], positions[r])
			}
			continue
		}
		w := want[r]
		if !ok || b != w.b || pos != w.pos || m.Slot(r) != w.slot || slots[r] != w.slot || int(positions[r]) != w.pos {
			t.Fatalf("row %d: Row (%d, %d, %v) Slot %d Slots %d Positions %d, naive b=%d pos=%d slot=%d",
				r, b, pos, ok, m.Slot(r), slots[r], positions[r], w.b, w.pos, w.slot)
		}
		if (r < m.CtxTokens) != (b < m.NumCtx) {
			t.Fatalf("row %d: batch index %d on the wrong side of CtxTokens %d / NumCtx %d", r, b, m.CtxTokens, m.NumCtx)
		}
	}
	for _, r := range []int{-1, m.PaddedTokens, m.PaddedTokens + 5} {
		if _, _, ok := m.Row(r); ok || m.Slot(r) != -1 {
			t.Fatalf("row %d outside [0, %d) mapped", r, m.PaddedTokens)
		}
	}
	for b := range m.NumSeqs {
		if m.Cached[b] != m.KVLen[b]-m.QLen[b] || m.CuQ[b+1]-m.CuQ[b] != m.QLen[b] ||
			m.CuKV[b+1]-m.CuKV[b] != m.KVLen[b] || m.CuQRows[b+1]-m.CuQRows[b] != m.QLen[b]*int32(m.Heads) {
			t.Fatalf("seq %d: inconsistent lengths q %d kv %d cached %d", b, m.QLen[b], m.KVLen[b], m.Cached[b])
		}
		need := (int(m.KVLen[b]) + m.PageSize - 1) / m.PageSize
		row := m.BlockTables[b*m.MaxPages : (b+1)*m.MaxPages]
		for j, pg := range row {
			if j < need && pg != rb.pages[m.Seqs[b]][j] || j >= need && pg != -1 {
				t.Fatalf("seq %d block table %v, pages %v, need %d", b, row, rb.pages[m.Seqs[b]], need)
			}
		}
	}
}

func TestRandomBatchesMatchNaiveEnumeration(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0x6d657461))
	for iter := range 2000 {
		rb := genRandomBatch(rng)
		if rng.IntN(3) == 0 {
			rb.params.PadTokensTo = len(naiveRows(rb)) + rng.IntN(64)
		}
		plan, err := NewPlan(rb.reqs, rb.lookup, rb.params)
		if err != nil {
			t.Fatalf("iteration %d: NewPlan: %v", iter, err)
		}
		for i, n := range plan.Needs() {
			r := rb.reqs[i]
			_, known := rb.cached[r.Seq]
			if n.Seq != r.Seq || n.Create == known {
				t.Fatalf("iteration %d: need %d = %+v for request %+v (known %v)", iter, i, n, r, known)
			}
		}
		m, err := plan.Build(rb.blockTable)
		if err != nil {
			t.Fatalf("iteration %d: Build: %v", iter, err)
		}
		checkAgainstNaive(t, rb, m)
	}
}
