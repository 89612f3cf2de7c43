package cuda

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// TestLaunchParamsPacking packs the KV and Q Params of launches on the CPU
// (fake device addresses, no GPU) and reads every field back through the
// abi table: each LayerArgs and Launch value lands in the field the kernels
// read, the config's eps included; the indexer query's Params (one packer
// with them) carry its own buffers and the same launch fields.
func TestLaunchParamsPacking(t *testing.T) {
	fake := func(addr, n int) *Buffer { return &Buffer{ptr: driver.DevicePtr(addr), n: n} }
	meta, err := mla.MetadataLayout(5, 7)
	require.NoError(t, err)
	meta.Buf = fake(0x100000, meta.Size)
	cfg := kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 32, NumPages: 11, KVScale: 0.75}
	a := &mla.LayerArgs{
		Heads: 3, Latent: fake(0x200000, 1<<20), LatentOffset: 2048, LatentStride: 1536,
		QIn: fake(0x300000, 1<<20), QOut: fake(0x400000, 1<<20), QFormat: mla.QFP8, QScale: 1.25,
		KVWeight: fake(0x500000, 2048), Eps: 1e-5, Rope: fake(0x600000, 1<<20), RopePositions: 999,
		Cache: fake(0x700000, cfg.PoolBytes()), CacheConfig: cfg, Meta: meta,
		Scheduler: metadata.SchedulerParams{QDeq: 1.5, KVDeq: 2.5, QScaling: 3.5, OScale: 4.5},
	}
	for _, l := range []mla.Launch{
		{Phase: metadata.Context, RowBegin: 0, Rows: 9, ValidRows: 9, SeqBegin: 0, NumSeqs: 2, WriteScheduler: true},
		{Phase: metadata.Generation, RowBegin: 9, Rows: 16, ValidRows: 12, SeqBegin: 2, NumSeqs: 3, SeqLen: 4},
		{Phase: metadata.Generation, Rows: 16, ValidRows: 9, NumSeqs: 3, SeqLen: 3, FromHeader: true},
	} {
		kv, err := kvParams(make([]byte, abi.Params.Size()), l, a)
		require.NoError(t, err)
		q, err := qParams(make([]byte, abi.Params.Size()), l, a)
		require.NoError(t, err)
		require.Len(t, kv, abi.Params.Size())
		require.Len(t, q, abi.Params.Size())
		log2 := int32(-1)
		if l.SeqLen == 4 {
			log2 = 2
		}
		sched := uint64(0)
		if l.WriteScheduler {
			sched = uint64(0x100000 + meta.OffScheduler)
		}
		b2i := func(v bool) uint64 {
			if v {
				return 1
			}
			return 0
		}
		f := func(v float32) uint64 { return uint64(math.Float32bits(v)) }
		i := func(v int32) uint64 { return uint64(uint32(v)) }
		common := map[abi.FieldID]uint64{
			abi.ParamRope: 0x600000, abi.ParamCuQ: uint64(0x100000 + meta.OffCuQ), abi.ParamCached: uint64(0x100000 + meta.OffCached),
			abi.ParamKVLen: uint64(0x100000 + meta.OffKVLen), abi.ParamBlockTables: uint64(0x100000 + meta.OffBlockTables),
			abi.ParamSched: sched, abi.ParamHdr: uint64(0x100000 + meta.OffHeader),
			abi.ParamRowBegin: i(int32(l.RowBegin)), abi.ParamRows: i(int32(l.Rows)), abi.ParamValidRows: i(int32(l.ValidRows)),
			abi.ParamSeqBegin: i(int32(l.SeqBegin)), abi.ParamNumSeqs: i(int32(l.NumSeqs)), abi.ParamSeqLen: i(int32(l.SeqLen)),
			abi.ParamSeqLenLog2: i(log2), abi.ParamHeads: 3, abi.ParamRopePositions: 999, abi.ParamPageStride: 7,
			abi.ParamPageSizeLog2: 5, abi.ParamPageBytes: i(int32(cfg.PageBytes())), abi.ParamNumPages: 11,
			abi.ParamQDeq: f(1.5), abi.ParamKVDeq: f(2.5), abi.ParamQScaling: f(3.5), abi.ParamOScale: f(4.5),
			abi.ParamEps: f(1e-5), abi.ParamWriteSched: b2i(l.WriteScheduler), abi.ParamFromHdr: b2i(l.FromHeader),
		}
		for name, c := range map[string]struct {
			packed []byte
			own    map[abi.FieldID]uint64
		}{
			"KV": {kv, map[abi.FieldID]uint64{abi.ParamIn: 0x200000 + 2048, abi.ParamOut: 0x700000, abi.ParamWeight: 0x500000,
				abi.ParamInStride: 1536 * 2, abi.ParamScale: f(0.75)}},
			"Q": {q, map[abi.FieldID]uint64{abi.ParamIn: 0x300000, abi.ParamOut: 0x400000, abi.ParamWeight: 0,
				abi.ParamInStride: 1024, abi.ParamScale: f(1.25)}},
		} {
			for fid := range abi.Params.Fields {
				id := abi.FieldID(fid)
				want, ok := c.own[id]
				if !ok {
					want, ok = common[id]
				}
				require.True(t, ok, "test has no expectation for field %s", abi.Params.Fields[id].Name)
				require.Equal(t, want, abi.Params.Raw(c.packed, id), "%s launch %v: field %s", name, l, abi.Params.Fields[id].Name)
			}
		}
		// The indexer query's launch: the same launch and metadata fields
		// (never the scheduler), its own buffers, 64 heads, no cache.
		ix := &mla.IndexerQueryArgs{
			Q: fake(0x800000, 1<<20), QOffset: 4096, QStride: 8192 + 16, W: fake(0x900000, 1<<20), WOffset: 64,
			QOut: fake(0xa00000, 1<<20), Rope: fake(0x600000, 1<<20), RopePositions: 777, Meta: meta,
		}
		packed, err := indexerParams(make([]byte, abi.Params.Size()), l, ix)
		require.NoError(t, err)
		own := map[abi.FieldID]uint64{
			abi.ParamIn: 0x800000 + 4096, abi.ParamOut: 0xa00000, abi.ParamWeight: 0x900000 + 64, abi.ParamInStride: (8192 + 16) * 2,
			abi.ParamSched: 0, abi.ParamWriteSched: 0, abi.ParamHeads: mla.IndexerHeads, abi.ParamRopePositions: 777,
			abi.ParamPageSizeLog2: 0, abi.ParamPageBytes: 0, abi.ParamNumPages: 0, abi.ParamScale: f(1),
			abi.ParamQDeq: 0, abi.ParamKVDeq: 0, abi.ParamQScaling: 0, abi.ParamOScale: 0, abi.ParamEps: 0,
		}
		for fid := range abi.Params.Fields {
			id := abi.FieldID(fid)
			want, ok := own[id]
			if !ok {
				want = common[id]
			}
			require.Equal(t, want, abi.Params.Raw(packed, id), "indexer launch %v: field %s", l, abi.Params.Fields[id].Name)
		}
	}
}

// TestDirectGrid: the direct path's grid has a warp for every row (KV) or
// every DirectQRows rows (Q), as its kernels do not loop, and at least one
// block.
func TestDirectGrid(t *testing.T) {
	for _, c := range []struct{ warps, n, perWarp, blocks int }{
		{4, 8192, 2, 1024}, {4, 8192, 1, 2048}, {4, 128, 1, 32}, {4, 5, 1, 2}, {4, 1, 1, 1}, {4, 0, 1, 1},
		{3, 7, 1, 3}, {1, 9, 1, 9}, {32, 33, 1, 2}, {3, 7, 3, 1}, {1, 7, 3, 3}, {2, 16384, 4, 2048},
	} {
		grid, block := directGrid(c.n, c.perWarp, c.warps)
		require.Equal(t, driver.Dim3{uint32(c.blocks), 1, 1}, grid, "%d rows, %d a warp, %d warps a block", c.n, c.perWarp, c.warps)
		require.Equal(t, driver.Dim3{uint32(32 * c.warps), 1, 1}, block)
		require.GreaterOrEqual(t, c.blocks*c.warps*c.perWarp, c.n)
	}
}
