package cudatune

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDefaults(t *testing.T) {
	// The H200's shapes, as they were before they moved into SM90.
	h200 := Knobs{Warps: 8, KVDepth: 4, QDepth: 4, QChunk: 8, BlocksPerSM: 2,
		DirectMaxRows: 1 << 19, DirectMaxRowsBF16: math.MaxInt32, DirectMinRows: 1, DirectWarps: 4, DirectHalfBlockRows: 8192, DirectQRows: 2, DirectMinBlocks: 1,
		BF16MMAMaxRows: -1, BF16MMADepth: 2, BF16MMAReduce: 1, BF16MMAWarpRows: 16, IndexerKeys: IndexerKeysFused, IndexerQuery: IndexerQueryStream, IndexerQueryWideMinRows: -1, IndexerQueryLaneMinRows: -1, IndexerStream: IndexerStreamAux, CuBLASLtSplitK: CuBLASLtSplitKAny,
		TopKSelectNarrowMinRows: 1024, IndexerQueryTokBlocksPerSM: 2, IndexerQueryTokMinRows: 4096}
	require.Equal(t, h200, Knobs{}.Defaults())
	require.Equal(t, h200, SM90.Knobs)
	set := Knobs{Warps: 3, KVDepth: 1, QDepth: 5, QChunk: 3, BlocksPerSM: 2, MaxBlocks: 1, DirectMaxRows: 7, DirectMaxRowsBF16: 8, DirectMinRows: 2, DirectWarps: 2, DirectHalfBlockRows: 5,
		DirectQRows: 3, DirectMinBlocks: 6, BF16MMAMaxRows: 9, BF16MMADepth: 8, BF16MMABlocksPerSM: 3, BF16MMAReduce: 2, BF16MMAWarpRows: 32, BF16MMAMaxSplits: 16, IndexerKeys: IndexerKeysSplit, IndexerQuery: IndexerQueryEarly, IndexerQueryWideMinRows: 512, IndexerQueryLaneMinRows: 2048, IndexerStream: IndexerStreamMain,
		TopKSelectNarrowMinRows: 300, CuBLASLtSplitK: CuBLASLtSplitKNone, WGMMAClusterSplits: 4, WGMMAMulticast: 2, IndexerQueryTokBlocksPerSM: 3, IndexerQueryTokMinRows: 700, SeparateLaunches: true, Verbose: true}
	require.Equal(t, set, set.Defaults(), "set fields stay")
	require.Equal(t, 8, Knobs{Warps: -1}.Defaults().Warps)
	require.Equal(t, -1, Knobs{DirectMaxRows: -5}.Defaults().DirectMaxRows, "negative: never direct")
	require.Equal(t, -1, Knobs{DirectMaxRowsBF16: -5}.Defaults().DirectMaxRowsBF16, "negative: never direct")
	require.Equal(t, -1, Knobs{BF16MMAMaxRows: -3}.Defaults().BF16MMAMaxRows, "negative: never the tensor-core kernel")
}

// TestCuBLASLtSplitKMask pins cublasLtReductionScheme_t's bits (cublasLt.h:
// NONE 0, INPLACE 1, COMPUTE_TYPE 2, OUTPUT_TYPE 4).
func TestCuBLASLtSplitKMask(t *testing.T) {
	for _, c := range []struct {
		s    CuBLASLtSplitK
		mask uint32
		set  bool
		name string
	}{{CuBLASLtSplitKAny, 0, false, "any"}, {CuBLASLtSplitKWorkspace, 6, true, "workspace"}, {CuBLASLtSplitKNone, 0, true, "none"}, {0, 0, false, "CuBLASLtSplitK(0)"}} {
		mask, set := c.s.ReductionMask()
		require.Equal(t, c.mask, mask, c.name)
		require.Equal(t, c.set, set, c.name)
		require.Equal(t, c.name, c.s.String())
	}
}

