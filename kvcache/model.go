package kvcache

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"sync"
)

// The cache model (DESIGN.md sections 8 and 9): every kind of cache memory
// a sequence holds is one row of a Layout (a PoolSpec), and a Model keeps
// the bookkeeping of all of them behind one Reserve, CommitLengths (the
// accepted lengths of an MTP step), Rollback, Finish and CheckInvariants.
// A row is one of four kinds:
//
//   - PoolPositions: pages by absolute position with a sliding window, the
//     SWA pages (a Cache). Row 0 is always this kind: sequence ids are
//     created, looked up and refused there.
//   - PoolEntries: a page cache whose lengths are derived, floor(n/Ratio)
//     entries for a sequence of n tokens, paged by entry index (the
//     compressed caches of each ratio).
//   - PoolSlots: one fixed-size slot per live sequence, the same index in
//     every layer that holds the row (the compressor states), plus slots a
//     chunk moves to (PoolSpec.InPlace).
//   - PoolShared: another row's bookkeeping (Owner) with this row's bytes:
//     its pages are the owner's page ids (the indexer's cache, paged by the
//     ratio-4 block table), or its slots the owner's slot indices (the
//     ratio-128 states beside the ratio-4 ones). It holds nothing of its
//     own, so it can never be fuller than its owner; the owner's refusal
//     names it.
//
// A new pool is a new row; the model's memory per sequence, its footprint
// and its usage are sums over the rows.

// PoolKind is a row's kind of bookkeeping.
type PoolKind uint8

// The kinds of rows; see the package's cache-model comment.
const (
	PoolPositions PoolKind = iota + 1
	PoolEntries
	PoolSlots
	PoolShared
)

// PoolSpec is one row of a cache model: a pool that each of Layers layers
// holds a buffer of, with its own sizes.
type PoolSpec struct {
	// Name is the pool's short name ("swa", "ratio-4", "indexer",
	// "state-4"): PoolUsage.Name, and Owner's reference.
	Name string
	// What names the pool in errors ("ratio-4 compressed pool"); "" for row
	// 0, whose errors are the page cache's own.
	What string
	Kind PoolKind
	// Layers is how many layers hold a buffer of the pool (footprint and
	// memory per sequence count each), at least 1.
	Layers int
	// Cache is the page cache of a PoolPositions or PoolEntries row (an
	// entry row's Window must be 0: entries live as long as the sequence).
	// Its PageBytes is one page of one layer.
	Cache Config
	// Ratio is a PoolEntries row's tokens per entry: a sequence of n
	// tokens holds floor(n/Ratio) entries.
	Ratio int
	// Slots is a PoolSlots row's slots, and InPlace the most tokens a live
	// sequence may add to its own slot in one iteration: a sequence with
	// earlier tokens whose iteration adds more moves to a fresh slot, and
	// gives its old one back when the iteration commits (so a rollback
	// finds its old state whole).
	Slots, InPlace int
	// Live is the most sequences that hold a slot at once (0: Slots).
	// The other Slots - Live slots serve only the moves, so a sized pool
	// (SlotsFor) never refuses a batch of live sequences: only new
	// sequences past Live are refused.
	Live int
	// SlotBytes is one slot of one layer (PoolSlots, or PoolShared of a
	// slot row).
	SlotBytes int64
	// EntryBytes is one entry of a PoolShared row of a paged owner: a page
	// of the row holds the owner's Cache.PageSize entries, unpadded.
	EntryBytes int
	// Owner names the row whose bookkeeping a PoolShared row uses.
	Owner string
}

// Layout is a cache model's table of pools, row 0 the PoolPositions row.
type Layout []PoolSpec

