package kvcache

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// Errors shared by every package that names sequences and positions
// (kvcache, metadata, engine): whichever package refuses a request, a server
// tests the cause with errors.Is against these two.
var (
	// ErrUnknownSequence: the id was never created, or its creation was
	// rolled back.
	ErrUnknownSequence = errors.New("unknown sequence")
	// ErrPositionOutOfRange: a position outside what the sequence may hold:
	// past its reserved length (Cache.Slot) or past the RoPE table
	// (metadata.NewPlan).
	ErrPositionOutOfRange = errors.New("position out of range")
)

// Errors a Cache returns, always wrapped with the sequence id or the
// numbers involved; test with errors.Is.
var (
	// ErrFinishedSequence: the id was finished; its pages are gone and it
	// cannot come back, not even by Create. An id that was never used but
	// lies between finished ids the cache merged to bound its memory is
	// refused the same way (MaxFinishedRuns).
	ErrFinishedSequence = errors.New("kvcache: finished sequence")
	// ErrSequenceExists: Create for an id that is live.
	ErrSequenceExists = errors.New("kvcache: sequence already exists")
	// ErrSequenceBusy: the sequence belongs to a reservation that is neither
	// committed nor rolled back.
	ErrSequenceBusy = errors.New("kvcache: sequence held by a pending reservation")
	// ErrDuplicateNeed: one Reserve call names the same id twice.
	ErrDuplicateNeed = errors.New("kvcache: sequence named twice in one reservation")
	// ErrInvalidNeed: a negative NewLength, or one below the current length.
	ErrInvalidNeed = errors.New("kvcache: invalid need")
	// ErrCacheFull: the free pages cannot cover the reservation.
	ErrCacheFull = errors.New("kvcache: cache full")
	// ErrReservationDone: Commit or Rollback of a reservation already
	// committed or rolled back.
	ErrReservationDone = errors.New("kvcache: reservation already committed or rolled back")
	// ErrInvalidLength: CommitLengths with a length outside what the
	// reservation allows, or for a sequence it does not hold.
	ErrInvalidLength = errors.New("kvcache: invalid committed length")
)

// Cache is the page bookkeeping of one KV cache pool: which pages each
// sequence owns, in order, and how many tokens each holds. The page memory
// itself lives elsewhere (Config.PoolBytes bytes, page i at
// i*Config.PageBytes()).
//
// Free pages are reused LIFO: Finish pushes a sequence's pages back so that
// the next allocations pop them again in the order the sequence held them.
// A fresh cache hands out pages 0, 1, 2, ... in order.
//
// All methods are safe for concurrent use.
type Cache struct {
	cfg      Config
	shift    uint // log2(PageSize)
	pageMask int  // PageSize - 1

	mu       sync.Mutex
	free     []int32 // stack; the next page handed out is the last element
	seqs     map[uint64]*sequence
	finished finishedSet // see MaxFinishedRuns
	// dense holds the live sequences by Handle-1 (nil: a free handle, in
	// freeHandles).
	dense       []*sequence
	freeHandles []Handle
	// Reserve's scratch, reused under mu: its call number (the stamp of the
	// live sequences it holds so far) and the ids it creates by need index.
	epoch    uint64
	creating map[uint64]int
	// tables numbers the states of block tables: every change of a
	// sequence's pages gives it the next number (sequence.table).
	tables uint64
	// spare is the memory of the last spent reservation, for the next.
	spare struct {
		entries []reservedEntry
		taken   []int32
	}
}

type sequence struct {
	pages    []int32      // by position; the first freed are -1 (the window freed them)
	freed    int          // leading pages the window gave back: Config.DeadPages(length)
	length   int          // committed tokens
	reserved int          // tokens the pages cover for: length, or the pending NewLength
	pending  *Reservation // non-nil while a reservation holds the sequence
	mark     uint64       // the Reserve call (Cache.epoch) that last named it
	markAt   int          // its index in that call's needs
	table    uint64       // the state of pages: Cache.tables when they last changed
	id       uint64
	handle   Handle
}

// Handle is a live sequence's index in the cache's dense table of
// sequences. LookupAll returns it and Need.Handle passes it back, so that a
// caller naming the same sequences step after step (a decode loop) skips
// the id's map lookup. It is only a hint: a zero, stale or wrong handle
// costs that lookup, never a wrong sequence.
type Handle int32

