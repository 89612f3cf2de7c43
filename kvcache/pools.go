package kvcache

import (
	"fmt"
	"sync"
)

// EntryCache is a page cache whose lengths are derived from the tokens: a
// sequence of n tokens holds floor(n/Ratio) entries, paged by entry index
// (a compressed cache; DESIGN.md section 8). Entries live as long as the
// sequence; an MTP acceptance that keeps fewer tokens drops the entries at
// or past floor(len/Ratio). Safe for concurrent use.
type EntryCache struct {
	cache *Cache
	ratio int

	mu    sync.Mutex // guards needs
	needs []Need     // ReserveBatch's reused memory
}

// NewEntryCache returns an empty derived cache of cfg's pages (Window 0).
func NewEntryCache(cfg Config, ratio int) (*EntryCache, error) {
	if ratio < 1 {
		return nil, fmt.Errorf("kvcache: entry cache ratio %d must be at least 1", ratio)
	}
	if cfg.Window != 0 {
		return nil, fmt.Errorf("kvcache: entry cache Config.Window %d: entries live as long as the sequence (want 0)", cfg.Window)
	}
	c, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &EntryCache{cache: c, ratio: ratio}, nil
}

// Cache is the page cache of the entries: lengths and block tables by
// entry index.
func (c *EntryCache) Cache() *Cache { return c.cache }

// Ratio is the tokens per entry.
func (c *EntryCache) Ratio() int { return c.ratio }

// EntryReservation is an EntryCache's pending part of a reservation.
type EntryReservation struct {
	*Reservation
	ratio int
}

// ReserveBatch reserves floor(NewLength/Ratio) entries for each need
// (Pool).
func (c *EntryCache) ReserveBatch(b *Batch) (PoolReservation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kn := c.needs[:0]
	for _, n := range b.Needs {
		kn = append(kn, Need{ID: n.ID, NewLength: n.NewLength / c.ratio, Create: n.Create})
	}
	c.needs = kn
	r, err := c.cache.Reserve(kn)
	if err != nil {
		return nil, err
	}
	return &EntryReservation{Reservation: r, ratio: c.ratio}, nil
}

// CommitLengths commits floor(n/Ratio) entries for each sequence named
// with n tokens, the reserved entries for the others.
func (r *EntryReservation) CommitLengths(lengths map[uint64]int) error {
	if lengths == nil {
		return r.Reservation.CommitLengths(nil)
	}
	entries := make(map[uint64]int, len(lengths))
	for id, n := range lengths {
		entries[id] = n / r.ratio
	}
	return r.Reservation.CommitLengths(entries)
}

// FinishSequence is the page cache's (Pool).
func (c *EntryCache) FinishSequence(id uint64, retire bool) error {
	return c.cache.FinishSequence(id, retire)
}

// Usage is the page cache's occupancy (Pool).
func (c *EntryCache) Usage() PoolUsage { return c.cache.Usage() }

// CheckLive checks the page cache's invariants and that exactly the live
// sequences hold entries, floor(len/Ratio) each (Pool).
func (c *EntryCache) CheckLive(lengths map[uint64]int) error {
	if err := c.cache.CheckInvariants(); err != nil {
		return err
	}
	entries := c.cache.Lengths()
	if len(entries) != len(lengths) {
		return fmt.Errorf("kvcache invariant: the ratio-%d entries are held by %d sequences, %d are live", c.ratio, len(entries), len(lengths))
	}
	for seq, n := range lengths {
		if got, ok := entries[seq]; !ok || got != n/c.ratio {
			return fmt.Errorf("kvcache invariant: sequence %d of length %d holds %d ratio-%d entries (present %v), want %d", seq, n, got, c.ratio, ok, n/c.ratio)
		}
	}
	return nil
}

// SlotPool hands out fixed-size state slots, one per live sequence and the
// same index in every layer that holds the states (the compressor's rings;
// DESIGN.md section 8). A sequence that adds more than InPlace tokens after
// earlier ones moves to a fresh slot (its iteration reads the old one and
// writes the new one), so a rollback leaves its old state whole; the old
// slot is given back when the iteration commits.
//
// At most Live sequences hold a slot; the Slots - Live others are for the
// moves. A pool sized by SlotsFor for the batches it serves therefore only
// ever refuses new sequences past Live, never a batch of live ones: a
// server whose sequences are all mid-prompt still makes progress (a pool
// of Live slots alone lets new sequences take every slot, and then every
// next chunk of every sequence is refused). Safe for concurrent use.
type SlotPool struct {
	slots, live, inPlace int

	mu      sync.Mutex
	owner   map[uint64]int32 // live sequence -> its slot
	free    []int32          // a stack: the next slot handed out is the last
	pending int              // slots taken by reservations not yet ended
	creates int              // of them, by sequences they create
}

