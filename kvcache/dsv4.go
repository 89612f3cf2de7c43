package kvcache

import (
	"fmt"
	"slices"

	"github.com/dsv4mla/prologue/numerics"
)

// DeepSeek-V4's cache model as a table (DESIGN.md sections 8 and 9): the
// sizes below appear nowhere else. Another model of the family is another
// table: DeepSeek-V4.1's compressed KV written by a source layer and read
// by the layers after it is a row whose Layers counts the source layers,
// with its own entry sizes.
const (
	// DSv4CompressedPageSize is the entries of one compressed page of any
	// ratio, and of one indexer page: a ratio-4 page covers 256 tokens, a
	// ratio-128 page 8192.
	DSv4CompressedPageSize = 64
	// DSv4CompressedFormat is the compressed entries' layout: section 3's
	// 584-byte fp8_ue8m0 row, pages padded as the SWA pages are.
	DSv4CompressedFormat = FormatFP8UE8M0
	// DSv4IndexerEntryBytes is one indexer key: 128 MXFP4 values as 64
	// bytes of nibbles, then the 4 scale bytes of its 32-value blocks.
	DSv4IndexerEntryBytes = numerics.MXFP4RowBytes
	// DSv4IndexerRatio is the ratio of the layers with an indexer.
	DSv4IndexerRatio = 4
)

// The rows' names (PoolUsage.Name) of a DSv4 layout.
const (
	DSv4SWA          = "swa"
	DSv4Indexer      = "indexer"
	DSv4IndexerState = "indexer-state"
)

// DSv4RatioPool is the name of the compressed pool of a ratio ("ratio-4"),
// DSv4StatePool that of its layers' compressor states ("state-4").
func DSv4RatioPool(ratio int) string { return fmt.Sprintf("ratio-%d", ratio) }
func DSv4StatePool(ratio int) string { return fmt.Sprintf("state-%d", ratio) }

// DSv4Pools sizes a DSv4 cache model.
type DSv4Pools struct {
	// SWA is the SWA page cache of every layer (Layers of them).
	SWA    Config
	Layers int
	// RatioLayers counts the layers of each compress ratio that have a
	// compressor, RatioPages their compressed pool's pages (every layer of
	// a ratio has a pool of that size; the block tables are the ratio's).
	RatioLayers, RatioPages map[int]int
	// StateBytes is one state slot of one layer of each ratio.
	StateBytes map[int]int64
	// Slots, Live and InPlace size the state slots (PoolSpec): one slot
	// index per live sequence in every compressed layer.
	Slots, Live, InPlace int
	// IndexerStateBytes > 0 adds the indexer of the ratio-4 layers: its
	// keys in 68-byte entries paged by the ratio-4 block table, and its
	// compressor's state slot of that many bytes.
	IndexerStateBytes int64
}

// DSv4Layout returns the table: the SWA pages; per ratio ascending its
// compressed pool; the indexer's keys; the state slots (the first ratio's
// row owns them, the others' and the indexer's share its indices).
func DSv4Layout(p DSv4Pools) Layout {
	l := Layout{{Name: DSv4SWA, Kind: PoolPositions, Layers: p.Layers, Cache: p.SWA}}
	var ratios []int
	for r, n := range p.RatioLayers {
		if n > 0 {
			ratios = append(ratios, r)
		}
	}
	slices.Sort(ratios)
	indexer := p.IndexerStateBytes > 0 && p.RatioLayers[DSv4IndexerRatio] > 0
	for _, r := range ratios {
		l = append(l, PoolSpec{Name: DSv4RatioPool(r), What: fmt.Sprintf("ratio-%d compressed pool", r), Kind: PoolEntries,
			Layers: p.RatioLayers[r], Ratio: r,
			Cache: Config{Format: DSv4CompressedFormat, PageSize: DSv4CompressedPageSize, NumPages: p.RatioPages[r]}})
		if r == DSv4IndexerRatio && indexer {
			l = append(l, PoolSpec{Name: DSv4Indexer, What: "indexer pool", Kind: PoolShared, Layers: p.RatioLayers[r],
				Owner: DSv4RatioPool(r), EntryBytes: DSv4IndexerEntryBytes})
		}
	}
	for i, r := range ratios {
		s := PoolSpec{Name: DSv4StatePool(r), Layers: p.RatioLayers[r], SlotBytes: p.StateBytes[r]}
		if i == 0 {
			s.What, s.Kind, s.Slots, s.Live, s.InPlace = "compressor state", PoolSlots, p.Slots, p.Live, p.InPlace
		} else {
			s.Kind, s.Owner = PoolShared, DSv4StatePool(ratios[0])
		}
		l = append(l, s)
	}
	if indexer {
		l = append(l, PoolSpec{Name: DSv4IndexerState, Kind: PoolShared, Layers: p.RatioLayers[DSv4IndexerRatio],
			Owner: DSv4StatePool(ratios[0]), SlotBytes: p.IndexerStateBytes})
	}
	return l
}
