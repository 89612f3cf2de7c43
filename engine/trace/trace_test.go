package trace_test

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/metadata"
)

type lineCase struct {
	at    int // line of the input in the testdata file
	input string
	want  string
}

// readLineCases reads testdata/lines.txt: an input line, "----", the
// expected result; cases are separated by blank lines, '#' starts a comment
// outside a case.
func readLineCases(t *testing.T) []lineCase {
	f, err := os.Open("testdata/lines.txt")
	require.NoError(t, err)
	defer f.Close()
	var cases []lineCase
	var cur *lineCase
	sc := bufio.NewScanner(f)
	state := 0 // 0: between cases, 1: after input, 2: in expected
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case state == 0 && (strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#")):
		case state == 0:
			cases = append(cases, lineCase{at: n, input: l})
			cur, state = &cases[len(cases)-1], 1
		case state == 1:
			require.Equal(t, "----", l, "testdata/lines.txt:%d: want ---- after the input", n)
			state = 2
		case strings.TrimSpace(l) == "":
			state = 0
		default:
			cur.want = strings.TrimSpace(cur.want + "\n" + l)
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, cases)
	return cases
}

func describe(s trace.Step) string {
	var b strings.Builder
	b.WriteString("context")
	for _, c := range s.Context {
		fmt.Fprintf(&b, " %d:%d", c.Seq, c.Tokens)
	}
	if g := s.Generation; g != nil {
		fmt.Fprintf(&b, " | generation mtp=%d %v", g.MTP, g.Seqs)
		if g.Accept != nil {
			fmt.Fprintf(&b, " accept %v", g.Accept)
		}
	} else {
		b.WriteString(" | generation none")
	}
	fmt.Fprintf(&b, " | finish %v", s.Finish)
	return b.String()
}

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/lines.txt expectations with the actual results")

func TestParseLine(t *testing.T) {
	cases := readLineCases(t)
	got := make([]string, len(cases))
	for i, c := range cases {
		s, err := trace.ParseLine([]byte(strings.TrimSpace(c.input)), 7)
		if err != nil {
			var le *trace.LineError
			require.ErrorAs(t, err, &le, "testdata/lines.txt:%d", c.at)
			require.Equal(t, 7, le.Line)
			got[i] = "error: " + err.Error()
			for _, goName := range []string{"uint64", "int", "[]", "*trace", "Go ", "json:", "struct"} {
				require.NotContains(t, err.Error(), goName, "testdata/lines.txt:%d: a message shows a Go type", c.at)
			}
		} else {
			got[i] = describe(s)
			require.Equal(t, 7, s.Line)
			// What parses also encodes and parses back to the same step.
			line, err := trace.MarshalLine(s)
			require.NoError(t, err)
			back, err := trace.ParseLine(line, 7)
			require.NoError(t, err, "re-parsing %s", line)
			require.Equal(t, describe(s), describe(back))
		}
		if !*rewrite {
			require.Equal(t, c.want, got[i], "testdata/lines.txt:%d: %s", c.at, c.input)
		}
	}
	if *rewrite {
		rewriteLineCases(t, cases, got)
	}
}

// rewriteLineCases replaces each case's expected result in
// testdata/lines.txt with got.
func rewriteLineCases(t *testing.T, cases []lineCase, got []string) {
	raw, err := os.ReadFile("testdata/lines.txt")
	require.NoError(t, err)
	lines := strings.Split(string(raw), "\n")
	var out []string
	next := 0
	for i := 0; i < len(lines); i++ {
		out = append(out, lines[i])
		if next < len(cases) && i+1 == cases[next].at {
			out = append(out, lines[i+1], got[next]) // the input, "----", the result
			i += 2
			for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
				i++
			}
			i-- // keep the blank line
			next++
		}
	}
	require.NoError(t, os.WriteFile("testdata/lines.txt", []byte(strings.Join(out, "\n")), 0o644))
}

