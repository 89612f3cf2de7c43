package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
)

func main() {
	args := os.Args[1:]
	sub := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	var err error
	switch sub {
	case "":
		var c config
		if c, err = parseFlags(args, os.Stderr); err == nil {
			err = run(&c, strings.Join(os.Args, " "))
		}
	case "host":
		err = hostMain(args, os.Stdout, os.Stderr)
	case "report":
		err = reportMain(args, os.Stdout, os.Stderr)
	case "topk":
		err = topkMain(args, os.Stdout, os.Stderr)
	default:
		err = fmt.Errorf("unknown subcommand %q (want host, report or topk, or flags for the measurements)", sub)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
}

// run is the measurements of one configuration on the device.
func run(c *config, command string) (err error) {
	if err := cuda.Available(); err != nil {
		return err
	}
	if c.CPUProfile != "" {
		stop, err := startCPUProfile(c.CPUProfile)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, stop()) }()
	}
	mainOpts, mainKnobs := c.Main.options(c.Verbose)
	main, err := newDevice(mainOpts, mainKnobs, c.Reps, c.ContiguousLatent)
	if err != nil {
		return err
	}
	if c.Verbose {
		fmt.Println(main.be.CompileLog())
	}
	rep := Report{Device: main.be.Props().Name, Date: time.Now().UTC().Format(time.RFC3339), Command: command,
		ContiguousLatent: c.ContiguousLatent}
	if rep.CopyGBps, err = main.measureCopy(); err != nil {
		return err
	}
	fmt.Printf("device %s, copy %.0f GB/s (read+write)\n", rep.Device, rep.CopyGBps)
	for _, md := range c.Models {
		sc, err := main.stridedCopy(md)
		if err != nil {
			return err
		}
		rep.StridedCopy = append(rep.StridedCopy, sc)
	}
	// The report is rewritten after every part, so a run cut short keeps
	// what it measured; a part that fails is reported and the next one runs.
	save := func() error { return rep.write(c.Out) }
	part := func(name string, do func() error) {
		if err := do(); err != nil {
			msg := fmt.Sprintf("%s: %v", name, err)
			fmt.Fprintln(os.Stderr, "bench: part failed:", msg)
			rep.Errors = append(rep.Errors, msg)
		}
		if err := save(); err != nil {
			rep.Errors = append(rep.Errors, "saving: "+err.Error())
			fmt.Fprintln(os.Stderr, "bench: saving the report:", err)
		}
	}
	// The check cases first: they are quick, and bench/check_peers.py needs
	// them even when a later part runs out of time.
	if c.CheckDir != "" {
		part("check cases", func() (err error) {
			rep.Checks, err = writeChecks(main, c.CheckDir, c.Models[0])
			return err
		})
	}
	variants := []timedVariant{{dev: main}}
	for _, v := range c.Variants {
		vOpts, vKnobs := v.options(false)
		vd, err := newDevice(vOpts, vKnobs, c.Reps, c.ContiguousLatent)
		if err != nil {
			return fmt.Errorf("variant %q: %w", v.Name, err)
		}
		vd.copyGBps = rep.CopyGBps
		variants = append(variants, timedVariant{dev: vd, name: v.Name})
	}
	if c.HostCost {
		for _, md := range c.Models {
			for _, mtp := range c.MTPs {
				part(fmt.Sprintf("host cost %s mtp %d", md.Name, mtp), func() error {
					hc, err := measureHostCost(context.Background(), hostCostPlan{Backend: "cuda", Model: md,
						Batches: c.GenBatches, MTP: mtp, Reps: c.HostReps, Prefill: c.HostPrefill})
					rep.HostCost = append(rep.HostCost, hc...)
					return err
				})
			}
		}
	}
	if c.Kernels {
		printKernelHeader()
		for _, md := range c.Models {
			part("single launches "+md.Name, func() error { return coldKernels(c, variants, md, &rep) })
		}
	}
	if c.Iteration {
		for _, md := range c.Models {
			for vi, v := range variants {
				part("iteration "+md.Name+" "+v.name, func() error {
					it, err := iteration(v.dev, md, 32, 3, c.IterationReps)
					if err != nil {
						return err
					}
					it.Variant = v.name
					if vi == 0 {
						rep.Iteration = append(rep.Iteration, it)
					} else {
						rep.IterationVariants = append(rep.IterationVariants, it)
					}
					fmt.Printf("iteration %s b=%d mtp=%d layers=%d: eager %.1f us (host %.1f us; issued in %.1f us, %.2f us a layer against %.2f us of device time), graph %.1f us (header-driven %.1f us; %.1f us each in a graph of two iterations), %.2fx %s\n",
						it.Model, it.Batch, it.MTP, it.Layers, it.EagerUs, it.HostUs, it.IssueUs, it.IssueUs/float64(it.Layers),
						it.EagerUs/float64(it.Layers), it.GraphUs, it.HeaderGraphUs, it.LongGraphUs, it.Speedup, it.Variant)
					return nil
				})
			}
		}
	}
	if c.Graph {
		for _, md := range c.Models {
			part("chain floor "+md.Name, func() error { return chainFloors(c, main, md, &rep) })
			part("layer graphs "+md.Name, func() error { return layerGraphs(c, main, md, &rep) })
		}
	}
	if c.Chain {
		for _, md := range c.Models {
			part("chain "+md.Name, func() error { return chains(c, main, md, &rep) })
		}
	}
	if c.Indexer {
		for _, md := range c.Models {
			part("indexer "+md.Name, func() error { return indexers(c, main, md, &rep) })
		}
		if err := writeIndexerTable(os.Stdout, rep.Indexer, rep.IndexerQuery); err != nil {
			return err
		}
	}
	if len(rep.Errors) > 0 {
		return fmt.Errorf("%d parts failed (listed in %s): %s", len(rep.Errors), c.Out, strings.Join(rep.Errors, "; "))
	}
	return nil
}

