package metadata

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/dsv4mla/prologue/kvcache"
)

// The testdata/*.txt files are github.com/cockroachdb/datadriven scripts:
//
//	# comment
//	run heads=2 page=64 maxpos=4096 [pad=N] [maxpages=N] [qdeq=F kvdeq=F qscaling=F oscale=F]
//	cache seq=7 len=10          (the cache holds seq 7 with 10 tokens)
//	cache seq=9 err=finished    (lookup of seq 9 fails)
//	pages seq=7 ids=3,4         (Build's block table for seq 7; none listed: empty)
//	pages seq=9 err=evicted     (the block table lookup of seq 9 fails)
//	req seq=7 phase=context new=5 [mtp=0]
//	----
//	expected dump or error (ends at a blank line or the end of the file)
//
// Run with -rewrite to print the actual output into the files; every
// rewritten expectation must then be checked by hand.

// errLookupFailed and errBlockTableFailed are what the test lookups wrap, so
// the dumps can show that errors.Is sees through NewPlan's and Build's
// wrapping.
var (
	errLookupFailed     = errors.New("lookup failed")
	errBlockTableFailed = errors.New("block table failed")
)

// kv parses "k=v" fields after the directive word.
func kv(t *testing.T, where string, fields []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("%s: field %q is not key=value", where, f)
		}
		if _, dup := m[k]; dup {
			t.Fatalf("%s: field %q given twice", where, k)
		}
		m[k] = v
	}
	return m
}

type argReader struct {
	t     *testing.T
	where string
	args  map[string]string
	used  map[string]bool
}

func newArgReader(t *testing.T, where string, fields []string) *argReader {
	return &argReader{t: t, where: where, args: kv(t, where, fields), used: map[string]bool{}}
}

func (a *argReader) has(k string) bool { _, ok := a.args[k]; return ok }

func (a *argReader) str(k string) string {
	a.t.Helper()
	v, ok := a.args[k]
	if !ok {
		a.t.Fatalf("%s: missing field %q", a.where, k)
	}
	a.used[k] = true
	return v
}

func (a *argReader) int(k string, def int) int {
	a.t.Helper()
	if !a.has(k) {
		return def
	}
	n, err := strconv.Atoi(a.str(k))
	if err != nil {
		a.t.Fatalf("%s: field %s: %v", a.where, k, err)
	}
	return n
}

func (a *argReader) uint64(k string) uint64 {
	a.t.Helper()
	n, err := strconv.ParseUint(a.str(k), 10, 64)
	if err != nil {
		a.t.Fatalf("%s: field %s: %v", a.where, k, err)
	}
	return n
}

func (a *argReader) float32(k string, def float32) float32 {
	a.t.Helper()
	if !a.has(k) {
		return def
	}
	f, err := strconv.ParseFloat(a.str(k), 32)
	if err != nil {
		a.t.Fatalf("%s: field %s: %v", a.where, k, err)
	}
	return float32(f)
}

// done fails on fields nobody read, so a typo cannot silently fall back to a
// default.
func (a *argReader) done() {
	a.t.Helper()
	for k := range a.args {
		if !a.used[k] {
			a.t.Fatalf("%s: unknown field %q", a.where, k)
		}
	}
}

type cacheEntry struct {
	length int
	err    string
}

type pageEntry struct {
	ids []int32
	err string
}

