package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// Limits of one line, far above any real batch; they keep every sum of a
// trace's tokens inside int.
const (
	MaxChunkTokens = 1 << 24 // tokens of one context chunk
	MaxMTP         = 255     // MTP drafts per generation step
	MaxLineBytes   = 16 << 20
)

// Step is one line of a trace.
type Step struct {
	Line       int         `json:"-"` // 1-based line number in the file; 0 when built in memory
	Context    []Chunk     `json:"context,omitempty"`
	Generation *Generation `json:"generation,omitempty"`
	Finish     []uint64    `json:"finish,omitempty"`
}

// Chunk is a piece of one sequence's prompt.
type Chunk struct {
	Seq    uint64 `json:"seq"`
	Tokens int    `json:"tokens"`
}

// Generation is one decode step of a set of sequences.
type Generation struct {
	MTP  int      `json:"mtp"`
	Seqs []uint64 `json:"seqs"`
	// Accept is, per sequence of Seqs (same order), how many of the step's
	// 1+MTP tokens verification accepted, each in [1, 1+MTP]: the sequence
	// keeps cached + Accept[i] tokens. Absent (nil): all accepted.
	Accept []int `json:"accept,omitempty"`
}

// LineError is a line that cannot be parsed or replayed.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("trace line %d: %v", e.Line, e.Err) }

func (e *LineError) Unwrap() error { return e.Err }

// HasBatch reports whether the step runs an iteration (context or
// generation work), as opposed to only finishing sequences.
func (s Step) HasBatch() bool { return len(s.Context) > 0 || s.Generation != nil }

// Tokens returns the context and generation tokens of the step's batch.
func (s Step) Tokens() (ctx, gen int) {
	for _, c := range s.Context {
		ctx += c.Tokens
	}
	if g := s.Generation; g != nil {
		gen = len(g.Seqs) * (1 + g.MTP)
	}
	return ctx, gen
}

// Sequences is the number of sequences in the step's batch.
func (s Step) Sequences() int {
	n := len(s.Context)
	if s.Generation != nil {
		n += len(s.Generation.Seqs)
	}
	return n
}

// Requests returns the batch as the engine takes it: context chunks in
// order, then the generation sequences in order.
func (s Step) Requests() []metadata.Request {
	reqs := make([]metadata.Request, 0, s.Sequences())
	for _, c := range s.Context {
		reqs = append(reqs, metadata.Request{Seq: c.Seq, Phase: metadata.Context, NewTokens: c.Tokens})
	}
	if g := s.Generation; g != nil {
		for _, seq := range g.Seqs {
			reqs = append(reqs, metadata.Request{Seq: seq, Phase: metadata.Generation, MTP: g.MTP})
		}
	}
	return reqs
}

// Accepted returns the generation sequences' accepted token counts by id
// (Generation.Accept), or nil when the line accepts every token.
func (s Step) Accepted() map[uint64]int {
	g := s.Generation
	if g == nil || g.Accept == nil {
		return nil
	}
	out := make(map[uint64]int, len(g.Seqs))
	for i, seq := range g.Seqs {
		out[seq] = g.Accept[i]
	}
	return out
}

// Validate checks a step on its own: positive chunk lengths within
// MaxChunkTokens, an MTP depth in [0, MaxMTP], a non-empty generation set,
// an accept list (when given) parallel to it with counts in [1, 1+MTP], no
// sequence twice in the batch or twice in finish, and something to do.
func (s Step) Validate() error {
	if !s.HasBatch() && len(s.Finish) == 0 {
		return errors.New(`nothing to do: give "context", "generation" or "finish"`)
	}
	where := map[uint64]string{}
	claim := func(seq uint64, at string) error {
		if prev, dup := where[seq]; dup {
			return fmt.Errorf("%s: seq %d is already in %s; a sequence appears once per batch", at, seq, prev)
		}
		where[seq] = at
		return nil
	}
	for i, c := range s.Context {
		at := fmt.Sprintf("context[%d]", i)
		if c.Tokens < 1 || c.Tokens > MaxChunkTokens {
			return fmt.Errorf("%s.tokens = %d, must be in [1, %d]", at, c.Tokens, MaxChunkTokens)
		}
		if err := claim(c.Seq, at); err != nil {
			return err
		}
	}
	if g := s.Generation; g != nil {
		if g.MTP < 0 || g.MTP > MaxMTP {
			return fmt.Errorf("generation.mtp = %d, must be in [0, %d]", g.MTP, MaxMTP)
		}
		if len(g.Seqs) == 0 {
			return errors.New("generation.seqs is empty; omit \"generation\" when no sequence decodes")
		}
		for i, seq := range g.Seqs {
			if err := claim(seq, fmt.Sprintf("generation.seqs[%d]", i)); err != nil {
				return err
			}
		}
		if g.Accept != nil && len(g.Accept) != len(g.Seqs) {
			return fmt.Errorf("generation.accept has %d counts for %d seqs; give one per sequence, in the order of seqs", len(g.Accept), len(g.Seqs))
		}
		for i, n := range g.Accept {
			if n < 1 || n > 1+g.MTP {
				return fmt.Errorf("generation.accept[%d] (seq %d) = %d, must be in [1, %d] (1 + mtp)", i, g.Seqs[i], n, 1+g.MTP)
			}
		}
	}
	seen := map[uint64]int{}
	for i, seq := range s.Finish {
		if j, dup := seen[seq]; dup {
			return fmt.Errorf("finish[%d]: seq %d is already in finish[%d]", i, seq, j)
		}
		seen[seq] = i
	}
	return nil
}

