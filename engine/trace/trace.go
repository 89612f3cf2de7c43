package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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

// Validate checks a step on its own: positive chunk lengths within
// MaxChunkTokens, an MTP depth in [0, MaxMTP], a non-empty generation set,
// no sequence twice in the batch or twice in finish, and something to do.
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

// Footprint replays the trace's lengths without running anything: the most
// pages of pageSize tokens held at once (after each line's batch, before
// its finishes) and the longest sequence, in tokens. It assumes every line
// is valid for the cache; the replay is what checks that.
func Footprint(steps []Step, pageSize int) (peakPages, maxLength int) {
	lengths := map[uint64]int{}
	pages := 0
	pagesOf := func(n int) int { return (n + pageSize - 1) / pageSize }
	grow := func(seq uint64, by int) {
		old := lengths[seq]
		lengths[seq] = old + by
		pages += pagesOf(old+by) - pagesOf(old)
		maxLength = max(maxLength, old+by)
	}
	for _, s := range steps {
		for _, c := range s.Context {
			grow(c.Seq, c.Tokens)
		}
		if g := s.Generation; g != nil {
			for _, seq := range g.Seqs {
				grow(seq, 1+g.MTP)
			}
		}
		peakPages = max(peakPages, pages)
		for _, seq := range s.Finish {
			pages -= pagesOf(lengths[seq])
			delete(lengths, seq)
		}
	}
	return peakPages, maxLength
}

// CheckFits returns a *LineError for the first line whose batch can never
// fit a pool of numPages pages of pageSize tokens: after the line, the
// sequences of its batch alone hold more pages than the whole pool. Like
// Footprint it replays the lengths, assuming every earlier line succeeds;
// it allocates nothing, so a replayer can refuse such a line before sizing
// any buffer for it. Whether a line fits the pages left free by the other
// sequences is the engine's to decide (ErrCacheFull).
func CheckFits(steps []Step, pageSize, numPages int) error {
	if pageSize < 1 || numPages < 1 {
		return fmt.Errorf("trace: CheckFits: page size %d and pages %d must be positive", pageSize, numPages)
	}
	lengths := map[uint64]int{}
	pagesOf := func(n int) int { return n/pageSize + min(n%pageSize, 1) }
	for _, s := range steps {
		pages, tokens := 0, 0
		for _, r := range s.Requests() {
			n := r.NewTokens
			if r.Phase == metadata.Generation {
				n = 1 + r.MTP
			}
			lengths[r.Seq] += n
			pages += pagesOf(lengths[r.Seq])
			tokens += lengths[r.Seq]
		}
		if pages > numPages {
			return &LineError{Line: s.Line, Err: fmt.Errorf(
				"the batch's sequences hold %d tokens after it, %d pages of %d tokens, more than the whole pool of %d pages: it can never fit",
				tokens, pages, pageSize, numPages)}
		}
		for _, seq := range s.Finish {
			delete(lengths, seq)
		}
	}
	return nil
}