// tableChangedLocked gives s's pages a new state number: called on every
// change of s.pages (entries or length), so that equal numbers mean equal
// tables (Reservation.TableState).
func (c *Cache) tableChangedLocked(s *sequence) {
	c.tables++
	s.table = c.tables
}

// handleLocked returns the live sequence id through its handle h when h
// still names it, else through the map.
func (c *Cache) handleLocked(h Handle, id uint64) (*sequence, bool) {
	if i := uint(h) - 1; i < uint(len(c.dense)) { // h in [1, len]
		if s := c.dense[i]; s != nil && s.id == id {
			return s, true
		}
	}
	s, ok := c.seqs[id]
	return s, ok
}

// addLocked makes s the live sequence id, with a handle.
func (c *Cache) addLocked(id uint64, s *sequence) {
	s.id = id
	if n := len(c.freeHandles); n > 0 {
		s.handle = c.freeHandles[n-1]
		c.freeHandles = c.freeHandles[:n-1]
		c.dense[s.handle-1] = s
	} else {
		c.dense = append(c.dense, s)
		s.handle = Handle(len(c.dense))
	}
	c.seqs[id] = s
}

// removeLocked forgets the live sequence s.
func (c *Cache) removeLocked(s *sequence) {
	delete(c.seqs, s.id)
	c.dense[s.handle-1] = nil
	c.freeHandles = append(c.freeHandles, s.handle)
}

// Need asks Reserve to make sequence ID cover NewLength tokens in total
// (cached plus new), not NewLength more.
type Need struct {
	ID        uint64
	NewLength int
	// Create says the sequence is new: the id must be neither live nor
	// finished, and the sequence starts empty. Otherwise it must be live.
	Create bool
	// Handle, when LookupAll returned one for ID, spares Reserve the id's
	// map lookup; zero or stale, it is ignored.
	Handle Handle
}

// Reservation is the pending result of a successful Reserve. Exactly one of
// Commit or Rollback must follow; until then its sequences are busy (Reserve
// and Finish refuse them) and BlockTable and Slot already see the reserved
// pages. A spent reservation refuses both with ErrReservationDone and changes
// nothing, so a deferred Rollback after Commit is harmless.
type Reservation struct {
	cache   *Cache
	entries []reservedEntry
	taken   []int32 // pages popped from the free list, in pop order
	done    bool    // guarded by cache.mu
}

type reservedEntry struct {
	seq      *sequence
	id       uint64
	created  bool
	oldPages int
	pages    int    // the pages that cover reserved
	reserved int    // the need's NewLength
	table    uint64 // seq.table once reserved: nothing changes it until the end
}

// New returns an empty cache for cfg, with every page free.
func New(cfg Config) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cache{
		cfg:      cfg,
		shift:    uint(bits.TrailingZeros(uint(cfg.PageSize))),
		pageMask: cfg.PageSize - 1,
		free:     make([]int32, cfg.NumPages),
		seqs:     make(map[uint64]*sequence),
		creating: make(map[uint64]int),
	}
	for i := range c.free {
		c.free[i] = int32(cfg.NumPages - 1 - i)
	}
	return c, nil
}

// Config returns the configuration the cache was built with.
func (c *Cache) Config() Config { return c.cfg }

// pagesFor returns ceil(n/P) without overflowing for huge n.
func (c *Cache) pagesFor(n int) int {
	p := n >> (c.shift & 63) // the mask spares the shift's check for counts past 63
	if n&c.pageMask != 0 {
		p++
	}
	return p
}

// liveLocked returns the live sequence id or the error that says why not.
func (c *Cache) liveLocked(id uint64) (*sequence, error) {
	if s, ok := c.seqs[id]; ok {
		return s, nil
	}
	if c.finished.contains(id) {
		return nil, fmt.Errorf("%w %d", ErrFinishedSequence, id)
	}
	return nil, fmt.Errorf("kvcache: %w %d", ErrUnknownSequence, id)
}

// Lookup returns the committed length of sequence id: the tokens stored
// before any pending reservation (0 for a sequence whose creating
// reservation is still pending).
func (c *Cache) Lookup(id uint64) (length int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.liveLocked(id)
	if err != nil {
		return 0, err
	}
	return s.length, nil
}

// SequenceLookup is one entry of LookupAll: ID and, optionally, a Handle
// from an earlier LookupAll for ID go in; Length, Handle and Err come out,
// as Lookup returns them (Handle 0 when Err is set).
type SequenceLookup struct {
	ID     uint64
	Handle Handle
	Length int
	Err    error
}

