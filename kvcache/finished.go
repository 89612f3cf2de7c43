package kvcache

import (
	"fmt"
	"slices"
	"strings"
)

// MaxFinishedRuns bounds the memory a Cache spends on remembering finished
// ids: at most this many runs of consecutive finished ids (16 bytes each,
// 1 MiB, at most twice that with the slack of a growing slice) are kept.
//
// The rule: finished ids are remembered as runs of consecutive ids, so a
// server that numbers its sequences with a counter keeps about one run per
// live sequence (the gaps between finished ids are the live ones), however
// long it runs. A server that skips ids makes one run per finished id; past
// MaxFinishedRuns runs the lowest run is forgotten, and its ids become
// unknown again (a context request may then create them anew). The newest
// MaxFinishedRuns runs are always refused.
const MaxFinishedRuns = 1 << 16

// idRun is the inclusive range [lo, hi] of finished ids.
type idRun struct{ lo, hi uint64 }

// finishedSet is a sorted list of disjoint, non-adjacent runs of ids.
type finishedSet struct {
	runs []idRun
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

// add records id, merging it with the runs it touches, then drops the
// lowest run while there are more than MaxFinishedRuns.
func (f *finishedSet) add(id uint64) {
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
	if len(f.runs) > MaxFinishedRuns {
		// Reslice rather than shift: the dropped runs go when append next
		// reallocates, which copies only the kept ones.
		f.runs = f.runs[len(f.runs)-MaxFinishedRuns:]
	}
	if cap(f.runs) > 4*len(f.runs)+64 {
		f.runs = slices.Clip(slices.Clone(f.runs)) // give memory back after a burst of gaps
	}
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
