package engine_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// compConfig is V4-Flash with one head and layers 0..3 (ratios 0, 0, 4,
// 128), windowed, with the compressor on: the compressor and the SWA cache
// do not depend on the heads, and one head keeps the Q path cheap.
func compConfig() engine.Config {
	cfg := smallConfig()
	cfg.Model.NumHeads = 1
	cfg.Layers = 4
	cfg.Cache = kvcache.Config{PageSize: 16, NumPages: 64, Window: 32}
	cfg.FullCache = false
	cfg.RopePositions = 2048
	cfg.MaxTokens = 512
	cfg.Compressor = engine.CompressorConfig{Ratio4Pages: 24, Ratio128Pages: 8}
	return cfg
}

// compRows draws a compressed layer's K and G rows for the iteration's
// tokens, keyed by (seed, seq, position, layer) like positionInputs.
func compRows(seed uint64, e *engine.Engine, it *engine.Iteration, layer int) (k, g []byte) {
	w := e.CompressorWidth(layer)
	m := it.Metadata()
	for row := range it.Tokens() {
		b, pos, _ := m.Row(row)
		rng := rand.New(rand.NewPCG(seed^m.Seqs[b]*0x9e3779b97f4a7c15^0xc0, uint64(pos)<<16|uint64(layer)))
		scale := math.Ldexp(1, rng.IntN(6)-2)
		for range w {
			k = binary.LittleEndian.AppendUint32(k, math.Float32bits(float32(rng.NormFloat64()*scale)))
			g = binary.LittleEndian.AppendUint32(g, math.Float32bits(float32(rng.NormFloat64()*3+0.5)))
		}
	}
	return k, g
}

// runComp runs one iteration with position-keyed inputs (compressor rows
// included), reports accepted (nil: all) and ends it.
func runComp(t testing.TB, seed uint64, e *engine.Engine, accepted map[uint64]int, reqs ...metadata.Request) {
	t.Helper()
	ctx := context.Background()
	it, err := e.Begin(ctx, reqs)
	require.NoError(t, err)
	for l := range e.Layers() {
		f, q := positionInputs(seed, e, it, l)
		require.NoError(t, it.SetInputs(l, f, q))
		if e.CompressorWidth(l) > 0 {
			k, g := compRows(seed, e, it, l)
			require.NoError(t, it.SetCompressorInputs(l, k, g))
		}
		require.NoError(t, it.RunLayer(ctx, l))
	}
	if accepted != nil {
		require.NoError(t, it.Accept(accepted))
	}
	require.NoError(t, it.End(ctx))
}

// compEntries returns seq's committed compressed entries in a layer, by
// index: the 576 value bytes and the 7 exponents.
func compEntries(t testing.TB, e *engine.Engine, layer int, seq uint64) [][]byte {
	t.Helper()
	r := e.CompressRatio(layer)
	n, err := e.Debug().CompressedEntries(r, seq)
	require.NoError(t, err)
	length, err := e.SequenceLength(seq)
	require.NoError(t, err)
	require.Equal(t, length/r, n, "layer %d seq %d: entries at length %d", layer, seq, length)
	table, err := e.Debug().CompressedBlockTable(r, seq)
	require.NoError(t, err)
	require.Len(t, table, (n+engine.CompressedPageSize-1)/engine.CompressedPageSize)
	pool, err := e.Debug().ReadCompressedPool(layer)
	require.NoError(t, err)
	cfg := kvcache.Config{PageSize: engine.CompressedPageSize, NumPages: len(pool) / kvcache.FormatFP8UE8M0.PageBytes(engine.CompressedPageSize)}
	out := make([][]byte, n)
	for i := range n {
		out[i] = positionBytes(t, cfg, pool, table, i)
		// An entry's UE8M0 exponents are e+127 with e >= -22: never 0, so a
		// zero byte is an entry never written (the pools start zeroed).
		for g, x := range out[i][kvcache.UE8M0ValueBytes:] {
			require.NotZero(t, x, "layer %d seq %d entry %d: exponent %d unwritten", layer, seq, i, g)
		}
	}
	return out
}