// LookupAll is Lookup for a whole batch under one lock, through the
// handles where they are still valid.
func (c *Cache) LookupAll(lookups []SequenceLookup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range lookups {
		l := &lookups[i]
		if s, ok := c.handleLocked(l.Handle, l.ID); ok {
			l.Length, l.Handle = s.length, s.handle
			if l.Err != nil {
				l.Err = nil
			}
			continue
		}
		_, l.Err = c.liveLocked(l.ID)
		l.Length, l.Handle = 0, 0
	}
}

// Reserve grows every sequence in needs so that its pages cover NewLength
// tokens, all or nothing. Every need is checked first (unknown, finished,
// existing, busy or duplicate ids, bad lengths; the first error in needs
// order is returned); then, if the free pages cannot cover the total, it
// returns ErrCacheFull saying how many pages were needed and free. On any
// error nothing changes. Pages are handed out in needs order.
func (c *Cache) Reserve(needs []Need) (*Reservation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()

	entries := resize(c.spare.entries, len(needs))
	ok := false
	defer func() {
		if !ok {
			clear(entries) // drop the sequence pointers
			c.spare.entries = entries[:0]
		}
	}()
	c.epoch++
	total, growing := c.checkGrowth(needs, entries)
	if !growing {
		c.epoch++ // a fresh stamp: the marks checkGrowth left are stale
		var err error
		if total, err = c.checkNeeds(needs, entries); err != nil {
			return nil, err
		}
	}
	if total == math.MaxInt {
		return nil, fmt.Errorf("%w: the needs add up to more pages than an int counts; %d free of %d", ErrCacheFull, len(c.free), c.cfg.NumPages)
	}
	if total > len(c.free) {
		return nil, fmt.Errorf("%w: need %d pages, %d free of %d", ErrCacheFull, total, len(c.free), c.cfg.NumPages)
	}

	ok = true
	r := &Reservation{cache: c, entries: entries, taken: c.spare.taken[:0]}
	c.spare.entries, c.spare.taken = nil, nil
	for i := range entries {
		e := &entries[i]
		s := e.seq
		if e.created {
			// Room to grow by as many pages again (at least 4), so that
			// a decode loop's reservations seldom reallocate the list.
			s = &sequence{pages: make([]int32, 0, e.pages+max(e.pages, 4))}
			c.addLocked(e.id, s)
			c.tableChangedLocked(s)
			e.seq = s
		}
		// Pop the pages off the free stack, the top one first.
		if add := e.pages - e.oldPages; add > 0 {
			top := len(c.free)
			for k := 1; k <= add; k++ {
				s.pages = append(s.pages, c.free[top-k])
			}
			c.tableChangedLocked(s)
			r.taken = append(r.taken, s.pages[len(s.pages)-add:]...)
			c.free = c.free[:top-add]
		}
		s.reserved = e.reserved
		s.pending = r
		e.table = s.table
	}
	c.afterMutation()
	return r, nil
}

// checkGrowth is Reserve's check pass for the needs of a decode step:
// live sequences, each named through its current handle, that keep or
// grow their length and belong to no reservation, none twice. It fills
// entries and returns the pages to add, or growing false as soon as a need
// is otherwise, having refused nothing (the sequences it stamped carry a
// stale mark once Reserve moves to the next epoch): checkNeeds then checks
// every need.
func (c *Cache) checkGrowth(needs []Need, entries []reservedEntry) (total int, growing bool) {
	dense, epoch := c.dense, c.epoch
	entries = entries[:len(needs)]
	for i := range needs {
		n := &needs[i]
		h := uint(n.Handle) - 1
		if h >= uint(len(dense)) {
			return 0, false
		}
		s := dense[h]
		if s == nil || s.id != n.ID || n.Create || s.mark == epoch || s.pending != nil || n.NewLength < s.length {
			return 0, false
		}
		s.mark, s.markAt = epoch, i
		have, pages := len(s.pages), c.pagesFor(n.NewLength)
		e := &entries[i] // field by field: cheaper than a whole-struct store
		e.seq, e.id, e.created, e.oldPages, e.pages, e.reserved = s, n.ID, false, have, pages, n.NewLength
		add := pages - have
		if add > math.MaxInt-total {
			return 0, false
		}
		total += add
	}
	return total, true
}

