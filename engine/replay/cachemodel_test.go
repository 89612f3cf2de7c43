package replay

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/weights"
)

// TestLongRandomReplay replays a long generated workload (arrivals, chunked
// prefills, MTP steps with random acceptance, finishes) on a windowed
// engine with the compressor, with pools tight enough that some lines are
// refused, verifying every iteration against a second cpu engine (Q, the
// SWA pages written, every compressed pool byte). After every line the
// engine's invariants hold (no page, entry or state leaks; lengths, entries
// and states agree), and once every sequence is finished every pool is
// free and no state is left. Two engines: V4-Flash's layers on the
// projected path (the compressor's pools, the indexer's kept but not
// computed), and the tiny model on the hidden-state path, where the
// ratio-4 layer's indexer computes its query, head weights, keys and top-k
// selection (index_topk 16, so the long prompts' rows score and select),
// the verify comparing its query, weights, whole indexer cache and states
// byte for byte.
func TestLongRandomReplay(t *testing.T) {
	flash := dsv4.Flash()
	flash.NumHeads = 1
	tiny := weights.TinyConfig() // layers 0, 4, 128
	tiny.IndexTopK = 16
	// workload is a replay's size: the generator's lines (about), its short
	// and long prompt lengths, the most generation steps of a stream and
	// the ratio-4 pool's pages, sized so that some lines are refused.
	type workload struct {
		lines        int
		prompt, long [2]int
		steps        int
		ratio4Pages  int
	}
	tests := []struct {
		name            string
		model           dsv4.Config
		layers          int
		input           engine.InputMode
		full, short     workload // the non-race pass, the -race (and -short) one
		indexer, verify bool
	}{
		{"projected", flash, 4, engine.InputProjected,
			workload{1500, [2]int{1, 160}, [2]int{300, 700}, 40, 8}, workload{200, [2]int{1, 160}, [2]int{300, 700}, 40, 8}, false, true},
		// The indexer's GEMMs (wq_b, 8192 outputs a token) and the
		// compressors' projections make a token costlier here, so shorter
		// prompts (under -race, short enough that the ratio-4 layers still
		// see more than index_topk entries); a verify would only compare the
		// cpu backend with itself, at twice the cost.
		{"hidden, indexer", tiny, 3, engine.InputHidden,
			workload{600, [2]int{1, 80}, [2]int{150, 400}, 40, 4}, workload{12, [2]int{1, 40}, [2]int{80, 160}, 12, 2}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			w := tt.full
			if testing.Short() || race.Enabled {
				// The detector sees the same goroutines in fewer lines;
				// .ci/run's non-race step replays them all.
				w = tt.short
			}
			n := w.lines
			p := trace.GenParams{
				Seed: seed, Streams: 4, Arrivals: n / 5, ArrivalSpan: max(n/2, n-100),
				PromptMin: w.prompt[0], PromptMax: w.prompt[1], ShortBudget: 200,
				LongPrompts: max(2, n/150), LongMin: w.long[0], LongMax: w.long[1],
				Chunk: 130, StepsMin: 2, StepsMax: w.steps, MTP: 3, Accept: true,
			}
			longRandomReplay(t, p, engine.Config{
				SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
				Model:            tt.model, Cache: kvcache.Config{PageSize: 16, NumPages: 32, Window: 32},
				Backend: engine.BackendCPU, Layers: tt.layers, MaxSeqs: 16, MaxTokens: 1024, RopePositions: 4096,
				Compressor: engine.CompressorConfig{Ratio4Pages: w.ratio4Pages, Ratio128Pages: 12, MaxDrafts: 3},
				Input:      tt.input,
				Eager:      true,
			}, tt.indexer, tt.verify)
		})
	}
}

