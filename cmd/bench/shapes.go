package main

import (
	"math/rand/v2"

	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
)

// model is the part of a DSv4 configuration the benchmark shapes need.
type model struct {
	Name         string
	Heads, QLora int
	Layers       int
	cfg          dsv4.Config
}

// shape is one batch: its requests and the tokens each sequence already
// holds.
type shape struct {
	Phase      string
	Batch, MTP int
	Tokens     int
	reqs       []metadata.Request
	cached     map[uint64]int
	// Context, when not 0, is a long-context generation shape's length
	// (longGenerationShape): the RoPE table and the plan hold Context
	// positions instead of ropePositions.
	Context int
}

// positions is the RoPE table's rows and the plan's position limit.
func (s *shape) positions() int {
	if s.Context > 0 {
		return s.Context
	}
	return ropePositions
}

// Fixed dimensions of every benchmark layer.
const (
	pageSize      = 64
	ropePositions = 8192
	// maxGenCached bounds the random tokens a generation sequence holds.
	maxGenCached = 4000
	// ctxChunk is the longest context request (chunked prefill).
	ctxChunk = 2048
	// minGraphBucket is the engine's smallest CUDA-graph batch (rows).
	minGraphBucket = 16
)

// generationShape is nb sequences of random lengths below maxGenCached,
// each adding 1+mtp tokens; the lengths are a function of (nb, mtp) only.
func generationShape(nb, mtp int) shape {
	r := rand.New(rand.NewPCG(uint64(nb), uint64(mtp)+7))
	s := shape{Phase: "generation", Batch: nb, MTP: mtp, Tokens: nb * (1 + mtp), cached: map[uint64]int{}}
	for i := range nb {
		id := uint64(i + 1)
		s.reqs = append(s.reqs, metadata.Request{Seq: id, Phase: metadata.Generation, MTP: mtp})
		s.cached[id] = 1 + r.IntN(maxGenCached)
	}
	return s
}

// longGenerationShape is generationShape with every sequence's last token
// within 64 positions below context (its cached tokens between
// context-(1+mtp)-63 and context-(1+mtp)): a decode step at a long context,
// where the indexer's selection scores every visible entry.
func longGenerationShape(nb, mtp, context int) shape {
	r := rand.New(rand.NewPCG(uint64(nb), uint64(context)))
	s := shape{Phase: "generation", Batch: nb, MTP: mtp, Tokens: nb * (1 + mtp), cached: map[uint64]int{}, Context: context}
	for i := range nb {
		id := uint64(i + 1)
		s.reqs = append(s.reqs, metadata.Request{Seq: id, Phase: metadata.Generation, MTP: mtp})
		s.cached[id] = max(1, context-(1+mtp)-r.IntN(64))
	}
	return s
}

// contextShape is t tokens of context in chunks of at most ctxChunk; every
// second chunk continues a sequence that already holds ctxChunk tokens (a
// chunked prefill).
func contextShape(t int) shape {
	chunk := min(t, ctxChunk)
	n := (t + chunk - 1) / chunk
	s := shape{Phase: "context", Batch: n, Tokens: t, cached: map[uint64]int{}}
	left := t
	for i := range n {
		id := uint64(i + 1)
		s.reqs = append(s.reqs, metadata.Request{Seq: id, Phase: metadata.Context, NewTokens: min(chunk, left)})
		left -= chunk
		if i%2 == 1 {
			s.cached[id] = ctxChunk
		}
	}
	return s
}

// shapes lists the run's generation shapes (every batch at every MTP) and
// then its context shapes.
func (c *config) shapes() []shape {
	var out []shape
	for _, mtp := range c.MTPs {
		for _, nb := range c.GenBatches {
			out = append(out, generationShape(nb, mtp))
		}
	}
	for _, t := range c.CtxTokens {
		out = append(out, contextShape(t))
	}
	return out
}

// graphBucket is the row count the engine pads a generation batch of this
// many tokens to when it replays CUDA graphs: the smallest power of two of
// at least minGraphBucket that holds it.
func graphBucket(tokens int) int {
	b := minGraphBucket
	for b < tokens {
		b *= 2
	}
	return b
}

// kvBytes is the DRAM traffic of the KV kernel over t tokens: the 1 KiB
// latent row and 256 bytes of RoPE table read, the cache row written.
func kvBytes(t int, f kvcache.Format) int64 { return int64(t) * int64(1024+256+f.BytesPerToken()) }

// qBytes is the Q kernel's: per head 1 KiB read and 512 elements written,
// and 256 bytes of RoPE table per token.
func qBytes(t, heads int, elemBytes int) int64 {
	return int64(t) * (int64(heads)*int64(1024+512*elemBytes) + 256)
}