// checkNeeds is Reserve's check pass for any needs: it refuses the first
// bad one, and otherwise fills entries (nil sequences for those to create)
// and returns the pages to add, saturated at math.MaxInt. A live sequence
// is stamped with the epoch to find duplicates; only ids to create go
// through a map of their own.
func (c *Cache) checkNeeds(needs []Need, entries []reservedEntry) (int, error) {
	clear(c.creating)
	total := 0
	entries = entries[:len(needs)]
	for i := range needs {
		n := &needs[i]
		s, live := c.handleLocked(n.Handle, n.ID)
		if live && s.mark == c.epoch {
			return 0, fmt.Errorf("%w: sequence %d in needs[%d] and needs[%d]", ErrDuplicateNeed, n.ID, s.markAt, i)
		}
		if !live && len(c.creating) > 0 {
			if j, dup := c.creating[n.ID]; dup {
				return 0, fmt.Errorf("%w: sequence %d in needs[%d] and needs[%d]", ErrDuplicateNeed, n.ID, j, i)
			}
		}
		if n.NewLength < 0 {
			return 0, fmt.Errorf("%w: needs[%d] (sequence %d): NewLength %d is negative", ErrInvalidNeed, i, n.ID, n.NewLength)
		}
		have := 0
		if n.Create {
			if c.finished.contains(n.ID) {
				return 0, fmt.Errorf("%w %d: needs[%d] cannot create it again", ErrFinishedSequence, n.ID, i)
			}
			if live {
				return 0, fmt.Errorf("%w: needs[%d] creates sequence %d", ErrSequenceExists, i, n.ID)
			}
			c.creating[n.ID] = i
			s = nil // created by the allocation pass
		} else {
			if !live {
				_, err := c.liveLocked(n.ID)
				return 0, fmt.Errorf("needs[%d]: %w", i, err)
			}
			if s.pending != nil {
				return 0, fmt.Errorf("%w: needs[%d] (sequence %d)", ErrSequenceBusy, i, n.ID)
			}
			if n.NewLength < s.length {
				return 0, fmt.Errorf("%w: needs[%d] (sequence %d): NewLength %d is below the current length %d",
					ErrInvalidNeed, i, n.ID, n.NewLength, s.length)
			}
			s.mark, s.markAt = c.epoch, i
			have = len(s.pages)
		}
		pages := c.pagesFor(n.NewLength)
		entries[i] = reservedEntry{seq: s, id: n.ID, created: n.Create, oldPages: have, pages: pages, reserved: n.NewLength}
		// Saturate rather than wrap: a sum of huge needs must stay huge.
		if add := pages - have; add > math.MaxInt-total {
			total = math.MaxInt
		} else {
			total += add
		}
	}
	return total, nil
}

// Holds reports whether sequence id belongs to the reservation and the
// reservation is still pending.
func (r *Reservation) Holds(id uint64) bool {
	c := r.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.seqs[id]
	return ok && s.pending == r
}

// AppendBlockTable appends to dst the pages of needs[i] of the Reserve call
// that made r, as Cache.AppendBlockTable would for its id, without looking
// the id up. The reservation must be pending, and the caller the goroutine
// that commits or rolls it back: nothing else changes a pending
// reservation's sequences, so it takes no lock (a metadata pass calls it
// once per sequence).
func (r *Reservation) AppendBlockTable(dst []int32, i int) ([]int32, error) {
	if r.done {
		return dst, ErrReservationDone
	}
	if i < 0 || i >= len(r.entries) {
		return dst, fmt.Errorf("kvcache: need %d out of range [0, %d) of the reservation", i, len(r.entries))
	}
	return append(dst, r.entries[i].seq.pages...), nil
}

// TableState returns the state number of needs[i]'s block table as
// AppendBlockTable appends it: equal numbers (from one Cache) mean the same
// sequence with the same pages, so a caller that keeps a copy of a table
// may skip copying it again while the number stays the same. Every change
// of a sequence's pages (Reserve adding pages, a commit or rollback
// dropping them, the window freeing them, a new sequence) takes a new
// number. Same contract as AppendBlockTable: r pending, the caller the
// goroutine that ends it.
func (r *Reservation) TableState(i int) (uint64, error) {
	if r.done {
		return 0, ErrReservationDone
	}
	if i < 0 || i >= len(r.entries) {
		return 0, fmt.Errorf("kvcache: need %d out of range [0, %d) of the reservation", i, len(r.entries))
	}
	return r.entries[i].table, nil
}

