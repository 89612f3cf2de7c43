package main

import (
	"context"
	"fmt"
	"time"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// hostCostPlan is the engine and the steps of one host-cost measurement.
type hostCostPlan struct {
	Backend string
	Model   model
	Batches []int
	MTP     int
	Reps    int // timed iterations per batch size (after hostWarmup)
	Prefill int // context tokens each sequence holds before generating
}

// hostWarmup iterations per batch size are not timed (the first one of a
// new graph bucket also captures its graphs).
const hostWarmup = 3

// config is the engine the measurement runs: one layer (the host cost of
// Begin and End does not depend on the layer count), room for the largest
// batch, and pages for every sequence's prefill and all its generation
// steps.
func (p hostCostPlan) config() engine.Config {
	maxB := 0
	for _, b := range p.Batches {
		maxB = max(maxB, b)
	}
	growth := len(p.Batches) * (p.Reps + hostWarmup) * (1 + p.MTP)
	perSeq := (p.Prefill+growth+pageSize-1)/pageSize + 1
	return engine.Config{
		Model:         p.Model.cfg,
		Cache:         kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: pageSize, NumPages: maxB * perSeq},
		Backend:       p.Backend,
		Layers:        1,
		MaxSeqs:       maxB,
		MaxTokens:     max(maxB*(1+p.MTP), min(p.Prefill, 4096)),
		RopePositions: perSeq * pageSize,
		// The host cost does not depend on the weights' values.
		SyntheticWeights: &engine.SyntheticWeights{},
		Input:            engine.InputProjected,
		FullCache:        true,
		Compressor:       engine.CompressorConfig{Off: true},
	}
}

// prefillBatches splits the context of seqs sequences of prefill tokens
// each into iterations of at most maxTokens tokens (a sequence's context
// may span iterations, in order).
func prefillBatches(seqs, prefill, maxTokens int) [][]metadata.Request {
	var out [][]metadata.Request
	var cur []metadata.Request
	room := maxTokens
	for s := 1; s <= seqs; s++ {
		for left := prefill; left > 0; {
			if room == 0 {
				out, cur, room = append(out, cur), nil, maxTokens
			}
			n := min(left, room)
			cur = append(cur, metadata.Request{Seq: uint64(s), Phase: metadata.Context, NewTokens: n})
			left -= n
			room -= n
			// A sequence appears once per iteration: close the batch when
			// its context goes on in the next one.
			if left > 0 {
				out, cur, room = append(out, cur), nil, maxTokens
			}
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// runIteration is one Begin, RunLayer, End; the layer runs and the device
// drains outside the timed spans, so begin and end are host time.
// graph reports whether the layers replayed CUDA graphs.
func runIteration(ctx context.Context, e *engine.Engine, reqs []metadata.Request) (begin, end time.Duration, graph bool, err error) {
	t0 := time.Now()
	it, err := e.Begin(ctx, reqs)
	begin = time.Since(t0)
	if err != nil {
		return 0, 0, false, err
	}
	defer it.Abort() // nothing once End succeeded
	for l := range e.Layers() {
		if err := it.RunLayer(ctx, l); err != nil {
			return 0, 0, false, err
		}
	}
	if err := e.Backend().Synchronize(ctx); err != nil {
		return 0, 0, false, err
	}
	t1 := time.Now()
	err = it.End(ctx)
	return begin, time.Since(t1), it.Debug().GraphPath(), err
}

// measureHostCost times the engine's own host work per generation
// iteration, Begin (plan, page reservation, metadata build and upload) and
// End (the wait on an idle device, the commit), for every batch size.
func measureHostCost(ctx context.Context, p hostCostPlan) (_ []HostCost, err error) {
	cfg := p.config()
	e, err := engine.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := e.Close(); err == nil {
			err = cerr
		}
	}()
	for i, reqs := range prefillBatches(cfg.MaxSeqs, p.Prefill, cfg.MaxTokens) {
		if _, _, _, err := runIteration(ctx, e, reqs); err != nil {
			return nil, fmt.Errorf("host cost: prefill iteration %d: %w", i, err)
		}
	}
	var out []HostCost
	for _, nb := range p.Batches {
		reqs := make([]metadata.Request, nb)
		for i := range reqs {
			reqs[i] = metadata.Request{Seq: uint64(i + 1), Phase: metadata.Generation, MTP: p.MTP}
		}
		var begins, ends, totals []float64
		graphs := false
		for i := range p.Reps + hostWarmup {
			b, e2, g, err := runIteration(ctx, e, reqs)
			if err != nil {
				return nil, fmt.Errorf("host cost: b=%d mtp=%d: %w", nb, p.MTP, err)
			}
			graphs = g
			if i >= hostWarmup {
				us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
				begins, ends, totals = append(begins, us(b)), append(ends, us(e2)), append(totals, us(b+e2))
			}
		}
		hc := HostCost{Backend: e.Backend().Name(), Model: p.Model.Name, Batch: nb, MTP: p.MTP, Tokens: nb * (1 + p.MTP),
			BeginUs: median(begins), EndUs: median(ends), TotalUs: median(totals), Reps: p.Reps, Graphs: graphs}
		out = append(out, hc)
		fmt.Printf("host cost %-4s %-5s b=%-4d mtp=%d: Begin %7.1f us, End %6.1f us, together %7.1f us (median of %d)\n",
			hc.Backend, hc.Model, hc.Batch, hc.MTP, hc.BeginUs, hc.EndUs, hc.TotalUs, hc.Reps)
	}
	return out, nil
}
