package engine_test

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/weights"
)

// What a server's attention kernel binds to: every buffer the engine
// writes for attention, with the argument names of FlashMLA's sparse
// decode and a varlen FMHA, the capacity shape (fixed for the engine's
// life, so a CUDA graph captured against it stays valid) and when the
// contents change. On CUDA, Buffer is a *cuda.Buffer (Ptr() + Offset is
// the device address); on the CPU backend, cpu.Bytes(Buffer)[Offset:].
func ExampleEngine_Handoff() {
	e, err := engine.New(context.Background(), engine.Config{
		Model:            weights.TinyConfig(), // layers of ratio 0, 4, 128 and an MTP layer
		Cache:            kvcache.Config{PageSize: 16, NumPages: 32},
		Backend:          engine.BackendCPU,
		SyntheticWeights: &engine.SyntheticWeights{Seed: 1},
		Compressor:       engine.CompressorConfig{Ratio4Pages: 4, Ratio128Pages: 2},
		MaxSeqs:          4,
		MaxTokens:        64,
		RopePositions:    1024,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	for _, t := range e.Handoff().Tensors() {
		fmt.Printf("%-17s %-7v %-14v %v\n", t.Name, t.DType, fmt.Sprint(t.Shape), t.Lifetime)
	}
	// Output:
	// q                 e4m3    [64 2 512]     per-layer
	// k_cache           uint8   [32 9792]      persistent
	// k_cache           uint8   [32 9792]      persistent
	// k_cache           uint8   [32 9792]      persistent
	// k_cache           uint8   [32 9792]      persistent
	// extra_k_cache     uint8   [4 37440]      persistent
	// extra_k_cache     uint8   [2 37440]      persistent
	// indices           int32   [64 512]       per-layer
	// block_table       int32   [4 64]         per-iteration
	// extra_block_table int32   [4 4]          per-iteration
	// extra_block_table int32   [4 1]          per-iteration
	// cache_seqlens     int32   [4]            per-iteration
	// seqlens_q         int32   [4]            per-iteration
	// cached            int32   [4]            per-iteration
	// cu_seqlens_q      int32   [5]            per-iteration
	// cu_seqlens_k      int32   [5]            per-iteration
	// cu_q_rows         int32   [5]            per-iteration
	// batch_header      int32   [9]            per-iteration
	// tile_id_counter   uint32  [1]            per-layer
	// scale_bmm1        float32 [2]            per-layer
	// scale_bmm2        float32 [1]            per-layer
}
