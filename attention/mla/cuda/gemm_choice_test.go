package cuda

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

var updateChoices = flag.Bool("gemm.choices.update", false, "TestGEMMChoicesH200: rewrite testdata/gemm_choices_h200.txt")

// engineGEMM is one GEMM shape the engine issues for a model: N outputs
// from K inputs, FP8 (the chain's) or bf16 (the compressor's and the
// indexer's projections).
type engineGEMM struct {
	name string
	bf16 bool
	n, k int
}

// engineGEMMs lists the GEMMs the engine runs for V4-Flash and V4-Pro: the
// fused [wq_a; wkv] and wq_b (all heads, and half of them as one of two
// head-sharded GPUs), the indexer's wq_b, the compressor's [wkv; wgate] of
// both ratios, the indexer compressor's projection and weights_proj.
func engineGEMMs() []engineGEMM {
	var out []engineGEMM
	for _, m := range []struct {
		name string
		c    dsv4.Config
	}{{"flash", dsv4.Flash()}, {"pro", dsv4.Pro()}} {
		c := m.c
		out = append(out,
			engineGEMM{m.name + "/fused-a", false, c.QLoraRank + numerics.HeadDim, c.HiddenSize},
			engineGEMM{m.name + "/wq_b", false, c.NumHeads * numerics.HeadDim, c.QLoraRank},
			engineGEMM{m.name + "/wq_b-half-heads", false, c.NumHeads / 2 * numerics.HeadDim, c.QLoraRank},
			engineGEMM{m.name + "/indexer-wq_b", false, mla.IndexerHeads * mla.IndexerDim, c.QLoraRank},
			engineGEMM{m.name + "/compressor-r4", true, 2 * compressor.Overlap(4) * numerics.HeadDim, c.HiddenSize},
			engineGEMM{m.name + "/compressor-r128", true, 2 * compressor.Overlap(128) * numerics.HeadDim, c.HiddenSize},
			engineGEMM{m.name + "/indexer-projection", true, 2 * compressor.Overlap(kvcache.DSv4IndexerRatio) * mla.IndexerDim, c.HiddenSize},
			engineGEMM{m.name + "/indexer-weights_proj", true, mla.IndexerHeads, c.HiddenSize},
			// The ratio-4 layer's one projection GEMM since ab58d7f: the
			// three above in one weight (engine/indexer.go).
			engineGEMM{m.name + "/r4-projection", true, 2*compressor.Overlap(4)*numerics.HeadDim + 2*compressor.Overlap(kvcache.DSv4IndexerRatio)*mla.IndexerDim + mla.IndexerHeads, c.HiddenSize},
		)
	}
	return out
}

// gemmChoice describes what the backend chooses for an M-row GEMM of
// shape s on the H200 with the default knobs: the implementation and the
// own kernel's launch shape.
func gemmChoice(s engineGEMM, m int) string {
	a := cudatune.ForDevice(9, 0, cudatune.Resources{SMs: 132, SharedPerBlockOptin: 227 << 10, SharedPerSM: 228 << 10, RegistersPerSM: 65536, L2Bytes: 50 << 20}) // what an H200 reports
	if s.bf16 {
		if m <= a.Knobs.BF16MMAMaxRows && s.n%16 == 0 && s.k%bf16MMAStage == 0 {
			kn, err := bf16MMAKernelOf(a.Knobs.BF16MMADepth, a.Knobs.BF16MMAReduce, a.Knobs.BF16MMAWarpRows)
			if err != nil {
				return err.Error()
			}
			p := planBF16MMA(a.BF16.SplitBlocksPerSM, kn.resident, a.Knobs.BF16MMAMaxSplits, m, s.n, s.k, a.SMs, bf16MMAPartBytes)
			return fmt.Sprintf("mma %s tiles=%d chunks=%d splits=%d ksplit=%d kchunk=%d shared=%d", kn.name, p.tiles, p.chunks, p.splits, p.kSplit, p.kChunk, p.shared)
		}
		return "cublaslt-or-simple"
	}
	if a.FP8.WGMMA.Chosen(m, s.n) {
		w := a.FP8.WGMMA
		w.MaxClusters = []int{0, 0, 66, 0, 30, 0, 0, 0, 15} // what the H200's driver reports (2026-12-02-h200-f/occupancy.log)
		p, err := planWGMMA(w, m, s.n, s.k, a.SMs, a.SharedPerBlockOptin, gemmPartBytes)
		if err != nil {
			return "wgmma: " + err.Error()
		}
		finish := ""
		if p.cluster {
			finish = " clusters"
		}
		return fmt.Sprintf("wgmma bn=%d chunks=%d splits=%d kb=%d grid=%d stages=%d%s", p.bn, p.chunks, p.splits, p.kbPerSplit, p.grid, p.stages, finish)
	}
	p := planOwnGEMM(a.FP8, m, s.n, s.k, a.SMs, gemmPartBytes)
	plan := fmt.Sprintf("mt=%d chunks=%d splits=%d kb=%d", p.mt, p.chunks, p.splits, p.kbPerSplit)
	if a.FP8.OwnKernel(m, s.n) {
		return "own " + plan
	}
	return "cublaslt (own where refused: " + plan + ")"
}

// TestGEMMChoicesH200 pins the GEMM choices for every shape the engine
// issues for V4-Flash and V4-Pro at M = 1..512 on the H200: the
// implementation and launch shape of each, as recorded in
// testdata/gemm_choices_h200.txt (runs of M with the same choice on one
// line). The table was written by the code before the GEMM choices moved
// into one architecture description (cudatune.Arch; the table is cfeb712's), so
// the move kept them; the wgmma rules (2026-12-02-h200-f) changed the
// shapes they name, with the H200's cluster capacity.
func TestGEMMChoicesH200(t *testing.T) {
	var b strings.Builder
	for _, s := range engineGEMMs() {
		last, from := "", 1
		flush := func(to int) {
			fmt.Fprintf(&b, "%s n=%d k=%d m=%d-%d %s\n", s.name, s.n, s.k, from, to, last)
		}
		for m := 1; m <= 512; m++ {
			c := gemmChoice(s, m)
			if m > 1 && c != last {
				flush(m - 1)
				from = m
			}
			last = c
		}
		flush(512)
	}
	const file = "testdata/gemm_choices_h200.txt"
	if *updateChoices {
		require.NoError(t, os.WriteFile(file, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, string(want), b.String())
}
