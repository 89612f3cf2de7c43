package kvcache

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// testLayout is a small DSv4 table: SWA pages of 4 tokens with a window of
// 8, ratio-4 entries (with the indexer's keys on their table) and ratio-8
// entries in pages of 2, and state slots that a sequence adding more than
// 3 tokens after earlier ones moves out of.
func testLayout(swaPages, r4Pages, r8Pages, slots int) Layout {
	l := DSv4Layout(DSv4Pools{
		SWA: Config{PageSize: 4, NumPages: swaPages, Window: 8}, Layers: 5,
		RatioLayers: map[int]int{4: 2, 8: 3}, RatioPages: map[int]int{4: r4Pages, 8: r8Pages},
		StateBytes: map[int]int64{4: 100, 8: 30}, Slots: slots, InPlace: 3, IndexerStateBytes: 7,
	})
	for i := range l {
		if l[i].Kind == PoolEntries {
			l[i].Cache.PageSize = 2
		}
	}
	return l
}

func batch(needs ...Need) *Batch { return &Batch{Needs: needs, Cached: make([]int, len(needs))} }

// usage is every pool's occupancy and every live sequence's tables, for
// comparing a model before and after a refusal.
func usage(t *testing.T, m *Model, ids ...uint64) string {
	out := fmt.Sprint(m.Usage())
	for _, id := range ids {
		for i := range m.Layout() {
			switch p := m.Pool(i).(type) {
			case *Cache:
				bt, err := p.BlockTable(id)
				out += fmt.Sprint(bt, err)
			case *EntryCache:
				bt, err := p.Cache().BlockTable(id)
				out += fmt.Sprint(bt, err)
			case *SlotPool:
				s, ok := p.Slot(id)
				out += fmt.Sprint(s, ok)
			}
		}
	}
	return out
}

func TestDSv4LayoutRows(t *testing.T) {
	l := testLayout(10, 4, 3, 5)
	require.NoError(t, l.Validate())
	var names []string
	for _, s := range l {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"swa", "ratio-4", "indexer", "ratio-8", "state-4", "state-8", "indexer-state"}, names)
	// Footprints: layers x units x unit bytes.
	swaPage := int64(FormatFP8UE8M0.PageBytes(4))
	entryPage := int64(FormatFP8UE8M0.PageBytes(2))
	want := []int64{5 * 10 * swaPage, 2 * 4 * entryPage, 2 * 4 * 2 * 68, 3 * 3 * entryPage, 2 * 5 * 100, 3 * 5 * 30, 2 * 5 * 7}
	for i := range l {
		require.Equal(t, want[i], l.Footprint(i), "row %s", l[i].Name)
	}
	// A sequence of 37 tokens: the pages of its last 8 positions (29..36:
	// pages 7 to 9), 9 ratio-4 entries (5 pages of 2, and as many indexer
	// pages), 4 ratio-8 entries (2 pages), one slot.
	wantUnits := []int{3, 5, 5, 2, 1, 1, 1}
	for i := range l {
		require.Equal(t, wantUnits[i], l.SequenceUnits(i, 37), "row %s", l[i].Name)
		require.Equal(t, int64(l[i].Layers)*int64(wantUnits[i])*l.UnitBytes(i), l.SequenceBytes(i, 37))
	}
	require.Equal(t, 0, l.SequenceUnits(1, 3), "no entry below the ratio")
}