// runCase executes one case and returns its dump.
func runCase(t *testing.T, d *datadriven.TestData) string {
	t.Helper()
	cmd := strings.Fields(d.FullCmd())
	where := d.Pos
	if cmd[0] != "run" {
		t.Fatalf("%s: unknown command %q", where, cmd[0])
	}
	a := newArgReader(t, where, cmd[1:])
	def := DefaultSchedulerParams()
	p := Params{
		Heads:        a.int("heads", 1),
		PageSize:     a.int("page", 64),
		MaxPositions: a.int("maxpos", 4096),
		PadTokensTo:  a.int("pad", 0),
		MaxPages:     a.int("maxpages", 0),
		Scheduler: SchedulerParams{
			QDeq:     a.float32("qdeq", def.QDeq),
			KVDeq:    a.float32("kvdeq", def.KVDeq),
			QScaling: a.float32("qscaling", def.QScaling),
			OScale:   a.float32("oscale", def.OScale),
		},
	}
	a.done()

	var reqs []Request
	cache := map[uint64]cacheEntry{}
	pages := map[uint64]pageEntry{}
	var input []string
	if d.Input != "" {
		input = strings.Split(d.Input, "\n")
	}
	for k, in := range input {
		f := strings.Fields(in)
		if len(f) == 0 {
			t.Fatalf("%s: blank input line %d", where, k+1)
		}
		w := fmt.Sprintf("%s (input line %d)", where, k+1)
		r := newArgReader(t, w, f[1:])
		switch f[0] {
		case "req":
			req := Request{Seq: r.uint64("seq"), NewTokens: r.int("new", 0), MTP: r.int("mtp", 0)}
			switch ph := r.str("phase"); ph {
			case "bogus":
				req.Phase = Phase(7)
			default:
				var err error
				if req.Phase, err = ParsePhase(ph); err != nil {
					t.Fatalf("%s: %v", w, err)
				}
			}
			reqs = append(reqs, req)
		case "cache":
			seq := r.uint64("seq")
			e := cacheEntry{length: r.int("len", 0)}
			if r.has("err") {
				e.err = r.str("err")
			}
			cache[seq] = e
		case "pages":
			seq := r.uint64("seq")
			var e pageEntry
			if r.has("err") {
				e.err = r.str("err")
			}
			if r.has("ids") {
				for _, s := range strings.Split(r.str("ids"), ",") {
					if s == "" {
						continue
					}
					n, err := strconv.ParseInt(s, 10, 32)
					if err != nil {
						t.Fatalf("%s: ids: %v", w, err)
					}
					e.ids = append(e.ids, int32(n))
				}
			}
			pages[seq] = e
		default:
			t.Fatalf("%s: unknown directive %q", w, f[0])
		}
		r.done()
	}

	var lookups []uint64
	lookup := func(seq uint64) (int, bool, error) {
		lookups = append(lookups, seq)
		e, ok := cache[seq]
		if !ok {
			return 0, false, nil
		}
		if e.err != "" {
			return 0, true, fmt.Errorf("%s: %w", e.err, errLookupFailed)
		}
		return e.length, true, nil
	}
	blockTable := func(seq uint64) ([]int32, error) {
		e := pages[seq]
		if e.err != "" {
			return nil, fmt.Errorf("%s: %w", e.err, errBlockTableFailed)
		}
		return e.ids, nil
	}

	var out strings.Builder
	plan, err := NewPlan(reqs, lookup, p)
	if err != nil {
		writeError(&out, err)
		return out.String()
	}
	// NewPlan must consult the cache once per request, in batch order.
	if len(lookups) != len(reqs) {
		t.Errorf("%s: %d lookups for %d requests", where, len(lookups), len(reqs))
	}
	for i := range lookups {
		if lookups[i] != reqs[i].Seq {
			t.Errorf("%s: lookup %d was seq %d, want %d", where, i, lookups[i], reqs[i].Seq)
		}
	}
	fmt.Fprint(&out, "needs:")
	for _, n := range plan.Needs() {
		fmt.Fprintf(&out, " %d:%d", n.Seq, n.Length)
		if n.Create {
			fmt.Fprint(&out, "+create")
		}
	}
	fmt.Fprintln(&out)
	m, err := plan.Build(blockTable)
	if err != nil {
		writeError(&out, err)
		return out.String()
	}
	checkRowConsistency(t, where, m)
	dumpMetadata(&out, m)
	return out.String()
}

