package trace

import (
	"bytes"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"slices"
)

// GenParams describe a synthetic server workload. Generate plays a small
// chunked-prefill scheduler over it: every iteration, each decoding stream
// takes one generation step of 1+MTP tokens; the oldest waiting long prompt
// gets one chunk of at most Chunk tokens; waiting short prompts are prefilled
// whole, oldest first, within ShortBudget tokens. A stream decodes for its
// drawn number of steps and is finished on the line of its last step.
type GenParams struct {
	Seed                 uint64
	Streams              int // short-prompt streams arriving at iteration 0
	Arrivals             int // more short-prompt streams, arriving during [1, ArrivalSpan]
	ArrivalSpan          int
	PromptMin, PromptMax int // short prompt lengths, uniform; PromptMax <= ShortBudget
	ShortBudget          int // context tokens per iteration for short prompts
	LongPrompts          int // long prompts, arriving during [1, ArrivalSpan]
	LongMin, LongMax     int // their lengths, uniform
	Chunk                int // chunked-prefill piece of a long prompt
	StepsMin, StepsMax   int // generation steps per stream, uniform
	MTP                  int // drafts per generation step
	// Accept draws, for every generation step, each sequence's accepted
	// token count uniformly in [1, 1+MTP] (the line's accept list); false
	// accepts every draft.
	Accept bool
}

// DefaultGenParams is the workload of the embedded default trace: 48 decode
// streams with MTP 3 (32 at the start, 16 arriving later) and 3 long prompts
// of 4096 to 10240 tokens arriving in 2048-token chunks while the streams
// decode, so most iterations are mixed batches.
func DefaultGenParams() GenParams {
	return GenParams{
		Seed:        1,
		Streams:     32,
		Arrivals:    16,
		ArrivalSpan: 50,
		PromptMin:   64,
		PromptMax:   512,
		ShortBudget: 1024,
		LongPrompts: 3,
		LongMin:     4096,
		LongMax:     10240,
		Chunk:       2048,
		StepsMin:    20,
		StepsMax:    64,
		MTP:         3,
	}
}

func (p GenParams) validate() error {
	check := []struct {
		name string
		ok   bool
	}{
		{"Streams + Arrivals + LongPrompts > 0", p.Streams+p.Arrivals+p.LongPrompts > 0},
		{"Streams, Arrivals, LongPrompts >= 0", p.Streams >= 0 && p.Arrivals >= 0 && p.LongPrompts >= 0},
		{"ArrivalSpan >= 1", p.ArrivalSpan >= 1},
		{"1 <= PromptMin <= PromptMax <= ShortBudget", 1 <= p.PromptMin && p.PromptMin <= p.PromptMax && p.PromptMax <= p.ShortBudget},
		{"1 <= LongMin <= LongMax", 1 <= p.LongMin && p.LongMin <= p.LongMax},
		{"Chunk >= 1", p.Chunk >= 1},
		{"1 <= StepsMin <= StepsMax", 1 <= p.StepsMin && p.StepsMin <= p.StepsMax},
		{"0 <= MTP <= MaxMTP", 0 <= p.MTP && p.MTP <= MaxMTP},
		{"lengths <= MaxChunkTokens", p.LongMax <= MaxChunkTokens && p.PromptMax <= MaxChunkTokens},
	}
	for _, c := range check {
		if !c.ok {
			return fmt.Errorf("trace: GenParams %+v: want %s", p, c.name)
		}
	}
	return nil
}

type genStream struct {
	seq       uint64
	arrive    int
	prompt    int
	prefilled int
	steps     int
	long      bool
}

// Generate returns the trace of a workload. The same params give the same
// trace.
func Generate(p GenParams) ([]Step, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(p.Seed, 0x7472616365))
	between := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	var arrivals []*genStream
	add := func(at int, long bool) {
		s := &genStream{arrive: at, long: long, steps: between(p.StepsMin, p.StepsMax)}
		if long {
			s.prompt = between(p.LongMin, p.LongMax)
		} else {
			s.prompt = between(p.PromptMin, p.PromptMax)
		}
		arrivals = append(arrivals, s)
	}
	for range p.Streams {
		add(0, false)
	}
	for range p.Arrivals {
		add(between(1, p.ArrivalSpan), false)
	}
	for range p.LongPrompts {
		add(between(1, p.ArrivalSpan), true)
	}
	slices.SortStableFunc(arrivals, func(a, b *genStream) int { return a.arrive - b.arrive })
	for i, s := range arrivals {
		s.seq = uint64(i + 1) // request ids in arrival order
	}

	var steps []Step
	var shortQ, longQ, decoding []*genStream
	next := 0
	for t := 0; next < len(arrivals) || len(shortQ)+len(longQ)+len(decoding) > 0; t++ {
		for ; next < len(arrivals) && arrivals[next].arrive <= t; next++ {
			if s := arrivals[next]; s.long {
				longQ = append(longQ, s)
			} else {
				shortQ = append(shortQ, s)
			}
		}
		var st Step
		var joined []*genStream
		if len(longQ) > 0 {
			s := longQ[0]
			n := min(p.Chunk, s.prompt-s.prefilled)
			st.Context = append(st.Context, Chunk{Seq: s.seq, Tokens: n})
			if s.prefilled += n; s.prefilled == s.prompt {
				longQ = longQ[1:]
				joined = append(joined, s)
			}
		}
		for budget := p.ShortBudget; len(shortQ) > 0 && shortQ[0].prompt <= budget; shortQ = shortQ[1:] {
			s := shortQ[0]
			st.Context = append(st.Context, Chunk{Seq: s.seq, Tokens: s.prompt})
			budget -= s.prompt
			joined = append(joined, s)
		}
		if len(decoding) > 0 {
			g := &Generation{MTP: p.MTP}
			kept := decoding[:0]
			for _, s := range decoding {
				g.Seqs = append(g.Seqs, s.seq)
				if p.Accept {
					g.Accept = append(g.Accept, between(1, 1+p.MTP))
				}
				if s.steps--; s.steps == 0 {
					st.Finish = append(st.Finish, s.seq)
				} else {
					kept = append(kept, s)
				}
			}
			decoding = kept
			st.Generation = g
		}
		decoding = append(decoding, joined...)
		if st.HasBatch() {
			steps = append(steps, st)
		}
	}
	return steps, nil
}

//go:generate go run ../../cmd/decode/gentrace -o default.jsonl

//go:embed default.jsonl
var defaultJSONL []byte

// DefaultJSONL returns the embedded default trace file.
func DefaultJSONL() []byte { return bytes.Clone(defaultJSONL) }

// DefaultComments are the header lines of the embedded default trace.
func DefaultComments(p GenParams) []string {
	return []string{
		"dsv4mla/prologue default trace: one serving iteration per line (README: cmd/decode trace format).",
		fmt.Sprintf("Generated by go run ./cmd/decode/gentrace from %+v; do not edit.", p),
	}
}

// Default parses the embedded default trace.
func Default() ([]Step, error) { return Parse(bytes.NewReader(defaultJSONL)) }
