package compressor

import "fmt"

// State is one sequence's compressor state in one layer: the projections
// (K[t], G[t]) of the positions a later entry still reads, keyed by
// position in a ring of Layer.StateRows rows. A new State is an empty
// sequence (no previous window, never another sequence's leftovers). A
// State is not safe for concurrent use; distinct States are independent.
type State struct {
	layer *Layer
	n     int // positions processed: the sequence's length in this layer
	first int // oldest position kept; rows [first, n) are valid
	// rollbackFloor is the least length Accept may return to: the start of
	// the last Append, but no more than MaxDrafts positions back.
	rollbackFloor int
	k, g          []float32 // [StateRows][Width] rings, position p at row p % StateRows
}

// NewState returns an empty state (length 0) for one sequence.
func (l *Layer) NewState() *State {
	rows := l.StateRows()
	return &State{
		layer: l,
		k:     make([]float32, rows*l.Width()),
		g:     make([]float32, rows*l.Width()),
	}
}

// Len returns the number of positions processed.
func (s *State) Len() int { return s.n }

// Window returns [first, end): the positions whose (K, G) the state must
// hold at its length, the state's defining content (rows an entry not yet
// emitted reads). Rows kept only for a rollback are outside it.
func (s *State) Window() (first, end int) { return s.layer.firstNeeded(s.n), s.n }

// Row returns copies of the (K, G) rows of a position the state holds, or
// ok = false.
func (s *State) Row(pos int) (k, g []float32, ok bool) {
	if pos < s.first || pos >= s.n {
		return nil, nil, false
	}
	rk, rg := s.row(pos)
	return append([]float32(nil), rk...), append([]float32(nil), rg...), true
}

func (s *State) row(pos int) (k, g []float32) {
	w := s.layer.Width()
	i := pos % s.layer.StateRows() * w
	return s.k[i : i+w : i+w], s.g[i : i+w : i+w]
}

