package main

import (
	"fmt"
	"github.com/dsv4mla/prologue/engine"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dsv4mla/prologue/engine/replay"
)

func dur(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond))
}

// writeIteration prints one trace line's result.
func writeIteration(w io.Writer, ir *replay.IterationReport) {
	if !ir.Batch {
		fmt.Fprintf(w, "line %4d  finish %v  free %d pages\n", ir.Line, ir.Finished, ir.FreePages)
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "iter %4d line %4d %-10s ctx %5d tok/%2d seq  gen %4d tok/%2d seq mtp %d  launches ctx_kv=%d ctx_q=%d gen_kv=%d gen_q=%d  wall %s",
		ir.Index, ir.Line, ir.Kind(), ir.ContextTokens, ir.ContextSeqs, ir.GenerationTokens, ir.GenerationSeqs, ir.MTP,
		ir.Launches.ContextKV, ir.Launches.ContextQ, ir.Launches.GenerationKV, ir.Launches.GenerationQ, dur(ir.WallNS))
	if ir.HasDevice {
		fmt.Fprintf(&b, "  device %s", dur(ir.DeviceNS))
	}
	if ir.Rows != ir.Tokens() {
		fmt.Fprintf(&b, "  rows %d", ir.Rows)
	}
	fmt.Fprintf(&b, "  free %d", ir.FreePages)
	if len(ir.Finished) > 0 {
		fmt.Fprintf(&b, "  finish %v", ir.Finished)
	}
	if ir.Verified {
		b.WriteString("  verified")
	}
	for _, d := range ir.Dumps {
		fmt.Fprintf(&b, "  dump %s", d)
	}
	fmt.Fprintln(w, b.String())
}

// writeSummary prints the replay's totals.
func writeSummary(w io.Writer, rep *replay.Report, traceName string) {
	s := rep.Summary
	var kinds []string
	for _, k := range s.ByKind {
		kinds = append(kinds, fmt.Sprintf("%d %s", k.Iterations, k.Kind))
	}
	fmt.Fprintf(w, "\nreplayed %s: %d lines, %d iterations (%s)\n", traceName, s.Lines, s.Iterations, strings.Join(kinds, ", "))
	fmt.Fprintf(w, "engine:   %s backend, %s, %d layers, %d heads, %s cache (%d pages of %d tokens), Q %s\n",
		rep.Backend, rep.Model, rep.Layers, rep.Heads, rep.CacheFormat, rep.Pages, rep.PageSize, rep.QFormat)
	fmt.Fprintf(w, "tokens:   context %d, generation %d, total %d; accepted %d (%d MTP drafts rejected)\n", s.ContextTokens, s.GenerationTokens,
		s.ContextTokens+s.GenerationTokens, s.AcceptedTokens, s.ContextTokens+s.GenerationTokens-s.AcceptedTokens)
	if s.TopKSelected > 0 {
		fmt.Fprintf(w, "top-k:    %d indexer entries selected (over the token rows of the ratio-4 layers)\n", s.TopKSelected)
	}
	fmt.Fprintf(w, "launches: context KV %d, context Q %d, generation KV %d, generation Q %d, total %d\n",
		s.Launches.ContextKV, s.Launches.ContextQ, s.Launches.GenerationKV, s.Launches.GenerationQ, s.Launches.Total())
	fmt.Fprintf(w, "wall:     %s total; per iteration p50 %s, p99 %s, max %s; %.0f tokens/s, %.0f accepted tokens/s\n",
		dur(s.WallNS), dur(s.WallP50NS), dur(s.WallP99NS), dur(s.WallMaxNS), s.TokensPerSecond, s.AcceptedPerSecond)
	if s.HasDevice {
		fmt.Fprintf(w, "device:   %s total\n", dur(s.DeviceNS))
	}
	window := "no window"
	if rep.Window > 0 {
		window = fmt.Sprintf("window %d tokens", rep.Window)
	}
	fmt.Fprintf(w, "cache:    fewest free pages %d of %d (%s); %d sequences finished\n", s.MinFreePages, rep.Pages, window, s.Finished)
	for _, p := range rep.Pools {
		if p.Slots { // counted in sequences: the rings also keep a slot for each chunk a batch can move
			fmt.Fprintf(w, "pool %-9s %d layers x state slots of %s for %d sequences; %d free at the end\n", p.Name+":", p.Layers,
				engine.FormatBytes(int64(p.PageBytes)), p.Pages, p.Free)
			continue
		}
		fmt.Fprintf(w, "pool %-9s %d layers x %d pages of %s (%s per layer); %d free at the end\n", p.Name+":", p.Layers, p.Pages,
			engine.FormatBytes(int64(p.PageBytes)), engine.FormatBytes(int64(p.Pages)*int64(p.PageBytes)), p.Free)
	}
	for _, m := range rep.SequenceMemory {
		if m.Length == s.LongestSequence && m.Length != 1<<10 && m.Length != 128<<10 && m.Length != 1<<20 {
			continue // the longest sequence's figure is printed last, once
		}
		writeSequenceMemory(w, "sequence at", m)
	}
	for _, m := range rep.SequenceMemory {
		if m.Length == s.LongestSequence {
			writeSequenceMemory(w, "longest sequence:", m)
			break
		}
	}
	if rep.Verify {
		fmt.Fprintf(w, "verify:   %d iterations byte-identical to the cpu reference (Q output after every layer, every cache page written, every compressed pool)\n", s.Verified)
	}
}

// writeSequenceMemory prints what one sequence of m.Length tokens holds.
func writeSequenceMemory(w io.Writer, label string, m engine.SequenceMemory) {
	parts := []string{"SWA " + engine.FormatBytes(m.SWA)}
	for _, r := range []int{4, 128} {
		if b, ok := m.Ratio[r]; ok {
			parts = append(parts, fmt.Sprintf("ratio %d %s", r, engine.FormatBytes(b)))
		}
	}
	if m.State > 0 {
		parts = append(parts, "state "+engine.FormatBytes(m.State))
	}
	if m.Indexer+m.IndexerState > 0 {
		parts = append(parts, "indexer "+engine.FormatBytes(m.Indexer+m.IndexerState))
	}
	fmt.Fprintf(w, "%s %d tokens: %s (%s)\n", label, m.Length, engine.FormatBytes(m.Total()), strings.Join(parts, ", "))
}

// parseSelection parses "all" or a comma-separated list of numbers and
// ranges (0,5,10-12) into a predicate, and returns the largest number it
// names (-1 for all).
func parseSelection(flagName, spec string) (func(int) bool, int, error) {
	spec = strings.TrimSpace(spec)
	if spec == "all" {
		return func(int) bool { return true }, -1, nil
	}
	type span struct{ lo, hi int }
	var spans []span
	largest := -1
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, 0, fmt.Errorf("%s %q: %q is not a number >= 0 or a range a-b (or all)", flagName, spec, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, 0, fmt.Errorf("%s %q: range %q is not a-b with a <= b", flagName, spec, part)
			}
		}
		spans = append(spans, span{a, b})
		largest = max(largest, b)
	}
	return func(i int) bool {
		for _, s := range spans {
			if s.lo <= i && i <= s.hi {
				return true
			}
		}
		return false
	}, largest, nil
}
