package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/internal/cudatune"
)

// This file is the one place that knows the CUDA backend's tuning options:
// when they move (or leave the production Options), only variant.options
// changes.

// variant is one kernel option set of --variant / --variants, written as
// space-separated words: warps=N kvd=N qd=N qchunk=N bpsm=N maxblocks=N (the
// streaming pipeline), direct=N directbf16=N dmin=N dwarps=N dhalf=N qrows=N dminb=N nodirect (the
// direct path: its largest launch in Q rows with FP8 Q and with bf16 Q, its smallest, warps a block, the
// largest launch in Q rows with whole blocks (larger: half), Q rows a warp,
// __launch_bounds__ minimum of blocks a multiprocessor, and off), ikeys=N iquery=N (the indexer's kernels:
// cudatune.IndexerKeys 1 split, 2 fused; cudatune.IndexerQuery 1 late, 2 early, 3 lean, 4 wide, 5 stream,
// 6 lane, 7 tok; iwide=N: the wide query kernel from N token rows on; ilane=N: the lane query kernel from N token
// rows on (before iwide's rule); istream=N: cudatune.IndexerStream 1 main, 2 the third
// stream; iqbpsm=N: the query's grid at most N blocks a multiprocessor;
// itok=N: indexer_query_tok from N token rows on; itokbpsm=N: its grid, N blocks a multiprocessor), tknarrow=N (the top-k select in 256-thread blocks from N rows on), ltsplitk=N (cuBLASLt's split-K
// reductions: cudatune.CuBLASLtSplitK 1 any, 2 through the workspace, 3 none), lth=N (the FP8 GEMMs on
// cuBLASLt run its heuristic's N-th result: cudatune.Knobs.CuBLASLtFP8Heuristic; lthbf=N the bf16 GEMMs), bfwg=N bfwgfin=N bfwgs=N
// bfwgt=N bfwgr=N bfwgpf=N (the compressor's bf16 projection GEMM on the sm_90a wgmma kernel up to N rows; its split K finished
// by cudatune.BF16WGMMAFinish 1 the reduction launch, 2 the unit's last block, 3 clusters; at most N
// splits; token tiles of at most N rows; a ring of at most N stages; 1: W prefetched into L2), nopdl
// separate, wgmma
// nowgmma wgcluster=N wgmc=N (every FP8 GEMM on the sm_90a wgmma kernel, or none; its split K finished
// by clusters of up to N blocks; clusters of N blocks sharing the activation tile), wgkernel=N (the
// wgmma kernel family of every GEMM it runs: cudatune.WGMMAKernel 1 wide, 2 narrow, 3 narrow-pipe, 4 wide-pipe),
// wgnarrow=N (GEMMs of at most 8192 outputs at up to 128 rows on wgmma family N), wgstages=N (the
// narrow families' deepest ring), wgchunks=N (the narrow planner's most token chunks), wgsplits=N (the most K
// splits, 1: none), wgwcast=N (clusters of up to N token-chunk blocks sharing the weight tile), wgsms=N
// (the wgmma GEMM planned for at most N multiprocessors). A zero
// number keeps the backend's default.
type variant struct {
	Name                    string // the text it was parsed from
	Warps, KVDepth, QDepth  int
	QChunk                  int
	BlocksPerSM, MaxBlocks  int
	DirectMaxRows           int
	DirectMaxRowsBF16       int
	DirectMinRows           int
	DirectWarps             int
	DirectHalfBlockRows     int
	DirectQRows             int
	DirectMinBlocks         int
	IndexerKeys             int
	IndexerQuery            int
	IndexerQueryWideMinRows int
	TopKSelectNarrowMinRows int
	IndexerQueryLaneMinRows int
	IndexerStream           int
	CuBLASLtSplitK          int
	CuBLASLtFP8Heuristic    int
	CuBLASLtBF16Heuristic   int
	IndexerQueryBlocksPerSM int
	IndexerQueryTokMinRows  int
	IndexerQueryTokBlocks   int
	BF16WGMMAMaxRows        int // the projection GEMM on the sm_90a wgmma kernel up to N rows
	BF16WGMMAFinish         int // its split K finished by 1 the reduction, 2 the last block, 3 clusters
	BF16WGMMAMaxSplits      int // its split K at most N ways
	BF16WGMMAMaxTile        int // its token tiles at most N rows
	BF16WGMMAMaxStages      int // its ring at most N stages
	BF16WGMMAL2Prefetch     int // 1: its W prefetched into L2 at the start
	NoDirect                bool
	NoPDL, SeparateLaunches bool
	WGMMA                   bool // every FP8 GEMM on the sm_90a wgmma kernel
	NoWGMMA                 bool // never the wgmma kernel
	WGMMAClusterSplits      int  // its split finish: clusters of up to N splits
	WGMMAMulticast          int  // clusters of N blocks sharing the activation tile
	WGMMAKernel             int  // the wgmma kernel family of every GEMM it runs
	WGMMANarrow             int  // the narrow GEMMs at up to 128 rows on that wgmma family
	WGMMANarrowStages       int  // the narrow families' deepest ring
	WGMMANarrowChunks       int  // the narrow planner's most token chunks
	WGMMAMaxSplits          int  // the wgmma GEMM's most K splits
	WGMMAWeightMulticast    int  // clusters of up to N token-chunk blocks sharing the weight tile
	WGMMAMaxSMs             int  // the wgmma GEMM planned for at most N multiprocessors
}

