package kvcache

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// MaxFinishedRuns bounds the memory a Cache spends on remembering finished
// ids: about this many runs of consecutive finished ids (16 bytes each,
// 1 MiB, at most twice that with the slack of a growing slice) are kept.
//
// The rule: finished ids are remembered as runs of consecutive ids, so a
// server that numbers its sequences with a counter keeps about one run per
// live sequence (the gaps between finished ids are the live ones), however
// long it runs. A server that skips ids makes one run per finished id; past
// MaxFinishedRuns runs the cache merges runs across their smallest gaps
// (never across a live id) until half as many are left. A finished id is
// therefore refused forever (ErrFinishedSequence), and so is an id that was
// never used but lies inside a merged gap: memory stays bounded, and no id
// ever comes back. Only where more than MaxFinishedRuns/2 gaps each hold a
// live sequence does the cache keep more runs, one per such gap.
const MaxFinishedRuns = 1 << 16

// idRun is the inclusive range [lo, hi] of finished ids.
type idRun struct{ lo, hi uint64 }

// finishedSet is a sorted list of disjoint, non-adjacent runs of ids.
type finishedSet struct {
	runs []idRun
	// limit is the run count past which add compacts: MaxFinishedRuns, or
	// more after a compaction that live ids kept from reaching its target.
	limit int
}

// find returns the index of the first run with lo > id.
func (f *finishedSet) find(id uint64) int {
	i, _ := slices.BinarySearchFunc(f.runs, id, func(r idRun, id uint64) int {
		if r.lo <= id {
			return -1
		}
		return 1
	})
	return i
}

func (f *finishedSet) contains(id uint64) bool {
	i := f.find(id)
	return i > 0 && f.runs[i-1].hi >= id
}

// maxRuns is the most runs the set holds between two adds.
func (f *finishedSet) maxRuns() int { return max(f.limit, MaxFinishedRuns) }

// add records id, merging it with the runs it touches. Past maxRuns runs it
// compacts; live lists the live ids (in any order), whose gaps it keeps.
func (f *finishedSet) add(id uint64, live func() []uint64) {
	i := f.find(id)
	if i > 0 && f.runs[i-1].hi >= id {
		return
	}
	joinPrev := i > 0 && f.runs[i-1].hi+1 == id
	joinNext := i < len(f.runs) && id+1 == f.runs[i].lo // id < lo, so id+1 cannot wrap
	switch {
	case joinPrev && joinNext:
		f.runs[i-1].hi = f.runs[i].hi
		f.runs = slices.Delete(f.runs, i, i+1)
	case joinPrev:
		f.runs[i-1].hi = id
	case joinNext:
		f.runs[i].lo = id
	default:
		f.runs = slices.Insert(f.runs, i, idRun{id, id})
	}
	if len(f.runs) > f.maxRuns() {
		f.compact(live())
	}
	if cap(f.runs) > 4*len(f.runs)+64 {
		f.runs = slices.Clip(slices.Clone(f.runs)) // give memory back after a burst of merges
	}
}

// compact merges runs across their smallest gaps that hold no live id
// (ties: the lower gap first) until MaxFinishedRuns/2 runs are left, or
// every gap left holds a live id. It costs O(n log n) for n runs, once
// every MaxFinishedRuns/2 adds.
func (f *finishedSet) compact(live []uint64) {
	slices.Sort(live)
	type gap struct {
		size uint64
		at   int // the gap between runs[at] and runs[at+1]
	}
	gaps := make([]gap, 0, len(f.runs))
	for i := range len(f.runs) - 1 {
		lo, hi := f.runs[i].hi+1, f.runs[i+1].lo-1 // the gap's ids, inclusive
		j, _ := slices.BinarySearch(live, lo)
		if j < len(live) && live[j] <= hi {
			continue // a live id lies in it: merging would finish it
		}
		gaps = append(gaps, gap{hi - lo + 1, i})
	}
	slices.SortFunc(gaps, func(a, b gap) int {
		return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.at, b.at))
	})
	merge := make([]bool, len(f.runs))
	for _, g := range gaps[:min(len(gaps), max(0, len(f.runs)-MaxFinishedRuns/2))] {
		merge[g.at] = true
	}
	out := f.runs[:0]
	for i, r := range f.runs {
		if i > 0 && merge[i-1] {
			out[len(out)-1].hi = r.hi
			continue
		}
		out = append(out, r)
	}
	f.runs = out
	f.limit = len(f.runs) + MaxFinishedRuns/2
}

func (f *finishedSet) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i, r := range f.runs {
		if i > 0 {
			b.WriteByte(' ')
		}
		if r.lo == r.hi {
			fmt.Fprint(&b, r.lo)
		} else {
			fmt.Fprintf(&b, "%d-%d", r.lo, r.hi)
		}
	}
	b.WriteByte(']')
	return b.String()
}
