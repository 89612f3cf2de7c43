package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/dsv4mla/prologue/engine/trace"
)

func main() {
	p := trace.DefaultGenParams()
	comments := trace.DefaultComments
	for _, a := range os.Args[1:] {
		if a == "-chain" || a == "--chain" {
			p, comments = trace.ChainGenParams(), trace.ChainComments
		}
	}
	flag.Bool("chain", false, "start from the chain trace's parameters instead of the default trace's")
	out := flag.String("o", "-", "output file (- for stdout)")
	flag.Uint64Var(&p.Seed, "seed", p.Seed, "random seed")
	flag.IntVar(&p.Streams, "streams", p.Streams, "decode streams whose prompts arrive at the start")
	flag.IntVar(&p.Arrivals, "arrivals", p.Arrivals, "decode streams arriving later")
	flag.IntVar(&p.ArrivalSpan, "arrival-span", p.ArrivalSpan, "later arrivals come within this many iterations")
	flag.IntVar(&p.PromptMin, "prompt-min", p.PromptMin, "shortest stream prompt")
	flag.IntVar(&p.PromptMax, "prompt-max", p.PromptMax, "longest stream prompt")
	flag.IntVar(&p.ShortBudget, "short-budget", p.ShortBudget, "context tokens per iteration for stream prompts")
	flag.IntVar(&p.LongPrompts, "long", p.LongPrompts, "long prompts")
	flag.IntVar(&p.LongMin, "long-min", p.LongMin, "shortest long prompt")
	flag.IntVar(&p.LongMax, "long-max", p.LongMax, "longest long prompt")
	flag.IntVar(&p.Chunk, "chunk", p.Chunk, "chunked-prefill piece of a long prompt")
	flag.IntVar(&p.StepsMin, "steps-min", p.StepsMin, "fewest generation steps per stream")
	flag.IntVar(&p.StepsMax, "steps-max", p.StepsMax, "most generation steps per stream")
	flag.IntVar(&p.MTP, "mtp", p.MTP, "MTP drafts per generation step")
	flag.BoolVar(&p.Accept, "accept", p.Accept, "draw each generation step's accepted token counts in [1, 1+mtp] (the lines' accept lists) instead of accepting every draft")
	flag.Parse()
	if err := run(p, comments(p), *out); err != nil {
		fmt.Fprintln(os.Stderr, "gentrace:", err)
		os.Exit(1)
	}
}

func run(p trace.GenParams, comments []string, out string) error {
	steps, err := trace.Generate(p)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := trace.Write(&buf, comments, steps); err != nil {
		return err
	}
	if out == "-" {
		_, err = os.Stdout.Write(buf.Bytes())
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}
