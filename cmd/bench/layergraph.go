package main

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
)

// graphShape is how the sweep lays out one shape as a server's CUDA graph
// would run it: a generation batch padded to the engine's graph bucket,
// launches reading their counts from the device header, every layer of the
// model; a context batch (launched eagerly by the engine) unpadded and with
// at most ctxLayers layers, which is enough to amortize a graph launch over
// layers that long.
func graphShape(md model, s shape, ctxLayers int) (layers int, spec layerSpec) {
	spec = layerSpec{cacheFormat: kvcache.FormatFP8UE8M0}
	if s.Phase == "generation" {
		spec.padTo, spec.fromHeader = graphBucket(s.Tokens), true
		return md.Layers, spec
	}
	return min(md.Layers, ctxLayers), spec
}

// layerGraphs times every shape of md the way a server's decode loop sees
// it: all layers of an iteration, each with its own latent, Q input and
// output, weight and cache pool, captured in one CUDA graph and replayed
// (L2 flushed before each replay, median); the time per layer is the total
// over the layers. Beside it, one layer launched alone, cold.
func layerGraphs(c *config, d *device, md model, rep *Report) error {
	for _, s := range c.shapes() {
		if err := layerGraphShape(c, d, md, s, rep); err != nil {
			return fmt.Errorf("graph %s %s %d tokens: %w", md.Name, s.Phase, s.Tokens, err)
		}
	}
	return nil
}

// layerGraphShape is layerGraphs on one shape, both Q formats.
func layerGraphShape(c *config, d *device, md model, s shape, rep *Report) error {
	ctx := context.Background()
	nLayers, spec := graphShape(md, s, c.CtxGraphLayers)
	spec.sets, spec.memBytes = nLayers, c.GraphMemBytes
	ls, err := d.setupLayers(md, s, spec)
	if err != nil {
		return err
	}
	defer d.free(ls)
	for _, q := range []mla.QFormat{mla.QFP8, mla.QBF16} {
		args := make([]mla.LayerArgs, nLayers)
		for l := range args {
			args[l] = ls.withFormats(l, spec.cacheFormat, q)
		}
		total, err := d.timeGraph(c.GraphReps, func() error {
			for l := range args {
				if err := mla.RunLayer(ctx, d.be, ls.launches, &args[l]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		cold, err := d.timeLaunch(func() error { return mla.RunLayer(ctx, d.be, ls.launches, &args[0]) })
		if err != nil {
			return err
		}
		lg := LayerGraph{
			Model: md.Name, Phase: s.Phase, Batch: s.Batch, MTP: s.MTP, Tokens: s.Tokens, Rows: ls.m.PaddedTokens,
			QFormat: q.String(), CacheFormat: spec.cacheFormat.String(), Layers: nLayers, Sets: len(ls.args),
			TotalUs: total, UsPerLayer: total / float64(nLayers), ColdLayerUs: cold,
			LayerBytes: kvBytes(s.Tokens, spec.cacheFormat) + qBytes(s.Tokens, md.Heads, q.ElemBytes()),
		}
		lg.CopyUsPerLayer = safeDiv(float64(lg.LayerBytes), rep.CopyGBps*1e3)
		lg.PctCopy = safeDiv(100*lg.CopyUsPerLayer, lg.UsPerLayer)
		rep.LayerGraphs = append(rep.LayerGraphs, lg)
		fmt.Printf("graph %-5s %-10s b=%-4d mtp=%d tokens=%-6d rows=%-6d Q %-4s %2d layers (%2d sets): %9.1f us, %7.2f us/layer (cold layer %7.2f us, copy %6.2f us, %5.1f%% of copy)\n",
			lg.Model, lg.Phase, lg.Batch, lg.MTP, lg.Tokens, lg.Rows, lg.QFormat, lg.Layers, lg.Sets, lg.TotalUs, lg.UsPerLayer,
			lg.ColdLayerUs, lg.CopyUsPerLayer, lg.PctCopy)
	}
	return kernelGraphs(c, d, md, s, ls, nLayers, spec.cacheFormat, rep)
}

// kernelGraphs times the KV kernel alone and the Q kernel alone (each Q
// format) of every layer in one graph, as layerGraphShape does the layer.
func kernelGraphs(c *config, d *device, md model, s shape, ls *layers, nLayers int, cf kvcache.Format, rep *Report) error {
	ctx := context.Background()
	type kernelRun struct {
		kernel, format string
		q              mla.QFormat
		bytes          int64
		run            func(l mla.Launch, a *mla.LayerArgs) error
	}
	runs := []kernelRun{{kernel: "kv", format: cf.String(), q: mla.QFP8, bytes: kvBytes(s.Tokens, cf),
		run: func(l mla.Launch, a *mla.LayerArgs) error { return d.be.KVNormRopeStore(ctx, l, a) }}}
	for _, q := range []mla.QFormat{mla.QFP8, mla.QBF16} {
		runs = append(runs, kernelRun{kernel: "q", format: q.String(), q: q, bytes: qBytes(s.Tokens, md.Heads, q.ElemBytes()),
			run: func(l mla.Launch, a *mla.LayerArgs) error { return d.be.QNormRopeQuant(ctx, l, a) }})
	}
	for _, kr := range runs {
		args := make([]mla.LayerArgs, nLayers)
		for l := range args {
			args[l] = ls.withFormats(l, cf, kr.q)
		}
		total, err := d.timeGraph(c.GraphReps, func() error {
			for l := range args {
				for _, launch := range ls.launches {
					if err := kr.run(launch, &args[l]); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s kernel graph: %w", kr.kernel, err)
		}
		kg := KernelGraph{Kernel: kr.kernel, Model: md.Name, Phase: s.Phase, Batch: s.Batch, MTP: s.MTP, Tokens: s.Tokens,
			Rows: ls.m.PaddedTokens, Format: kr.format, Layers: nLayers, TotalUs: total, UsPerLayer: total / float64(nLayers),
			Bytes: kr.bytes}
		kg.CopyUs = safeDiv(float64(kg.Bytes), rep.CopyGBps*1e3)
		kg.PctCopy = safeDiv(100*kg.CopyUs, kg.UsPerLayer)
		rep.KernelGraphs = append(rep.KernelGraphs, kg)
		fmt.Printf("kgraph %-2s %-5s %-10s b=%-4d mtp=%d tokens=%-6d %-14s %2d layers: %9.1f us, %8.2f us/layer (copy %7.2f us, %5.1f%% of copy)\n",
			kg.Kernel, kg.Model, kg.Phase, kg.Batch, kg.MTP, kg.Tokens, kg.Format, kg.Layers, kg.TotalUs, kg.UsPerLayer, kg.CopyUs, kg.PctCopy)
	}
	return nil
}