// field returns where key's value goes: a number or a switch (nil, nil for
// an unknown key).
func (v *variant) field(key string) (*int, *bool) {
	switch key {
	case "warps":
		return &v.Warps, nil
	case "kvd":
		return &v.KVDepth, nil
	case "qd":
		return &v.QDepth, nil
	case "qchunk":
		return &v.QChunk, nil
	case "bpsm":
		return &v.BlocksPerSM, nil
	case "maxblocks":
		return &v.MaxBlocks, nil
	case "direct":
		return &v.DirectMaxRows, nil
	case "directbf16":
		return &v.DirectMaxRowsBF16, nil
	case "dmin":
		return &v.DirectMinRows, nil
	case "dwarps":
		return &v.DirectWarps, nil
	case "dhalf":
		return &v.DirectHalfBlockRows, nil
	case "qrows":
		return &v.DirectQRows, nil
	case "dminb":
		return &v.DirectMinBlocks, nil
	case "ikeys":
		return &v.IndexerKeys, nil
	case "iquery":
		return &v.IndexerQuery, nil
	case "iwide":
		return &v.IndexerQueryWideMinRows, nil
	case "tknarrow":
		return &v.TopKSelectNarrowMinRows, nil
	case "ilane":
		return &v.IndexerQueryLaneMinRows, nil
	case "istream":
		return &v.IndexerStream, nil
	case "ltsplitk":
		return &v.CuBLASLtSplitK, nil
	case "lth":
		return &v.CuBLASLtFP8Heuristic, nil
	case "lthbf":
		return &v.CuBLASLtBF16Heuristic, nil
	case "iqbpsm":
		return &v.IndexerQueryBlocksPerSM, nil
	case "itok":
		return &v.IndexerQueryTokMinRows, nil
	case "itokbpsm":
		return &v.IndexerQueryTokBlocks, nil
	case "bfwg":
		return &v.BF16WGMMAMaxRows, nil
	case "bfwgfin":
		return &v.BF16WGMMAFinish, nil
	case "bfwgs":
		return &v.BF16WGMMAMaxSplits, nil
	case "bfwgt":
		return &v.BF16WGMMAMaxTile, nil
	case "bfwgr":
		return &v.BF16WGMMAMaxStages, nil
	case "bfwgpf":
		return &v.BF16WGMMAL2Prefetch, nil
	case "nodirect":
		return nil, &v.NoDirect
	case "nopdl":
		return nil, &v.NoPDL
	case "separate":
		return nil, &v.SeparateLaunches
	case "wgmma":
		return nil, &v.WGMMA
	case "nowgmma":
		return nil, &v.NoWGMMA
	case "wgcluster":
		return &v.WGMMAClusterSplits, nil
	case "wgmc":
		return &v.WGMMAMulticast, nil
	case "wgkernel":
		return &v.WGMMAKernel, nil
	case "wgnarrow":
		return &v.WGMMANarrow, nil
	case "wgstages":
		return &v.WGMMANarrowStages, nil
	case "wgchunks":
		return &v.WGMMANarrowChunks, nil
	case "wgsplits":
		return &v.WGMMAMaxSplits, nil
	case "wgwcast":
		return &v.WGMMAWeightMulticast, nil
	case "wgsms":
		return &v.WGMMAMaxSMs, nil
	}
	return nil, nil
}

// parseVariant reads one option set. Every word must be a known key, a
// number key needs "=N" with 0 <= N <= 1<<24 (direct=N reaches 64K tokens
// x 128 heads), a switch takes no value, and no key may repeat.
func parseVariant(text string) (variant, error) {
	v := variant{Name: strings.TrimSpace(text)}
	seen := map[string]bool{}
	for _, word := range strings.Fields(text) {
		key, val, hasVal := strings.Cut(word, "=")
		if seen[key] {
			return variant{}, fmt.Errorf("variant %q: option %q given twice", text, key)
		}
		seen[key] = true
		num, sw := v.field(key)
		if num != nil {
			if !hasVal || val == "" {
				return variant{}, fmt.Errorf("variant %q: option %q needs a number (%s=N)", text, key, key)
			}
			n, err := strconv.Atoi(val)
			if err != nil {
				return variant{}, fmt.Errorf("variant %q: option %s=%q is not a whole number", text, key, val)
			}
			if n < 0 || n > 1<<24 {
				return variant{}, fmt.Errorf("variant %q: option %s=%d is outside [0, %d]", text, key, n, 1<<24)
			}
			*num = n
			continue
		}
		if sw != nil {
			if hasVal {
				return variant{}, fmt.Errorf("variant %q: option %q takes no value (got %q)", text, key, val)
			}
			*sw = true
			continue
		}
		return variant{}, fmt.Errorf("variant %q: unknown option %q (known: warps=N kvd=N qd=N qchunk=N bpsm=N maxblocks=N direct=N directbf16=N dmin=N dwarps=N dhalf=N qrows=N dminb=N ikeys=N iquery=N iwide=N ilane=N istream=N tknarrow=N ltsplitk=N lth=N lthbf=N iqbpsm=N itok=N itokbpsm=N bfwg=N bfwgfin=N bfwgs=N bfwgt=N bfwgr=N bfwgpf=N nodirect nopdl separate wgmma nowgmma wgcluster=N wgmc=N wgkernel=N wgnarrow=N wgstages=N wgchunks=N wgsplits=N wgwcast=N wgsms=N)", text, key)
	}
	return v, nil
}