func TestReaderSkipsCommentsAndCountsLines(t *testing.T) {
	in := "# header\n\n{\"context\":[{\"seq\":1,\"tokens\":4}]}\r\n   # indented comment\n{\"generation\":{\"mtp\":1,\"seqs\":[1]},\"finish\":[1]}\n{\"finish\":[1]"
	r := trace.NewReader(strings.NewReader(in))
	s, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, 3, s.Line)
	s, err = r.Next()
	require.NoError(t, err)
	require.Equal(t, 5, s.Line)
	require.Equal(t, []uint64{1}, s.Finish)
	_, err = r.Next()
	require.ErrorContains(t, err, "trace line 6: malformed JSON")
	_, err = trace.Parse(strings.NewReader(in))
	require.ErrorContains(t, err, "trace line 6")
}

func TestReaderLongLines(t *testing.T) {
	// A valid line longer than the reader's buffer.
	var b strings.Builder
	b.WriteString(`{"generation":{"mtp":0,"seqs":[`)
	for i := range 40000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, i)
	}
	b.WriteString("]}}\n")
	steps, err := trace.Parse(strings.NewReader(b.String()))
	require.NoError(t, err)
	require.Len(t, steps[0].Generation.Seqs, 40000)

	huge := strings.Repeat(" ", trace.MaxLineBytes+1) + "{}"
	_, err = trace.Parse(strings.NewReader(huge))
	require.ErrorContains(t, err, "trace line 1: longer than")
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReaderIOError(t *testing.T) {
	_, err := trace.Parse(failingReader{})
	require.ErrorContains(t, err, "trace line 1: disk on fire")
}

func TestRequestsOrderAndTokens(t *testing.T) {
	s := trace.Step{
		Context:    []trace.Chunk{{Seq: 5, Tokens: 100}, {Seq: 6, Tokens: 7}},
		Generation: &trace.Generation{MTP: 3, Seqs: []uint64{1, 2}},
	}
	require.Equal(t, []metadata.Request{
		{Seq: 5, Phase: metadata.Context, NewTokens: 100},
		{Seq: 6, Phase: metadata.Context, NewTokens: 7},
		{Seq: 1, Phase: metadata.Generation, MTP: 3},
		{Seq: 2, Phase: metadata.Generation, MTP: 3},
	}, s.Requests())
	c, g := s.Tokens()
	require.Equal(t, 107, c)
	require.Equal(t, 8, g)
	require.Equal(t, 4, s.Sequences())
	require.True(t, s.HasBatch())
	require.False(t, trace.Step{Finish: []uint64{1}}.HasBatch())
}

func TestWriteParseRoundTrip(t *testing.T) {
	steps := []trace.Step{
		{Context: []trace.Chunk{{Seq: 1, Tokens: 2048}}},
		{Context: []trace.Chunk{{Seq: 1, Tokens: 10}}, Generation: &trace.Generation{MTP: 0, Seqs: []uint64{2}}},
		{Generation: &trace.Generation{MTP: 3, Seqs: []uint64{1, 2}}, Finish: []uint64{2}},
		{Finish: []uint64{1}},
	}
	var buf bytes.Buffer
	require.NoError(t, trace.Write(&buf, []string{"a comment"}, steps))
	require.True(t, strings.HasPrefix(buf.String(), "# a comment\n"))
	back, err := trace.Parse(&buf)
	require.NoError(t, err)
	for i := range steps {
		steps[i].Line = i + 2
	}
	require.Equal(t, steps, back)

	err = trace.Write(io.Discard, nil, []trace.Step{{}})
	require.ErrorContains(t, err, "step 0: nothing to do")
}

