package kvcache

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"
)

// The files under testdata/ are github.com/cockroachdb/datadriven scripts
// (run with -rewrite to print the actual output into them; every rewritten
// expectation must then be checked by hand). Commands:
//
//	init page-size=P pages=N [format=F] [window=W]
//	                                       new cache; prints the counters
//	reserve NAME NEED...                   NEED is ID:LEN (NewLength LEN),
//	                                       ID:+N (committed length + N), with
//	                                       an optional :create suffix
//	commit NAME [ID:LEN...]                commit NAME, sequence ID ending at
//	                                       length LEN (CommitLengths); prints
//	                                       the counters and the named sequences
//	rollback NAME                          spend reservation NAME
//	finish ID | retire ID | lookup ID | table ID
//	slot ID POS...                         one line per position
//	split-slot SLOT...                     page and offset of raw slots
//	state                                  full dump of the bookkeeping
//	offsets format=F page-size=P off=K     layout numbers of one token
//
// After every command the harness checks the invariants, and after every
// refused mutation it checks that the full state dump did not change.
func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			st := &scriptState{reservations: map[string]*Reservation{}}
			datadriven.RunTest(t, file, func(t *testing.T, d *datadriven.TestData) string {
				return st.step(t, d)
			})
		})
	}
}

type scriptState struct {
	cache        *Cache
	reservations map[string]*Reservation
}

// step runs one command and checks the invariants after it.
func (st *scriptState) step(t *testing.T, d *datadriven.TestData) string {
	fields := strings.Fields(d.FullCmd())
	mutating := slices.Contains([]string{"reserve", "commit", "rollback", "finish", "retire"}, fields[0])
	var before string
	if st.cache != nil {
		before = dumpState(st.cache)
	}
	got, failed, err := st.run(fields)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	if st.cache == nil {
		return got
	}
	if err := st.cache.CheckInvariants(); err != nil {
		d.Fatalf(t, "%v", err)
	}
	if mutating && failed {
		if after := dumpState(st.cache); after != before {
			d.Fatalf(t, "refused %s changed the state\nbefore:\n%s\nafter:\n%s", d.Cmd, before, after)
		}
	}
	return got
}

// run executes one command. It returns the output, whether the cache refused
// the command, and an error only for a malformed script.
func (st *scriptState) run(fields []string) (out string, refused bool, err error) {
	cmd, args := fields[0], fields[1:]
	if cmd != "init" && cmd != "offsets" && st.cache == nil {
		return "", false, fmt.Errorf("%s before init", cmd)
	}
	refuse := func(err error) (string, bool, error) { return "error: " + err.Error(), true, nil }
	switch cmd {
	case "init":
		kv, err := keyValues(args)
		if err != nil {
			return "", false, err
		}
		cfg := Config{PageSize: atoiOr(kv["page-size"], -1), NumPages: atoiOr(kv["pages"], -1), KVScale: 1, Window: atoiOr(kv["window"], 0)}
		if s, ok := kv["format"]; ok {
			if cfg.Format, err = ParseFormat(s); err != nil {
				return "", false, err
			}
		}
		c, err := New(cfg)
		if err != nil {
			return refuse(err)
		}
		st.cache, st.reservations = c, map[string]*Reservation{}
		return counters(c), false, nil
	case "reserve":
		if len(args) < 1 {
			return "", false, fmt.Errorf("reserve needs a name")
		}
		var needs []Need
		for _, a := range args[1:] {
			n, err := st.parseNeed(a)
			if err != nil {
				return "", false, err
			}
			needs = append(needs, n)
		}
		r, err := st.cache.Reserve(needs)
		if err != nil {
			return refuse(err)
		}
		st.reservations[args[0]] = r
		var lines []string
		for _, n := range needs {
			lines = append(lines, describeSeq(n.ID, st.cache.seqs[n.ID]))
		}
		lines = append(lines, counters(st.cache))
		return strings.Join(lines, "\n"), false, nil
	case "commit", "rollback":
		if len(args) < 1 || st.reservations[args[0]] == nil || (cmd == "rollback" && len(args) != 1) {
			return "", false, fmt.Errorf("%s needs a known reservation name", cmd)
		}
		r := st.reservations[args[0]]
		var ids []uint64
		switch {
		case cmd == "rollback":
			err = r.Rollback()
		case len(args) == 1:
			err = r.Commit()
		default:
			lengths := map[uint64]int{}
			for _, a := range args[1:] {
				idStr, lenStr, ok := strings.Cut(a, ":")
				id, ierr := strconv.ParseUint(idStr, 10, 64)
				n, nerr := strconv.Atoi(lenStr)
				if !ok || ierr != nil || nerr != nil {
					return "", false, fmt.Errorf("commit length %q: want ID:LEN", a)
				}
				lengths[id] = n
				ids = append(ids, id)
			}
			err = r.CommitLengths(lengths)
		}
		if err != nil {
			return refuse(err)
		}
		var lines []string
		for _, id := range ids {
			lines = append(lines, describeSeq(id, st.cache.seqs[id]))
		}
		return strings.Join(append(lines, counters(st.cache)), "\n"), false, nil
	case "finish", "retire", "lookup", "table":
		if len(args) != 1 {
			return "", false, fmt.Errorf("%s needs one id", cmd)
		}
		id, err := strconv.ParseUint(args[0], 10, 64)
		if err != nil {
			return "", false, err
		}
		switch cmd {
		case "finish", "retire":
			f := st.cache.Finish
			if cmd == "retire" {
				f = st.cache.Retire
			}
			if err := f(id); err != nil {
				return refuse(err)
			}
			return counters(st.cache), false, nil
		case "lookup":
			n, err := st.cache.Lookup(id)
			if err != nil {
				return refuse(err)
			}
			return fmt.Sprintf("length %d", n), false, nil
		default:
			pages, err := st.cache.BlockTable(id)
			if err != nil {
				return refuse(err)
			}
			return fmt.Sprint(pages), false, nil
		}
	case "slot":
		if len(args) < 2 {
			return "", false, fmt.Errorf("slot needs an id and positions")
		}
		id, err := strconv.ParseUint(args[0], 10, 64)
		if err != nil {
			return "", false, err
		}
		var lines []string
		for _, a := range args[1:] {
			pos, err := strconv.Atoi(a)
			if err != nil {
				return "", false, err
			}
			s, err := st.cache.Slot(id, pos)
			if err != nil {
				lines = append(lines, fmt.Sprintf("pos %d: error: %v", pos, err))
				continue
			}
			lines = append(lines, fmt.Sprintf("pos %d: slot %d", pos, s))
		}
		return strings.Join(lines, "\n"), false, nil
	case "split-slot":
		var lines []string
		for _, a := range args {
			slot, err := strconv.ParseInt(a, 10, 64)
			if err != nil {
				return "", false, err
			}
			page, off, err := st.cache.Config().SplitSlot(slot)
			if err != nil {
				lines = append(lines, fmt.Sprintf("slot %d: error: %v", slot, err))
				continue
			}
			lines = append(lines, fmt.Sprintf("slot %d: page %d off %d", slot, page, off))
		}
		return strings.Join(lines, "\n"), false, nil
	case "state":
		return dumpState(st.cache), false, nil
	case "offsets":
		kv, err := keyValues(args)
		if err != nil {
			return "", false, err
		}
		f, err := ParseFormat(kv["format"])
		if err != nil {
			return "", false, err
		}
		p, off := atoiOr(kv["page-size"], -1), atoiOr(kv["off"], -1)
		return fmt.Sprintf("value=%d scale=%d token-bytes=%d page-bytes=%d",
			f.ValueOffset(p, off), f.ScaleOffset(p, off), f.BytesPerToken(), f.PageBytes(p)), false, nil
	}
	return "", false, fmt.Errorf("unknown command %q", cmd)
}

