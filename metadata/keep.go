package metadata

import "sync/atomic"

// RowKeeper remembers how the block-table rows of one reused Metadata were
// built (Plan.BuildKeeping), so that the next build over it keeps the rows
// whose page list did not change, and an uploader that holds the last
// build's rows may skip the kept ones (Kept). A decode loop's batch
// changes few rows a step: most sequences gain a page only every PageSize
// tokens. The zero RowKeeper has built nothing. Not safe for concurrent use.
type RowKeeper struct {
	keys     []rowKey // by row: the last successful build's, rewritten in place by the next
	rebuilt  []int32  // the rows of the last build not kept from build from, ascending
	mem      *int32   // the rows' memory (&BlockTables[0]) of the last build
	maxPages int      // their width
	build    uint64   // the last successful build's number; 0: none
	from     uint64   // the build before it, whose rows it kept
}

// rowKey is what a block-table row's contents follow from.
type rowKey struct {
	state        uint64 // the page list's state (0: unknown)
	seq          uint64
	need, behind int
}

// builds numbers the builds of every RowKeeper: a number names one build
// of one Metadata.
var builds atomic.Uint64

// canKeep reports whether rows of the last build are still in tables.
func (k *RowKeeper) canKeep(tables []int32, maxPages int) bool {
	return k.build != 0 && maxPages == k.maxPages && len(tables) > 0 && &tables[0] == k.mem
}

// begin starts a build of n rows: the keys, those of the last build's rows
// below n and zero (unknown) ones after them, and no row rebuilt yet.
func (k *RowKeeper) begin(n int) []rowKey {
	if old := len(k.keys); cap(k.keys) < n {
		k.keys = append(make([]rowKey, 0, n), k.keys...)[:n]
	} else {
		k.keys = k.keys[:n]
		if old < n {
			clear(k.keys[old:])
		}
	}
	k.rebuilt = k.rebuilt[:0]
	return k.keys
}

// done records a successful build into tables.
func (k *RowKeeper) done(tables []int32, maxPages int) {
	k.mem, k.maxPages = nil, maxPages
	if len(tables) > 0 {
		k.mem = &tables[0]
	}
	k.from, k.build = k.build, builds.Add(1)
}

// forget drops what k knew: the rows' memory holds an unfinished build.
func (k *RowKeeper) forget() {
	k.keys, k.rebuilt, k.build, k.from, k.mem = k.keys[:0], k.rebuilt[:0], 0, 0, nil
}

// Kept reports the last build: its number, the number of the build before
// it (0: none), its number of rows, and the rows it rebuilt, ascending:
// every other row holds what it held after build from (all of them when
// from is 0). An uploader whose copy is exactly build from's may skip the
// rows not rebuilt; any other must compare or copy them.
func (k *RowKeeper) Kept() (build, from uint64, rows int, rebuilt []int32) {
	return k.build, k.from, len(k.keys), k.rebuilt
}