// Append processes the tokens at positions startPos, startPos+1, ... whose
// projections are K[t] and G[t] (Width values each; G includes ape), and
// returns the entries they complete, by ascending index: entry i when
// position (i+1)*r - 1 is among them, the boundary token included. startPos
// must equal Len(): a gap or an overlap is refused (to redo rejected drafts,
// call Accept first). On error nothing changes.
func (s *State) Append(startPos int, K, G [][]float32) ([]Entry, error) {
	if err := s.checkAppend(startPos, K, G); err != nil {
		return nil, err
	}
	if len(K) == 0 {
		return nil, nil // nothing to do; the last step stays rollback-able
	}
	l := s.layer
	end := startPos + len(K)
	src := func(pos int) ([]float32, []float32) {
		if pos >= startPos {
			return K[pos-startPos], G[pos-startPos]
		}
		return s.row(pos)
	}
	// Entries first, from the state and the new rows: the state changes
	// only once every entry succeeded.
	var entries []Entry
	var pooled [Dim]float32
	for i := startPos / l.ratio; (i+1)*l.ratio <= end; i++ {
		l.pool(i, src, &pooled)
		e, err := l.FinishEntry(i, &pooled)
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	s.keep(startPos, K, G)
	return entries, nil
}

// Advance is Append for a backend that computes the entries itself (the
// CUDA kernel, from the rows it read with Row before the call): it keeps
// the rows exactly as Append does and returns the indices of the entries
// they complete, [floor(startPos/r), floor((startPos+len(K))/r)), without
// computing them. The checks are Append's, the RoPE table's included (an
// entry past the table fails as in Append); on error nothing changes.
func (s *State) Advance(startPos int, K, G [][]float32) (EntryRange, error) {
	if err := s.checkAppend(startPos, K, G); err != nil {
		return EntryRange{}, err
	}
	l := s.layer
	end := startPos + len(K)
	done := EntryRange{Begin: startPos / l.ratio, End: end / l.ratio}
	if done.Len() > 0 {
		if err := l.rope.CheckPosition((done.End - 1) * l.ratio); err != nil {
			return EntryRange{}, fmt.Errorf("compressor: entry %d: %w", done.End-1, err)
		}
	}
	if len(K) == 0 {
		return done, nil // nothing to do; the last step stays rollback-able
	}
	s.keep(startPos, K, G)
	return done, nil
}

// checkAppend checks Append's arguments.
func (s *State) checkAppend(startPos int, K, G [][]float32) error {
	l := s.layer
	if startPos != s.n {
		return fmt.Errorf("compressor: Append at position %d, but the sequence has %d positions (want startPos = %d; roll back drafts with Accept)",
			startPos, s.n, s.n)
	}
	if len(K) != len(G) {
		return fmt.Errorf("compressor: %d K rows but %d G rows", len(K), len(G))
	}
	for t := range K {
		if len(K[t]) != l.Width() || len(G[t]) != l.Width() {
			return fmt.Errorf("compressor: token %d (position %d): K has %d values and G %d, want %d each",
				t, startPos+t, len(K[t]), len(G[t]), l.Width())
		}
	}
	return nil
}

// keep stores the rows of a checked, non-empty Append and moves the length.
func (s *State) keep(startPos int, K, G [][]float32) {
	l := s.layer
	end := startPos + len(K)
	// Keep what any length this step may end at (after Accept) still needs.
	floor := max(startPos, end-l.maxDrafts)
	first := l.firstNeeded(floor)
	for pos := max(first, startPos); pos < end; pos++ {
		rk, rg := s.row(pos)
		copy(rk, K[pos-startPos])
		copy(rg, G[pos-startPos])
	}
	s.first, s.n, s.rollbackFloor = first, end, floor
}

// EntryRange is a half-open range [Begin, End) of entry indices.
type EntryRange struct{ Begin, End int }

// Len returns the number of indices in the range.
func (r EntryRange) Len() int { return r.End - r.Begin }

// Accept sets the length to newLen after an MTP verify step: the positions
// at or past newLen (rejected drafts) are forgotten, and the returned range
// lists the entries they had completed, [floor(newLen/r), floor(Len()/r)),
// which the caller drops from the compressed cache. Afterwards everything
// equals a run in which the rejected positions were never appended, and no
// further rollback is possible until the next Append. newLen must be in
// [max(start of the last Append, Len() - MaxDrafts), Len()]; newLen = Len()
// accepts everything. On error nothing changes.
func (s *State) Accept(newLen int) (EntryRange, error) {
	if newLen < s.rollbackFloor || newLen > s.n {
		return EntryRange{}, fmt.Errorf("compressor: Accept length %d outside [%d, %d] (the last step's start, at most MaxDrafts %d back, to its end)",
			newLen, s.rollbackFloor, s.n, s.layer.maxDrafts)
	}
	r := s.layer.ratio
	dropped := EntryRange{Begin: newLen / r, End: s.n / r}
	s.n = newLen
	s.first = s.layer.firstNeeded(newLen)
	s.rollbackFloor = newLen
	return dropped, nil
}

// Clone returns an independent copy of the state: an engine keeps one
// before a step it may have to undo whole (an aborted prefill chunk longer
// than MaxDrafts, which Accept cannot roll back).
func (s *State) Clone() *State {
	c := *s
	c.k = append([]float32(nil), s.k...)
	c.g = append([]float32(nil), s.g...)
	return &c
}

// StateFromRing returns the state of a sequence of length n whose rows are
// ring, StateRows rows of Width K values then Width G values, position p at
// row p % StateRows (a backend's ring slot, read back): the rows the state
// needs at length n, [Window()), are taken from it. No rollback is
// possible before the next Append.
func (l *Layer) StateFromRing(n int, ring []float32) (*State, error) {
	w, rows := l.Width(), l.StateRows()
	if n < 0 {
		return nil, fmt.Errorf("compressor: state length %d is negative", n)
	}
	if len(ring) != rows*2*w {
		return nil, fmt.Errorf("compressor: ring of %d values, want %d rows of %d", len(ring), rows, 2*w)
	}
	s := l.NewState()
	s.n, s.first, s.rollbackFloor = n, l.firstNeeded(n), n
	for pos := s.first; pos < n; pos++ {
		r := pos % rows * 2 * w
		k, g := s.row(pos)
		copy(k, ring[r:r+w])
		copy(g, ring[r+w:r+2*w])
	}
	return s, nil
}
