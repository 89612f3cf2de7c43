package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/weights"
)

// cudaStreams are the CUDA backend under each cudatune.IndexerStream, by
// the name the engine opens it as.
var cudaStreams = map[string]cudatune.IndexerStream{
	"cuda-istream-main": cudatune.IndexerStreamMain,
	"cuda-istream-aux":  cudatune.IndexerStreamAux,
}

func init() {
	for name, s := range cudaStreams {
		engine.RegisterBackend(name, func(o engine.Options) (mla.Backend, error) {
			b, err := cuda.NewTuned(cuda.Options{Device: o.Device, Logger: o.Logger}, cudatune.Knobs{IndexerStream: s})
			if err != nil {
				return nil, err
			}
			return b, nil
		}, cuda.Available)
	}
}

// TestChainCUDAIndexerStreams runs the hidden-state chain with the
// indexer on the GPU with its query path on the main stream and on the
// third stream (cudatune.IndexerStreamAux: the wq_b GEMM and the query
// step forked after q_norm, the step after the side stream's projection
// GEMM), through CUDA graphs and launch by launch, and verifies every
// layer as cmd/decode --verify does (the indexer's query, head weights and
// cache entries byte for byte): the tiny model's ratio-4 layer 1 and
// V4-Flash's layer 2 with synthetic weights, prefill then MTP decode with
// rejected drafts.
func TestChainCUDAIndexerStreams(t *testing.T) {
	requireCUDA(t, 1)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	steps, err := trace.Parse(strings.NewReader(`
{"context":[{"seq":1,"tokens":23},{"seq":2,"tokens":6}]}
{"context":[{"seq":2,"tokens":5}],"generation":{"mtp":3,"seqs":[1],"accept":[2]}}
{"generation":{"mtp":3,"seqs":[1,2],"accept":[1,3]}}
{"generation":{"mtp":3,"seqs":[1,2],"accept":[4,1]}}
{"generation":{"mtp":3,"seqs":[1,2],"accept":[2,2]}}
`))
	require.NoError(t, err)
	for _, model := range []string{"tiny", "flash"} {
		for _, backend := range []string{"cuda-istream-main", "cuda-istream-aux"} {
			for _, graphs := range []bool{true, false} {
				t.Run(model+"/"+backend+map[bool]string{true: "/graphs", false: "/eager"}[graphs], func(t *testing.T) {
					m, layers, idxLayer, r128 := weights.TinyConfig(), 3, 1, 2 // layer 1 is the ratio-4 layer
					m.IndexTopK = 4
					if model == "flash" {
						m, idxLayer, r128 = dsv4.Flash(), 2, 0 // layers 0 and 1 are SWA-only
					}
					r, err := replay.New(context.Background(), replay.Options{
						Engine: engine.Config{
							Model: m, Cache: kvcache.Config{PageSize: 16, NumPages: 64, Window: 32},
							Backend: backend, Layers: layers, MaxSeqs: 4, MaxTokens: 64, RopePositions: 256,
							Compressor:       engine.CompressorConfig{Ratio4Pages: 4, Ratio128Pages: r128, MaxDrafts: 3},
							Input:            engine.InputHidden,
							SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
							Eager:            !graphs,
						},
						Seed: seed, Verify: true,
					})
					require.NoError(t, err)
					defer r.Close()
					require.True(t, r.Engine().RunsIndexer(idxLayer))
					require.Equal(t, cudaStreams[backend] == cudatune.IndexerStreamAux, r.Engine().Debug().IndexerQueryOnAux(idxLayer))
					rep, err := r.Run(context.Background(), steps, nil)
					require.NoError(t, err)
					require.Equal(t, len(steps), rep.Summary.Verified)
				})
			}
		}
	}
}