// longRandomReplay is TestLongRandomReplay on one workload and engine
// configuration; indexer says the ratio-4 layers compute the indexer (and its pools must
// be listed and drained like the others).
func longRandomReplay(t *testing.T, p trace.GenParams, cfg engine.Config, indexer, verify bool) {
	steps, err := trace.Generate(p)
	require.NoError(t, err)
	r, err := New(context.Background(), Options{Engine: cfg, Seed: p.Seed, Verify: verify})
	require.NoError(t, err)
	defer r.Close()
	e := r.Engine()
	for l := range cfg.Layers {
		ratio, err := cfg.Model.CompressRatio(l)
		require.NoError(t, err)
		require.Equal(t, indexer && ratio == kvcache.DSv4IndexerRatio, e.RunsIndexer(l), "layer %d", l)
	}
	refused := 0
	ids := map[uint64]bool{}
	dead := map[uint64]bool{} // sequences whose prompt was refused: a server drops them
	for _, s := range steps {
		s = withoutDead(s, dead)
		if !s.HasBatch() && len(s.Finish) == 0 {
			continue
		}
		for _, q := range s.Requests() {
			ids[q.Seq] = true
		}
		if _, err := r.Step(context.Background(), s); err != nil {
			for _, q := range s.Requests() {
				if _, err := e.SequenceLength(q.Seq); err != nil {
					dead[q.Seq] = true
				}
			}
			var ve *VerifyError
			require.False(t, errors.As(err, &ve), "line %d: %v", s.Line, err)
			// A refused line (a full pool, or a sequence whose prompt was
			// refused before) changes nothing.
			if !errors.Is(err, engine.ErrCacheFull) && !errors.Is(err, kvcache.ErrUnknownSequence) && !errors.Is(err, kvcache.ErrFinishedSequence) {
				require.NoError(t, err, "line %d", s.Line)
			}
			refused++
			// The server still ends the sequences the line finishes.
			for _, id := range s.Finish {
				_ = e.Finish(id)
				if verify {
					_ = r.Reference().Finish(id)
				}
			}
		}
		require.NoError(t, e.Debug().CheckInvariants(), "after line %d", s.Line)
		if verify {
			require.NoError(t, r.Reference().Debug().CheckInvariants(), "reference, after line %d", s.Line)
		}
	}
	t.Logf("%d lines, %d refused", len(steps), refused)
	require.Positive(t, refused, "the pools are sized to refuse some lines")
	require.Less(t, refused, len(steps)*3/4, "most lines run")
	for id := range ids {
		_ = e.Finish(id) // the lines that finished them may have been refused
	}
	require.NoError(t, e.Debug().CheckInvariants())
	require.Zero(t, e.Sequences())
	require.Zero(t, e.Debug().CompressorSequences())
	names := map[string]bool{}
	for _, p := range e.Pools() {
		names[p.Name] = true
		require.Equal(t, p.Pages, p.Free, "pool %s", p.Name)
	}
	for _, n := range []string{kvcache.DSv4SWA, kvcache.DSv4RatioPool(4), kvcache.DSv4RatioPool(128), kvcache.DSv4StatePool(4),
		kvcache.DSv4Indexer, kvcache.DSv4IndexerState} {
		require.True(t, names[n], "pool %s listed", n)
	}
}