// Validate reports the first bad row, by index, name and field.
func (l Layout) Validate() error {
	if len(l) == 0 || l[0].Kind != PoolPositions {
		return errors.New("kvcache: Layout: row 0 must be a PoolPositions row (the SWA pages)")
	}
	seen := map[string]int{}
	for i, s := range l {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("kvcache: Layout row %d (%q): %s", i, s.Name, fmt.Sprintf(format, args...))
		}
		if s.Name == "" {
			return bad("Name is empty")
		}
		if j, dup := seen[s.Name]; dup {
			return bad("Name also names row %d", j)
		}
		seen[s.Name] = i
		if s.Layers < 1 || s.Layers > math.MaxInt32 {
			return bad("Layers %d must be in [1, %d]", s.Layers, math.MaxInt32)
		}
		switch s.Kind {
		case PoolPositions:
			if i != 0 {
				return bad("only row 0 may be a PoolPositions row")
			}
			if err := s.Cache.Validate(); err != nil {
				return bad("%v", err)
			}
		case PoolEntries:
			if err := s.Cache.Validate(); err != nil {
				return bad("%v", err)
			}
			if s.Cache.Window != 0 {
				return bad("Cache.Window %d: entries live as long as the sequence (want 0)", s.Cache.Window)
			}
			if s.Ratio < 1 || s.Ratio > math.MaxInt32 {
				return bad("Ratio %d must be in [1, %d]", s.Ratio, math.MaxInt32)
			}
		case PoolSlots:
			if s.Slots < 1 || s.Slots > math.MaxInt32 {
				return bad("Slots %d must be in [1, %d]", s.Slots, math.MaxInt32)
			}
			if s.InPlace < 0 {
				return bad("InPlace %d is negative", s.InPlace)
			}
			if s.Live < 0 || s.Live > s.Slots {
				return bad("Live %d must be in [0, Slots = %d] (0: Slots)", s.Live, s.Slots)
			}
			if s.SlotBytes < 0 {
				return bad("SlotBytes %d is negative", s.SlotBytes)
			}
		case PoolShared:
			j, ok := seen[s.Owner]
			if !ok || j == i {
				return bad("Owner %q names no earlier row", s.Owner)
			}
			switch l[j].Kind {
			case PoolShared:
				return bad("Owner %q is itself a shared row", s.Owner)
			case PoolSlots:
				if s.SlotBytes < 0 {
					return bad("SlotBytes %d is negative", s.SlotBytes)
				}
			default:
				if s.EntryBytes < 1 || s.EntryBytes > MaxPageSize {
					return bad("EntryBytes %d must be in [1, %d]", s.EntryBytes, MaxPageSize)
				}
			}
		default:
			return bad("Kind %d is not a pool kind", s.Kind)
		}
	}
	return nil
}

// owner returns the row whose bookkeeping row i uses (i itself unless
// shared). The layout must be valid.
func (l Layout) owner(i int) int {
	if l[i].Kind != PoolShared {
		return i
	}
	for j := range i {
		if l[j].Name == l[i].Owner {
			return j
		}
	}
	return i
}

// Units returns row i's pages (or slots) per layer.
func (l Layout) Units(i int) int {
	o := l[l.owner(i)]
	if o.Kind == PoolSlots {
		return o.Slots
	}
	return o.Cache.NumPages
}

// UnitBytes returns the bytes of one page (or slot) of row i in one layer.
func (l Layout) UnitBytes(i int) int64 {
	s, o := l[i], l[l.owner(i)]
	switch {
	case s.Kind == PoolPositions || s.Kind == PoolEntries:
		return int64(s.Cache.PageBytes())
	case o.Kind == PoolSlots:
		return s.SlotBytes
	default:
		return int64(s.EntryBytes) * int64(o.Cache.PageSize)
	}
}

// Footprint returns the bytes of row i's buffers: Layers buffers of Units
// pages (or slots), saturating at math.MaxInt64.
func (l Layout) Footprint(i int) int64 {
	return mulSat(int64(l[i].Layers), mulSat(int64(l.Units(i)), l.UnitBytes(i)))
}

// SequenceUnits returns the pages (or slots) of row i that a sequence of
// length tokens holds between iterations, in each layer: with a window the
// pages of its last Window positions (Config.LivePages), the pages of its
// floor(length/Ratio) entries, or one slot.
func (l Layout) SequenceUnits(i, length int) int {
	o := l[l.owner(i)]
	switch o.Kind {
	case PoolPositions:
		return o.Cache.LivePages(length)
	case PoolEntries:
		entries := length / o.Ratio
		return entries/o.Cache.PageSize + min(entries%o.Cache.PageSize, 1)
	default:
		return 1
	}
}

