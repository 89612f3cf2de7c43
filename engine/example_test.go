package engine_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// The whole life of a request on the CPU backend: a 100-token prompt in
// two chunked-prefill pieces, two generation steps with 3 MTP drafts each
// (4 tokens per step), then Finish, after which the sequence is refused.
// It is the plain prologue, each part asked for by name: the projections'
// outputs in (InputProjected), every token kept (FullCache), no compressor,
// eager launches; the zero Config is DeepSeek-V4's layer (Example_server).
func Example() {
	ctx := context.Background()
	e, err := engine.New(ctx, engine.Config{
		SyntheticWeights: &engine.SyntheticWeights{},
		Model:            dsv4.Flash(),
		Cache:            kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 64, NumPages: 16},
		Backend:          engine.BackendCPU,
		Layers:           2,
		MaxSeqs:          4,
		MaxTokens:        64,
		Input:            engine.InputProjected,
		FullCache:        true,
		Compressor:       engine.CompressorConfig{Off: true},
		Eager:            true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()

	// Synthetic activations; a server passes the A and q_b projections'
	// outputs (or writes engine.Inputs on the device).
	rng := rand.New(rand.NewPCG(1, 2))
	activations := func(n int) []byte {
		b := make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(b[2*i:], numerics.BF16FromF32(float32(rng.NormFloat64())))
		}
		return b
	}
	step := func(reqs ...metadata.Request) {
		it, err := e.Begin(ctx, reqs)
		if err != nil {
			fmt.Println("refused:", err)
			return
		}
		defer it.Abort() // does nothing once End succeeded
		for layer := range e.Layers() {
			fusedA := activations(it.Tokens() * e.FusedRowElems())
			q := activations(it.Tokens() * e.Heads() * numerics.HeadDim)
			if err := it.SetInputs(layer, fusedA, q); err != nil {
				fmt.Println(err)
				return
			}
			if err := it.RunLayer(ctx, layer); err != nil {
				fmt.Println(err)
				return
			}
		}
		if err := it.End(ctx); err != nil {
			fmt.Println(err)
			return
		}
		m, pos := it.Metadata(), it.Metadata().Positions()
		fmt.Printf("ctx %2d gen %d tokens, positions %d..%d, slots %d..%d, launches %+v\n",
			m.CtxTokens, m.GenTokens, pos[0], pos[len(pos)-1], m.Slot(0), m.Slot(m.Tokens-1), it.Debug().Census())
	}

	const seq = 7
	step(metadata.Request{Seq: seq, Phase: metadata.Context, NewTokens: 64})
	step(metadata.Request{Seq: seq, Phase: metadata.Context, NewTokens: 36})
	step(metadata.Request{Seq: seq, Phase: metadata.Generation, MTP: 3})
	step(metadata.Request{Seq: seq, Phase: metadata.Generation, MTP: 3})

	n, _ := e.SequenceLength(seq)
	pages, _ := e.Debug().BlockTable(seq)
	fmt.Printf("seq %d holds %d tokens in pages %v; %d of 16 pages free\n", seq, n, pages, e.FreePages())
	if err := e.Finish(seq); err != nil {
		fmt.Println(err)
	}
	fmt.Printf("finished: %d of 16 pages free\n", e.FreePages())
	step(metadata.Request{Seq: seq, Phase: metadata.Generation, MTP: 3})
	// Output:
	// ctx 64 gen 0 tokens, positions 0..63, slots 0..63, launches {ContextKV:2 ContextQ:2 GenerationKV:0 GenerationQ:0}
	// ctx 36 gen 0 tokens, positions 64..99, slots 64..99, launches {ContextKV:2 ContextQ:2 GenerationKV:0 GenerationQ:0}
	// ctx  0 gen 4 tokens, positions 100..103, slots 100..103, launches {ContextKV:0 ContextQ:0 GenerationKV:2 GenerationQ:2}
	// ctx  0 gen 4 tokens, positions 104..107, slots 104..107, launches {ContextKV:0 ContextQ:0 GenerationKV:2 GenerationQ:2}
	// seq 7 holds 108 tokens in pages [0 1]; 14 of 16 pages free
	// finished: 16 of 16 pages free
	// refused: engine: Begin: metadata: request 0 (seq 7): lookup: kvcache: finished sequence 7
}

// A configuration is sized before anything is allocated: Footprint says
// what New would take, and New refuses a configuration past MemoryLimit
// with the size and the field to change.
func ExampleConfig_Footprint() {
	cfg := engine.Config{
		SyntheticWeights: &engine.SyntheticWeights{},
		Model:            dsv4.Flash(),
		Cache:            kvcache.Config{PageSize: 64, NumPages: 1024},
		Backend:          engine.BackendCPU,
		Layers:           2,
		MaxTokens:        4096,
		Input:            engine.InputProjected,
		FullCache:        true,
		Compressor:       engine.CompressorConfig{Off: true},
		Eager:            true,
	}
	fp, err := cfg.Footprint()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(engine.FormatBytes(fp.Total()), "=", fp)

	cfg.MaxTokens = 1 << 24 // a hostile trace's batch
	_, err = engine.New(context.Background(), cfg)
	var ce *engine.ConfigError
	if errors.As(err, &ce) && errors.Is(err, engine.ErrMemoryLimit) {
		fmt.Println("refused:", ce.Field)
	}
	// Output:
	// 518.1 MiB = input buffers 268.0 MiB, Q output 128.0 MiB, KV cache pools 73.1 MiB, RoPE tables 48.0 MiB, metadata 1.0 MiB, weights 8.0 KiB, page bookkeeping 4.0 KiB
	// refused: MaxTokens
}

// An MTP verify step: each sequence runs its token and 3 drafts, and the
// server reports how many verification kept before the step ends. With a
// 128-token window the pages behind it go back to the pool.
func ExampleIteration_Accept() {
	ctx := context.Background()
	m := dsv4.Flash()
	m.NumHeads = 1
	e, err := engine.New(ctx, engine.Config{
		SyntheticWeights: &engine.SyntheticWeights{},
		Model:            m, Backend: engine.BackendCPU, Layers: 1, MaxSeqs: 2, MaxTokens: 300,
		Cache:      kvcache.Config{PageSize: 64, NumPages: 16, Window: kvcache.DSv4Window},
		Input:      engine.InputProjected,
		Compressor: engine.CompressorConfig{Off: true},
		Eager:      true,
	})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	run := func(accepted map[uint64]int, reqs ...metadata.Request) {
		it, err := e.Begin(ctx, reqs)
		if err != nil {
			panic(err)
		}
		fused := make([]byte, it.Tokens()*e.FusedRowElems()*2)
		q := make([]byte, it.Tokens()*e.Heads()*512*2)
		if err := it.SetInputs(0, fused, q); err != nil {
			panic(err)
		}
		if err := it.RunLayer(ctx, 0); err != nil {
			panic(err)
		}
		if err := it.Accept(accepted); err != nil {
			panic(err)
		}
		if err := it.End(ctx); err != nil {
			panic(err)
		}
	}
	run(nil, metadata.Request{Seq: 1, Phase: metadata.Context, NewTokens: 300})
	table, _ := e.Debug().BlockTable(1)
	fmt.Println("after the prompt:", table)
	run(map[uint64]int{1: 2}, metadata.Request{Seq: 1, Phase: metadata.Generation, MTP: 3})
	n, _ := e.SequenceLength(1)
	fmt.Println("kept 2 of 4:", n)
	// Output:
	// after the prompt: [-1 -1 2 3 4]
	// kept 2 of 4: 302
}