// Reader reads a trace one step at a time.
type Reader struct {
	r    *bufio.Reader
	line int
}

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next step, skipping blank and comment lines; io.EOF at
// the end. Errors are *LineError.
func (r *Reader) Next() (Step, error) {
	for {
		line, err := r.readLine()
		if err != nil {
			return Step{}, err
		}
		t := bytes.TrimSpace(line)
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		return ParseLine(t, r.line)
	}
}

func (r *Reader) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxLineBytes {
			return nil, &LineError{Line: r.line + 1, Err: fmt.Errorf("longer than %d bytes", MaxLineBytes)}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(line) > 0:
			r.line++
			return line, nil
		case err != nil:
			if err != io.EOF {
				err = &LineError{Line: r.line + 1, Err: err}
			}
			return nil, err
		}
		r.line++
		return line, nil
	}
}

// Parse reads a whole trace.
func Parse(r io.Reader) ([]Step, error) {
	tr := NewReader(r)
	var steps []Step
	for {
		s, err := tr.Next()
		if err == io.EOF {
			return steps, nil
		}
		if err != nil {
			return nil, err
		}
		steps = append(steps, s)
	}
}

// MarshalLine encodes a step as one line, without the newline.
func MarshalLine(s Step) ([]byte, error) {
	if err := s.Validate(); err != nil {
		if s.Line > 0 {
			return nil, &LineError{Line: s.Line, Err: err}
		}
		return nil, err
	}
	return json.Marshal(s)
}