func writeError(out *strings.Builder, err error) {
	fmt.Fprintf(out, "error: %v\n", err)
	for _, s := range []struct {
		name string
		err  error
	}{
		{"ErrUnknownSequence", kvcache.ErrUnknownSequence},
		{"ErrPositionOutOfRange", kvcache.ErrPositionOutOfRange},
		{"ErrTooManyTokens", ErrTooManyTokens},
		{"errLookupFailed", errLookupFailed},
		{"errBlockTableFailed", errBlockTableFailed},
	} {
		if errors.Is(err, s.err) {
			fmt.Fprintf(out, "is: %s\n", s.name)
		}
	}
}

func joinInts[T int32 | int64 | uint64](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatInt(int64(x), 10)
	}
	return strings.Join(s, " ")
}

func f32(v float32) string {
	return fmt.Sprintf("%s(%#08x)", strconv.FormatFloat(float64(v), 'g', -1, 32), math.Float32bits(v))
}

func dumpMetadata(out *strings.Builder, m *Metadata) {
	fmt.Fprintf(out, "seqs=%d ctx=%d gen=%d ctx_tokens=%d gen_tokens=%d tokens=%d padded=%d gen_seq_len=%d heads=%d page=%d\n",
		m.NumSeqs, m.NumCtx, m.NumGen, m.CtxTokens, m.GenTokens, m.Tokens, m.PaddedTokens, m.GenSeqLen, m.Heads, m.PageSize)
	fmt.Fprintf(out, "seq: %s\n", joinInts(m.Seqs))
	fmt.Fprintf(out, "q_len: %s\n", joinInts(m.QLen))
	fmt.Fprintf(out, "kv_len: %s\n", joinInts(m.KVLen))
	fmt.Fprintf(out, "cached: %s\n", joinInts(m.Cached))
	fmt.Fprintf(out, "cu_q: %s\n", joinInts(m.CuQ))
	fmt.Fprintf(out, "cu_kv: %s\n", joinInts(m.CuKV))
	fmt.Fprintf(out, "cu_q_rows: %s\n", joinInts(m.CuQRows))
	fmt.Fprintf(out, "block_tables max_pages=%d:\n", m.MaxPages)
	for b := range m.NumSeqs {
		fmt.Fprintf(out, "  %d: %s\n", b, joinInts(m.BlockTables[b*m.MaxPages:(b+1)*m.MaxPages]))
	}
	fmt.Fprintf(out, "scheduler: tile_counter=%d bmm1=%s,%s bmm2=%s\n",
		m.Scheduler.TileCounter, f32(m.Scheduler.BMM1[0]), f32(m.Scheduler.BMM1[1]), f32(m.Scheduler.BMM2))
	fmt.Fprintln(out, "rows:")
	for t := range m.PaddedTokens {
		b, pos, ok := m.Row(t)
		if !ok {
			fmt.Fprintf(out, "  %d: pad slot=%d\n", t, m.Slot(t))
			continue
		}
		fmt.Fprintf(out, "  %d: b=%d pos=%d slot=%d\n", t, b, pos, m.Slot(t))
	}
}

// checkRowConsistency compares the bulk Positions/Slots with Row/Slot.
func checkRowConsistency(t *testing.T, where string, m *Metadata) {
	t.Helper()
	positions, slots := m.Positions(), m.Slots()
	if len(positions) != m.PaddedTokens || len(slots) != m.PaddedTokens {
		t.Fatalf("%s: Positions %d, Slots %d rows, want %d", where, len(positions), len(slots), m.PaddedTokens)
	}
	for r := range m.PaddedTokens {
		_, pos, ok := m.Row(r)
		if !ok {
			pos = 0
		}
		if int(positions[r]) != pos || slots[r] != m.Slot(r) {
			t.Errorf("%s: row %d: Positions %d Slots %d, Row/Slot give %d %d", where, r, positions[r], slots[r], pos, m.Slot(r))
		}
	}
}

func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no testdata/*.txt files")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			cases := 0
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				cases++
				return runCase(t, d)
			})
			if cases == 0 {
				t.Fatalf("%s: no cases", path)
			}
		})
	}
}
