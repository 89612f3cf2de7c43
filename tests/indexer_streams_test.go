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
// the name the engine opens it as; the -nolt, -nopdl and -nowgmma
// variants run the third stream with one GEMM path or launch form less
// (every FP8 GEMM on the own kernels, no programmatic dependent launch, no
// wgmma kernel), the -ltws and -ltnone ones with cuBLASLt's split K only
// through its workspace or not at all (cudatune.CuBLASLtSplitK), on the
// tiny model only; -tok the third stream with indexer_query_tok at every
// size (cudatune.IndexerQueryTok), on the tiny model and V4-Flash decode.
var cudaStreams = map[string]struct {
	stream cudatune.IndexerStream
	opts   cuda.Options
	split  cudatune.CuBLASLtSplitK
	query  cudatune.IndexerQuery
}{
	"cuda-istream-aux-tok":     {stream: cudatune.IndexerStreamAux, query: cudatune.IndexerQueryTok},
	"cuda-istream-aux-ltws":    {stream: cudatune.IndexerStreamAux, split: cudatune.CuBLASLtSplitKWorkspace},
	"cuda-istream-aux-ltnone":  {stream: cudatune.IndexerStreamAux, split: cudatune.CuBLASLtSplitKNone},
	"cuda-istream-main-ltnone": {stream: cudatune.IndexerStreamMain, split: cudatune.CuBLASLtSplitKNone},
	"cuda-istream-main":        {stream: cudatune.IndexerStreamMain},
	"cuda-istream-aux":         {stream: cudatune.IndexerStreamAux},
	"cuda-istream-aux-nolt":    {stream: cudatune.IndexerStreamAux, opts: cuda.Options{NoCuBLASLt: true}},
	"cuda-istream-aux-nopdl":   {stream: cudatune.IndexerStreamAux, opts: cuda.Options{NoPDL: true}},
	"cuda-istream-aux-nowgmma": {stream: cudatune.IndexerStreamAux, opts: cuda.Options{NoWGMMA: true}},
}

func init() {
	for name, s := range cudaStreams {
		engine.RegisterBackend(name, func(o engine.Options) (mla.Backend, error) {
			opts := s.opts
			opts.Device, opts.Logger = o.Device, o.Logger
			b, err := cuda.NewTuned(opts, cudatune.Knobs{IndexerStream: s.stream, CuBLASLtSplitK: s.split, IndexerQuery: s.query})
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
// rejected drafts; and, through graphs, cmd/decode's own run (its
// embedded chain trace, V4-Flash's first four layers and V4-Pro's first
// three, 1024 pages of 64 tokens, the default window and compressor).
func TestChainCUDAIndexerStreams(t *testing.T) {
	requireCUDA(t, 1)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	short, err := trace.Parse(strings.NewReader(`
{"context":[{"seq":1,"tokens":23},{"seq":2,"tokens":6}]}
{"context":[{"seq":2,"tokens":5}],"generation":{"mtp":3,"seqs":[1],"accept":[2]}}
{"generation":{"mtp":3,"seqs":[1,2],"accept":[1,3]}}
{"generation":{"mtp":3,"seqs":[1,2],"accept":[4,1]}}
{"generation":{"mtp":3,"seqs":[1,2],"accept":[2,2]}}
`))
	require.NoError(t, err)
	chain, err := trace.DefaultChain()
	require.NoError(t, err)
	st := trace.Summarize(chain)
	for _, model := range []string{"tiny", "flash", "flash-decode", "pro-decode"} {
		backends := []string{"cuda-istream-main", "cuda-istream-aux"}
		if model == "tiny" || model == "flash-decode" {
			backends = append(backends, "cuda-istream-aux-tok")
		}
		if model == "tiny" {
			backends = append(backends, "cuda-istream-aux-nolt", "cuda-istream-aux-nopdl", "cuda-istream-aux-nowgmma",
				"cuda-istream-aux-ltws", "cuda-istream-aux-ltnone", "cuda-istream-main-ltnone")
		}
		for _, backend := range backends {
			for _, graphs := range []bool{true, false} {
				decode := strings.HasSuffix(model, "-decode")
				if decode && !graphs {
					continue // cmd/decode's default
				}
				t.Run(model+"/"+backend+map[bool]string{true: "/graphs", false: "/eager"}[graphs], func(t *testing.T) {
					steps := short
					cfg := engine.Config{
						Model: weights.TinyConfig(), Cache: kvcache.Config{PageSize: 16, NumPages: 64, Window: 32},
						Backend: backend, Layers: 3, MaxSeqs: 4, MaxTokens: 64, RopePositions: 256,
						Compressor:       engine.CompressorConfig{Ratio4Pages: 4, Ratio128Pages: 2, MaxDrafts: 3},
						Input:            engine.InputHidden,
						SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
						Eager:            !graphs,
					}
					cfg.Model.IndexTopK = 4
					idxLayer := 1 // tiny: layer 1 is the ratio-4 layer
					switch model {
					case "flash":
						cfg.Model, cfg.Compressor.Ratio128Pages, idxLayer = dsv4.Flash(), 0, 2 // layers 0 and 1 are SWA-only
					case "flash-decode", "pro-decode":
						steps = chain
						cfg.Model, cfg.Layers, idxLayer = dsv4.Flash(), 4, 2
						if model == "pro-decode" {
							cfg.Model, cfg.Layers = dsv4.Pro(), 3 // layers 0 and 1 are ratio 128
						}
						cfg.Cache, cfg.RopePositions, cfg.Compressor = kvcache.Config{PageSize: 64, NumPages: 1024}, 65536, engine.CompressorConfig{}
						cfg.MaxSeqs, cfg.MaxTokens = st.MaxSeqs, st.MaxTokens
					}
					r, err := replay.New(context.Background(), replay.Options{Engine: cfg, Seed: seed, Verify: true})
					require.NoError(t, err)
					defer r.Close()
					require.True(t, r.Engine().RunsIndexer(idxLayer))
					require.Equal(t, cudaStreams[backend].stream == cudatune.IndexerStreamAux, r.Engine().Debug().IndexerQueryOnAux(idxLayer))
					rep, err := r.Run(context.Background(), steps, nil)
					require.NoError(t, err)
					require.Equal(t, len(steps), rep.Summary.Verified)
				})
			}
		}
	}
}
