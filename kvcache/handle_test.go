package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReserveDuplicates: a second need for one id is refused naming both
// indices, whether the id is live or to be created, before any other check
// of that need, and nothing changes.
func TestReserveDuplicates(t *testing.T) {
	c, err := New(Config{PageSize: 4, NumPages: 16})
	require.NoError(t, err)
	r, err := c.Reserve([]Need{{ID: 1, NewLength: 3, Create: true}, {ID: 2, NewLength: 5, Create: true}})
	require.NoError(t, err)
	require.NoError(t, r.Commit())
	tests := []struct {
		name  string
		needs []Need
		want  string
	}{
		{"live twice", []Need{{ID: 1, NewLength: 4}, {ID: 1, NewLength: 4}}, "sequence 1 in needs[0] and needs[1]"},
		{"live, then others", []Need{{ID: 1, NewLength: 4}, {ID: 2, NewLength: 6}, {ID: 1, NewLength: 4}}, "sequence 1 in needs[0] and needs[2]"},
		{"live, then created", []Need{{ID: 2, NewLength: 6}, {ID: 2, NewLength: 1, Create: true}}, "sequence 2 in needs[0] and needs[1]"},
		{"created twice", []Need{{ID: 9, NewLength: 1, Create: true}, {ID: 9, NewLength: 1, Create: true}}, "sequence 9 in needs[0] and needs[1]"},
		{"duplicate before a bad length", []Need{{ID: 1, NewLength: 4}, {ID: 1, NewLength: -1}}, "sequence 1 in needs[0] and needs[1]"},
		{"stale handle", []Need{{ID: 1, NewLength: 4, Handle: 2}, {ID: 1, NewLength: 4, Handle: 1}}, "sequence 1 in needs[0] and needs[1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Reserve(tt.needs)
			require.ErrorIs(t, err, ErrDuplicateNeed)
			require.ErrorContains(t, err, tt.want)
			require.Equal(t, 16-3, c.FreePages())
			require.Equal(t, map[uint64]int{1: 3, 2: 5}, c.Lengths())
			require.NoError(t, c.CheckInvariants())
		})
	}
	// The stamps of a refused call do not leak into the next one.
	r, err = c.Reserve([]Need{{ID: 1, NewLength: 4}, {ID: 2, NewLength: 6}})
	require.NoError(t, err)
	require.NoError(t, r.Commit())
}

// TestHandles: LookupAll hands out handles that spare the id lookup; a zero,
// stale, reused, out-of-range or other sequence's handle still finds the
// right sequence, in LookupAll and in Reserve.
func TestHandles(t *testing.T) {
	c, err := New(Config{PageSize: 4, NumPages: 32})
	require.NoError(t, err)
	create := func(id uint64, n int) {
		r, err := c.Reserve([]Need{{ID: id, NewLength: n, Create: true}})
		require.NoError(t, err)
		require.NoError(t, r.Commit())
	}
	create(10, 3)
	create(20, 6)
	ls := []SequenceLookup{{ID: 10}, {ID: 20}, {ID: 30}}
	c.LookupAll(ls)
	require.Equal(t, 3, ls[0].Length)
	require.Equal(t, 6, ls[1].Length)
	require.NoError(t, ls[0].Err)
	require.NotZero(t, ls[0].Handle)
	require.NotEqual(t, ls[0].Handle, ls[1].Handle)
	require.ErrorIs(t, ls[2].Err, ErrUnknownSequence)
	require.Zero(t, ls[2].Handle)
	h10, h20 := ls[0].Handle, ls[1].Handle

	// 10 finishes and 40 takes its handle: 10's old handle now names 40.
	require.NoError(t, c.Finish(10))
	create(40, 9)
	ls = []SequenceLookup{{ID: 10, Handle: h10}, {ID: 40, Handle: h20}, {ID: 20, Handle: 1000}, {ID: 20, Handle: -3}, {ID: 40}}
	c.LookupAll(ls)
	require.ErrorIs(t, ls[0].Err, ErrFinishedSequence)
	require.Zero(t, ls[0].Handle)
	require.Equal(t, 9, ls[1].Length)
	require.Equal(t, h10, ls[1].Handle)
	require.Equal(t, 6, ls[2].Length)
	require.Equal(t, h20, ls[2].Handle)
	require.Equal(t, 6, ls[3].Length)
	require.Equal(t, 9, ls[4].Length)

	// Reserve through a wrong handle grows the sequence the id names.
	r, err := c.Reserve([]Need{{ID: 20, NewLength: 7, Handle: h10}, {ID: 40, NewLength: 10, Handle: h10}})
	require.NoError(t, err)
	require.NoError(t, r.Commit())
	require.Equal(t, map[uint64]int{20: 7, 40: 10}, c.Lengths())
	_, err = c.Reserve([]Need{{ID: 10, NewLength: 4, Handle: h10}})
	require.ErrorIs(t, err, ErrFinishedSequence)
	require.NoError(t, c.CheckInvariants())
}