// requireSameCompressed checks that two engines hold the same compressed
// entries and compressor state of seq in every compressed layer, bit for
// bit.
func requireSameCompressed(t testing.TB, a, b *engine.Engine, seq uint64, what string) {
	t.Helper()
	for l := range a.Layers() {
		if a.CompressorWidth(l) == 0 {
			continue
		}
		ea, eb := compEntries(t, a, l, seq), compEntries(t, b, l, seq)
		require.Len(t, ea, len(eb), "%s: layer %d seq %d entries", what, l, seq)
		for i := range ea {
			require.Equal(t, eb[i], ea[i], "%s: layer %d seq %d entry %d", what, l, seq, i)
		}
		sa, err := a.Debug().CompressorState(l, seq)
		require.NoError(t, err)
		sb, err := b.Debug().CompressorState(l, seq)
		require.NoError(t, err)
		require.Equal(t, sb.Len(), sa.Len())
		fa, ea2 := sa.Window()
		fb, eb2 := sb.Window()
		require.Equal(t, [2]int{fb, eb2}, [2]int{fa, ea2}, "%s: layer %d seq %d state window", what, l, seq)
		for pos := fa; pos < ea2; pos++ {
			ka, ga, ok := sa.Row(pos)
			require.True(t, ok)
			kb, gb, ok := sb.Row(pos)
			require.True(t, ok)
			require.Equal(t, f32bits(kb), f32bits(ka), "%s: layer %d seq %d state K at %d", what, l, seq, pos)
			require.Equal(t, f32bits(gb), f32bits(ga), "%s: layer %d seq %d state G at %d", what, l, seq, pos)
		}
	}
}

func f32bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

// TestCompressorChunkInvariance: one prompt of 300 tokens in one chunk, in
// chunks split at positions 1, 2, 3 mod 4 and 1, 127 mod 128 (chunks
// shorter than 4 and longer than 256 among them), token by token, and
// inside batches of other sequences, on the cpu backend and on the host
// path: every compressed byte, every state value and every readable SWA
// byte is the same.
func TestCompressorChunkInvariance(t *testing.T) {
	seed := testSeed(t)
	const n = 300
	const seq = 7
	splits := map[string][]int{
		"one chunk":      {n},
		"mod 4":          {1, 1, 1, 2, 3, 5, 7, 13, 97, 129, 41},
		"mod 128":        {129, 126, 45},
		"long then tail": {257, 1, 2, 40},
		"short":          {3, 3, 3, 3, 3, 3, 282},
	}
	ref := newEngine(t, compConfig())
	runComp(t, seed, ref, nil, ctxReq(seq, n))
	check := func(e *engine.Engine, what string) {
		requireSameCompressed(t, e, ref, seq, what)
		requireSameLive(t, e, ref, seq, what)
	}
	// Under the race detector three of the five splits (the map's order
	// is random, so a different three each run).
	ran := 0
	for name, chunks := range splits {
		if race.Enabled && ran == 3 {
			break
		}
		ran++
		for _, backend := range []string{engine.BackendCPU} {
			e := newEngine(t, compConfig())
			done := 0
			for _, c := range chunks {
				runComp(t, seed, e, nil, ctxReq(seq, c))
				done += c
			}
			require.Equal(t, n, done)
			check(e, name+" on "+backend)
		}
	}
	// Token by token after a 1-token prompt, with other sequences decoding
	// and prefilling alongside; under the race detector to 140 tokens (one
	// ratio-128 boundary; .ci/run's non-race step runs all 300).
	tokens := n
	if race.Enabled {
		tokens = 140
		ref = newEngine(t, compConfig())
		runComp(t, seed, ref, nil, ctxReq(seq, tokens))
	}
	e := newEngine(t, compConfig())
	runComp(t, seed, e, nil, ctxReq(seq, 1), ctxReq(100, 5))
	next, live := uint64(101), []uint64{}
	for pos := 1; pos < tokens; pos++ {
		reqs := []metadata.Request{}
		if pos%9 == 0 {
			reqs = append(reqs, ctxReq(next, 1+pos%13))
			live = append(live, next)
			next++
		}
		reqs = append(reqs, genReq(seq, 0), genReq(100, 0))
		runComp(t, seed, e, nil, reqs...)
		if pos%37 == 0 {
			for _, o := range live {
				require.NoError(t, e.Finish(o))
			}
			live = live[:0]
		}
	}
	check(e, "token by token in batches")
}

