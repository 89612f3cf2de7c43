package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/metadata"
)

func TestPrefillBatches(t *testing.T) {
	for _, c := range []struct{ seqs, prefill, maxTokens int }{{3, 70, 100}, {4, 10, 4096}, {2, 300, 128}, {1, 1, 1}, {5, 64, 64}} {
		batches := prefillBatches(c.seqs, c.prefill, c.maxTokens)
		got := map[uint64]int{}
		last := uint64(0)
		for i, b := range batches {
			require.NotEmpty(t, b, "batch %d", i)
			tokens := 0
			inBatch := map[uint64]bool{}
			for _, r := range b {
				assert.Equal(t, metadata.Context, r.Phase)
				assert.False(t, inBatch[r.Seq], "seq %d twice in batch %d", r.Seq, i)
				inBatch[r.Seq] = true
				assert.GreaterOrEqual(t, r.Seq, last, "sequences in order")
				last = r.Seq
				tokens += r.NewTokens
				got[r.Seq] += r.NewTokens
			}
			assert.LessOrEqual(t, tokens, c.maxTokens)
		}
		require.Len(t, got, c.seqs)
		for s := 1; s <= c.seqs; s++ {
			assert.Equal(t, c.prefill, got[uint64(s)], "seq %d of %+v", s, c)
		}
	}
}

// The host-cost measurement end to end on the CPU backend: every batch
// size gets a row, and the engine accepts every iteration it asks for.
func TestMeasureHostCostCPU(t *testing.T) {
	fl, err := modelNamed("flash")
	require.NoError(t, err)
	p := hostCostPlan{Backend: "cpu", Model: fl, Batches: []int{1, 3}, MTP: 1, Reps: 2, Prefill: 70}
	cfg := p.config()
	assert.Equal(t, 3, cfg.MaxSeqs)
	assert.Equal(t, 1, cfg.Layers)
	hc, err := measureHostCost(context.Background(), p)
	require.NoError(t, err)
	require.Len(t, hc, 2)
	for i, nb := range p.Batches {
		h := hc[i]
		assert.Equal(t, "cpu", h.Backend)
		assert.Equal(t, "flash", h.Model)
		assert.Equal(t, nb, h.Batch)
		assert.Equal(t, nb*2, h.Tokens)
		assert.Equal(t, 2, h.Reps)
		assert.False(t, h.Graphs, "the cpu backend has no graphs")
		assert.Positive(t, h.BeginUs)
		assert.Positive(t, h.EndUs)
		assert.GreaterOrEqual(t, h.TotalUs, h.BeginUs/2)
	}
}

func TestHostSubcommandErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--models", "nope"}, `unknown model "nope"`},
		{[]string{"--gen-batches", "a"}, "not a whole number"},
		{[]string{"--reps", "0"}, "--reps = 0"},
		{[]string{"stray"}, `unexpected argument "stray"`},
	} {
		err := hostMain(c.args, nil, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), c.err)
	}
}
