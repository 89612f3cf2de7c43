package tests

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/metadata"
)

type dispatchCase struct {
	name     string
	reqs     []metadata.Request
	cached   map[uint64]int
	pad      int
	expected []string
	line     int
}

func parseDispatch(t *testing.T, path string) []dispatchCase {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var cases []dispatchCase
	var cur *dispatchCase
	inLaunches := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		switch {
		case fields[0] == "case":
			cases = append(cases, dispatchCase{name: fields[1], cached: map[uint64]int{}, line: n})
			cur, inLaunches = &cases[len(cases)-1], false
		case fields[0] == "end":
			cur, inLaunches = nil, false
		case cur == nil:
			t.Fatalf("%s:%d: %q outside a case", path, n, line)
		case inLaunches:
			cur.expected = append(cur.expected, line)
		case fields[0] == "launches":
			inLaunches = true
		case fields[0] == "batch":
			for _, r := range fields[1:] {
				p := strings.Split(r, ":")
				require.Len(t, p, 3, "%s:%d", path, n)
				id, _ := strconv.ParseUint(p[1], 10, 64)
				v, _ := strconv.Atoi(p[2])
				if p[0] == "ctx" {
					cur.reqs = append(cur.reqs, metadata.Request{Seq: id, Phase: metadata.Context, NewTokens: v})
				} else {
					cur.reqs = append(cur.reqs, metadata.Request{Seq: id, Phase: metadata.Generation, MTP: v})
				}
			}
		case fields[0] == "cached":
			for _, c := range fields[1:] {
				p := strings.Split(c, ":")
				id, _ := strconv.ParseUint(p[0], 10, 64)
				v, _ := strconv.Atoi(p[1])
				cur.cached[id] = v
			}
		case fields[0] == "pad":
			cur.pad, _ = strconv.Atoi(fields[1])
		default:
			t.Fatalf("%s:%d: unknown directive %q", path, n, fields[0])
		}
	}
	require.NoError(t, sc.Err())
	return cases
}

func formatLaunch(l mla.Launch) string {
	s := fmt.Sprintf("%s rows=[%d,%d) valid=%d seqs=[%d,%d) seq_len=%d",
		l.Phase, l.RowBegin, l.RowBegin+l.Rows, l.ValidRows, l.SeqBegin, l.SeqBegin+l.NumSeqs, l.SeqLen)
	if l.WriteScheduler {
		s += " sched"
	}
	return s
}

// buildMetadata runs the metadata pass with one page per 64 tokens, numbered
// in order.
func buildMetadata(t testing.TB, reqs []metadata.Request, cached map[uint64]int, pad, heads int) *metadata.Metadata {
	p := metadata.Params{Heads: heads, PageSize: 64, MaxPositions: 1 << 16, PadTokensTo: pad, Scheduler: metadata.DefaultSchedulerParams()}
	plan, err := metadata.NewPlan(reqs, func(s uint64) (int, bool, error) { n, ok := cached[s]; return n, ok, nil }, p)
	require.NoError(t, err)
	next := int32(0)
	tables := map[uint64][]int32{}
	for _, n := range plan.Needs() {
		for i := 0; i < (n.Length+63)/64; i++ {
			tables[n.Seq] = append(tables[n.Seq], next)
			next++
		}
	}
	m, err := plan.Build(func(s uint64) ([]int32, error) { return tables[s], nil })
	require.NoError(t, err)
	return m
}

// TestDispatchCensus pins the launches each batch shape produces.
func TestDispatchCensus(t *testing.T) {
	for _, c := range parseDispatch(t, "testdata/dispatch.txt") {
		t.Run(c.name, func(t *testing.T) {
			m := buildMetadata(t, c.reqs, c.cached, c.pad, 4)
			var got []string
			for _, l := range mla.Plan(m) {
				got = append(got, formatLaunch(l))
			}
			require.Equal(t, c.expected, got, "case at testdata/dispatch.txt:%d", c.line)
			var census mla.Census
			census.Add(mla.Plan(m))
			require.Equal(t, 2*len(c.expected), census.Total())
		})
	}
}