// startCPUProfile profiles the process into path until stop.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(fmt.Errorf("--cpuprofile: %w", err), f.Close())
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// hostMain is the host subcommand: the engine's Begin/End host cost on a
// chosen backend, written as a report with only host_cost.
func hostMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench host", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "bench-host.json", "JSON report")
	backend := fs.String("backend", "cpu", "engine backend: cpu, or cuda on a GPU machine")
	models := fs.String("models", "flash", "models: flash, pro")
	batches := fs.String("gen-batches", defaultGenBatches, "generation batch sizes")
	mtps := fs.String("mtp", "3", "draft tokens per generation sequence")
	reps := fs.Int("reps", 30, "timed iterations per batch size (median)")
	prefill := fs.Int("prefill", 64, "context tokens each sequence holds before generating")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("host: unexpected argument %q", fs.Arg(0))
	}
	ms, err := parseModels(*models)
	if err != nil {
		return err
	}
	bs, err := parseInts("gen-batches", *batches, 1, 4096)
	if err != nil {
		return err
	}
	mt, err := parseInts("mtp", *mtps, 0, 15)
	if err != nil {
		return err
	}
	if *reps < 1 || *prefill < 1 {
		return fmt.Errorf("host: --reps = %d and --prefill = %d must be at least 1", *reps, *prefill)
	}
	rep := Report{Date: time.Now().UTC().Format(time.RFC3339), Command: "bench host " + strings.Join(args, " "), Device: *backend}
	for _, md := range ms {
		for _, mtp := range mt {
			hc, err := measureHostCost(context.Background(), hostCostPlan{Backend: *backend, Model: md, Batches: bs, MTP: mtp,
				Reps: *reps, Prefill: *prefill})
			if err != nil {
				return err
			}
			rep.HostCost = append(rep.HostCost, hc...)
		}
	}
	fmt.Fprintf(stdout, "host cost written to %s\n", *out)
	return rep.write(*out)
}