// parseNeed reads ID:LEN, ID:+N, either with an optional :create suffix.
func (st *scriptState) parseNeed(s string) (Need, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "create") {
		return Need{}, fmt.Errorf("need %q: want ID:LEN, ID:+N, optionally :create", s)
	}
	id, err := strconv.ParseUint(parts[0], 10, 64)
	if err != nil {
		return Need{}, fmt.Errorf("need %q: %v", s, err)
	}
	n := Need{ID: id, Create: len(parts) == 3}
	if rel, ok := strings.CutPrefix(parts[1], "+"); ok {
		d, err := strconv.Atoi(rel)
		if err != nil {
			return Need{}, fmt.Errorf("need %q: %v", s, err)
		}
		base := 0
		if seq, live := st.cache.seqs[id]; live && !n.Create {
			base = seq.length
		}
		n.NewLength = base + d
		return n, nil
	}
	if n.NewLength, err = strconv.Atoi(parts[1]); err != nil {
		return Need{}, fmt.Errorf("need %q: %v", s, err)
	}
	return n, nil
}

func keyValues(args []string) (map[string]string, error) {
	kv := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return nil, fmt.Errorf("argument %q is not key=value", a)
		}
		kv[k] = v
	}
	return kv, nil
}

func atoiOr(s string, def int) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return def
	}
	return n
}

func counters(c *Cache) string {
	return fmt.Sprintf("free=%d used=%d seqs=%d", c.FreePages(), c.UsedPages(), c.Sequences())
}

func describeSeq(id uint64, s *sequence) string {
	line := fmt.Sprintf("seq %d: len=%d reserved=%d pages=%v", id, s.length, s.reserved, s.pages)
	if s.pending != nil {
		line += " pending"
	}
	return line
}

// dumpState prints everything the cache holds, ids sorted; it reads the
// fields directly, so it takes the lock itself.
func dumpState(c *Cache) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := slices.Clone(c.free)
	slices.Reverse(next)
	lines := []string{fmt.Sprintf("free (next first): %v", next)}
	for _, id := range slices.Sorted(maps.Keys(c.seqs)) {
		lines = append(lines, describeSeq(id, c.seqs[id]))
	}
	if len(c.finished.runs) > 0 {
		lines = append(lines, fmt.Sprintf("finished: %v", &c.finished))
	}
	return strings.Join(lines, "\n")
}
