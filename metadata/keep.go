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
	kept     []bool   // by row of the last build: kept from build from
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
// below n and zero (unknown) ones after them, and no row kept yet.
func (k *RowKeeper) begin(n int) (keys []rowKey, kept []bool) {
	if old := len(k.keys); cap(k.keys) < n {
		k.keys = append(make([]rowKey, 0, n), k.keys...)[:n]
	} else {
		k.keys = k.keys[:n]
		if old < n {
			clear(k.keys[old:])
		}
	}
	if cap(k.kept) < n {
		k.kept = make([]bool, n)
	}
	k.kept = k.kept[:n]
	clear(k.kept)
	return k.keys, k.kept
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
	k.keys, k.build, k.from, k.mem = k.keys[:0], 0, 0, nil
	clear(k.kept)
}

// Kept reports the last build: its number, the number of the build before
// it (0: none), and which of its rows it kept unchanged from that one
// (rows[b] true: row b holds what it held after build from). An uploader
// whose copy is exactly build from's may skip those rows; any other must
// compare or copy them.
func (k *RowKeeper) Kept() (build, from uint64, rows []bool) {
	return k.build, k.from, k.kept
}