// TestReservationTablesAndHolds: a pending reservation gives each need's
// block table by index, as the cache gives it by id, and holds exactly its
// sequences; once spent it refuses and holds nothing, and its memory serves
// the next reservation without reaching the spent one.
func TestReservationTablesAndHolds(t *testing.T) {
	c, err := New(Config{PageSize: 4, NumPages: 32})
	require.NoError(t, err)
	r0, err := c.Reserve([]Need{{ID: 7, NewLength: 5, Create: true}})
	require.NoError(t, err)
	require.NoError(t, r0.Commit())
	r, err := c.Reserve([]Need{{ID: 7, NewLength: 9}, {ID: 8, NewLength: 2, Create: true}})
	require.NoError(t, err)
	for i, id := range []uint64{7, 8} {
		want, err := c.BlockTable(id)
		require.NoError(t, err)
		got, err := r.AppendBlockTable([]int32{-5}, i)
		require.NoError(t, err)
		require.Equal(t, append([]int32{-5}, want...), got)
		require.True(t, r.Holds(id))
	}
	require.False(t, r.Holds(9))
	require.False(t, r0.Holds(7))
	_, err = r.AppendBlockTable(nil, 2)
	require.ErrorContains(t, err, "need 2 out of range [0, 2)")
	_, err = r.AppendBlockTable(nil, -1)
	require.Error(t, err)
	require.NoError(t, r.Commit())
	require.False(t, r.Holds(7))
	_, err = r.AppendBlockTable(nil, 0)
	require.ErrorIs(t, err, ErrReservationDone)

	r2, err := c.Reserve([]Need{{ID: 8, NewLength: 3}})
	require.NoError(t, err)
	require.ErrorIs(t, r.Rollback(), ErrReservationDone) // a late deferred Rollback
	require.True(t, r2.Holds(8))
	require.NoError(t, r2.Rollback())
	require.Equal(t, map[uint64]int{7: 9, 8: 2}, c.Lengths())
	require.NoError(t, c.CheckInvariants())
}

// TestReserveThroughHandles: Reserve with every need's handle (the
// decode step's shorter check, which hands over to the full one at the
// first need it does not cover) refuses and reserves exactly as Reserve
// without handles does, on random steps: growing, duplicated, busy,
// created, shrunk, negative, finished and too large needs.
func TestReserveThroughHandles(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	cfg := Config{PageSize: 4, NumPages: 64}
	with, err := New(cfg)
	require.NoError(t, err)
	without, err := New(cfg)
	require.NoError(t, err)
	both := func(f func(c *Cache) error) error {
		errWith, errWithout := f(with), f(without)
		require.Equal(t, fmt.Sprint(errWithout), fmt.Sprint(errWith))
		return errWith
	}
	lengths := map[uint64]int{}
	next := uint64(1)
	for step := range 400 {
		var ids []uint64
		for id := range lengths {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if len(ids) < 3 || rng.IntN(8) == 0 { // a new sequence
			l := 1 + rng.IntN(9)
			require.NoError(t, both(func(c *Cache) error {
				r, err := c.Reserve([]Need{{ID: next, NewLength: l, Create: true}})
				if err == nil {
					err = r.Commit()
				}
				return err
			}))
			lengths[next] = l
			next++
			continue
		}
		if with.FreePages() < 24 || rng.IntN(10) == 0 { // a finished one
			id := ids[rng.IntN(len(ids))]
			require.NoError(t, both(func(c *Cache) error { return c.Finish(id) }))
			delete(lengths, id)
			continue
		}
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		ids = ids[:1+rng.IntN(len(ids))]
		needs := make([]Need, len(ids))
		for i, id := range ids {
			needs[i] = Need{ID: id, NewLength: lengths[id] + rng.IntN(6)}
		}
		j := rng.IntN(len(needs))
		switch rng.IntN(12) {
		case 0:
			needs = append(needs, needs[j])
		case 1:
			needs[j].NewLength = lengths[needs[j].ID] - 1 - rng.IntN(2)
		case 2:
			needs[j].NewLength = -1
		case 3:
			needs = append(needs, Need{ID: next, NewLength: 2, Create: true})
		case 4:
			needs[j].Create = true
		case 5:
			needs[j].NewLength = 1000
		case 6:
			needs[j].ID = next - 1 + uint64(rng.IntN(3)) // maybe finished, maybe unknown
		}
		// A busy sequence, sometimes: a pending reservation holds it.
		var busy [2]*Reservation
		if rng.IntN(10) == 0 {
			id := ids[rng.IntN(len(ids))]
			for k, c := range []*Cache{with, without} {
				busy[k], err = c.Reserve([]Need{{ID: id, NewLength: lengths[id]}})
				require.NoError(t, err)
			}
		}
		ls := make([]SequenceLookup, len(needs))
		for i, n := range needs {
			ls[i].ID = n.ID
		}
		with.LookupAll(ls)
		var res [2]*Reservation
		err := both(func(c *Cache) error {
			ns := slices.Clone(needs)
			k := 1
			if c == with {
				k = 0
				for i := range ns {
					ns[i].Handle = ls[i].Handle
				}
			}
			var err error
			res[k], err = c.Reserve(ns)
			return err
		})
		for k, c := range []*Cache{with, without} {
			if res[k] != nil {
				require.NoError(t, res[k].Commit())
			}
			if busy[k] != nil {
				require.NoError(t, busy[k].Rollback())
			}
			require.NoError(t, c.CheckInvariants(), "step %d", step)
		}
		if err == nil {
			for _, n := range needs {
				lengths[n.ID] = n.NewLength
				next = max(next, n.ID+1)
			}
		}
		require.Equal(t, without.Lengths(), with.Lengths(), "step %d", step)
		require.Equal(t, lengths, with.Lengths(), "step %d", step)
		for id := range lengths {
			a, err := with.BlockTable(id)
			require.NoError(t, err)
			b, err := without.BlockTable(id)
			require.NoError(t, err)
			require.Equal(t, b, a, "step %d: sequence %d", step, id)
		}
	}
}
