package main

import (
	"context"
	"errors"
	"time"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
)

// iteration times a whole decode step: every layer's KV and Q launch, with
// per-layer inputs, eagerly from Go (one hand-over to the driver thread per
// layer, as a server calls the engine per layer) and as a CUDA graph, three
// ways: with the batch's counts in the launch parameters, reading them from
// the device header as the engine's captured decode graph does, and the
// header-driven iteration twice in one graph (per iteration), as in a
// server's graph of the whole model.
func iteration(d *device, md model, nb, mtp, reps int) (Iteration, error) {
	s := generationShape(nb, mtp)
	ls, err := d.setupLayers(md, s, layerSpec{sets: md.Layers, cacheFormat: kvcache.FormatFP8UE8M0, padTo: graphBucket(s.Tokens)})
	if err != nil {
		return Iteration{}, err
	}
	defer d.free(ls)
	ctx := context.Background()
	stepWith := func(launches []mla.Launch) func() error {
		return func() error {
			for l := range ls.args {
				if err := mla.RunLayer(ctx, d.be, launches, &ls.args[l]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	step := stepWith(ls.launches)
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
	graph, err := d.replayGraph(step, reps)
	if err != nil {
		return Iteration{}, err
	}
	headerStep := stepWith(mla.FromHeader(ls.launches))
	header, err := d.replayGraph(headerStep, reps)
	if err != nil {
		return Iteration{}, err
	}
	twice, err := d.replayGraph(func() error {
		if err := headerStep(); err != nil {
			return err
		}
		return headerStep()
	}, reps)
	if err != nil {
		return Iteration{}, err
	}
	it := Iteration{Model: md.Name, Batch: nb, MTP: mtp, Layers: len(ls.args), EagerUs: median(eager), GraphUs: graph,
		HeaderGraphUs: header, LongGraphUs: twice / 2, HostUs: median(host), IssueUs: median(issue)}
	it.Speedup = safeDiv(it.EagerUs, it.GraphUs)
	return it, nil
}

// replayGraph captures step and returns the median device time of reps
// replays (after three warm-up ones), back to back as a decode loop
// replays them: no L2 flush between.
func (d *device) replayGraph(step func() error, reps int) (_ float64, err error) {
	g, err := d.be.Capture(step)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	var times []float64
	for i := range reps + 3 {
		t, err := d.be.Time(context.Background(), g.Launch)
		if err != nil {
			return 0, err
		}
		if i >= 3 {
			times = append(times, float64(t.Nanoseconds())/1e3)
		}
	}
	return median(times), nil
}