// TestCompressorAccept: MTP verify steps whose drafts are partly rejected
// leave every compressed entry, every compressor state and every readable
// SWA byte as a run that never speculated, and continuing afterwards stays
// byte-identical. Scripted cases first (a step crossing a ratio-4 boundary
// rejected before it and at it, a ratio-128 boundary likewise, rejected
// inside a 128-window, full acceptance), then random steps with drafts
// 1..7 and per-sequence accepted counts, repeated rejections included.
func TestCompressorAccept(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 4))
	cfg := compConfig()
	spec, plain := newEngine(t, cfg), newEngine(t, cfg)
	type scripted struct {
		prompt, drafts, accept int
		what                   string
	}
	cases := []scripted{
		{6, 3, 1, "ratio-4 boundary at 7, rejected before it"},
		{6, 3, 2, "ratio-4 boundary at 7, rejected at it"},
		{6, 3, 4, "ratio-4 boundary, full acceptance"},
		{126, 4, 1, "ratio-128 boundary at 127, rejected before it"},
		{126, 4, 2, "ratio-128 boundary at 127, rejected at it"},
		{60, 7, 3, "inside a ratio-128 window"},
		{3, 7, 8, "from a prompt shorter than 4, full acceptance"},
		{1, 7, 1, "every draft rejected"},
	}
	var seqs []uint64
	for i, c := range cases {
		s := uint64(10 + i)
		seqs = append(seqs, s)
		runComp(t, seed, spec, nil, ctxReq(s, c.prompt))
		runComp(t, seed, plain, nil, ctxReq(s, c.prompt))
	}
	// One batch per depth: every scripted sequence of that depth verifies
	// together with different accepted counts.
	for _, d := range []int{3, 4, 7} {
		var reqs []metadata.Request
		accepted := map[uint64]int{}
		for i, c := range cases {
			if c.drafts == d {
				reqs = append(reqs, genReq(seqs[i], d))
				accepted[seqs[i]] = c.accept
			}
		}
		runComp(t, seed, spec, accepted, reqs...)
		for s, n := range accepted {
			runComp(t, seed, plain, nil, genReq(s, n-1))
		}
	}
	for i, c := range cases {
		requireSameCompressed(t, spec, plain, seqs[i], c.what)
		requireSameLive(t, spec, plain, seqs[i], c.what)
	}
	steps := 80
	if race.Enabled {
		steps = 16 // the detector sees the same goroutines; .ci/run's non-race step runs all 80
	}
	for stepNo := range steps {
		d := 1 + rng.IntN(7)
		accepted := map[uint64]int{}
		var reqs []metadata.Request
		for _, s := range seqs[:4] {
			reqs = append(reqs, genReq(s, d))
			switch rng.IntN(4) {
			case 0:
				accepted[s] = 1 + d
			case 1:
				accepted[s] = 1
			default:
				accepted[s] = 1 + rng.IntN(1+d)
			}
		}
		runComp(t, seed, spec, accepted, reqs...)
		for _, s := range seqs[:4] {
			runComp(t, seed, plain, nil, genReq(s, accepted[s]-1))
		}
		if stepNo%8 == 7 {
			for _, s := range seqs[:4] {
				requireSameCompressed(t, spec, plain, s, fmt.Sprintf("random step %d", stepNo))
				requireSameLive(t, spec, plain, s, fmt.Sprintf("random step %d", stepNo))
			}
		}
	}
	// Continue without speculation: a chunk then decode, both engines.
	for _, s := range seqs {
		runComp(t, seed, spec, nil, ctxReq(s, 9))
		runComp(t, seed, plain, nil, ctxReq(s, 9))
		requireSameCompressed(t, spec, plain, s, "continued")
	}
	for _, s := range seqs {
		require.NoError(t, spec.Finish(s))
	}
	for _, p := range spec.Pools() {
		require.Equal(t, p.Pages, p.Free, "pool %s leaks", p.Name)
	}
}