func TestSummarizeAndFootprint(t *testing.T) {
	steps := []trace.Step{
		{Line: 1, Context: []trace.Chunk{{Seq: 1, Tokens: 100}, {Seq: 2, Tokens: 64}}},
		{Line: 2, Context: []trace.Chunk{{Seq: 1, Tokens: 30}}, Generation: &trace.Generation{MTP: 3, Seqs: []uint64{2}}},
		{Line: 3, Generation: &trace.Generation{MTP: 3, Seqs: []uint64{1, 2}}, Finish: []uint64{2}},
		{Line: 4, Finish: []uint64{1}},
	}
	require.Equal(t, trace.Stats{
		Lines: 4, Iterations: 3, ContextTokens: 194, GenerationTokens: 12, MixedIterations: 1,
		MaxTokens: 164, MaxTokensLine: 1, MaxSeqs: 2, Sequences: 2, Finished: 2,
	}, trace.Summarize(steps))
	// Pages of 64: after line 1, seq 1 holds 2 and seq 2 holds 1; after line
	// 2, 130 and 68 tokens hold 3 + 2; after line 3, 134 and 72 hold 3 + 2.
	peak, longest := trace.Footprint(steps, 64, 0)
	require.Equal(t, 5, peak)
	require.Equal(t, 134, longest)
}

// TestFootprintWindowAccept: with a window the pages behind it do not
// count once a line commits (they do while it runs), and a generation step
// keeps only the tokens its accept list says.
func TestFootprintWindowAccept(t *testing.T) {
	steps := []trace.Step{
		{Line: 1, Context: []trace.Chunk{{Seq: 1, Tokens: 300}}},
		{Line: 2, Generation: &trace.Generation{MTP: 3, Seqs: []uint64{1}, Accept: []int{1}}},
		{Line: 3, Generation: &trace.Generation{MTP: 3, Seqs: []uint64{1}, Accept: []int{2}}},
		{Line: 4, Context: []trace.Chunk{{Seq: 2, Tokens: 64}}, Generation: &trace.Generation{MTP: 3, Seqs: []uint64{1}}},
	}
	// Window 128, pages of 64: line 1 holds 5 pages in flight, then 3
	// (positions 172..299 on pages 2..4); line 2 runs to 304 (page 4 still
	// covers it) and keeps 301; line 3 runs to 305 and keeps 303; line 4
	// runs seq 1 to 307 and seq 2 to 64: 3 + 1 pages.
	peak, longest := trace.Footprint(steps, 64, 128)
	require.Equal(t, 5, peak)
	require.Equal(t, 307, longest)
	// Without a window every page counts: 5 after line 1, then 5.
	peak, longest = trace.Footprint(steps, 64, 0)
	require.Equal(t, 6, peak)
	require.Equal(t, 307, longest)
	require.NoError(t, trace.CheckFits(steps, 64, 5, 128))
	require.ErrorContains(t, trace.CheckFits(steps, 64, 4, 128), "trace line 1: the batch's sequences hold 300 tokens after it, 5 pages")
	require.ErrorContains(t, trace.CheckFits(steps, 64, 5, 0), "trace line 4:")
	// Accepted lengths drive the next lines: seq 1 keeps 301 then 303, so
	// line 4 asks for 307 (page 4 holds 256..319) and not 312.
	require.Equal(t, map[uint64]int{1: 2}, steps[2].Accepted())
	require.Nil(t, steps[3].Accepted())
}

