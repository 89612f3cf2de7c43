package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/kvcache"
)

// cacheState is everything a refused line must leave alone, in one engine.
type cacheState struct {
	pools   [][]byte
	tables  map[uint64]string
	lengths map[uint64]string
	free    int
}

func stateOf(t *testing.T, e *engine.Engine, ids []uint64) cacheState {
	s := cacheState{tables: map[uint64]string{}, lengths: map[uint64]string{}, free: e.FreePages()}
	for l := range e.Layers() {
		p, err := e.Debug().ReadPool(l)
		require.NoError(t, err)
		s.pools = append(s.pools, p)
	}
	for _, id := range ids {
		tb, err := e.Debug().BlockTable(id)
		s.tables[id] = fmt.Sprint(tb, err)
		n, err := e.SequenceLength(id)
		s.lengths[id] = fmt.Sprint(n, err)
	}
	return s
}

func requireSameState(t *testing.T, want, got cacheState) {
	t.Helper()
	require.Equal(t, want.free, got.free, "free pages")
	require.Equal(t, want.tables, got.tables, "block tables")
	require.Equal(t, want.lengths, got.lengths, "lengths")
	for l := range want.pools {
		require.True(t, string(want.pools[l]) == string(got.pools[l]), "layer %d pool bytes changed", l)
	}
}

// The good prefix: sequences 1 (100 tokens) and 2 (12 tokens) live, 3
// finished; 16 pages of 16 tokens with 8 in use. The RoPE table (128
// positions) is shorter than the pool (256 tokens).
const badLinePrefix = `{"context":[{"seq":1,"tokens":64},{"seq":2,"tokens":8},{"seq":3,"tokens":5}]}
{"context":[{"seq":1,"tokens":32}],"generation":{"mtp":3,"seqs":[2]},"finish":[3]}
{"generation":{"mtp":3,"seqs":[1]}}
`

// neverFits holds 120 + 120 + 104 tokens after it, 8 + 8 + 7 pages: more
// than the 16 of the whole pool, within the RoPE table and MaxTokens.
const neverFits = `{"context":[{"seq":4,"tokens":120},{"seq":5,"tokens":120}],"generation":{"mtp":3,"seqs":[1]}}`

// TestBadLineLosesNothing replays a good prefix, then a bad line: the error
// names the line, and the cache (pool bytes, block tables, lengths, free
// pages) of both the engine and the verify reference is as the prefix left
// it; a good line after it replays and verifies.
func TestBadLineLosesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		line string
		want error
		msg  string
	}{
		{"generation on an unknown sequence", `{"generation":{"mtp":3,"seqs":[1,2,9]}}`, kvcache.ErrUnknownSequence, "seq 9"},
		{"generation on a finished sequence", `{"generation":{"mtp":3,"seqs":[3]}}`, kvcache.ErrFinishedSequence, "finished sequence 3"},
		{"prompt on a finished sequence", `{"context":[{"seq":3,"tokens":5}]}`, kvcache.ErrFinishedSequence, "finished sequence 3"},
		{"batch beyond the pool", `{"context":[{"seq":4,"tokens":100},{"seq":5,"tokens":90}],"generation":{"mtp":3,"seqs":[1,2]}}`, kvcache.ErrCacheFull, "need 13 pages, 8 free of 16"},
		{"prompt past the RoPE table", `{"context":[{"seq":1,"tokens":40}],"generation":{"mtp":3,"seqs":[2]}}`, kvcache.ErrPositionOutOfRange, "exceeds MaxPositions = 128"},
		{"new prompt past the RoPE table", `{"context":[{"seq":6,"tokens":129}]}`, kvcache.ErrPositionOutOfRange, "kv_len = 129"},
		{"finish of an unknown sequence", `{"generation":{"mtp":3,"seqs":[1,2]},"finish":[2,8]}`, kvcache.ErrUnknownSequence, "finish[1]"},
		{"finish of a finished sequence", `{"context":[{"seq":7,"tokens":3}],"finish":[3]}`, kvcache.ErrFinishedSequence, "finish[0]"},
		{"batch larger than the whole pool", neverFits, kvcache.ErrCacheFull, "need 16 pages, 8 free of 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			steps, err := trace.Parse(strings.NewReader(badLinePrefix + c.line + "\n" + `{"generation":{"mtp":3,"seqs":[1,2]}}` + "\n"))
			require.NoError(t, err)
			opts := replayOptions(t, steps, 16)
			opts.Engine.Cache.PageSize = 16
			opts.Engine.RopePositions = 128
			opts.Engine.MaxTokens = 256
			opts.Verify = true
			r, err := replay.New(context.Background(), opts)
			require.NoError(t, err)
			defer r.Close()
			ctx := context.Background()
			for _, s := range steps[:3] {
				_, err := r.Step(ctx, s)
				require.NoError(t, err)
			}
			ids := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9}
			engines := []*engine.Engine{r.Engine(), r.Reference()}
			var before []cacheState
			for _, e := range engines {
				before = append(before, stateOf(t, e, ids))
			}

			_, err = r.Step(ctx, steps[3])
			require.Error(t, err)
			t.Log(err)
			var le *trace.LineError
			require.ErrorAs(t, err, &le)
			require.Equal(t, 4, le.Line)
			require.True(t, errors.Is(err, c.want), "%v is not %v", err, c.want)
			require.Contains(t, err.Error(), c.msg)
			for i, e := range engines {
				requireSameState(t, before[i], stateOf(t, e, ids))
			}

			// The cache still serves: the next good line replays and verifies.
			ir, err := r.Step(ctx, steps[4])
			require.NoError(t, err)
			require.True(t, ir.Verified)
		})
	}
}