// TestCompressorRefusalAndAbort: a batch that does not fit a compressed
// pool is refused with ErrCacheFull naming the pool, and nothing changes
// (pages, tables, states, pool bytes); an iteration aborted after its
// layers ran (a long chunk and an MTP step) leaves the states as before,
// so the run continues exactly as if it never happened.
func TestCompressorRefusalAndAbort(t *testing.T) {
	seed := testSeed(t)
	cfg := compConfig()
	cfg.Compressor.Ratio4Pages = 3 // 192 entries: 768 tokens
	e, ref := newEngine(t, cfg), newEngine(t, cfg)
	runComp(t, seed, e, nil, ctxReq(1, 300))
	runComp(t, seed, ref, nil, ctxReq(1, 300))
	snap := func() (s []any) {
		for l := 2; l < 4; l++ {
			p, err := e.Debug().ReadCompressedPool(l)
			require.NoError(t, err)
			st, err := e.Debug().CompressorState(l, 1)
			require.NoError(t, err)
			s = append(s, p, st.Len())
		}
		t4, err := e.Debug().CompressedBlockTable(4, 1)
		require.NoError(t, err)
		return append(s, t4, e.Pools())
	}
	before, kv := snap(), takeSnapshot(t, e, 1, 2)
	_, err := e.Begin(t.Context(), []metadata.Request{ctxReq(2, 260)}) // 65 entries: 2 pages, 1 free (seq 1 holds 75 in 2)
	require.ErrorIs(t, err, engine.ErrCacheFull)
	require.ErrorContains(t, err, "ratio-4 compressed pool")
	require.Equal(t, before, snap())
	requireSameSnapshot(t, kv, takeSnapshot(t, e, 1, 2))

	ctx := context.Background()
	for _, reqs := range [][]metadata.Request{{ctxReq(1, 150), ctxReq(3, 20)}, {genReq(1, 5)}} {
		it, err := e.Begin(ctx, reqs)
		require.NoError(t, err)
		for l := range e.Layers() {
			f, q := positionInputs(seed+1, e, it, l) // other values: an abort must leave no trace
			require.NoError(t, it.SetInputs(l, f, q))
			if e.CompressorWidth(l) > 0 {
				k, g := compRows(seed+1, e, it, l)
				require.NoError(t, it.SetCompressorInputs(l, k, g))
			}
			require.NoError(t, it.RunLayer(ctx, l))
		}
		it.Abort()
		_, err = e.Debug().CompressorState(2, 3)
		require.Error(t, err, "the created sequence is gone")
		requireSameCompressed(t, e, ref, 1, "after abort")
	}
	runComp(t, seed, e, nil, ctxReq(1, 150))
	runComp(t, seed, ref, nil, ctxReq(1, 150))
	requireSameCompressed(t, e, ref, 1, "continued after aborts")
	requireSameLive(t, e, ref, 1, "continued after aborts")
}

// TestCompressorHidden: on the hidden-state path the engine projects the
// hidden rows with each compressed layer's weights (ape by absolute
// position): a prompt in one chunk and split across a ratio-128 boundary
// and mid ratio-4 window gives the same entries and states.
func TestCompressorHidden(t *testing.T) {
	seed := testSeed(t)
	cfg := compConfig()
	cfg.Input = engine.InputHidden
	cfg.Model.HiddenSize = 256 // small GEMMs; the compressor's shapes do not depend on it
	cfg.Compressor.Ratio4Pages, cfg.Compressor.Ratio128Pages = 2, 1
	hiddenRows := func(e *engine.Engine, it *engine.Iteration, layer int) []byte {
		m := it.Metadata()
		var out []byte
		for row := range it.Tokens() {
			b, pos, _ := m.Row(row)
			rng := rand.New(rand.NewPCG(seed^m.Seqs[b], uint64(pos)<<16|uint64(layer)))
			out = append(out, randomBF16(rng, e.HiddenSize())...)
		}
		return out
	}
	run := func(e *engine.Engine, chunks ...int) {
		ctx := context.Background()
		for _, c := range chunks {
			it, err := e.Begin(ctx, []metadata.Request{ctxReq(1, c)})
			require.NoError(t, err)
			for l := range e.Layers() {
				require.NoError(t, it.SetHidden(l, hiddenRows(e, it, l)))
				require.NoError(t, it.RunLayer(ctx, l))
			}
			require.NoError(t, it.End(ctx))
		}
	}
	one, split := newEngine(t, cfg), newEngine(t, cfg)
	run(one, 130)
	run(split, 126, 3, 1)
	requireSameCompressed(t, split, one, 1, "hidden path, split")
	require.Len(t, compEntries(t, one, 3, 1), 1)
	require.Len(t, compEntries(t, one, 2, 1), 32)
}