// TestSequenceMemoryFlash pins DESIGN.md section 8's figures for V4-Flash
// at 1M tokens: about 3.3 GB per sequence with the window and the
// compressed caches (3.7 GB with the indexer's keys of section 9), against about 25.7 GB (in decimal units, 27 GB) when
// every layer keeps every token.
func TestSequenceMemoryFlash(t *testing.T) {
	cfg := engine.Config{
		SyntheticWeights: &engine.SyntheticWeights{},
		Model:            dsv4.Flash(), Cache: kvcache.Config{PageSize: 64, NumPages: 64, Window: kvcache.DSv4Window},
		Backend: engine.BackendCPU, MaxSeqs: 1, MaxTokens: 64, RopePositions: 64,
		Compressor: engine.CompressorConfig{Ratio4Pages: 1, Ratio128Pages: 1},
		Input:      engine.InputProjected,
		Eager:      true,
	}
	m, err := cfg.SequenceMemory(1 << 20)
	require.NoError(t, err)
	pageBytes := int64(37440)
	require.Equal(t, 44*2*pageBytes, m.SWA)                     // the last 128 positions fill pages 16382 and 16383, 44 layers
	require.Equal(t, 21*4096*pageBytes, m.Ratio[4])             // 262144 entries, 21 layers
	require.Equal(t, 20*128*pageBytes, m.Ratio[128])            // 8192 entries, 20 layers
	require.Equal(t, int64(21*16*1024*8+20*136*512*8), m.State) // (8 + 7 + 1) and (128 + 7 + 1) rows
	require.InDelta(t, 3.33e9, float64(m.Total()-m.Indexer-m.IndexerState), 0.05e9)
	// Section 9: the indexer's keys, 68 bytes an entry (374 MB), and its
	// compressor's states (16 rows of 2*256 float32), 21 layers.
	require.Equal(t, int64(21*4096*64*68), m.Indexer)
	require.Equal(t, int64(21*16*256*8), m.IndexerState)
	require.InDelta(t, 3.71e9, float64(m.Total()), 0.05e9)
	full := cfg
	full.Cache.Window, full.FullCache = 0, true
	full.Compressor = engine.CompressorConfig{Off: true}
	f, err := full.SequenceMemory(1 << 20)
	require.NoError(t, err)
	require.Equal(t, 44*16384*pageBytes, f.Total())
}

// TestSequenceMemoryBounds: a length past max_position_embeddings (up to
// math.MaxInt, whose page count once overflowed to a negative figure) is
// refused; the longest allowed one gives positive, finite parts.
func TestSequenceMemoryBounds(t *testing.T) {
	for _, window := range []int{0, kvcache.DSv4Window} {
		cfg := engine.Config{
			SyntheticWeights: &engine.SyntheticWeights{},
			Model:            dsv4.Flash(), Cache: kvcache.Config{PageSize: 64, NumPages: 64, Window: window}, FullCache: window == 0,
			Backend: engine.BackendCPU, MaxSeqs: 1, MaxTokens: 64, RopePositions: 64,
			Compressor: engine.CompressorConfig{Ratio4Pages: 1, Ratio128Pages: 1},
			Input:      engine.InputProjected,
			Eager:      true,
		}
		longest := cfg.Model.MaxPositionEmbeddings
		for _, n := range []int{-1, longest + 1, math.MaxInt - 63, math.MaxInt} {
			_, err := cfg.SequenceMemory(n)
			require.ErrorIs(t, err, kvcache.ErrPositionOutOfRange, "window %d, length %d", window, n)
		}
		m, err := cfg.SequenceMemory(longest)
		require.NoError(t, err)
		require.Positive(t, m.SWA)
		require.Positive(t, m.State)
		require.Less(t, m.Total(), int64(math.MaxInt64))
		for r, b := range m.Ratio {
			require.Positive(t, b, "ratio %d", r)
		}
	}
}

// withoutDead drops the sequences of dead from a line (and their accepted
// counts and finishes).
func withoutDead(s trace.Step, dead map[uint64]bool) trace.Step {
	out := trace.Step{Line: s.Line}
	for _, c := range s.Context {
		if !dead[c.Seq] {
			out.Context = append(out.Context, c)
		}
	}
	if g := s.Generation; g != nil {
		ng := &trace.Generation{MTP: g.MTP}
		for i, seq := range g.Seqs {
			if dead[seq] {
				continue
			}
			ng.Seqs = append(ng.Seqs, seq)
			if g.Accept != nil {
				ng.Accept = append(ng.Accept, g.Accept[i])
			}
		}
		if len(ng.Seqs) > 0 {
			out.Generation = ng
		}
	}
	for _, seq := range s.Finish {
		if !dead[seq] {
			out.Finish = append(out.Finish, seq)
		}
	}
	return out
}