// SequenceBytes returns what a sequence of length tokens holds of row i
// between iterations, over its layers, saturating.
func (l Layout) SequenceBytes(i, length int) int64 {
	return mulSat(int64(l[i].Layers), mulSat(int64(l.SequenceUnits(i, length)), l.UnitBytes(i)))
}

// Index returns the row named name, or -1.
func (l Layout) Index(name string) int {
	for i, s := range l {
		if s.Name == name {
			return i
		}
	}
	return -1
}

func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// PoolUsage is one pool's occupancy, for a server's scheduler.
type PoolUsage struct {
	Name      string // the row's PoolSpec.Name: "swa", "ratio-4", "indexer", "state-4", ...
	Layers    int    // layers with a buffer of this pool (each holds Pages pages)
	Pages     int    // pages per layer (state slots: the most sequences holding one, PoolSpec.Live)
	PageBytes int    // one page (or slot) of one layer
	Free      int    // pages no sequence holds (state slots: how many more sequences may take one)
	Slots     bool   // the pool counts state slots, not pages
}

// Batch is one iteration's needs, in batch order, as every pool of a Model
// sees them.
type Batch struct {
	// Needs are the tokens each sequence holds after the iteration (the
	// PoolPositions row's needs; Handle hints go to it).
	Needs []Need
	// Cached is each need's committed length before the iteration (0 for
	// a sequence it creates): a slot row tells from it whether the
	// sequence adds more than InPlace tokens after earlier ones.
	Cached []int
}

// Pool is the bookkeeping of one row of a Model: Cache (positions),
// EntryCache (derived lengths) and SlotPool (state slots) implement it.
type Pool interface {
	// ReserveBatch takes what the batch needs, or refuses (ErrCacheFull
	// when it does not fit) having changed nothing.
	ReserveBatch(b *Batch) (PoolReservation, error)
	// FinishSequence gives a finished sequence's memory back. With retire
	// the sequence is not live (its creation rolled back): the id is only
	// marked finished where the pool remembers ids.
	FinishSequence(id uint64, retire bool) error
	// Usage is the pool's occupancy (Name and Layers are the Model's).
	Usage() PoolUsage
	// CheckLive verifies the pool's invariants against the live
	// sequences' committed lengths (row 0's): between iterations each
	// holds exactly what its length needs, and nothing else is held.
	CheckLive(lengths map[uint64]int) error
}

// PoolReservation is a pool's pending part of a Model reservation.
type PoolReservation interface {
	// CommitLengths commits, with the tokens each named sequence keeps
	// (cached + accepted; nil or absent: what was reserved).
	CommitLengths(lengths map[uint64]int) error
	// Rollback puts everything back as it was before ReserveBatch.
	Rollback() error
}