// TestCompressorStateSlots: the states live in ring slots on the backend,
// one per live sequence (at most Compressor.MaxSequences) and one per
// chunk a batch can move. A new sequence takes a slot, and so does a chunk
// longer than 1 + MaxDrafts tokens after earlier ones (it writes a fresh
// slot, so an abort keeps the old state); a batch creating more sequences
// than MaxSequences allows is refused with ErrCacheFull naming the state,
// changing nothing, while a batch of live sequences' chunks always fits,
// and a finished sequence's slot serves the next. The moved sequence's
// entries and state equal those of an engine with room to spare.
func TestCompressorStateSlots(t *testing.T) {
	seed := testSeed(t)
	cfg := compConfig()
	cfg.Compressor.MaxSequences = 2
	e := newEngine(t, cfg)
	roomy := compConfig()
	ref := newEngine(t, roomy)
	for _, x := range []*engine.Engine{e, ref} {
		runComp(t, seed, x, nil, ctxReq(1, 20))
		runComp(t, seed, x, nil, ctxReq(2, 30))
	}
	require.Equal(t, 2, e.Debug().CompressorSequences())
	pools := e.Pools()
	for _, reqs := range [][]metadata.Request{
		{ctxReq(3, 5)},               // a third sequence
		{ctxReq(3, 2), genReq(1, 3)}, // a new sequence, and a step in place
		{ctxReq(3, 2), ctxReq(1, 9)}, // a new sequence, and a long chunk
	} {
		_, err := e.Begin(t.Context(), reqs)
		require.ErrorIs(t, err, engine.ErrCacheFull, "%v", reqs)
		require.ErrorContains(t, err, "compressor state")
		require.Equal(t, pools, e.Pools())
		require.NoError(t, e.Debug().CheckInvariants())
	}
	// Long chunks of live sequences move to fresh slots beyond
	// MaxSequences: admitted, and an abort gives the slots back.
	for _, reqs := range [][]metadata.Request{
		{ctxReq(1, 9)},
		{ctxReq(2, 100), genReq(1, 7)},
		{ctxReq(1, 100), ctxReq(2, 100)},
	} {
		it, err := e.Begin(t.Context(), reqs)
		require.NoError(t, err, "%v", reqs)
		it.Abort()
		require.Equal(t, pools, e.Pools())
		require.NoError(t, e.Debug().CheckInvariants())
	}
	// Steps and short chunks stay in place: no slot needed.
	for _, x := range []*engine.Engine{e, ref} {
		runComp(t, seed, x, nil, genReq(1, 7), genReq(2, 7))
		runComp(t, seed, x, nil, ctxReq(1, 8))
		runComp(t, seed, x, nil, ctxReq(1, 30), ctxReq(2, 40)) // both move
	}
	require.NoError(t, e.Finish(2))
	require.NoError(t, ref.Finish(2))
	for _, x := range []*engine.Engine{e, ref} {
		runComp(t, seed, x, nil, ctxReq(1, 200)) // moves again
		runComp(t, seed, x, nil, genReq(1, 2))
		require.NoError(t, x.Debug().CheckInvariants())
	}
	require.Equal(t, 1, e.Debug().CompressorSequences())
	requireSameCompressed(t, e, ref, 1, "after moving slots")
	requireSameLive(t, e, ref, 1, "after moving slots")
	runComp(t, seed, e, nil, ctxReq(4, 3)) // the slot seq 2 left is free again
	require.NoError(t, e.Debug().CheckInvariants())
}

// TestCompressorSlotsThreeSequences: with the default MaxSequences (2 x
// MaxSeqs) three sequences prefilling in chunks two at a time run: their
// chunks move to slots of their own beyond the live ones (a pool of
// MaxSequences slots alone refused the third line: three live states and
// two moves).
func TestCompressorSlotsThreeSequences(t *testing.T) {
	seed := testSeed(t)
	cfg := compConfig()
	cfg.MaxSeqs, cfg.MaxTokens = 2, 64
	e := newEngine(t, cfg)
	for _, line := range [][]metadata.Request{
		{ctxReq(1, 20), ctxReq(2, 20)},
		{ctxReq(1, 20), ctxReq(3, 20)},
		{ctxReq(2, 20), ctxReq(3, 20)},
		{ctxReq(1, 20), ctxReq(2, 20)},
	} {
		runComp(t, seed, e, nil, line...)
		require.NoError(t, e.Debug().CheckInvariants())
	}
	require.Equal(t, 3, e.Debug().CompressorSequences())
}

