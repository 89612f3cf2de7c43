package engine_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// The layer from hidden states: the engine holds each layer's attention
// weights (here synthetic ones from a seed; Config.Checkpoint names a real
// checkpoint directory) and runs act_quant, the [wq_a; wkv] and wq_b FP8
// GEMMs, q_norm and the prologue. A server hands over each layer's hidden
// states (SetHidden, or writes HiddenInput on the device) and reads Q and
// the KV cache. This engine computes heads [2, 4) of 4: one shard of
// head-sharded tensor parallelism.
func Example_hiddenStates() {
	ctx := context.Background()
	model := weights.TinyConfig() // hidden 256, q_lora_rank 256
	model.NumHeads = 4
	e, err := engine.New(ctx, engine.Config{
		Model:            model,
		Cache:            kvcache.Config{PageSize: 64, NumPages: 8},
		Backend:          engine.BackendCPU,
		Input:            engine.InputHidden,
		SyntheticWeights: &engine.SyntheticWeights{Seed: 42},
		HeadBegin:        2,
		HeadEnd:          4,
		Layers:           2,
		MaxSeqs:          4,
		MaxTokens:        64,
		FullCache:        true,
		Compressor:       engine.CompressorConfig{Off: true},
		Eager:            true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	fmt.Printf("hidden input: %d bytes = %d tokens x %d bf16; Q heads per token: %d\n",
		e.HiddenInput().Len(), 64, e.HiddenSize(), e.Heads())

	rng := rand.New(rand.NewPCG(1, 2))
	hidden := func(tokens int) []byte {
		b := make([]byte, 2*tokens*e.HiddenSize())
		for i := range tokens * e.HiddenSize() {
			binary.LittleEndian.PutUint16(b[2*i:], numerics.BF16FromF32(float32(rng.NormFloat64())))
		}
		return b
	}
	for _, reqs := range [][]metadata.Request{
		{{Seq: 1, Phase: metadata.Context, NewTokens: 20}, {Seq: 2, Phase: metadata.Context, NewTokens: 7}},
		{{Seq: 1, Phase: metadata.Generation, MTP: 1}, {Seq: 2, Phase: metadata.Generation, MTP: 1}},
	} {
		it, err := e.Begin(ctx, reqs)
		if err != nil {
			fmt.Println(err)
			return
		}
		for layer := range e.Layers() {
			// The hidden states differ per layer in a real model.
			if err := it.SetHidden(layer, hidden(it.Tokens())); err != nil {
				fmt.Println(err)
				return
			}
			if err := it.RunLayer(ctx, layer); err != nil {
				fmt.Println(err)
				return
			}
		}
		q, err := it.Debug().ReadQ()
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := it.End(ctx); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%d tokens: Q %d bytes (%d tokens x %d heads x 512 e4m3), launches %+v\n",
			it.Tokens(), len(q), it.Tokens(), e.Heads(), it.Debug().Census())
	}
	// Output:
	// hidden input: 32768 bytes = 64 tokens x 256 bf16; Q heads per token: 2
	// 27 tokens: Q 27648 bytes (27 tokens x 2 heads x 512 e4m3), launches {ContextKV:2 ContextQ:2 GenerationKV:0 GenerationQ:0}
	// 4 tokens: Q 4096 bytes (4 tokens x 2 heads x 512 e4m3), launches {ContextKV:0 ContextQ:0 GenerationKV:2 GenerationQ:2}
}