// SlotsFor is the slots a pool of live sequences needs so that no batch of
// at most maxSeqs sequences and maxTokens tokens is refused for its moves:
// live, plus one per chunk that can move in one batch (each adds more than
// inPlace tokens), min(maxSeqs, maxTokens/(inPlace+1)).
func SlotsFor(live, inPlace, maxSeqs, maxTokens int) int {
	return live + min(maxSeqs, maxTokens/(inPlace+1))
}

// NewSlotPool returns slots free slots for at most live sequences; the
// first handed out is slot 0.
func NewSlotPool(slots, live, inPlace int) (*SlotPool, error) {
	if slots < 1 || live < 1 || live > slots || inPlace < 0 {
		return nil, fmt.Errorf("kvcache: slot pool of %d slots for %d sequences, %d in place: want 1 <= live <= slots, inPlace >= 0", slots, live, inPlace)
	}
	p := &SlotPool{slots: slots, live: live, inPlace: inPlace, owner: map[uint64]int32{}, free: make([]int32, slots)}
	for i := range p.free {
		p.free[i] = int32(slots - 1 - i)
	}
	return p, nil
}

// Slots is the pool's size, Live the most sequences holding a slot,
// InPlace the most tokens a sequence adds to its own slot.
func (p *SlotPool) Slots() int   { return p.slots }
func (p *SlotPool) Live() int    { return p.live }
func (p *SlotPool) InPlace() int { return p.inPlace }

// Slot returns the slot of a live sequence.
func (p *SlotPool) Slot(id uint64) (int32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.owner[id]
	return s, ok
}

// Sequences is the number of sequences holding a slot.
func (p *SlotPool) Sequences() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owner)
}

// SlotReservation is a SlotPool's pending part of a reservation: per need
// (batch index), the slot the sequence's state is read from and the one it
// is written to (a fresh one when they differ).
type SlotReservation struct {
	pool     *SlotPool
	ids      []uint64
	from, to []int32
	taken    []int32 // taken from the free list, in order
	creates  int     // of the needs, sequences without a slot before
	done     bool
}

// From and To are need i's slots: the state before the iteration is read
// from From, the state after it is written to To.
func (r *SlotReservation) From(i int) int32 { return r.from[i] }
func (r *SlotReservation) To(i int) int32   { return r.to[i] }

// moves reports whether need i takes a fresh slot: a sequence without one,
// or one adding more than InPlace tokens after earlier ones.
func (p *SlotPool) moves(b *Batch, i int) (live bool, fresh bool) {
	_, live = p.owner[b.Needs[i].ID]
	return live, !live || (b.Cached[i] > 0 && b.Needs[i].NewLength-b.Cached[i] > p.inPlace)
}

// ReserveBatch takes the fresh slots the batch needs, or refuses with
// ErrCacheFull changing nothing (Pool).
func (p *SlotPool) ReserveBatch(b *Batch) (PoolReservation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	creates, need := 0, 0
	for i := range b.Needs {
		live, fresh := p.moves(b, i)
		if !live {
			creates++
		}
		if fresh {
			need++
		}
	}
	if held := len(p.owner) + p.creates; creates > p.live-held {
		return nil, fmt.Errorf("%w: the batch creates %d sequences, %d hold state slots of at most %d",
			ErrCacheFull, creates, held, p.live)
	}
	if need > len(p.free) {
		return nil, fmt.Errorf("%w: the batch needs %d free state slots (new sequences, and chunks of more than %d tokens after earlier ones), %d of %d are free",
			ErrCacheFull, need, p.inPlace, len(p.free), p.slots)
	}
	n := len(b.Needs)
	r := &SlotReservation{pool: p, ids: make([]uint64, n), from: make([]int32, n), to: make([]int32, n)}
	take := func() int32 {
		s := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		r.taken = append(r.taken, s)
		return s
	}
	for i := range b.Needs {
		r.ids[i] = b.Needs[i].ID
		live, fresh := p.moves(b, i)
		switch {
		case !live:
			s := take()
			r.from[i], r.to[i] = s, s
		case fresh:
			r.from[i], r.to[i] = p.owner[b.Needs[i].ID], take()
		default:
			s := p.owner[b.Needs[i].ID]
			r.from[i], r.to[i] = s, s
		}
	}
	p.pending += len(r.taken)
	r.creates = creates
	p.creates += creates
	p.afterMutation()
	return r, nil
}