// TestCompressorSchedulerProgress is a seeded random continuous-batching
// loop as a naive server runs it: arrivals admitted whenever they come
// (the engine refuses what does not fit), every prefilling sequence's next
// chunk in each batch, generation with MTP and random acceptance, finishes.
// It must make progress: every arrival finishes, only batches that bring
// new sequences past Compressor.MaxSequences are refused (never one of
// live sequences alone, whatever their chunks), and nothing leaks. (With
// the state slots shared between live sequences and moves, arrivals took
// every slot and then every batch with a chunk was refused: a livelock,
// 1473 of 1500 batches refused.)
func TestCompressorSchedulerProgress(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 26))
	cfg := compConfig()
	cfg.MaxSeqs, cfg.MaxTokens = 4, 96
	cfg.Cache.NumPages = 256
	cfg.Compressor.MaxSequences = 4 // arrivals come faster than that
	e := newEngine(t, cfg)
	type seq struct {
		id               uint64
		prompt, gen, pos int // prompt and generated tokens wanted, tokens held
		done             int // tokens generated
	}
	const arrivals = 24
	var waiting, live []*seq
	for i := range arrivals {
		waiting = append(waiting, &seq{id: uint64(i + 1), prompt: 10 + rng.IntN(90), gen: 1 + rng.IntN(10)})
	}
	finished, batches, refused, refusedLive := 0, 0, 0, 0
	ctx := context.Background()
	for ; finished < arrivals && batches < 1500; batches++ {
		var reqs []metadata.Request
		tokens := 0
		var admitted []*seq
		// Prefilling sequences first, then up to two arrivals, then a
		// generation step of the sequences done prefilling.
		for _, s := range live {
			if s.pos < s.prompt && len(reqs) < cfg.MaxSeqs {
				n := min(s.prompt-s.pos, 9+rng.IntN(30), cfg.MaxTokens-tokens)
				if n > 0 {
					reqs, tokens = append(reqs, ctxReq(s.id, n)), tokens+n
				}
			}
		}
		for k := 0; k < 2 && k < len(waiting) && len(reqs) < cfg.MaxSeqs && rng.IntN(2) == 0; k++ {
			s := waiting[k]
			n := min(s.prompt, 9+rng.IntN(30), cfg.MaxTokens-tokens)
			if n > 0 {
				reqs, tokens = append(reqs, ctxReq(s.id, n)), tokens+n
				admitted = append(admitted, s)
			}
		}
		mtp := rng.IntN(4)
		var gens []*seq
		for _, s := range live {
			if s.pos >= s.prompt && len(reqs) < cfg.MaxSeqs && tokens+1+mtp <= cfg.MaxTokens {
				reqs, tokens = append(reqs, genReq(s.id, mtp)), tokens+1+mtp
				gens = append(gens, s)
			}
		}
		if len(reqs) == 0 {
			continue
		}
		it, err := e.Begin(ctx, reqs)
		if err != nil {
			require.ErrorIs(t, err, engine.ErrCacheFull, "batch %d: %v", batches, reqs)
			require.ErrorContains(t, err, "compressor state")
			refused++
			if len(admitted) == 0 {
				refusedLive++
			}
			continue
		}
		for l := range e.Layers() {
			f, q := positionInputs(seed, e, it, l)
			require.NoError(t, it.SetInputs(l, f, q))
			if e.CompressorWidth(l) > 0 {
				k, g := compRows(seed, e, it, l)
				require.NoError(t, it.SetCompressorInputs(l, k, g))
			}
			require.NoError(t, it.RunLayer(ctx, l))
		}
		accepted := map[uint64]int{}
		for _, s := range gens {
			accepted[s.id] = 1 + rng.IntN(1+mtp)
		}
		require.NoError(t, it.Accept(accepted))
		require.NoError(t, it.End(ctx))
		for _, r := range reqs {
			if r.Phase == metadata.Context {
				for _, s := range append(live, admitted...) {
					if s.id == r.Seq {
						s.pos += r.NewTokens
					}
				}
			}
		}
		live = append(live, admitted...)
		waiting = waiting[len(admitted):]
		for _, s := range gens {
			s.pos += accepted[s.id]
			s.done += accepted[s.id]
		}
		keep := live[:0]
		for _, s := range live {
			if s.done >= s.gen {
				require.NoError(t, e.Finish(s.id))
				finished++
				continue
			}
			keep = append(keep, s)
		}
		live = keep
	}
	t.Logf("%d batches, %d refused (%d without a new sequence), %d of %d sequences finished", batches, refused, refusedLive, finished, arrivals)
	require.Equal(t, arrivals, finished, "every arrival finishes")
	require.Zero(t, refusedLive, "a batch of live sequences is never refused")
	require.Positive(t, refused, "arrivals past MaxSequences are refused")
	require.NoError(t, e.Debug().CheckInvariants())
	require.Zero(t, e.Debug().CompressorSequences())
	for _, p := range e.Pools() {
		require.Equal(t, p.Pages, p.Free, "pool %s", p.Name)
	}
}