func TestDirect(t *testing.T) {
	cases := []struct {
		name           string
		maxRows, bf16  int // DirectMaxRows, DirectMaxRowsBF16
		minRows        int
		rows           int
		wantFP8, wantB bool // FP8 Q, bf16 Q
	}{
		{"default, V4-Flash b=32 MTP 3", 0, 0, 0, 32 * 4 * 64, true, true},
		{"default, at the threshold", 0, 0, 0, SM90.Knobs.DirectMaxRows, true, true},
		{"default, one past: FP8 Q streams", 0, 0, 0, SM90.Knobs.DirectMaxRows + 1, false, true},
		{"default, V4-Pro 64K context tokens", 0, 0, 0, 65536 * 128, false, true},
		{"default, at the minimum", 0, 0, 0, SM90.Knobs.DirectMinRows, true, true},
		{"default, one below the minimum", 0, 0, 0, SM90.Knobs.DirectMinRows - 1, false, false},
		{"at the threshold", 98, 98, 1, 98, true, true},
		{"one past the threshold", 98, 98, 1, 99, false, false},
		{"thresholds apart", 98, 50, 1, 60, true, false},
		{"one row", 1, 1, 1, 1, true, true},
		{"off", -1, -1, 1, 1, false, false},
		{"FP8 off", -1, 0, 1, 1, false, true},
		{"bf16 off", 0, -1, 1, 1, true, false},
		{"off, no rows", -1, -1, 1, 0, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := Knobs{DirectMaxRows: c.maxRows, DirectMaxRowsBF16: c.bf16, DirectMinRows: c.minRows}.Defaults()
			require.Equal(t, c.wantFP8, k.Direct(c.rows, false), "FP8 Q")
			require.Equal(t, c.wantB, k.Direct(c.rows, true), "bf16 Q")
		})
	}
}

func TestDirectBlockWarps(t *testing.T) {
	cases := []struct {
		name          string
		warps, half   int
		rows, wantOut int
	}{
		{"default, V4-Flash b=32 MTP 3 (one wave)", 0, 0, 32 * 4 * 64, 4},
		{"default, V4-Pro b=32 MTP 3 (two waves)", 0, 0, 32 * 4 * 128, 2},
		{"default, at the threshold", 0, 0, SM90.Knobs.DirectHalfBlockRows, 4},
		{"default, one past", 0, 0, SM90.Knobs.DirectHalfBlockRows + 1, 2},
		{"odd warps round down", 3, 10, 11, 1},
		{"one warp stays one", 1, 10, 11, 1},
		{"never", 4, -1, 1 << 30, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k := Knobs{DirectWarps: c.warps, DirectHalfBlockRows: c.half}.Defaults()
			require.Equal(t, c.wantOut, k.DirectBlockWarps(c.rows))
		})
	}
}

// TestForDevice: a device's reported resources replace the table's, the
// choices stay the measured ones; an H200's report gives SM90 itself, and
// another architecture is named as borrowing sm_90's choices.
func TestForDevice(t *testing.T) {
	require.Equal(t, SM90, ForDevice(9, 0, Resources{SMs: 132, SharedPerBlockOptin: 227 << 10, SharedPerSM: 228 << 10, RegistersPerSM: 65536, L2Bytes: 50 << 20}))
	require.Equal(t, SM90, ForDevice(9, 0, Resources{}), "nothing reported: the table")
	require.Equal(t, 264, SM90.CompressStoreBlocksPerSM*SM90.SMs, "compress_step's ring-store blocks, as before the move")
	a := ForDevice(9, 0, Resources{SMs: 114, SharedPerBlockOptin: 200 << 10, SharedPerSM: 201 << 10, RegistersPerSM: 1 << 15, L2Bytes: 60 << 20})
	require.Equal(t, Resources{SMs: 114, SharedPerBlockOptin: 200 << 10, SharedPerSM: 201 << 10, RegistersPerSM: 1 << 15, L2Bytes: 60 << 20}, a.Resources)
	require.Equal(t, SM90.FP8, a.FP8)
	require.Equal(t, SM90.Knobs, a.Knobs)
	b := ForDevice(8, 9, Resources{SMs: 128, SharedPerBlockOptin: 99 << 10})
	require.Equal(t, [2]int{8, 9}, [2]int{b.Major, b.Minor})
	require.Contains(t, b.Name, "sm_89")
	require.Contains(t, b.Name, SM90.Name)
	require.Equal(t, SM90.L2Bytes, b.L2Bytes)
	require.Empty(t, b.FP8.WGMMA.TokenTiles, "no sm_90a kernel off compute capability 9.0")
	require.False(t, b.FP8.WGMMA.Chosen(1, 128))
	require.Empty(t, ForDevice(10, 0, Resources{}).FP8.WGMMA.TokenTiles)
}

