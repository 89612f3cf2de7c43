package main

import (
	"context"
	"time"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
)

// iteration times a whole decode step: every layer's KV and Q launch, with
// per-layer inputs, eagerly from Go (one hand-over to the driver thread per
// layer, as a server calls the engine per layer) and as a CUDA graph.
func iteration(d *device, md model, nb, mtp, reps int) (Iteration, error) {
	s := generationShape(nb, mtp)
	ls, err := d.setupLayers(md, s, layerSpec{sets: md.Layers, cacheFormat: kvcache.FormatFP8UE8M0})
	if err != nil {
		return Iteration{}, err
	}
	defer d.free(ls)
	ctx := context.Background()
	step := func() error {
		for l := range ls.args {
			if err := mla.RunLayer(ctx, d.be, ls.launches, &ls.args[l]); err != nil {
				return err
			}
		}
		return nil
	}
	var issued time.Duration
	timedStep := func() error {
		t0 := time.Now()
		err := step()
		issued = time.Since(t0)
		return err
	}
	var eager, host, issue []float64 // device, host wall and issue times, us
	for i := range reps + 3 {
		t0 := time.Now()
		t, err := d.be.Time(ctx, timedStep)
		if err != nil {
			return Iteration{}, err
		}
		if i >= 3 {
			eager = append(eager, float64(t.Nanoseconds())/1e3)
			host = append(host, float64(time.Since(t0).Nanoseconds())/1e3)
			issue = append(issue, float64(issued.Nanoseconds())/1e3)
		}
	}
	g, err := d.be.Capture(step)
	if err != nil {
		return Iteration{}, err
	}
	defer g.Close()
	var graph []float64
	for i := range reps + 3 {
		t, err := d.be.Time(ctx, g.Launch)
		if err != nil {
			return Iteration{}, err
		}
		if i >= 3 {
			graph = append(graph, float64(t.Nanoseconds())/1e3)
		}
	}
	it := Iteration{Model: md.Name, Batch: nb, MTP: mtp, Layers: len(ls.args), EagerUs: median(eager), GraphUs: median(graph), HostUs: median(host),
		IssueUs: median(issue)}
	it.Speedup = safeDiv(it.EagerUs, it.GraphUs)
	return it, nil
}
