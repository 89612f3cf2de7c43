package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

func TestGenerationShape(t *testing.T) {
	for _, c := range []struct{ nb, mtp int }{{1, 0}, {3, 3}, {256, 3}} {
		s := generationShape(c.nb, c.mtp)
		assert.Equal(t, "generation", s.Phase)
		assert.Equal(t, c.nb*(1+c.mtp), s.Tokens)
		require.Len(t, s.reqs, c.nb)
		require.Len(t, s.cached, c.nb)
		for _, r := range s.reqs {
			assert.Equal(t, metadata.Generation, r.Phase)
			assert.Equal(t, c.mtp, r.MTP)
			n := s.cached[r.Seq]
			assert.True(t, n >= 1 && n <= maxGenCached, "seq %d holds %d tokens", r.Seq, n)
		}
		assert.Equal(t, s.cached, generationShape(c.nb, c.mtp).cached, "lengths are a function of the shape")
	}
	// Not all sequences of a large batch have one length.
	s := generationShape(64, 3)
	lens := map[int]bool{}
	for _, n := range s.cached {
		lens[n] = true
	}
	assert.Greater(t, len(lens), 32)
}

func TestContextShape(t *testing.T) {
	for _, tokens := range []int{1, 1024, 2048, 4096, 5000, 65536} {
		s := contextShape(tokens)
		assert.Equal(t, "context", s.Phase)
		sum := 0
		for i, r := range s.reqs {
			assert.Equal(t, metadata.Context, r.Phase)
			assert.LessOrEqual(t, r.NewTokens, ctxChunk)
			assert.Positive(t, r.NewTokens)
			sum += r.NewTokens
			_, continued := s.cached[r.Seq]
			assert.Equal(t, i%2 == 1, continued, "every second chunk continues a sequence")
		}
		assert.Equal(t, tokens, sum)
		assert.Equal(t, len(s.reqs), s.Batch)
	}
}

func TestGraphBucket(t *testing.T) {
	for _, c := range []struct{ tokens, want int }{{1, 16}, {16, 16}, {17, 32}, {128, 128}, {129, 256}, {1024, 1024}} {
		assert.Equal(t, c.want, graphBucket(c.tokens), "tokens %d", c.tokens)
	}
}

func TestTrafficBytes(t *testing.T) {
	// KV: 1 KiB latent + 256 B RoPE row read, the cache row written.
	assert.Equal(t, int64(3*(1024+256+584)), kvBytes(3, kvcache.FormatFP8UE8M0))
	assert.Equal(t, int64(3*(1024+256+1024)), kvBytes(3, kvcache.FormatBF16))
	// Q: per head 1 KiB read and 512 or 1024 bytes written, plus the RoPE row.
	assert.Equal(t, int64(5*(64*1536+256)), qBytes(5, 64, 1))
	assert.Equal(t, int64(5*(128*2048+256)), qBytes(5, 128, 2))
}

func TestSetsWithin(t *testing.T) {
	assert.Equal(t, 43, setsWithin(43, 1<<20, 0), "no bound")
	assert.Equal(t, 43, setsWithin(43, 1<<20, 1<<40))
	assert.Equal(t, 4, setsWithin(43, 10, 45))
	assert.Equal(t, 1, setsWithin(43, 100, 5), "at least one set")
	fl, err := modelNamed("flash")
	require.NoError(t, err)
	// rows 128: latent 128*1536*2, Q in and out 2*128*64*1024, 10 ue8m0 pages.
	assert.Equal(t, int64(128*1536*2+2*128*64*1024+10*kvcache.FormatFP8UE8M0.PageBytes(64)+2048), perSetBytes(fl, 128, 1536, 10, kvcache.FormatFP8UE8M0))
}

func TestShapeMetadata(t *testing.T) {
	fl, err := modelNamed("flash")
	require.NoError(t, err)
	for _, c := range []struct {
		s     shape
		padTo int
	}{{generationShape(5, 3), 32}, {generationShape(1, 0), 16}, {contextShape(5000), 0}} {
		m, pages, err := shapeMetadata(fl, c.s, c.padTo)
		require.NoError(t, err)
		assert.Equal(t, c.s.Tokens, m.Tokens)
		if c.padTo > 0 {
			assert.Equal(t, c.padTo, m.PaddedTokens)
		}
		// Every real token has its own slot inside the pool.
		seen := map[int64]bool{}
		for tok := range m.Tokens {
			slot := m.Slot(tok)
			require.True(t, slot >= 0 && slot < int64(pages*pageSize), "slot %d of a pool of %d pages", slot, pages)
			require.False(t, seen[slot], "slot %d twice", slot)
			seen[slot] = true
		}
	}
}

func TestGraphShape(t *testing.T) {
	pro, err := modelNamed("pro")
	require.NoError(t, err)
	layers, spec := graphShape(pro, generationShape(32, 3), 8)
	assert.Equal(t, 61, layers)
	assert.Equal(t, 128, spec.padTo)
	assert.True(t, spec.fromHeader)
	assert.Equal(t, kvcache.FormatFP8UE8M0, spec.cacheFormat)
	layers, spec = graphShape(pro, contextShape(4096), 8)
	assert.Equal(t, 8, layers)
	assert.Zero(t, spec.padTo)
	assert.False(t, spec.fromHeader)
}

func TestLargestFormat(t *testing.T) {
	assert.Equal(t, kvcache.FormatBF16, largestFormat([]kvcache.Format{kvcache.FormatFP8UE8M0, kvcache.FormatBF16, kvcache.FormatFP8PerTensor}))
	assert.Equal(t, kvcache.FormatFP8UE8M0, largestFormat([]kvcache.Format{kvcache.FormatFP8PerTensor, kvcache.FormatFP8UE8M0}))
}

func TestCheckCases(t *testing.T) {
	cases := checkCases()
	require.Len(t, cases, len(kvcache.Formats())+1, "every cache format, and a bf16-Q context case")
	names := map[string]bool{}
	for _, c := range cases {
		assert.False(t, names[c.name])
		names[c.name] = true
	}
}