// CommitLengths makes each sequence hold its To slot and gives the slots
// it moved from back. The lengths change nothing: the states are keyed by
// position, so the next step of a sequence starts at its accepted length.
func (r *SlotReservation) CommitLengths(map[uint64]int) error {
	p := r.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.done {
		return ErrReservationDone
	}
	r.done = true
	for i, id := range r.ids {
		if old, live := p.owner[id]; live && old != r.to[i] {
			p.free = append(p.free, old)
		}
		p.owner[id] = r.to[i]
	}
	p.pending -= len(r.taken)
	p.creates -= r.creates
	p.afterMutation()
	return nil
}

// Rollback gives the fresh slots back, in reverse order.
func (r *SlotReservation) Rollback() error {
	p := r.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.done {
		return ErrReservationDone
	}
	r.done = true
	for i := len(r.taken) - 1; i >= 0; i-- {
		p.free = append(p.free, r.taken[i])
	}
	p.pending -= len(r.taken)
	p.creates -= r.creates
	p.afterMutation()
	return nil
}

// FinishSequence gives a live sequence's slot back; an id without one is
// no error (Pool).
func (p *SlotPool) FinishSequence(id uint64, _ bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.owner[id]; ok {
		p.free = append(p.free, s)
		delete(p.owner, id)
	}
	p.afterMutation()
	return nil
}

// afterMutation runs checkLocked in builds with -tags invariants.
func (p *SlotPool) afterMutation() {
	if invariantsEnabled {
		if err := p.checkLocked(); err != nil {
			panic(err)
		}
	}
}

// checkLocked verifies the slots alone: each held, free or pending at most
// once, and all of them one of the three.
func (p *SlotPool) checkLocked() error {
	seen := make([]bool, p.slots)
	claim := func(s int32, what string) error {
		if s < 0 || int(s) >= p.slots || seen[s] {
			return fmt.Errorf("kvcache invariant: %s slot %d is outside [0, %d) or counted twice", what, s, p.slots)
		}
		seen[s] = true
		return nil
	}
	for _, s := range p.owner {
		if err := claim(s, "held"); err != nil {
			return err
		}
	}
	for _, s := range p.free {
		if err := claim(s, "free"); err != nil {
			return err
		}
	}
	if len(p.owner)+len(p.free)+p.pending != p.slots {
		return fmt.Errorf("kvcache invariant: %d held + %d free + %d pending slots != %d", len(p.owner), len(p.free), p.pending, p.slots)
	}
	if len(p.owner)+p.creates > p.live {
		return fmt.Errorf("kvcache invariant: %d sequences hold state slots and %d are being created, more than %d", len(p.owner), p.creates, p.live)
	}
	return nil
}

// Usage counts slots as pages, as a scheduler admits sequences (Pool):
// Pages is Live, Free how many more sequences may take a slot. The slots
// kept for moves are not counted: a batch of live sequences always finds
// them (Slots and FreeSlots count every slot).
func (p *SlotPool) Usage() PoolUsage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolUsage{Pages: p.live, Free: p.live - len(p.owner) - p.creates}
}

// FreeSlots is the number of slots neither held nor taken by a pending
// reservation, those kept for moves included.
func (p *SlotPool) FreeSlots() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// CheckLive checks that every live sequence holds a slot of its own,
// every other slot is free, and no other sequence holds one (Pool).
func (p *SlotPool) CheckLive(lengths map[uint64]int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkLocked(); err != nil {
		return err
	}
	if p.pending != 0 {
		return fmt.Errorf("kvcache invariant: %d state slots held by a pending reservation", p.pending)
	}
	if len(p.owner) != len(lengths) {
		return fmt.Errorf("kvcache invariant: state slots for %d sequences, %d live", len(p.owner), len(lengths))
	}
	held := make([]bool, p.slots)
	for seq := range lengths {
		slot, ok := p.owner[seq]
		if !ok {
			return fmt.Errorf("kvcache invariant: live sequence %d has no state slot", seq)
		}
		if slot < 0 || int(slot) >= len(held) || held[slot] {
			return fmt.Errorf("kvcache invariant: sequence %d holds state slot %d, outside [0, %d) or held twice", seq, slot, len(held))
		}
		held[slot] = true
	}
	for _, s := range p.free {
		if s < 0 || int(s) >= len(held) || held[s] {
			return fmt.Errorf("kvcache invariant: free state slot %d is outside [0, %d), held or listed twice", s, len(held))
		}
		held[s] = true
	}
	for s, ok := range held {
		if !ok {
			return fmt.Errorf("kvcache invariant: state slot %d is neither held nor free (a leak)", s)
		}
	}
	return nil
}
