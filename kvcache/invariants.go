package kvcache

import "fmt"

// CheckInvariants verifies the bookkeeping: every page in [0, NumPages) is
// either free or owned by exactly one live sequence; free + used pages ==
// NumPages; each sequence's block table has exactly ceil(reserved/P)
// entries, of which the first Config.DeadPages(committed length) are -1
// (freed by the window: no query can read them) and the others owned pages;
// its
// committed length does not exceed its reserved length (they are equal
// unless a pending reservation holds it); no live id is also finished; the
// finished runs are sorted, disjoint, not adjacent and at most
// MaxFinishedRuns (more only where live ids kept the last compaction from
// merging enough gaps).
func (c *Cache) CheckInvariants() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkLocked()
}

func (c *Cache) checkLocked() error {
	// owner[p] is 0 for an unclaimed page, 1 for a free one, and 2+k for
	// one owned by the k-th sequence visited (ids[k]).
	owner := make([]int, c.cfg.NumPages)
	var ids []uint64
	describe := func(o int) string {
		if o == 1 {
			return "the free list"
		}
		return fmt.Sprintf("sequence %d", ids[o-2])
	}
	claim := func(p int32, o int) error {
		if p < 0 || int(p) >= c.cfg.NumPages {
			return fmt.Errorf("kvcache invariant: %s holds page %d outside [0, %d)", describe(o), p, c.cfg.NumPages)
		}
		if owner[p] != 0 {
			return fmt.Errorf("kvcache invariant: page %d held by %s and by %s", p, describe(owner[p]), describe(o))
		}
		owner[p] = o
		return nil
	}
	for _, p := range c.free {
		if err := claim(p, 1); err != nil {
			return err
		}
	}
	used := 0
	for id, s := range c.seqs {
		ids = append(ids, id)
		o := len(ids) + 1
		what := describe(o)
		if dead := c.cfg.DeadPages(s.length); s.freed != dead || dead > len(s.pages) {
			return fmt.Errorf("kvcache invariant: %s has %d pages freed by the window at length %d, want %d", what, s.freed, s.length, dead)
		}
		for j, p := range s.pages {
			if j < s.freed {
				if p != -1 {
					return fmt.Errorf("kvcache invariant: %s keeps page %d at block %d, behind the window (length %d, window %d)", what, p, j, s.length, c.cfg.Window)
				}
				continue
			}
			if err := claim(p, o); err != nil {
				return err
			}
		}
		used += len(s.pages) - s.freed
		if want := c.pagesFor(s.reserved); len(s.pages) != want {
			return fmt.Errorf("kvcache invariant: %s has %d pages for %d reserved tokens, want %d", what, len(s.pages), s.reserved, want)
		}
		if s.length < 0 || s.length > s.reserved {
			return fmt.Errorf("kvcache invariant: %s has length %d, reserved %d", what, s.length, s.reserved)
		}
		if s.pending == nil && s.length != s.reserved {
			return fmt.Errorf("kvcache invariant: %s has no pending reservation but length %d != reserved %d", what, s.length, s.reserved)
		}
		if s.pending != nil && s.pending.done {
			return fmt.Errorf("kvcache invariant: %s is held by a spent reservation", what)
		}
		if c.finished.contains(id) {
			return fmt.Errorf("kvcache invariant: %s is both live and finished", what)
		}
		if s.id != id || s.handle <= 0 || int(s.handle) > len(c.dense) || c.dense[s.handle-1] != s {
			return fmt.Errorf("kvcache invariant: %s is not at its handle %d (id %d)", what, s.handle, s.id)
		}
	}
	for _, h := range c.freeHandles {
		if h <= 0 || int(h) > len(c.dense) || c.dense[h-1] != nil {
			return fmt.Errorf("kvcache invariant: free handle %d is in use or out of range", h)
		}
	}
	if len(c.seqs)+len(c.freeHandles) != len(c.dense) {
		return fmt.Errorf("kvcache invariant: %d live sequences + %d free handles != %d handles", len(c.seqs), len(c.freeHandles), len(c.dense))
	}
	runs := c.finished.runs
	if len(runs) > c.finished.maxRuns() {
		return fmt.Errorf("kvcache invariant: %d finished runs, more than %d", len(runs), c.finished.maxRuns())
	}
	for i, r := range runs {
		if r.lo > r.hi || (i > 0 && (runs[i-1].hi >= r.lo || runs[i-1].hi+1 == r.lo)) {
			return fmt.Errorf("kvcache invariant: finished runs %v are not sorted, disjoint and apart", &c.finished)
		}
	}
	if used+len(c.free) != c.cfg.NumPages {
		return fmt.Errorf("kvcache invariant: %d used + %d free pages != %d", used, len(c.free), c.cfg.NumPages)
	}
	return nil
}
