package trace_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine/trace"
)

// The embedded file is exactly what the generator writes: regenerate it
// with go generate ./engine/trace after changing DefaultGenParams.
func TestDefaultTraceIsGenerated(t *testing.T) {
	p := trace.DefaultGenParams()
	steps, err := trace.Generate(p)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, trace.Write(&buf, trace.DefaultComments(p), steps))
	require.True(t, bytes.Equal(buf.Bytes(), trace.DefaultJSONL()),
		"engine/trace/default.jsonl is stale: run go generate ./engine/trace")
}

// checkLifecycle replays a trace's sequence states: generation and finish
// only on live sequences, nothing after finish, every sequence finished.
func checkLifecycle(t *testing.T, steps []trace.Step) {
	t.Helper()
	live, done := map[uint64]int{}, map[uint64]bool{}
	for _, s := range steps {
		for _, c := range s.Context {
			require.False(t, done[c.Seq], "line %d: context for finished seq %d", s.Line, c.Seq)
			live[c.Seq] += c.Tokens
		}
		if g := s.Generation; g != nil {
			for _, seq := range g.Seqs {
				_, ok := live[seq]
				require.True(t, ok, "line %d: generation for seq %d before its prompt", s.Line, seq)
				live[seq] += 1 + g.MTP
			}
		}
		for _, seq := range s.Finish {
			_, ok := live[seq]
			require.True(t, ok, "line %d: finish of seq %d that is not live", s.Line, seq)
			delete(live, seq)
			done[seq] = true
		}
	}
	require.Empty(t, live, "sequences never finished")
}

func TestDefaultTraceLooksLikeServerTraffic(t *testing.T) {
	require.Less(t, len(trace.DefaultJSONL()), 200<<10, "keep the embedded trace small")
	steps, err := trace.Default()
	require.NoError(t, err)
	checkLifecycle(t, steps)
	st := trace.Summarize(steps)
	t.Logf("%+v", st)

	maxDecode, chunks2048 := 0, 0
	chunksPerSeq := map[uint64]int{}
	for _, s := range steps {
		if g := s.Generation; g != nil {
			require.Equal(t, 3, g.MTP, "line %d", s.Line)
			maxDecode = max(maxDecode, len(g.Seqs))
		}
		for _, c := range s.Context {
			chunksPerSeq[c.Seq]++
			if c.Tokens == 2048 {
				chunks2048++
			}
		}
	}
	chunked := 0
	for _, n := range chunksPerSeq {
		if n > 1 {
			chunked++
		}
	}
	require.GreaterOrEqual(t, maxDecode, 24, "dozens of decode streams at once")
	require.GreaterOrEqual(t, chunks2048, 6, "long prompts arrive in 2048-token chunks")
	require.GreaterOrEqual(t, chunked, 3, "chunked prefills continue at a cached offset")
	require.GreaterOrEqual(t, st.MixedIterations, 10, "mixed batches")
	require.Equal(t, st.Sequences, st.Finished)
}

func TestGenerateDeterministicAndValidated(t *testing.T) {
	p := trace.DefaultGenParams()
	p.Seed = 99
	a, err := trace.Generate(p)
	require.NoError(t, err)
	b, err := trace.Generate(p)
	require.NoError(t, err)
	require.Equal(t, a, b)
	checkLifecycle(t, a)
	p.Seed = 100
	c, err := trace.Generate(p)
	require.NoError(t, err)
	require.NotEqual(t, a, c)

	// Accept draws each step's accepted counts; the lines parse back.
	p.Accept = true
	d, err := trace.Generate(p)
	require.NoError(t, err)
	checkLifecycle(t, d)
	partial := 0
	for _, s := range d {
		if g := s.Generation; g != nil {
			require.Len(t, g.Accept, len(g.Seqs))
			for _, n := range g.Accept {
				require.True(t, n >= 1 && n <= 1+g.MTP)
				if n < 1+g.MTP {
					partial++
				}
			}
		}
	}
	require.Positive(t, partial, "some drafts are rejected")
	var buf bytes.Buffer
	require.NoError(t, trace.Write(&buf, nil, d))
	back, err := trace.Parse(&buf)
	require.NoError(t, err)
	for i := range back {
		back[i].Line = 0
	}
	require.Equal(t, d, back)

	for i, edit := range []func(*trace.GenParams){
		func(p *trace.GenParams) { p.PromptMax = p.ShortBudget + 1 },
		func(p *trace.GenParams) { p.Chunk = 0 },
		func(p *trace.GenParams) { p.StepsMin = 0 },
		func(p *trace.GenParams) { p.MTP = -1 },
		func(p *trace.GenParams) { p.Streams, p.Arrivals, p.LongPrompts = 0, 0, 0 },
		func(p *trace.GenParams) { p.LongMin = p.LongMax + 1 },
	} {
		p := trace.DefaultGenParams()
		edit(&p)
		_, err := trace.Generate(p)
		require.Error(t, err, fmt.Sprint("case ", i))
	}
}