// TestCheckFits: a line whose own sequences need more pages than the whole
// pool is refused by line number before any replay; a line that fits only
// once other sequences finish is not (that is the engine's ErrCacheFull).
func TestCheckFits(t *testing.T) {
	steps, err := trace.Parse(strings.NewReader(`# pool: 8 pages of 16 tokens
{"context":[{"seq":1,"tokens":100},{"seq":2,"tokens":16}]}
{"generation":{"mtp":3,"seqs":[1]},"finish":[2]}
{"context":[{"seq":3,"tokens":16}],"generation":{"mtp":0,"seqs":[1]}}
{"context":[{"seq":4,"tokens":16777216}]}
`))
	require.NoError(t, err)
	// Line 2 holds 7 + 1 pages; line 3 holds seq 1's 104 tokens in 7 (seq
	// 2 is not in its batch); line 4 holds seqs 3 and 1, 16 + 105 tokens in
	// 1 + 7 pages: each fits 8 pages alone.
	require.NoError(t, trace.CheckFits(steps[:3], 16, 8, 0))
	err = trace.CheckFits(steps, 16, 8, 0)
	var le *trace.LineError
	require.ErrorAs(t, err, &le)
	require.Equal(t, 5, le.Line)
	require.EqualError(t, err, "trace line 5: the batch's sequences hold 16777216 tokens after it, 1048576 pages of 16 tokens, more than the whole pool of 8 pages: it can never fit")
	err = trace.CheckFits(steps, 16, 7, 0)
	require.ErrorContains(t, err, "trace line 2: the batch's sequences hold 116 tokens after it, 8 pages of 16 tokens, more than the whole pool of 7 pages")
	require.Error(t, trace.CheckFits(steps, 0, 8, 0))
	require.Equal(t, 5, trace.Summarize(steps).MaxTokensLine)
}

// FuzzParseLine: whatever ParseLine accepts is valid, encodes, and parses
// back to the same step; whatever it refuses is a *LineError with the line.
func FuzzParseLine(f *testing.F) {
	for _, seed := range []string{
		`{"context":[{"seq":1,"tokens":5}]}`,
		`{"context":[{"seq":7,"tokens":2048}],"generation":{"mtp":3,"seqs":[1,2,3]},"finish":[2]}`,
		`{"finish":[1]}`, `{}`, `[1]`, `{"generation":{"seqs":[]}}`, `{"context":[{"seq":-1}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		s, err := trace.ParseLine(line, 3)
		if err != nil {
			var le *trace.LineError
			if !errors.As(err, &le) || le.Line != 3 || !strings.HasPrefix(err.Error(), "trace line 3: ") {
				t.Fatalf("error %v is not a *LineError for line 3", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted an invalid step: %v", err)
		}
		enc, err := trace.MarshalLine(s)
		if err != nil {
			t.Fatalf("accepted step does not encode: %v", err)
		}
		back, err := trace.ParseLine(enc, 3)
		if err != nil {
			t.Fatalf("%s does not parse back: %v", enc, err)
		}
		if describe(s) != describe(back) {
			t.Fatalf("round trip changed %s into %s", describe(s), describe(back))
		}
		c, g := s.Tokens()
		if c < 0 || g < 0 || len(s.Requests()) != s.Sequences() {
			t.Fatalf("bad counts: ctx %d gen %d requests %d sequences %d", c, g, len(s.Requests()), s.Sequences())
		}
	})
}

// The embedded chain trace, cmd/decode's default, is what its generator
// writes, and shows DeepSeek-V4's cache model: an accept list on every
// generation step, some rejecting drafts, and a sequence long enough for
// the window to free a page of 64 (past 192 tokens) and for a ratio-128
// entry.
func TestChainTraceIsGeneratedAndShowsTheCacheModel(t *testing.T) {
	p := trace.ChainGenParams()
	steps, err := trace.Generate(p)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, trace.Write(&buf, trace.ChainComments(p), steps))
	embedded, err := trace.DefaultChain()
	require.NoError(t, err)
	var again bytes.Buffer
	require.NoError(t, trace.Write(&again, trace.ChainComments(p), embedded))
	require.Equal(t, buf.String(), again.String(), "engine/trace/chain.jsonl is stale: run go generate ./engine/trace")

	rejected := 0
	for _, s := range embedded {
		if g := s.Generation; g != nil {
			require.NotNil(t, g.Accept, "line %d: every generation step has an accept list", s.Line)
			for _, n := range g.Accept {
				rejected += 1 + g.MTP - n
			}
		}
	}
	require.Positive(t, rejected, "some drafts are rejected")
	_, longest := trace.Footprint(embedded, 64, 128)
	require.Greater(t, longest, 192)
}
