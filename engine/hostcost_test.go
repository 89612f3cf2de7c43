package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// hostOnlyBackend is the CPU backend's memory with kernels that do nothing
// and graphs that replay nothing: an iteration through it costs only the
// engine's own host work, the part BenchmarkBegin measures.
type hostOnlyBackend struct{ *cpu.Backend }

func (hostOnlyBackend) Name() string { return hostOnlyName }
func (hostOnlyBackend) KVNormRopeStore(context.Context, mla.Launch, *mla.LayerArgs) error {
	return nil
}
func (hostOnlyBackend) QNormRopeQuant(context.Context, mla.Launch, *mla.LayerArgs) error {
	return nil
}
func (hostOnlyBackend) Capture(f func() error) (mla.Graph, error) {
	if err := f(); err != nil {
		return nil, err
	}
	return noGraph{}, nil
}

type noGraph struct{}

func (noGraph) Launch() error { return nil }
func (noGraph) Close() error  { return nil }

const hostOnlyName = "host-only-test"

// hostOnlyOpening is true only while BenchmarkBegin opens its engine, so
// that no other test's auto backend picks the kernel-less backend.
var hostOnlyOpening bool

func init() {
	engine.RegisterBackend(hostOnlyName,
		func(engine.Options) (mla.Backend, error) { return hostOnlyBackend{cpu.New(1)}, nil },
		func() error {
			if !hostOnlyOpening {
				return fmt.Errorf("%s is only for BenchmarkBegin", hostOnlyName)
			}
			return nil
		})
}

// BenchmarkBegin is the engine's host cost of one generation iteration
// (Begin, the layer's no-op launches or graph replay, End) at decode sizes,
// every sequence holding about 2048 tokens, graphs on as the CUDA backend
// runs them. The refills (fresh sequences, with the timer stopped) take
// most of a CPU profile's samples: leave them out with
// go tool pprof -ignore refillDecodeBatch.
func BenchmarkBegin(b *testing.B) {
	const prefill, pageSize = 2048, 64
	for _, mtp := range []int{0, 3} {
		for _, nb := range []int{1, 32, 256} {
			b.Run(fmt.Sprintf("b=%d/mtp=%d", nb, mtp), func(b *testing.B) {
				// Every refill steps the sequences are replaced by fresh ones
				// of prefill tokens, so they hold prefill to prefill+refill*(1+mtp)
				// tokens whatever b.N is.
				const refill = 64
				perSeq := (prefill+refill*(1+mtp))/pageSize + 2
				cfg := engine.Config{
					SyntheticWeights: &engine.SyntheticWeights{},
					Model:            smallModel(),
					Cache:            kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: pageSize, NumPages: nb * perSeq},
					Backend:          hostOnlyName,
					Layers:           1,
					MaxSeqs:          nb,
					MaxTokens:        max(nb*(1+mtp), prefill),
					RopePositions:    perSeq * pageSize,
					Input:            engine.InputProjected,
					FullCache:        true,
					Compressor:       engine.CompressorConfig{Off: true},
				}
				hostOnlyOpening = true
				e := newEngine(b, cfg)
				hostOnlyOpening = false
				decode := make([]metadata.Request, nb)
				next := uint64(1)
				refillDecodeBatch(b, e, decode, &next, prefill, mtp)
				runIteration(b, e, decode) // captures the bucket's graph
				steps := 0
				for b.Loop() {
					if steps++; steps%refill == 0 {
						b.StopTimer()
						refillDecodeBatch(b, e, decode, &next, prefill, mtp)
						b.StartTimer()
					}
					runIteration(b, e, decode)
				}
			})
		}
	}
}

// runIteration is one Begin, RunLayer(0), End.
func runIteration(b *testing.B, e *engine.Engine, reqs []metadata.Request) {
	ctx := context.Background()
	it, err := e.Begin(ctx, reqs)
	if err != nil {
		b.Fatal(err)
	}
	if err := it.RunLayer(ctx, 0); err != nil {
		b.Fatal(err)
	}
	if err := it.End(ctx); err != nil {
		b.Fatal(err)
	}
}

// refillDecodeBatch finishes decode's sequences and replaces them with
// fresh ones (ids from *next on) of prefill tokens, as generation requests
// of mtp drafts.
func refillDecodeBatch(b *testing.B, e *engine.Engine, decode []metadata.Request, next *uint64, prefill, mtp int) {
	for _, r := range decode {
		if r.Seq != 0 {
			if err := e.Finish(r.Seq); err != nil {
				b.Fatal(err)
			}
		}
	}
	for s := range decode {
		runIteration(b, e, []metadata.Request{ctxReq(*next, prefill)})
		decode[s] = genReq(*next, mtp)
		*next++
	}
}
