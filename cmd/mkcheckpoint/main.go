package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/weights"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mkcheckpoint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "tiny", "model config: flash, pro, tiny, or a config.json path")
	layers := fs.String("layers", "all", `layers to write: "all" or a list like 0,2-3,43`)
	seed := fs.Uint64("seed", 1, "generator seed")
	out := fs.String("out", "", "output directory (required)")
	scaleFormat := fs.String("scale-format", "e8m0", "FP8 block scale dtype: e8m0 (F8_E8M0, as the release) or f32")
	naming := fs.String("naming", "deepseek", "tensor names: deepseek, vllm, hf or hf-v3")
	perShard := fs.Int("layers-per-shard", 2, "layers per shard file")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	usage := func(err error) int {
		fmt.Fprintln(stderr, "mkcheckpoint:", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usage(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if *out == "" {
		return usage(errors.New("--out is required"))
	}
	cfg, err := modelConfig(*model)
	if err != nil {
		return usage(err)
	}
	opts := weights.SyntheticOptions{LayersPerShard: *perShard}
	if opts.Layers, err = parseLayers(*layers, cfg.NumAttentionLayers()); err != nil {
		return usage(err)
	}
	if opts.ScaleFormat, err = weights.ParseScaleFormat(*scaleFormat); err != nil {
		return usage(err)
	}
	if opts.Naming, err = weights.ParseNaming(*naming); err != nil {
		return usage(err)
	}
	if *perShard <= 0 {
		return usage(fmt.Errorf("--layers-per-shard %d: must be positive", *perShard))
	}
	start := time.Now()
	if err := weights.WriteSynthetic(*out, &cfg, *seed, opts); err != nil {
		fmt.Fprintln(stderr, "mkcheckpoint:", err)
		return exitError
	}
	n := len(opts.Layers)
	if opts.Layers == nil {
		n = cfg.NumAttentionLayers()
	}
	fmt.Fprintf(stdout, "wrote %s: %s, %d layers, seed %d, %s scales, %s names, in %v\n",
		*out, cfg.Name, n, *seed, opts.ScaleFormat, opts.Naming, time.Since(start).Round(time.Millisecond))
	return exitOK
}

func modelConfig(name string) (dsv4.Config, error) {
	switch name {
	case "flash":
		return dsv4.Flash(), nil
	case "pro":
		return dsv4.Pro(), nil
	case "tiny":
		return weights.TinyConfig(), nil
	}
	if strings.HasSuffix(name, ".json") {
		return dsv4.Load(name)
	}
	return dsv4.Config{}, fmt.Errorf("--model %q: want flash, pro, tiny or a config.json path", name)
}

// parseLayers reads "all" (nil: every layer) or a list of indices and
// inclusive ranges.
func parseLayers(s string, n int) ([]int, error) {
	if s == "all" {
		return nil, nil
	}
	var out []int
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("--layers %q: %q is not a layer index", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("--layers %q: %q is not a range a-b with a <= b", s, part)
			}
		}
		for i := a; i <= b; i++ {
			if i < 0 || i >= n {
				return nil, fmt.Errorf("--layers %q: layer %d out of range [0, %d)", s, i, n)
			}
			if seen[i] {
				return nil, fmt.Errorf("--layers %q: layer %d listed twice", s, i)
			}
			seen[i] = true
			out = append(out, i)
		}
	}
	return out, nil
}