// Write writes the comment lines (each prefixed with "# ") and then one line
// per step.
func Write(w io.Writer, comments []string, steps []Step) error {
	bw := bufio.NewWriter(w)
	for _, c := range comments {
		fmt.Fprintf(bw, "# %s\n", c)
	}
	for i, s := range steps {
		b, err := MarshalLine(s)
		if err != nil {
			return fmt.Errorf("trace: step %d: %w", i, err)
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// Stats summarizes a trace.
type Stats struct {
	Lines            int // steps (non-comment lines)
	Iterations       int // steps with a batch
	ContextTokens    int
	GenerationTokens int
	MixedIterations  int // iterations with both phases
	MaxTokens        int // the largest batch, in tokens
	MaxTokensLine    int // the line of the largest batch (the first of equals)
	MaxSeqs          int // the largest batch, in sequences
	Sequences        int // distinct sequence ids
	Finished         int // finish entries
}

// Summarize computes a trace's Stats.
func Summarize(steps []Step) Stats {
	st := Stats{Lines: len(steps)}
	ids := map[uint64]struct{}{}
	for _, s := range steps {
		st.Finished += len(s.Finish)
		if !s.HasBatch() {
			continue
		}
		st.Iterations++
		c, g := s.Tokens()
		st.ContextTokens += c
		st.GenerationTokens += g
		if c > 0 && g > 0 {
			st.MixedIterations++
		}
		if c+g > st.MaxTokens {
			st.MaxTokens, st.MaxTokensLine = c+g, s.Line
		}
		st.MaxSeqs = max(st.MaxSeqs, s.Sequences())
		for _, r := range s.Requests() {
			ids[r.Seq] = struct{}{}
		}
	}
	st.Sequences = len(ids)
	return st
}

// lengthReplay replays the trace's sequence lengths as a cache with a
// sliding window of window tokens (0: none) holds them in pages of
// pageSize tokens.
type lengthReplay struct {
	cache   kvcache.Config // PageSize and Window only
	lengths map[uint64]int
}

func newLengthReplay(pageSize, window int) *lengthReplay {
	return &lengthReplay{cache: kvcache.Config{PageSize: pageSize, Window: window}, lengths: map[uint64]int{}}
}

// pagesOf is ceil(n/pageSize), without overflow.
func (r *lengthReplay) pagesOf(n int) int { return n/r.cache.PageSize + min(n%r.cache.PageSize, 1) }

// inFlight returns the pages a sequence holds while a batch growing it to
// n tokens runs: every page up to n, less those the window freed at its
// committed length.
func (r *lengthReplay) inFlight(seq uint64, n int) int {
	return r.pagesOf(n) - r.cache.DeadPages(r.lengths[seq])
}

// live returns the pages a sequence of n committed tokens holds.
func (r *lengthReplay) live(n int) int { return r.pagesOf(n) - r.cache.DeadPages(n) }

// Footprint replays the trace's lengths without running anything: the most
// pages of pageSize tokens held at once (while each line's batch runs,
// before its finishes) and the longest sequence, in tokens, in a cache with
// a sliding window of window tokens (0: every token kept). Generation steps
// keep the tokens their accept list says. It assumes every line is valid
// for the cache; the replay is what checks that.
func Footprint(steps []Step, pageSize, window int) (peakPages, maxLength int) {
	r := newLengthReplay(pageSize, window)
	held := 0 // pages of committed lengths
	for _, s := range steps {
		accepted := s.Accepted()
		flight := held
		for _, q := range s.Requests() {
			old := r.lengths[q.Seq]
			n := old + q.NewTokens
			if q.Phase == metadata.Generation {
				n = old + 1 + q.MTP
			}
			flight += r.inFlight(q.Seq, n) - r.live(old)
			maxLength = max(maxLength, n)
			if a, ok := accepted[q.Seq]; ok {
				n = old + a
			}
			held += r.live(n) - r.live(old)
			r.lengths[q.Seq] = n
		}
		peakPages = max(peakPages, flight)
		for _, seq := range s.Finish {
			held -= r.live(r.lengths[seq])
			delete(r.lengths, seq)
		}
	}
	return peakPages, maxLength
}

// CheckFits returns a *LineError for the first line whose batch can never
// fit a pool of numPages pages of pageSize tokens with a sliding window of
// window tokens (0: none): while the line runs, the sequences of its batch
// alone hold more pages than the whole pool. Like Footprint it replays the
// lengths, assuming every earlier line succeeds; it allocates nothing, so a
// replayer can refuse such a line before sizing any buffer for it. Whether
// a line fits the pages left free by the other sequences is the engine's
// to decide (ErrCacheFull).
func CheckFits(steps []Step, pageSize, numPages, window int) error {
	if pageSize < 1 || numPages < 1 || window < 0 {
		return fmt.Errorf("trace: CheckFits: page size %d and pages %d must be positive, window %d not negative", pageSize, numPages, window)
	}
	r := newLengthReplay(pageSize, window)
	for _, s := range steps {
		accepted := s.Accepted()
		pages, tokens := 0, 0
		for _, q := range s.Requests() {
			old := r.lengths[q.Seq]
			n := old + q.NewTokens
			if q.Phase == metadata.Generation {
				n = old + 1 + q.MTP
			}
			pages += r.inFlight(q.Seq, n)
			tokens += n
			if a, ok := accepted[q.Seq]; ok {
				n = old + a
			}
			r.lengths[q.Seq] = n
		}
		if pages > numPages {
			return &LineError{Line: s.Line, Err: fmt.Errorf(
				"the batch's sequences hold %d tokens after it, %d pages of %d tokens, more than the whole pool of %d pages: it can never fit",
				tokens, pages, pageSize, numPages)}
		}
		for _, seq := range s.Finish {
			delete(r.lengths, seq)
		}
	}
	return nil
}

// EntryFootprint replays the trace's lengths as a compressed cache of one
// ratio holds them: floor(length/ratio) entries per sequence, in pages of
// pageSize entries, counting a batch's entries while it runs (before its
// accept lists cut them). It returns the most pages held at once, the
// pages a ratio's compressed pool needs for the trace.
func EntryFootprint(steps []Step, ratio, pageSize int) (peakPages int) {
	lengths := map[uint64]int{}
	pagesOf := func(n int) int { return (n/ratio + pageSize - 1) / pageSize }
	held := 0
	for _, s := range steps {
		accepted := s.Accepted()
		flight := held
		for _, q := range s.Requests() {
			old := lengths[q.Seq]
			n := old + q.NewTokens
			if q.Phase == metadata.Generation {
				n = old + 1 + q.MTP
			}
			flight += pagesOf(n) - pagesOf(old)
			if a, ok := accepted[q.Seq]; ok {
				n = old + a
			}
			held += pagesOf(n) - pagesOf(old)
			lengths[q.Seq] = n
		}
		peakPages = max(peakPages, flight)
		for _, seq := range s.Finish {
			held -= pagesOf(lengths[seq])
			delete(lengths, seq)
		}
	}
	return peakPages
}
