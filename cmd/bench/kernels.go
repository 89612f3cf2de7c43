package main

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
)

// largestFormat is the format of fs with the largest page, so one pool
// serves them all.
func largestFormat(fs []kvcache.Format) kvcache.Format {
	best := fs[0]
	for _, f := range fs[1:] {
		if f.PageBytes(pageSize) > best.PageBytes(pageSize) {
			best = f
		}
	}
	return best
}

// timedVariant is a device with the variant it runs (the main one first).
type timedVariant struct {
	dev  *device
	name string // "" for the main variant
}

// coldKernels times every kernel on every shape of md as a cold single
// launch: L2 flushed before each, median of the repetitions. The main
// variant's rows also get a same-size copy timed the same way.
func coldKernels(c *config, variants []timedVariant, md model, rep *Report) error {
	for _, s := range c.shapes() {
		if err := coldShape(c, variants, md, s, rep); err != nil {
			return fmt.Errorf("%s %s %d tokens: %w", md.Name, s.Phase, s.Tokens, err)
		}
	}
	return nil
}

// coldShape is coldKernels on one shape.
func coldShape(c *config, variants []timedVariant, md model, s shape, rep *Report) error {
	main := variants[0].dev
	ctx := context.Background()
	ls, err := main.setupLayers(md, s, layerSpec{sets: 1, cacheFormat: largestFormat(c.Formats)})
	if err != nil {
		return err
	}
	defer main.free(ls)
	launch := ls.launches[0] // every benchmark shape is one phase: one launch covers it
	for vi, v := range variants {
		if vi > 0 && !c.VariantKernels {
			continue
		}
		record := func(kernel, format string, us float64, bytes int64) error {
			r := Result{Kernel: kernel, Model: md.Name, Format: format, Phase: s.Phase, Batch: s.Batch, MTP: s.MTP,
				Tokens: s.Tokens, Us: us, Bytes: bytes, GBps: safeDiv(float64(bytes), us*1e3), Variant: v.name}
			r.PctCopy = safeDiv(100*r.GBps, rep.CopyGBps)
			if vi == 0 {
				cu, err := main.sameSizeCopyUs(bytes)
				if err != nil {
					return err
				}
				r.CopyUs, r.PctSameSize = cu, safeDiv(100*cu, us)
			}
			rep.Results = append(rep.Results, r)
			fmt.Printf("%-6s %-5s %-14s %-10s %5d %3d %6d %10.2f %8.0f %5.1f%% %5.1f%% %s\n", kernel, md.Name, format, s.Phase,
				s.Batch, s.MTP, s.Tokens, us, r.GBps, r.PctCopy, r.PctSameSize, v.name)
			return nil
		}
		for _, f := range c.Formats {
			a := ls.withFormats(0, f, mla.QFP8)
			us, err := v.dev.timeLaunch(func() error { return v.dev.be.KVNormRopeStore(ctx, launch, &a) })
			if err != nil {
				return err
			}
			if err := record("kv", f.String(), us, kvBytes(s.Tokens, f)); err != nil {
				return err
			}
		}
		for _, q := range []mla.QFormat{mla.QFP8, mla.QBF16} {
			a := ls.withFormats(0, c.Formats[0], q)
			us, err := v.dev.timeLaunch(func() error { return v.dev.be.QNormRopeQuant(ctx, launch, &a) })
			if err != nil {
				return err
			}
			if err := record("q", q.String(), us, qBytes(s.Tokens, md.Heads, q.ElemBytes())); err != nil {
				return err
			}
		}
	}
	return nil
}

func printKernelHeader() {
	fmt.Printf("%-6s %-5s %-14s %-10s %5s %3s %6s %10s %8s %6s %6s\n", "kernel", "model", "format", "phase", "batch", "mtp", "tokens", "us", "GB/s", "%copy", "%same")
}