// TestWGMMAChosen: the wgmma kernel is chosen by its rules only: on SM90
// the measured shapes (V4-Flash's [wq_a; wkv] up to 32 rows, V4-Pro's up
// to 32, the indexer's wq_b up to 8, the main wq_b up to 32), each rule
// naming its measurement.
func TestWGMMAChosen(t *testing.T) {
	for _, c := range []struct {
		m, n int
		want bool
	}{
		{1, 1536, true}, {32, 1536, true}, {33, 1536, false}, {128, 1536, false}, {512, 1536, false},
		{1, 2048, true}, {32, 2048, true}, {33, 2048, false}, {128, 2048, false},
		{1, 8192, true}, {8, 8192, true}, {9, 8192, false}, {128, 8192, false},
		{1, 32768, true}, {32, 32768, true}, {33, 32768, false}, {128, 65536, false}, {4096, 65536, false},
	} {
		require.Equal(t, c.want, SM90.FP8.WGMMA.Chosen(c.m, c.n), "m %d n %d", c.m, c.n)
	}
	for _, r := range SM90.FP8.WGMMA.Use {
		require.Contains(t, r.Source, "bench/results/", "rule %+v names its measurement", r)
	}
	a := WGMMAArch{TokenTiles: []int{8}, Use: []OwnRule{{MaxN: 4096, MaxM: 64}, {MaxN: math.MaxInt, MaxM: 128}}}
	for _, c := range []struct {
		m, n int
		want bool
	}{{64, 4096, true}, {65, 4096, false}, {128, 4097, true}, {129, 32768, false}, {1, 128, true}} {
		require.Equal(t, c.want, a.Chosen(c.m, c.n), "m %d n %d", c.m, c.n)
	}
	a.TokenTiles = nil
	require.False(t, a.Chosen(1, 128), "no kernels: never chosen")
}

// TestWGMMAKernelFor: the rules of one MaxN are N's, tried in order by M
// (a wider N's rule never takes a narrower N's rows), each naming its
// kernel family (none: the wide one).
func TestWGMMAKernelFor(t *testing.T) {
	a := WGMMAArch{TokenTiles: []int{8}, Use: []OwnRule{
		{MaxN: 1536, MaxM: 32}, {MaxN: 1536, MaxM: 128, Kernel: WGMMANarrowPipe},
		{MaxN: 8192, MaxM: 512, Kernel: WGMMANarrow}, {MaxN: math.MaxInt, MaxM: 32}}}
	for _, c := range []struct {
		m, n int
		want WGMMAKernel
	}{
		{1, 1536, WGMMAWide}, {32, 1536, WGMMAWide}, {33, 1536, WGMMANarrowPipe}, {128, 1024, WGMMANarrowPipe},
		{129, 1536, 0}, {129, 2048, WGMMANarrow}, {512, 8192, WGMMANarrow}, {513, 8192, 0},
		{32, 32768, WGMMAWide}, {33, 32768, 0},
	} {
		require.Equal(t, c.want, a.KernelFor(c.m, c.n), "m %d n %d", c.m, c.n)
		require.Equal(t, c.want != 0, a.Chosen(c.m, c.n), "m %d n %d", c.m, c.n)
	}
	require.Equal(t, "narrow-pipe", WGMMANarrowPipe.String())
}

// TestOwnKernel: the measured FP8 GEMM choice by shape (the own kernel up
// to 32 rows for N up to 4096, up to 8 above), and the rules' sources named.
func TestOwnKernel(t *testing.T) {
	for _, c := range []struct {
		m, n int
		own  bool
	}{
		{1, 32768, true}, {8, 32768, true}, {9, 32768, false}, {8, 4097, true}, {9, 4097, false},
		{32, 4096, true}, {33, 4096, false}, {32, 1536, true}, {33, 1536, false}, {512, 128, false},
	} {
		require.Equal(t, c.own, SM90.FP8.OwnKernel(c.m, c.n), "m %d n %d", c.m, c.n)
	}
	require.True(t, FP8GEMMArch{}.OwnKernel(4096, 4096), "no rule: the own kernel")
	for _, r := range SM90.FP8.Own {
		require.Contains(t, r.Source, "bench/results/")
	}
}

