package engine_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// serverRequest is one request of the serving loop below.
type serverRequest struct {
	id                uint64
	prompt, generate  int // prompt tokens, tokens to generate
	prefilled, output int // prompt tokens in the cache, tokens generated
	chunk             int // prompt tokens in the open iteration
}

func (r *serverRequest) length() int { return r.prefilled + r.output }

// A server's continuous-batching loop on DeepSeek-V4's own layer, from the
// hidden states: requests arrive while others run, long prompts are
// prefilled in chunks beside the decode steps (within MaxTokens a
// batch), each decode step runs the
// next token and two MTP drafts and reports through Accept how many the
// model's verification kept, a finished request is Finished, and a new one
// is admitted only when Pools says every pool can hold it at its full
// length. After each layer the server's attention kernel reads what the
// engine wrote in place, through Handoff; here, after the ratio-4 layer, a
// stand-in on the CPU backend that finds, for each sequence's last token,
// its window rows and compressed entries through the block tables (on
// CUDA the same tensors are device addresses, read by a kernel on the
// engine's stream). The tiny model has a ratio-0, a ratio-4, a ratio-128
// and an MTP layer.
func Example_server() {
	ctx := context.Background()
	// The zero Config is DeepSeek-V4's layer: hidden-state input, the
	// 128-token window, the compressor, CUDA graphs where the backend has
	// them. The pools are sized small here so that admission matters.
	e, err := engine.New(ctx, engine.Config{
		Model:   weights.TinyConfig(), // hidden 256: small GEMMs
		Cache:   kvcache.Config{PageSize: 16, NumPages: 48},
		Backend: engine.BackendCPU,
		// A server names its checkpoint (Checkpoint); an example asks for
		// synthetic weights by name.
		SyntheticWeights: &engine.SyntheticWeights{Seed: 7},
		Compressor:       engine.CompressorConfig{Ratio4Pages: 6, Ratio128Pages: 2},
		MaxSeqs:          4,
		MaxTokens:        128,
		RopePositions:    2048,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	cfg, h := e.Config(), e.Handoff()
	var names []string
	for _, t := range h.Tensors() {
		if len(names) == 0 || names[len(names)-1] != t.Name {
			names = append(names, t.Name)
		}
	}
	fmt.Println("attention binds to:", strings.Join(names, " "))

	const chunk, mtp = 64, 2 // prefill tokens per step; drafts per decode step
	arrivals := map[int][]*serverRequest{
		0: {{id: 1, prompt: 170, generate: 8}},
		1: {{id: 2, prompt: 40, generate: 6}},
		2: {{id: 3, prompt: 270, generate: 3}, {id: 4, prompt: 30, generate: 4}},
	}
	var waiting, running []*serverRequest
	for step := 0; len(arrivals)+len(waiting)+len(running) > 0; step++ {
		waiting = append(waiting, arrivals[step]...)
		delete(arrivals, step)
		// Admission, first come first served: a request joins when every
		// pool holds it at its full length beside what the running ones
		// will still take.
		for len(waiting) > 0 && len(running) < cfg.MaxSeqs && fits(cfg, e.Pools(), running, waiting[0], mtp) {
			running, waiting = append(running, waiting[0]), waiting[1:]
		}
		// The batch, within MaxTokens: the decode steps' tokens first, the
		// rest to prompt chunks; context requests come first in the batch.
		budget := cfg.MaxTokens
		for _, r := range running {
			if r.prefilled == r.prompt {
				budget -= 1 + mtp
			}
		}
		var reqs []metadata.Request
		var line []string
		for _, r := range running {
			r.chunk = min(chunk, r.prompt-r.prefilled, budget)
			if r.chunk > 0 {
				budget -= r.chunk
				reqs = append(reqs, metadata.Request{Seq: r.id, Phase: metadata.Context, NewTokens: r.chunk})
				line = append(line, fmt.Sprintf("prefill %d [%d,%d)", r.id, r.prefilled, r.prefilled+r.chunk))
			}
		}
		for _, r := range running {
			if r.prefilled == r.prompt {
				reqs = append(reqs, metadata.Request{Seq: r.id, Phase: metadata.Generation, MTP: mtp})
			}
		}
		it, err := e.Begin(ctx, reqs)
		if err != nil {
			fmt.Println(err)
			return
		}
		var seen string
		for l := range e.Layers() {
			// The layer's hidden states: the model's residual stream (here
			// drawn at random per token), or written on the device into
			// HiddenInput.
			if err := it.SetHidden(l, hiddenRows(it, e.HiddenSize(), l)); err != nil {
				fmt.Println(err)
				return
			}
			if err := it.RunLayer(ctx, l); err != nil {
				fmt.Println(err)
				return
			}
			if h.Ratio[l] == 4 {
				seen = attend(h, l, it.Metadata().Seqs)
			}
		}
		// Verification of the drafts (here a fixed pattern) keeps 1 to
		// 1+mtp tokens of each decode step; End commits them.
		accepted := map[uint64]int{}
		m := it.Metadata()
		for b := m.NumCtx; b < m.NumSeqs; b++ {
			accepted[m.Seqs[b]] = 1 + int(m.Seqs[b]+uint64(step))%(1+mtp)
		}
		if err := it.Accept(accepted); err != nil {
			fmt.Println(err)
			return
		}
		if err := it.End(ctx); err != nil {
			fmt.Println(err)
			return
		}
		var still []*serverRequest
		for _, r := range running {
			if n, ok := accepted[r.id]; ok {
				r.output += n
				line = append(line, fmt.Sprintf("decode %d +%d", r.id, n))
			} else {
				r.prefilled += r.chunk
			}
			if r.output >= r.generate {
				if err := e.Finish(r.id); err != nil {
					fmt.Println(err)
					return
				}
				line = append(line, fmt.Sprintf("finish %d at %d", r.id, r.length()))
				continue
			}
			still = append(still, r)
		}
		running = still
		fmt.Printf("step %d: %s; attention %s; free %s\n", step, strings.Join(line, ", "), seen, freePages(e.Pools()))
	}
	fmt.Println("live sequences:", e.Sequences())
	// Output:
	// attention binds to: q k_cache extra_k_cache indices block_table extra_block_table cache_seqlens seqlens_q cached cu_seqlens_q cu_seqlens_k cu_q_rows batch_header tile_id_counter scale_bmm1 scale_bmm2
	// step 0: prefill 1 [0,64); attention 1: 64 window + 16 ratio-4; free swa 44/48 ratio-4 5/6 indexer 5/6 ratio-128 2/2 state 7/8
	// step 1: prefill 1 [64,128), prefill 2 [0,40); attention 1: 128 window + 32 ratio-4, 2: 40 window + 10 ratio-4; free swa 37/48 ratio-4 4/6 indexer 4/6 ratio-128 1/2 state 6/8
	// step 2: prefill 1 [128,170), prefill 3 [0,64), prefill 4 [0,19), decode 2 +2; attention 1: 128 window + 42 ratio-4, 3: 64 window + 16 ratio-4, 4: 19 window + 4 ratio-4, 2: 43 window + 10 ratio-4; free swa 30/48 ratio-4 2/6 indexer 2/6 ratio-128 1/2 state 4/8
	// step 3: prefill 3 [64,128), prefill 4 [19,30), decode 1 +2, decode 2 +3; attention 3: 128 window + 32 ratio-4, 4: 30 window + 7 ratio-4, 1: 128 window + 43 ratio-4, 2: 45 window + 11 ratio-4; free swa 26/48 ratio-4 2/6 indexer 2/6 ratio-128 0/2 state 4/8
	// step 4: prefill 3 [128,192), decode 1 +3, decode 2 +1, finish 2 at 46, decode 4 +3; attention 3: 128 window + 48 ratio-4, 1: 128 window + 43 ratio-4, 2: 48 window + 12 ratio-4, 4: 33 window + 8 ratio-4; free swa 28/48 ratio-4 3/6 indexer 3/6 ratio-128 0/2 state 5/8
	// step 5: prefill 3 [192,256), decode 1 +1, decode 4 +1, finish 4 at 34; attention 3: 128 window + 64 ratio-4, 1: 128 window + 44 ratio-4, 4: 36 window + 9 ratio-4; free swa 32/48 ratio-4 4/6 indexer 4/6 ratio-128 0/2 state 6/8
	// step 6: prefill 3 [256,270), decode 1 +2, finish 1 at 178; attention 3: 128 window + 67 ratio-4, 1: 128 window + 44 ratio-4; free swa 39/48 ratio-4 4/6 indexer 4/6 ratio-128 1/2 state 7/8
	// step 7: decode 3 +2; attention 3: 128 window + 68 ratio-4; free swa 40/48 ratio-4 4/6 indexer 4/6 ratio-128 1/2 state 7/8
	// step 8: decode 3 +3, finish 3 at 275; attention 3: 128 window + 68 ratio-4; free swa 48/48 ratio-4 6/6 indexer 6/6 ratio-128 2/2 state 8/8
	// live sequences: 0
}

// fits says whether every pool can hold next at its full length beside
// what the running requests will still take, from Pools and
// Config.SequenceMemory.
func fits(cfg engine.Config, pools []engine.PoolUsage, running []*serverRequest, next *serverRequest, mtp int) bool {
	pages := func(length int) map[string]int64 {
		m, err := cfg.SequenceMemory(length)
		if err != nil {
			panic(err)
		}
		out := map[string]int64{"swa": m.SWA}
		for r, b := range m.Ratio {
			out[fmt.Sprintf("ratio-%d", r)] = b
		}
		return out
	}
	// A decode step may overshoot the tokens asked for by its drafts.
	need := pages(next.prompt + next.generate + mtp)
	for _, r := range running {
		final, now := pages(r.prompt+r.generate+mtp), pages(r.length())
		for k, b := range final {
			need[k] += b - now[k]
		}
	}
	for _, p := range pools {
		if p.Slots {
			if p.Free < 1 { // no more sequences may take a state slot (their chunks' moves have slots of their own)
				return false
			}
			continue
		}
		if b, ok := need[p.Name]; ok && b > int64(p.Free)*int64(p.PageBytes)*int64(p.Layers) {
			return false
		}
	}
	return true
}

// attend stands in for the server's attention kernel of a ratio-4 layer:
// bound to the hand-off alone, it counts, for each sequence's last token,
// the window rows and compressed entries it reads, checking that each lies
// in a page the block tables give (seqs only labels the batch rows).
func attend(h *engine.Handoff, layer int, seqs []uint64) string {
	mem := func(t engine.Tensor) []byte { return cpu.Bytes(t.Buffer)[t.Offset:] }
	i32 := func(t engine.Tensor, i int) int { return int(int32(binary.LittleEndian.Uint32(mem(t)[4*i:]))) }
	numSeqs := i32(h.BatchHeader, mla.HdrNumSeqs)
	r := h.Ratio[layer]
	bt := h.ExtraBlockTable[r]
	var out []string
	for b := range numSeqs {
		kv := i32(h.CacheSeqlens, b)
		window := 0
		for pos := max(0, kv-kvcache.DSv4Window); pos < kv; pos++ {
			if i32(h.BlockTable, b*h.BlockTable.Strides[0]+pos/h.PageSize) >= 0 {
				window++
			}
		}
		entries := 0
		for i := range kv / r {
			if i32(bt, b*bt.Strides[0]+i/engine.CompressedPageSize) >= 0 {
				entries++
			}
		}
		out = append(out, fmt.Sprintf("%d: %d window + %d ratio-%d", seqs[b], window, entries, r))
	}
	return strings.Join(out, ", ")
}

// hiddenRows draws the iteration's hidden rows, keyed by sequence,
// position and layer.
func hiddenRows(it *engine.Iteration, hidden, layer int) []byte {
	m := it.Metadata()
	out := make([]byte, 0, 2*it.Tokens()*hidden)
	for t := range it.Tokens() {
		b, pos, _ := m.Row(t)
		rng := rand.New(rand.NewPCG(m.Seqs[b], uint64(pos)<<8|uint64(layer)))
		for range hidden {
			out = binary.LittleEndian.AppendUint16(out, numerics.BF16FromF32(float32(rng.NormFloat64())))
		}
	}
	return out
}

// freePages lists each pool's free pages (slots for the states).
func freePages(pools []engine.PoolUsage) string {
	var out []string
	for _, p := range pools {
		name := p.Name
		if p.Slots {
			name = "state"
			if strings.Contains(strings.Join(out, " "), "state ") {
				continue // the states of every ratio share their slots
			}
		}
		out = append(out, fmt.Sprintf("%s %d/%d", name, p.Free, p.Pages))
	}
	return strings.Join(out, " ")
}