// AppendTableStates appends to dst the TableState of every need, in needs
// order. Same contract as TableState.
func (r *Reservation) AppendTableStates(dst []uint64) ([]uint64, error) {
	if r.done {
		return dst, ErrReservationDone
	}
	out := slices.Grow(dst, len(r.entries))[:len(dst)+len(r.entries)]
	states, entries := out[len(dst):], r.entries
	for i := range states {
		states[i] = entries[i].table
	}
	return out, nil
}

// Commit makes the reserved lengths permanent and releases the sequences.
// With a window (Config.Window), each sequence's pages whose positions all
// lie below its new length minus the window go back to the pool; their
// block-table entries become -1.
func (r *Reservation) Commit() error { return r.CommitLengths(nil) }

// CommitLengths commits with the lengths the sequences actually keep: a
// sequence named in lengths ends at that length, in [its committed length
// before Reserve, its reserved length] (after an MTP verify step, cached +
// accepted tokens), the others at their reserved length. Positions at or
// past the new length are dead: pages holding only such positions go back
// to the pool, as do the pages the window frees at the new length. A length
// out of range or a sequence the reservation does not hold is refused
// (ErrInvalidLength) and nothing changes; the reservation stays pending.
func (r *Reservation) CommitLengths(lengths map[uint64]int) error {
	c := r.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.done {
		return ErrReservationDone
	}
	if len(lengths) > 0 {
		held := make(map[uint64]*sequence, len(r.entries))
		for _, e := range r.entries {
			held[e.id] = e.seq
		}
		for id, n := range lengths {
			s, ok := held[id]
			if !ok {
				return fmt.Errorf("%w: sequence %d is not in the reservation", ErrInvalidLength, id)
			}
			if n < s.length || n > s.reserved {
				return fmt.Errorf("%w: sequence %d: length %d not in [%d, %d] (committed, reserved)", ErrInvalidLength, id, n, s.length, s.reserved)
			}
		}
	}
	r.done = true
	for i := range r.entries {
		e := &r.entries[i]
		s := e.seq
		n, keep := e.reserved, e.pages
		if lengths != nil {
			if v, ok := lengths[e.id]; ok {
				n, keep = v, c.pagesFor(v)
			}
		}
		// Pages past the kept length hold only rejected positions; they
		// were taken by this reservation (the old pages cover the old
		// length), so they go back in reverse pop order.
		if keep < len(s.pages) {
			for i := len(s.pages) - 1; i >= keep; i-- {
				c.free = append(c.free, s.pages[i])
			}
			s.pages = s.pages[:keep]
			c.tableChangedLocked(s)
		}
		s.length, s.reserved, s.pending = n, n, nil
		if c.cfg.Window != 0 {
			c.slideLocked(s)
		}
	}
	r.recycleLocked()
	c.afterMutation()
	return nil
}

// recycleLocked hands the memory of a spent reservation to the next Reserve:
// nothing reads it once done is set.
func (r *Reservation) recycleLocked() {
	clear(r.entries) // drop the sequence pointers
	r.cache.spare.entries, r.cache.spare.taken = r.entries[:0], r.taken[:0]
	r.entries, r.taken = nil, nil
}

// resize returns s with length n, reusing its memory when it is large
// enough; the contents are left for the caller to overwrite.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// slideLocked gives back the pages of s that the window has left behind
// its committed length, highest position first (so the next allocations
// reuse them lowest first).
func (c *Cache) slideLocked(s *sequence) {
	dead := c.cfg.DeadPages(s.length)
	if dead <= s.freed {
		return
	}
	for i := dead - 1; i >= s.freed; i-- {
		c.free = append(c.free, s.pages[i])
		s.pages[i] = -1
	}
	s.freed = dead
	c.tableChangedLocked(s)
}

// Rollback undoes the reservation: reserved pages go back to the free list
// (pushed back in reverse pop order, so that without intervening mutations
// the free list is exactly as before), created sequences are forgotten and
// reserved lengths return to the committed ones.
func (r *Reservation) Rollback() error {
	c := r.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.done {
		return ErrReservationDone
	}
	r.done = true
	for i := len(r.entries) - 1; i >= 0; i-- {
		e := r.entries[i]
		if len(e.seq.pages) != e.oldPages {
			e.seq.pages = e.seq.pages[:e.oldPages]
			c.tableChangedLocked(e.seq)
		}
		e.seq.reserved = e.seq.length
		e.seq.pending = nil
		if e.created {
			c.removeLocked(e.seq)
		}
	}
	for i := len(r.taken) - 1; i >= 0; i-- {
		c.free = append(c.free, r.taken[i])
	}
	r.recycleLocked()
	c.afterMutation()
	return nil
}