func TestLayoutValidate(t *testing.T) {
	good := testLayout(4, 4, 4, 4)
	for _, c := range []struct {
		name string
		edit func(l Layout) Layout
		want string
	}{
		{"empty", func(Layout) Layout { return nil }, "row 0 must be a PoolPositions row"},
		{"entries first", func(l Layout) Layout { return l[1:] }, "row 0 must be a PoolPositions row"},
		{"second positions row", func(l Layout) Layout { l[1].Kind = PoolPositions; return l }, "only row 0"},
		{"duplicate name", func(l Layout) Layout { l[3].Name = "ratio-4"; return l }, `Name also names row 1`},
		{"no layers", func(l Layout) Layout { l[1].Layers = 0; return l }, "Layers 0"},
		{"ratio 0", func(l Layout) Layout { l[1].Ratio = 0; return l }, "Ratio 0"},
		{"windowed entries", func(l Layout) Layout { l[1].Cache.Window = 4; return l }, "Cache.Window 4"},
		{"no slots", func(l Layout) Layout { l[4].Slots = 0; return l }, "Slots 0"},
		{"unknown owner", func(l Layout) Layout { l[2].Owner = "ratio-5"; return l }, `Owner "ratio-5"`},
		{"shared of shared", func(l Layout) Layout { l[6].Owner = "indexer"; return l }, "itself a shared row"},
		{"no entry bytes", func(l Layout) Layout { l[2].EntryBytes = 0; return l }, "EntryBytes 0"},
		{"bad pages", func(l Layout) Layout { l[3].Cache.NumPages = 0; return l }, "NumPages 0"},
		{"bad kind", func(l Layout) Layout { l[3].Kind = 9; return l }, "Kind 9"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.edit(append(Layout(nil), good...))
			require.ErrorContains(t, l.Validate(), c.want)
			_, err := NewModel(l)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// TestModelRefusalIsAtomic: a batch that does not fit one pool is refused
// with ErrCacheFull naming it (and the rows sharing its bookkeeping), and
// every pool is exactly as before: the next reservation gets the same
// pages and slots as one on a model that never saw the refusal.
func TestModelRefusalIsAtomic(t *testing.T) {
	for _, c := range []struct {
		name  string
		l     Layout
		needs []Need
		want  string
	}{
		{"swa", testLayout(6, 10, 10, 10), []Need{{ID: 2, NewLength: 25, Create: true}}, "need 7 pages, 5 free of 6"},
		{"ratio-4", testLayout(10, 2, 10, 10), []Need{{ID: 2, NewLength: 17, Create: true}}, "ratio-4 compressed pool and indexer pool: kvcache: cache full"},
		{"ratio-8", testLayout(10, 10, 1, 10), []Need{{ID: 2, NewLength: 24, Create: true}}, "ratio-8 compressed pool: kvcache: cache full"},
		{"state", testLayout(10, 10, 10, 2), []Need{{ID: 2, NewLength: 1, Create: true}, {ID: 3, NewLength: 1, Create: true}}, "compressor state: kvcache: cache full: the batch creates 2 sequences, 1 hold state slots of at most 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := NewModel(c.l)
			require.NoError(t, err)
			ref, err := NewModel(c.l)
			require.NoError(t, err)
			for _, x := range []*Model{m, ref} {
				r, err := x.Reserve(batch(Need{ID: 1, NewLength: 4, Create: true}))
				require.NoError(t, err)
				require.NoError(t, r.CommitLengths(nil))
			}
			before := usage(t, m, 1, 2)
			_, err = m.Reserve(batch(c.needs...))
			require.ErrorIs(t, err, ErrCacheFull)
			require.ErrorContains(t, err, c.want)
			require.Equal(t, before, usage(t, m, 1, 2))
			require.NoError(t, m.CheckInvariants())
			small := Batch{Needs: []Need{{ID: 1, NewLength: 5}, {ID: 7, NewLength: 9, Create: true}}, Cached: []int{4, 0}}
			for _, x := range []*Model{m, ref} {
				r, err := x.Reserve(&small)
				require.NoError(t, err)
				require.NoError(t, r.CommitLengths(nil))
			}
			require.Equal(t, usage(t, ref, 1, 7), usage(t, m, 1, 7))
		})
	}
}

// TestModelAccept: an MTP step committed with the accepted lengths keeps
// floor(len/r) entries per ratio and gives back the pages of rejected
// positions and entries; the slot stays.
func TestModelAccept(t *testing.T) {
	m, err := NewModel(testLayout(10, 10, 10, 4))
	require.NoError(t, err)
	r, err := m.Reserve(batch(Need{ID: 1, NewLength: 14, Create: true}))
	require.NoError(t, err)
	require.NoError(t, r.CommitLengths(nil))
	ratio4 := m.Pool(1).(*EntryCache).Cache()
	ratio8 := m.Pool(3).(*EntryCache).Cache()
	n, _ := ratio4.Lookup(1)
	require.Equal(t, 3, n)
	// A step of 1 + 2 drafts in place, 14 -> 17: 4 ratio-4 entries, 2 ratio-8.
	r, err = m.Reserve(&Batch{Needs: []Need{{ID: 1, NewLength: 17}}, Cached: []int{14}})
	require.NoError(t, err)
	slots := r.Row(m.Layout().Index("state-4")).(*SlotReservation)
	require.Equal(t, slots.From(0), slots.To(0), "a step of 3 tokens stays in place")
	pages, _ := ratio4.BlockTable(1)
	require.Len(t, pages, 2)
	require.NoError(t, r.CommitLengths(map[uint64]int{1: 15})) // one token accepted
	n, _ = ratio4.Lookup(1)
	require.Equal(t, 3, n, "entry 3 (tokens 12..15) dropped")
	n, _ = ratio8.Lookup(1)
	require.Equal(t, 1, n, "entry 1 (tokens 8..15) dropped")
	pages, _ = ratio4.BlockTable(1)
	require.Len(t, pages, 2, "entries 0..2 in pages of 2")
	n, _ = m.SWA().Lookup(1)
	require.Equal(t, 15, n)
	require.NoError(t, m.CheckInvariants())
	// A chunk of 4 tokens after earlier ones moves to a fresh slot; a
	// rollback keeps the old one, a commit gives it back.
	old, _ := m.Pool(4).(*SlotPool).Slot(1)
	for _, commit := range []bool{false, true} {
		r, err = m.Reserve(&Batch{Needs: []Need{{ID: 1, NewLength: 19}}, Cached: []int{15}})
		require.NoError(t, err)
		slots = r.Row(4).(*SlotReservation)
		require.Equal(t, old, slots.From(0))
		require.NotEqual(t, old, slots.To(0))
		if commit {
			require.NoError(t, r.CommitLengths(nil))
		} else {
			require.NoError(t, r.Rollback())
			require.ErrorIs(t, r.Rollback(), ErrReservationDone)
		}
		require.NoError(t, m.CheckInvariants())
	}
	now, _ := m.Pool(4).(*SlotPool).Slot(1)
	require.NotEqual(t, old, now)
	require.Equal(t, 3, m.Usage()[4].Free)
	require.NoError(t, m.Finish(1))
	for _, u := range m.Usage() {
		require.Equal(t, u.Pages, u.Free, "pool %s", u.Name)
	}
	require.ErrorIs(t, m.Finish(1), ErrFinishedSequence)
	_, err = m.Reserve(batch(Need{ID: 1, NewLength: 1, Create: true}))
	require.ErrorIs(t, err, ErrFinishedSequence)
}

// TestModelRetire: a sequence whose creation rolled back can be retired
// in every pool that remembers ids.
func TestModelRetire(t *testing.T) {
	m, err := NewModel(testLayout(10, 10, 10, 4))
	require.NoError(t, err)
	r, err := m.Reserve(batch(Need{ID: 5, NewLength: 9, Create: true}))
	require.NoError(t, err)
	require.NoError(t, r.Rollback())
	require.ErrorIs(t, m.Finish(5), ErrUnknownSequence)
	require.NoError(t, m.Retire(5))
	_, err = m.Pool(1).(*EntryCache).Cache().Reserve([]Need{{ID: 5, NewLength: 1, Create: true}})
	require.ErrorIs(t, err, ErrFinishedSequence)
	require.NoError(t, m.CheckInvariants())
}

// TestModelRandom drives a model with random batches (new sequences, chunks
// in place and moving, MTP steps with random acceptance, rollbacks,
// finishes, refusals) against a plain map of lengths: after every step the
// invariants hold and every sequence holds exactly what its length needs;
// at the end, with every sequence finished, every pool is free.
func TestModelRandom(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	l := testLayout(40, 12, 6, 6)
	m, err := NewModel(l)
	require.NoError(t, err)
	lengths := map[uint64]int{}
	next := uint64(1)
	refused, committed := 0, 0
	for step := range 3000 {
		b := &Batch{}
		seen := map[uint64]bool{}
		for range 1 + rng.IntN(3) {
			if len(lengths) == 0 || rng.IntN(4) == 0 {
				b.Needs = append(b.Needs, Need{ID: next, NewLength: 1 + rng.IntN(20), Create: true})
				b.Cached = append(b.Cached, 0)
				next++
				continue
			}
			for id, n := range lengths {
				if !seen[id] {
					seen[id] = true
					b.Needs = append(b.Needs, Need{ID: id, NewLength: n + 1 + rng.IntN(8)})
					b.Cached = append(b.Cached, n)
				}
				break
			}
		}
		r, err := m.Reserve(b)
		if err != nil {
			require.ErrorIs(t, err, ErrCacheFull, "step %d", step)
			refused++
		} else {
			switch rng.IntN(4) {
			case 0:
				require.NoError(t, r.Rollback())
			case 1:
				accepted := map[uint64]int{}
				for i, n := range b.Needs {
					accepted[n.ID] = b.Cached[i] + rng.IntN(n.NewLength-b.Cached[i]+1)
				}
				require.NoError(t, r.CommitLengths(accepted))
				for id, n := range accepted {
					lengths[id] = n
				}
				committed++
			default:
				require.NoError(t, r.CommitLengths(nil))
				for _, n := range b.Needs {
					lengths[n.ID] = n.NewLength
				}
				committed++
			}
		}
		if len(lengths) > 0 && rng.IntN(5) == 0 {
			for id := range lengths {
				require.NoError(t, m.Finish(id))
				delete(lengths, id)
				break
			}
		}
		require.NoError(t, m.CheckInvariants(), "step %d", step)
		require.Equal(t, lengths, m.SWA().Lengths(), "step %d", step)
	}
	t.Logf("%d committed, %d refused", committed, refused)
	require.Positive(t, refused)
	require.Positive(t, committed)
	for id := range lengths {
		require.NoError(t, m.Finish(id))
	}
	for _, u := range m.Usage() {
		require.Equal(t, u.Pages, u.Free, "pool %s", u.Name)
	}
}

// TestSlotPoolLive: a pool sized by SlotsFor refuses only new sequences
// past Live; live sequences' chunks that move always find a slot, and the
// slots they leave return at commit.
func TestSlotPoolLive(t *testing.T) {
	const live, inPlace, maxSeqs, maxTokens = 2, 3, 2, 20
	slots := SlotsFor(live, inPlace, maxSeqs, maxTokens)
	require.Equal(t, 4, slots, "2 live, and min(2 sequences, 20/4 chunks) moves")
	require.Equal(t, 3, SlotsFor(2, 3, 8, 7), "7 tokens carry one chunk of 4 or more")
	p, err := NewSlotPool(slots, live, inPlace)
	require.NoError(t, err)
	r, err := p.ReserveBatch(batch(Need{ID: 1, NewLength: 4, Create: true}, Need{ID: 2, NewLength: 4, Create: true}))
	require.NoError(t, err)
	require.NoError(t, r.CommitLengths(nil))
	_, err = p.ReserveBatch(batch(Need{ID: 3, NewLength: 4, Create: true}))
	require.ErrorIs(t, err, ErrCacheFull)
	require.ErrorContains(t, err, "the batch creates 1 sequences, 2 hold state slots of at most 2")
	for range 3 { // both move, every time
		r, err = p.ReserveBatch(&Batch{Needs: []Need{{ID: 1, NewLength: 8}, {ID: 2, NewLength: 8}}, Cached: []int{4, 4}})
		require.NoError(t, err)
		sr := r.(*SlotReservation)
		require.NotEqual(t, sr.From(0), sr.To(0))
		require.NotEqual(t, sr.From(1), sr.To(1))
		require.Zero(t, p.FreeSlots())
		require.Zero(t, p.Usage().Free, "no sequence more may take a slot")
		require.NoError(t, r.CommitLengths(nil))
		require.Equal(t, 2, p.FreeSlots())
		require.Zero(t, p.Usage().Free)
		require.NoError(t, p.CheckLive(map[uint64]int{1: 8, 2: 8}))
	}
	// A pending creation counts against Live.
	require.NoError(t, p.FinishSequence(2, false))
	r, err = p.ReserveBatch(batch(Need{ID: 3, NewLength: 1, Create: true}))
	require.NoError(t, err)
	_, err = p.ReserveBatch(batch(Need{ID: 4, NewLength: 1, Create: true}))
	require.ErrorIs(t, err, ErrCacheFull)
	require.NoError(t, r.Rollback())
	_, err = NewSlotPool(2, 3, 0)
	require.Error(t, err, "more live sequences than slots")
}