// parseVariants reads the ';'-separated --variants list; empty entries are
// refused so that a stray ';' does not time the defaults twice.
func parseVariants(list string) ([]variant, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var out []variant
	for i, text := range strings.Split(list, ";") {
		if strings.TrimSpace(text) == "" {
			return nil, fmt.Errorf("--variants %q: entry %d is empty", list, i+1)
		}
		v, err := parseVariant(text)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// options is the CUDA backend configuration of the variant: the user
// options and the launch-shape knobs (internal/cudatune).
func (v variant) options(verbose bool) (cuda.Options, cudatune.Knobs) {
	direct, directBF16 := v.DirectMaxRows, v.DirectMaxRowsBF16
	if v.NoDirect {
		direct, directBF16 = -1, -1
	}
	return cuda.Options{NoPDL: v.NoPDL, GEMMWGMMA: v.WGMMA, NoWGMMA: v.NoWGMMA}, cudatune.Knobs{
		WGMMAClusterSplits:         v.WGMMAClusterSplits,
		WGMMAMulticast:             v.WGMMAMulticast,
		WGMMAKernel:                cudatune.WGMMAKernel(v.WGMMAKernel),
		WGMMANarrow:                cudatune.WGMMAKernel(v.WGMMANarrow),
		WGMMANarrowStages:          v.WGMMANarrowStages,
		WGMMANarrowChunks:          v.WGMMANarrowChunks,
		WGMMAMaxSplits:             v.WGMMAMaxSplits,
		WGMMAWeightMulticast:       v.WGMMAWeightMulticast,
		WGMMAMaxSMs:                v.WGMMAMaxSMs,
		Warps:                      v.Warps,
		KVDepth:                    v.KVDepth,
		QDepth:                     v.QDepth,
		QChunk:                     v.QChunk,
		BlocksPerSM:                v.BlocksPerSM,
		MaxBlocks:                  v.MaxBlocks,
		DirectMaxRows:              direct,
		DirectMaxRowsBF16:          directBF16,
		DirectMinRows:              v.DirectMinRows,
		DirectWarps:                v.DirectWarps,
		DirectQRows:                v.DirectQRows,
		DirectHalfBlockRows:        v.DirectHalfBlockRows,
		DirectMinBlocks:            v.DirectMinBlocks,
		IndexerKeys:                cudatune.IndexerKeys(v.IndexerKeys),
		IndexerQuery:               cudatune.IndexerQuery(v.IndexerQuery),
		IndexerStream:              cudatune.IndexerStream(v.IndexerStream),
		CuBLASLtSplitK:             cudatune.CuBLASLtSplitK(v.CuBLASLtSplitK),
		CuBLASLtFP8Heuristic:       v.CuBLASLtFP8Heuristic,
		CuBLASLtBF16Heuristic:      v.CuBLASLtBF16Heuristic,
		IndexerQueryBlocksPerSM:    v.IndexerQueryBlocksPerSM,
		IndexerQueryTokMinRows:     v.IndexerQueryTokMinRows,
		IndexerQueryTokBlocksPerSM: v.IndexerQueryTokBlocks,
		BF16WGMMAMaxRows:           v.BF16WGMMAMaxRows,
		BF16WGMMAFinish:            v.BF16WGMMAFinish,
		BF16WGMMAMaxSplits:         v.BF16WGMMAMaxSplits,
		BF16WGMMAMaxTile:           v.BF16WGMMAMaxTile,
		BF16WGMMAMaxStages:         v.BF16WGMMAMaxStages,
		BF16WGMMAL2Prefetch:        v.BF16WGMMAL2Prefetch,
		IndexerQueryWideMinRows:    v.IndexerQueryWideMinRows,
		TopKSelectNarrowMinRows:    v.TopKSelectNarrowMinRows,
		IndexerQueryLaneMinRows:    v.IndexerQueryLaneMinRows,
		SeparateLaunches:           v.SeparateLaunches,
		Verbose:                    verbose,
	}
}