func TestMalformedLineIsRefusedBeforeReplay(t *testing.T) {
	_, err := trace.Parse(strings.NewReader(badLinePrefix + `{"generation":{"mtp":3,"seqs":[1,2}}` + "\n"))
	var le *trace.LineError
	require.ErrorAs(t, err, &le)
	require.Equal(t, 4, le.Line)
	require.ErrorContains(t, err, "trace line 4: malformed JSON at byte offset 34: invalid character '}' after array element")
}

// TestLineThatCanNeverFit: trace.CheckFits names, before any replay, the
// line whose own sequences need more pages than the whole pool, and only
// that one; the replay refuses the same line with ErrCacheFull.
func TestLineThatCanNeverFit(t *testing.T) {
	steps, err := trace.Parse(strings.NewReader(badLinePrefix + neverFits + "\n"))
	require.NoError(t, err)
	require.NoError(t, trace.CheckFits(steps[:3], 16, 16, 0), "the prefix fits")
	err = trace.CheckFits(steps, 16, 16, 0)
	var le *trace.LineError
	require.ErrorAs(t, err, &le)
	require.Equal(t, 4, le.Line)
	require.ErrorContains(t, err, "trace line 4: the batch's sequences hold 344 tokens after it, 23 pages of 16 tokens, more than the whole pool of 16 pages: it can never fit")
}

// TestMalformedLinesAreRefusedBeforeReplay: what the parser refuses (wrong
// case, duplicate keys, a null line) never reaches an engine, and the
// message names the line.
func TestMalformedLinesAreRefusedBeforeReplay(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{`{"generation":{"mtp":3,"SEQS":[1,2]}}`, `trace line 4: unknown field "SEQS" in generation: field names are lower case, write "seqs"`},
		{`{"context":[{"seq":6,"tokens":3}],"context":[{"seq":7,"tokens":3}]}`, `trace line 4: field "context" appears twice; give it once`},
		{`null`, `trace line 4: a line must be a JSON object, not null`},
	} {
		_, err := trace.Parse(strings.NewReader(badLinePrefix + c.line + "\n"))
		var le *trace.LineError
		require.ErrorAs(t, err, &le)
		require.Equal(t, 4, le.Line)
		require.EqualError(t, err, c.want)
	}
}