// ReserveBatch is Reserve of b's needs (Pool).
func (c *Cache) ReserveBatch(b *Batch) (PoolReservation, error) {
	r, err := c.Reserve(b.Needs)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// FinishSequence is Finish, or Retire with retire (Pool).
func (c *Cache) FinishSequence(id uint64, retire bool) error {
	if retire {
		return c.Retire(id)
	}
	return c.Finish(id)
}

// Usage is the cache's occupancy (Pool).
func (c *Cache) Usage() PoolUsage {
	return PoolUsage{Pages: c.cfg.NumPages, PageBytes: c.cfg.PageBytes(), Free: c.FreePages()}
}

// CheckLive is CheckInvariants: the positions row's lengths are its own
// (Pool).
func (c *Cache) CheckLive(map[uint64]int) error { return c.CheckInvariants() }

// Model is the bookkeeping of every pool of a Layout: one reservation per
// iteration over all of them, all or nothing. It is used by one goroutine
// at a time for Reserve and the reservation's end (a server's step loop);
// its pools lock themselves, so Finish and the accessors may run from any
// goroutine between them.
type Model struct {
	// mu orders the model's own mutations (a reservation's end, Finish)
	// so that the invariants hold whenever none is under way.
	mu      sync.Mutex
	pending bool // a reservation is neither committed nor rolled back
	layout  Layout
	pools   []Pool // by row; nil for shared rows
	swa     *Cache
	// prefix is each row's error prefix: its What, and the shared rows'
	// that use its bookkeeping.
	prefix []string
	spare  []PoolReservation // the last spent reservation's rows, for the next
}

// NewModel returns an empty model of layout, every pool free.
func NewModel(layout Layout) (*Model, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	m := &Model{layout: append(Layout(nil), layout...), pools: make([]Pool, len(layout)), prefix: make([]string, len(layout))}
	for i, s := range layout {
		var err error
		switch s.Kind {
		case PoolPositions:
			m.swa, err = New(s.Cache)
			m.pools[i] = m.swa
		case PoolEntries:
			m.pools[i], err = NewEntryCache(s.Cache, s.Ratio)
		case PoolSlots:
			live := s.Live
			if live == 0 {
				live = s.Slots
			}
			m.pools[i], err = NewSlotPool(s.Slots, live, s.InPlace)
		}
		if err != nil {
			return nil, fmt.Errorf("kvcache: Layout row %d (%q): %w", i, s.Name, err)
		}
		if s.Kind == PoolShared {
			o := layout.owner(i)
			m.prefix[o] = joinWhat(m.prefix[o], s.What)
		} else {
			m.prefix[i] = joinWhat(s.What, m.prefix[i])
		}
	}
	return m, nil
}

func joinWhat(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + " and " + b
}

// Layout returns the model's table of pools.
func (m *Model) Layout() Layout { return append(Layout(nil), m.layout...) }

// SWA returns row 0's page cache: the positions, the ids and their lengths.
func (m *Model) SWA() *Cache { return m.swa }

// Pool returns row i's bookkeeping (nil for a shared row).
func (m *Model) Pool(i int) Pool { return m.pools[i] }

// ModelReservation is a Model's pending reservation: one per row. Exactly
// one of CommitLengths or Rollback must follow; a spent one refuses both
// with ErrReservationDone.
type ModelReservation struct {
	model *Model
	held  []PoolReservation // by row; nil for shared rows
	done  bool
}

// Reserve takes what the batch needs in every pool, row by row, or refuses
// with the first row's error (naming the pool: "ratio-4 compressed pool:
// kvcache: cache full: ...") having changed nothing: the rows reserved
// before it roll back.
func (m *Model) Reserve(b *Batch) (*ModelReservation, error) {
	if len(b.Cached) != len(b.Needs) {
		return nil, fmt.Errorf("kvcache: Batch has %d needs and %d cached lengths", len(b.Needs), len(b.Cached))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending {
		return nil, fmt.Errorf("%w: the model has a pending reservation", ErrSequenceBusy)
	}
	r := &ModelReservation{model: m, held: m.spare}
	m.spare = nil
	if r.held == nil {
		r.held = make([]PoolReservation, len(m.pools))
	}
	for i, p := range m.pools {
		if p == nil {
			continue
		}
		h, err := p.ReserveBatch(b)
		if err != nil {
			for j := i - 1; j >= 0; j-- {
				if r.held[j] != nil {
					_ = r.held[j].Rollback()
				}
			}
			clear(r.held)
			m.spare = r.held
			if m.prefix[i] != "" {
				err = fmt.Errorf("%s: %w", m.prefix[i], err)
			}
			return nil, err
		}
		r.held[i] = h
	}
	m.pending = true
	return r, nil
}

// Row returns row i's part of the reservation (nil for a shared row):
// *Reservation, *EntryReservation or *SlotReservation by the row's kind.
func (r *ModelReservation) Row(i int) PoolReservation { return r.held[i] }

// SWA returns row 0's reservation.
func (r *ModelReservation) SWA() *Reservation { return r.held[0].(*Reservation) }

// CommitLengths commits every row with the tokens each named sequence keeps
// (nil: every reserved token), row 0 first. A refused length (outside
// [committed, reserved]) is refused by row 0 before anything changes.
func (r *ModelReservation) CommitLengths(lengths map[uint64]int) error {
	r.model.mu.Lock()
	defer r.model.mu.Unlock()
	if r.done {
		return ErrReservationDone
	}
	if err := r.held[0].CommitLengths(lengths); err != nil {
		return err
	}
	var errs []error
	for i := 1; i < len(r.held); i++ {
		if r.held[i] != nil {
			if err := r.held[i].CommitLengths(lengths); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", r.model.layout[i].Name, err))
			}
		}
	}
	r.finish()
	return errors.Join(errs...)
}

// Rollback undoes every row, the last first.
func (r *ModelReservation) Rollback() error {
	r.model.mu.Lock()
	defer r.model.mu.Unlock()
	if r.done {
		return ErrReservationDone
	}
	var errs []error
	for i := len(r.held) - 1; i >= 0; i-- {
		if r.held[i] != nil {
			if err := r.held[i].Rollback(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", r.model.layout[i].Name, err))
			}
		}
	}
	r.finish()
	return errors.Join(errs...)
}

// finish spends r and hands its memory to the model's next Reserve.
// Called with the model's mu held.
func (r *ModelReservation) finish() {
	r.done = true
	clear(r.held)
	m := r.model
	m.spare, r.held, m.pending = r.held, nil, false
	m.afterMutation()
}

// afterMutation checks every pool against the live sequences in builds
// with -tags invariants, when no reservation is pending. Called with mu
// held.
func (m *Model) afterMutation() {
	if invariantsEnabled && !m.pending {
		if err := m.checkLocked(); err != nil {
			panic(err)
		}
	}
}

// Finish ends sequence id in every pool: row 0 first (an unknown, finished
// or busy id is refused there, nothing changed), then the others.
func (m *Model) Finish(id uint64) error { return m.finish(id, false) }

// Retire marks id finished in every pool that remembers ids, without it
// being live (its creating reservation rolled back after a Finish was
// accepted for it): Cache.Retire.
func (m *Model) Retire(id uint64) error { return m.finish(id, true) }

func (m *Model) finish(id uint64, retire bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.afterMutation()
	if err := m.swa.FinishSequence(id, retire); err != nil {
		return err
	}
	var errs []error
	for i := 1; i < len(m.pools); i++ {
		if p := m.pools[i]; p != nil {
			if err := p.FinishSequence(id, retire); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", m.layout[i].What, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Usage returns every row's occupancy, in row order (a shared row reports
// its owner's pages and free count with its own bytes).
func (m *Model) Usage() []PoolUsage {
	out := make([]PoolUsage, len(m.layout))
	for i, s := range m.layout {
		o := m.layout.owner(i)
		u := m.pools[o].Usage()
		u.Name, u.Layers, u.PageBytes, u.Slots = s.Name, s.Layers, int(m.layout.UnitBytes(i)), m.layout[o].Kind == PoolSlots
		out[i] = u
	}
	return out
}

// CheckInvariants verifies every pool against row 0's live sequences:
// each pool's own invariants, each live sequence holding exactly what its
// length needs there, and nothing held for any other id (no leak when
// sequences finish). Call it between iterations.
func (m *Model) CheckInvariants() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending {
		return fmt.Errorf("kvcache: Model.CheckInvariants: %w: a reservation is pending", ErrSequenceBusy)
	}
	return m.checkLocked()
}

func (m *Model) checkLocked() error {
	if err := m.swa.CheckInvariants(); err != nil {
		return err
	}
	lengths := m.swa.Lengths()
	for i := 1; i < len(m.pools); i++ {
		if p := m.pools[i]; p != nil {
			if err := p.CheckLive(lengths); err != nil {
				return fmt.Errorf("%s: %w", m.layout[i].What, err)
			}
		}
	}
	return nil
}

// String lists the rows, for logs.
func (l Layout) String() string {
	var b strings.Builder
	for i, s := range l {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %dx%dx%d B", s.Name, s.Layers, l.Units(i), l.UnitBytes(i))
	}
	return b.String()
}