// BlockTable returns a copy of the pages of sequence id, in position order,
// including pages of a pending reservation (the metadata pass needs them
// before the batch commits). Pages the window freed are -1.
func (c *Cache) BlockTable(id uint64) ([]int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.liveLocked(id)
	if err != nil {
		return nil, err
	}
	return append([]int32(nil), s.pages...), nil
}

// AppendBlockTable is BlockTable appending to dst, so that a caller that
// reads many tables per iteration reuses one buffer.
func (c *Cache) AppendBlockTable(dst []int32, id uint64) ([]int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.liveLocked(id)
	if err != nil {
		return dst, err
	}
	return append(dst, s.pages...), nil
}

// Slot returns the slot of position pos of sequence id:
// page*P + (pos & (P-1)) with page = BlockTable(id)[pos >> log2 P]. pos must
// lie in [0, reserved length), where the reserved length counts a pending
// reservation, and not in a page the window freed.
func (c *Cache) Slot(id uint64, pos int) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.liveLocked(id)
	if err != nil {
		return 0, err
	}
	if pos < 0 || pos >= s.reserved {
		return 0, fmt.Errorf("kvcache: %w: position %d of sequence %d not in [0, %d)", ErrPositionOutOfRange, pos, id, s.reserved)
	}
	page := s.pages[pos>>c.shift]
	if page < 0 {
		return 0, fmt.Errorf("kvcache: %w: position %d of sequence %d is behind the window (its page was freed; length %d, window %d)",
			ErrPositionOutOfRange, pos, id, s.length, c.cfg.Window)
	}
	return int64(page)<<c.shift | int64(pos&(c.cfg.PageSize-1)), nil
}

// Finish ends sequence id: its pages return to the free list and the id is
// remembered as finished, so later requests for it fail with
// ErrFinishedSequence, forever (MaxFinishedRuns says how that stays within
// bounded memory). A sequence held by a pending reservation cannot be
// finished (ErrSequenceBusy).
func (c *Cache) Finish(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.liveLocked(id)
	if err != nil {
		return err
	}
	if s.pending != nil {
		return fmt.Errorf("%w: cannot finish sequence %d", ErrSequenceBusy, id)
	}
	for i := len(s.pages) - 1; i >= s.freed; i-- {
		c.free = append(c.free, s.pages[i])
	}
	c.removeLocked(s)
	c.finished.add(id, c.liveIDsLocked)
	c.afterMutation()
	return nil
}

// liveIDsLocked lists the live ids (pending creations included).
func (c *Cache) liveIDsLocked() []uint64 {
	ids := make([]uint64, 0, len(c.seqs))
	for id := range c.seqs {
		ids = append(ids, id)
	}
	return ids
}

// Retire marks id finished without it being live: later requests for it
// fail with ErrFinishedSequence, as after Finish. The engine uses it when a
// Finish was accepted for a sequence whose creating reservation then rolled
// back, so that the finish is applied rather than lost. A live id is refused
// (ErrSequenceExists): finish it instead.
func (c *Cache) Retire(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, live := c.seqs[id]; live {
		return fmt.Errorf("%w: cannot retire live sequence %d; finish it", ErrSequenceExists, id)
	}
	c.finished.add(id, c.liveIDsLocked)
	c.afterMutation()
	return nil
}

// FreePages returns the number of pages no sequence owns.
func (c *Cache) FreePages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.free)
}

// UsedPages returns the number of pages owned by sequences, pending
// reservations included.
func (c *Cache) UsedPages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfg.NumPages - len(c.free)
}

// Sequences returns the number of live sequences, including those created by
// a pending reservation.
func (c *Cache) Sequences() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seqs)
}

// afterMutation runs the invariant check in builds with -tags invariants.
func (c *Cache) afterMutation() {
	if invariantsEnabled {
		if err := c.checkLocked(); err != nil {
			panic(err)
		}
	}
}

// Lengths returns the committed length of every live sequence, by id
// (sequences created by a pending reservation count with length 0).
func (c *Cache) Lengths() map[uint64]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uint64]int, len(c.seqs))
	for id, s := range c.seqs {
		out[id] = s.length
	}
	return out
}