func TestIndexerQueryAt(t *testing.T) {
	for _, c := range []struct {
		name  string
		k     Knobs
		rows  int
		wantQ IndexerQuery
	}{
		{"default, b=1 MTP 3", Knobs{}, 4, IndexerQueryStream},
		{"default, b=32 MTP 3", Knobs{}, 128, IndexerQueryStream},
		{"default, prefill", Knobs{}, 16384, IndexerQueryTok},
		{"default, below the tok rule", Knobs{}, 4095, IndexerQueryStream},
		{"the wide rule over the default", Knobs{IndexerQueryWideMinRows: 128}, 128, IndexerQueryWide},
		{"named kernel", Knobs{IndexerQueryTokMinRows: -1, IndexerQuery: IndexerQueryEarly, IndexerQueryWideMinRows: -1}, 4096, IndexerQueryEarly},
		{"wide everywhere", Knobs{IndexerQuery: IndexerQueryWide, IndexerQueryWideMinRows: -1}, 4, IndexerQueryWide},
		{"below the threshold", Knobs{IndexerQuery: IndexerQueryLean, IndexerQueryWideMinRows: 512}, 511, IndexerQueryLean},
		{"at the threshold", Knobs{IndexerQuery: IndexerQueryLean, IndexerQueryWideMinRows: 512}, 512, IndexerQueryWide},
		{"negative: never", Knobs{IndexerQueryTokMinRows: -1, IndexerQuery: IndexerQueryLate, IndexerQueryWideMinRows: -7}, 1 << 20, IndexerQueryLate},
		{"stream everywhere", Knobs{IndexerQuery: IndexerQueryStream, IndexerQueryWideMinRows: -1, IndexerQueryTokMinRows: -1}, 1 << 14, IndexerQueryStream},
		{"below the lane threshold", Knobs{IndexerQueryLaneMinRows: 1024}, 1023, IndexerQueryStream},
		{"lane from its threshold", Knobs{IndexerQueryTokMinRows: -1, IndexerQueryLaneMinRows: 1024}, 1024, IndexerQueryLane},
		{"lane before the wide rule", Knobs{IndexerQueryTokMinRows: -1, IndexerQueryWideMinRows: 512, IndexerQueryLaneMinRows: 512}, 4096, IndexerQueryLane},
		{"lane negative: never", Knobs{IndexerQueryTokMinRows: -1, IndexerQueryLaneMinRows: -3}, 1 << 20, IndexerQueryStream},
		{"below the tok threshold", Knobs{IndexerQueryTokMinRows: 512}, 511, IndexerQueryStream},
		{"tok from its threshold", Knobs{IndexerQueryTokMinRows: 512}, 512, IndexerQueryTok},
		{"tok before the lane rule", Knobs{IndexerQueryLaneMinRows: 256, IndexerQueryTokMinRows: 512}, 4096, IndexerQueryTok},
		{"tok negative: never", Knobs{IndexerQueryTokMinRows: -1}, 1 << 20, IndexerQueryStream},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.wantQ, c.k.Defaults().IndexerQueryAt(c.rows))
		})
	}
}

func TestTopKSelectNarrowAt(t *testing.T) {
	for _, c := range []struct {
		name       string
		k          Knobs
		rows, keys int
		want       bool
	}{
		{"default, decode b=32 MTP 3 at 8K", Knobs{}, 128, 2048, false},
		{"default, prefill 16K", Knobs{}, 16384, 4096, true},
		{"default, prefill 16K with a page more", Knobs{}, 16384, 4160, true},
		{"below the threshold", Knobs{TopKSelectNarrowMinRows: 1024}, 1023, 4096, false},
		{"at the threshold", Knobs{TopKSelectNarrowMinRows: 1024}, 1024, 4096, true},
		{"prefill 16K", Knobs{TopKSelectNarrowMinRows: 1024}, 16384, TopKSelectNarrowMaxKeys, true},
		{"rows too long", Knobs{TopKSelectNarrowMinRows: 1024}, 16384, TopKSelectNarrowMaxKeys + 1, false},
		{"negative: never", Knobs{TopKSelectNarrowMinRows: -3}, 1 << 20, 64, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, c.k.Defaults().TopKSelectNarrowAt(c.rows, c.keys))
		})
	}
}
