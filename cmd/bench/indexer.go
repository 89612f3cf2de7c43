package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// The lightning indexer's cost in a ratio-4 layer (DESIGN.md section 9,
// issue 23's goal: at most 15% added to the layer through the graph). A
// ratio-4 layer without the indexer is the chain with its ratio-4 KV
// compressor forked (chainComp, the engine's way); the indexer adds what
// the engine issues (engine/indexer.go, engine/chain.go runChain):
//   - on the side stream, after the main compressor: its compressor's
//     projection GEMM of the hidden rows (bf16, [wkv; wgate], 2*256
//     outputs) and its step (mla.EntryIndexer) into the layer's indexer
//     cache;
//   - on the main stream after the Q prologue: its wq_b GEMM (FP8, on
//     q_norm's activation), weights_proj (bf16, of the hidden rows) and the
//     query step (RoPE, Hadamard, MXFP4, head weights);
//   - with the selection, after the join: the top-k over the layer's
//     indexer cache.
// Every layer of a graph has its own indexer weights, states, cache and
// indices; the activations follow the chain's input sets.

// idxMode is what a ratio-4 layer of an indexer graph runs.
type idxMode int

const (
	idxOff      idxMode = iota // (a) the ratio-4 layer without the indexer
	idxPrologue                // (b) with the indexer's prologue
	idxTopK                    // (c) with the prologue and the top-k selection
	idxSide                    // (b') as (b), its query's GEMM and step on the side stream
	idxSeparate                // (b'') as (b), the three bf16 projections as three GEMMs (the engine before its one GEMM)
	idxNoKeys                  // (b-k) as (b) without the indexer's key step: what the step costs the layer
	idxAux                     // (b3) as (b), its wq_b GEMM and query step on a third stream (cudatune.IndexerStreamAux)
	idxAuxGEMM                 // (b3g) as (b), its wq_b GEMM alone on a third stream, the query step after the join
	idxMainQ                   // (b1) as (b), the query path on the main stream (cudatune.IndexerStreamMain)
	// What each piece of the prologue costs the layer through the graph
	// (b minus these): the engine's way without one piece.
	idxNoQuery    // (b-q) as (b) without the query step
	idxNoWqB      // (b-g) as (b) without the indexer's wq_b GEMM
	idxNarrowProj // (b-p) as (b), the projection GEMM at the compressor's width (without the indexer's 576 columns)
	idxKeysOnly   // (b-qg) as (b) without the wq_b GEMM and the query step: the keys and the projection columns
	idxAlone      // the indexer's prologue alone: its GEMMs and steps in order on one stream
	idxQueryAlone // the query step alone (no GEMM)
	idxTopKAlone  // the top-k selection alone
)

func (m idxMode) String() string {
	switch m {
	case idxOff:
		return "without the indexer"
	case idxPrologue:
		return "with its prologue"
	case idxTopK:
		return "with prologue and top-k"
	case idxSide:
		return "with its prologue, query on the side stream"
	case idxSeparate:
		return "with its prologue, three bf16 projections"
	case idxNoKeys:
		return "with its prologue but the key step"
	case idxAux:
		return "with its prologue, query path on a third stream"
	case idxAuxGEMM:
		return "with its prologue, wq_b GEMM on a third stream"
	case idxMainQ:
		return "with its prologue, query path on the main stream"
	case idxNoQuery:
		return "with its prologue but the query step"
	case idxNoWqB:
		return "with its prologue but the wq_b GEMM"
	case idxNarrowProj:
		return "with its prologue, the projection GEMM without its columns"
	case idxKeysOnly:
		return "with its prologue but the wq_b GEMM and the query step"
	case idxAlone:
		return "prologue alone"
	case idxQueryAlone:
		return "query step alone"
	case idxTopKAlone:
		return "top-k alone"
	}
	return fmt.Sprintf("idxMode(%d)", int(m))
}

// idxModes are the graphs timed per shape, in order: those without the
// selection first, so that a run cut short during the selection keeps
// the prologue's figures.
var idxModes = []idxMode{idxOff, idxPrologue, idxMainQ, idxAux, idxAuxGEMM, idxNoKeys, idxNoQuery, idxNoWqB, idxNarrowProj, idxKeysOnly, idxSide, idxSeparate, idxAlone, idxQueryAlone, idxTopK, idxTopKAlone}

// idxWidth is one K or G row of the indexer compressor's projections.
var idxWidth = compressor.Overlap(kvcache.DSv4IndexerRatio) * mla.IndexerDim

// compWidth4 is one K or G row of the ratio-4 KV compressor's projections.
var compWidth4 = compressor.Overlap(kvcache.DSv4IndexerRatio) * compressor.Dim

// idxQueryN is the indexer wq_b GEMM's output width (64 heads of 128).
const idxQueryN = mla.IndexerHeads * mla.IndexerDim

// indexerWeightBytes is what one ratio-4 layer's indexer adds to the
// layer's weights: wq_b (e4m3 with its 128x128 block scales), weights_proj
// and the compressor's [wkv; wgate] (bf16), its ape and norm weight
// (float32).
func indexerWeightBytes(md model) int64 {
	cd := chainDimsOf(md)
	return fp8WeightBytes(idxQueryN, cd.qLora) + 2*int64(mla.IndexerHeads)*int64(cd.hidden) +
		2*2*int64(idxWidth)*int64(cd.hidden) + 4*int64(kvcache.DSv4IndexerRatio*idxWidth) + 4*mla.IndexerDim
}

// compressWeightBytes is the ratio-4 KV compressor's projection weights
// ([wkv; wgate] bf16), the part of a ratio-4 layer's weights beyond the
// chain's.
func compressWeightBytes(md model, ratio int) int64 {
	return 2 * 2 * int64(compressor.Overlap(ratio)*compressor.Dim) * int64(chainDimsOf(md).hidden)
}

// bufMaker is what the indexer's setup needs of a device: the CUDA
// device, or the CPU backend in tests.
type bufMaker interface {
	alloc(n int) (mla.Buffer, error)
	write(dst mla.Buffer, off int, src []byte) error
	randBF16(n, rowElems int) (mla.Buffer, error)
	randF32(n int, lo, hi float32) (mla.Buffer, error)
	randE4M3(n int) (mla.Buffer, error)
}

func (d *device) alloc(n int) (mla.Buffer, error)                 { return d.be.Alloc(n) }
func (d *device) write(dst mla.Buffer, off int, src []byte) error { return d.be.Write(dst, off, src) }

// idxBackend is what the indexer's launches need: the CUDA backend, or the
// CPU backend in tests.
type idxBackend interface {
	GEMM(ctx context.Context, a *mla.GEMMArgs) error
	BF16GEMM(ctx context.Context, a *mla.BF16GEMMArgs) error
	CompressStep(ctx context.Context, a *mla.CompressStepArgs) error
	mla.IndexerQuerier
	mla.TopKSelector
}

// idxLayer is one ratio-4 layer's indexer weights, states, cache and
// indices.
type idxLayer struct {
	wqB   mla.FP8Weight // [64*128][q_lora_rank]
	wproj mla.Buffer    // [64][hidden] bf16 (the separate GEMMs' and alone)
	wkvg  mla.Buffer    // [2*256][hidden] bf16 (the separate GEMMs' and alone)
	ape   mla.Buffer    // [4][256] float32
	norm  mla.Buffer    // [128] float32
	ring  mla.Buffer    // slots of ringRows rows of 2*256 float32
	pool  mla.Buffer    // pages of 64 MXFP4 entries
	out   mla.Buffer    // [rows][index_topk] int32
	// fused is the layer's three bf16 projections in one matrix,
	// [fusedN][hidden], as the engine uploads it: the ratio-4 compressor's
	// [wkv; wgate], the indexer compressor's, weights_proj.
	fused mla.Buffer
}

// idxSet is one input set's indexer activations.
type idxSet struct {
	qIn  mla.Buffer // [rows][64*128] bf16: the wq_b GEMM's output
	kg   mla.Buffer // [rows][2*256] float32: the compressor's projections (separate GEMMs)
	wp   mla.Buffer // [rows][64] float32: weights_proj's output (separate GEMMs)
	qOut mla.Buffer // [rows][64][128]: room for either query format
	wOut mla.Buffer // [rows][64] float32-sized: either format's head weights
}

// idxInputs is what the indexer reads of a layer's chain: the shape's
// metadata and launches, the RoPE table, and per input set the hidden rows
// and q_norm's activation.
type idxInputs struct {
	m             *metadata.Metadata
	launches      []mla.Launch
	rows          int
	rope          mla.Buffer
	ropePositions int
	meta          *mla.MetadataBuffers
	hidden        []mla.Buffer
	qn            []mla.FP8Activations
	eps           float32
}

// chainIdx is one shape's indexer in every layer of a graph.
type chainIdx struct {
	md       model
	in       idxInputs
	layers   []idxLayer
	sets     []idxSet
	plan     mla.Buffer // the ratio-4 compressor plan (the main compressor's)
	scratch  mla.Buffer
	maxJobs  int
	ringRows int
	pages    int
	tk       mla.TopKShape
	tkPlan   mla.Buffer
	tkScr    mla.Buffer
	// proj is the one projection GEMM's output, [rows][fusedN] float32
	// (the engine's compressor projection rows): the compressor's K and G,
	// the indexer compressor's, weights_proj's; each step reads its columns.
	proj mla.Buffer
	// Visible is the most entries a token of the shape sees, Scored the
	// token rows that see more than index_topk (whose scores the selection
	// computes; the others select every entry).
	Visible, Scored int
	bufs            []mla.Buffer
}

// topkPlan is the selection's plan and shape for m's batch over rows rows
// with the ratio-4 block tables, and the most visible entries and the rows
// that score (see chainIdx).
func topkPlan(m *metadata.Metadata, rows, topK, pages int, tables [][]int32) (raw []byte, s mla.TopKShape, visible, scored int, err error) {
	var p mla.TopKPlan
	if err := p.SetFromMetadata(m, tables); err != nil {
		return nil, s, 0, 0, err
	}
	stride := 1
	for _, t := range tables {
		stride = max(stride, len(t))
	}
	s = mla.TopKShape{TopK: topK, Rows: rows, MaxSeqs: max(m.NumSeqs, 1), PageStride: stride, PageSize: engine.CompressedPageSize,
		NumPages: max(pages, 1), ScratchEntries: int(p.ScratchEntries(topK))}
	for _, q := range p.Seqs {
		for i := range q.Rows {
			v := mla.TopKVisible(q.Start + i)
			visible = max(visible, v)
			if v > topK {
				scored++
			}
		}
	}
	raw, err = p.Encode(&s)
	return raw, s, visible, scored, err
}

// randomIndexerEntries is n pages' worth of MXFP4 entries: random nibbles,
// scale bytes in [120, 127] (values of the order of a normalized key), as
// the history a decode step's selection scores. Outside the race
// detector's per-byte instrumentation (//go:norace): it writes only its
// own new slice, tens of MB at a long context.
//
//go:norace
func randomIndexerEntries(r *rand.Rand, n int) []byte {
	out := make([]byte, n*mla.IndexerPageBytes(engine.CompressedPageSize))
	for e := 0; e+mla.IndexerEntryBytes <= len(out); e += mla.IndexerEntryBytes {
		for i := 0; i < 64; i += 8 {
			binary.LittleEndian.PutUint64(out[e+i:], r.Uint64())
		}
		v := r.Uint32()
		for i := range mla.IndexerEntryBytes - 64 {
			out[e+64+i] = byte(120 + (v>>(8*i))&7)
		}
	}
	return out
}

// setupIndexer lays out the indexer of layers ratio-4 layers over in's
// shape: every layer its own weights, states, cache (filled with random
// entries) and indices, one set of activations per input set.
func setupIndexer(mk bufMaker, md model, in idxInputs, layers int) (_ *chainIdx, err error) {
	cd := chainDimsOf(md)
	m := in.m
	x := &chainIdx{md: md, in: in, ringRows: mla.RingRows(kvcache.DSv4IndexerRatio, benchMaxDrafts),
		maxJobs: mla.MaxCompressJobs(kvcache.DSv4IndexerRatio, m.NumSeqs, in.rows)}
	keep := func(buf mla.Buffer, err error) (mla.Buffer, error) {
		if err == nil {
			x.bufs = append(x.bufs, buf)
		}
		return buf, err
	}
	fail := func(what string, err error) (*chainIdx, error) {
		return x, fmt.Errorf("indexer %s: %w", what, err)
	}
	plan, tables, pages, err := ratioTables(m, kvcache.DSv4IndexerRatio)
	if err != nil {
		return fail("plan", err)
	}
	x.pages = pages
	raw, err := plan.Encode(m.NumSeqs, x.maxJobs)
	if err != nil {
		return fail("plan", err)
	}
	if x.plan, err = keep(mk.alloc(len(raw))); err != nil {
		return fail("plan", err)
	}
	if err := mk.write(x.plan, 0, raw); err != nil {
		return fail("plan", err)
	}
	if x.scratch, err = keep(mk.alloc(mla.CompressScratchBytes(x.maxJobs))); err != nil {
		return fail("scratch", err)
	}
	tkRaw, tk, visible, scored, err := topkPlan(m, in.rows, md.cfg.IndexTopK, pages, tables)
	if err != nil {
		return fail("top-k plan", err)
	}
	x.tk, x.Visible, x.Scored = tk, visible, scored
	if x.tkPlan, err = keep(mk.alloc(len(tkRaw))); err != nil {
		return fail("top-k plan", err)
	}
	if err := mk.write(x.tkPlan, 0, tkRaw); err != nil {
		return fail("top-k plan", err)
	}
	if tk.ScratchEntries > 0 {
		if x.tkScr, err = keep(mk.alloc(4 * tk.ScratchEntries)); err != nil {
			return fail("top-k scratch", err)
		}
	}
	// One history for every layer's cache (each its own buffer).
	history := randomIndexerEntries(rand.New(rand.NewPCG(uint64(in.rows), uint64(pages))), pages)
	for l := range layers {
		var il idxLayer
		il.wqB = mla.FP8Weight{N: idxQueryN, K: cd.qLora}
		steps := []struct {
			what string
			do   func() error
		}{
			{"wq_b", func() (err error) { il.wqB.Data, err = keep(mk.randE4M3(idxQueryN * cd.qLora)); return }},
			{"wq_b scales", func() (err error) {
				il.wqB.Scale, err = keep(mk.randF32(((idxQueryN+127)/128)*((cd.qLora+127)/128), 0.5/1024, 2.0/1024))
				return
			}},
			{"weights_proj", func() (err error) { il.wproj, err = keep(mk.randBF16(mla.IndexerHeads*cd.hidden, cd.hidden)); return }},
			{"compressor weights", func() (err error) { il.wkvg, err = keep(mk.randBF16(2*idxWidth*cd.hidden, cd.hidden)); return }},
			{"compressor ape", func() (err error) {
				il.ape, err = keep(mk.randF32(kvcache.DSv4IndexerRatio*idxWidth, -0.02, 0.02))
				return
			}},
			{"compressor norm", func() (err error) { il.norm, err = keep(mk.randF32(mla.IndexerDim, 0.5, 1.5)); return }},
			{"compressor states", func() (err error) {
				il.ring, err = keep(mk.randF32(m.NumSeqs*x.ringRows*2*idxWidth, -1, 1))
				return
			}},
			{"cache", func() (err error) {
				if il.pool, err = keep(mk.alloc(pages * mla.IndexerPageBytes(engine.CompressedPageSize))); err != nil {
					return err
				}
				return mk.write(il.pool, 0, history)
			}},
			{"top-k indices", func() (err error) { il.out, err = keep(mk.alloc(4 * in.rows * tk.TopK)); return }},
			{"fused projections", func() (err error) { il.fused, err = keep(mk.randBF16(fusedN(compWidth4)*cd.hidden, cd.hidden)); return }},
		}
		for _, st := range steps {
			if err := st.do(); err != nil {
				return fail(fmt.Sprintf("layer %d %s", l, st.what), err)
			}
		}
		x.layers = append(x.layers, il)
	}
	rows := in.rows
	if x.proj, err = keep(mk.alloc(rows * fusedN(compWidth4) * 4)); err != nil {
		return fail("projection rows", err)
	}
	for i := range in.hidden {
		var s idxSet
		steps := []struct {
			what string
			dst  *mla.Buffer
			n    int
		}{
			{"wq_b output", &s.qIn, rows * idxQueryN * 2},
			{"compressor projections", &s.kg, rows * 2 * idxWidth * 4},
			{"weights_proj output", &s.wp, rows * mla.IndexerHeads * 4},
			{"query", &s.qOut, rows * mla.IndexerHeads * max(mla.IndexerQueryMXFP4.RowBytes(), mla.IndexerQueryFP8.RowBytes())},
			{"head weights", &s.wOut, rows * mla.IndexerHeads * max(mla.IndexerQueryMXFP4.WeightBytes(), mla.IndexerQueryFP8.WeightBytes())},
		}
		for _, st := range steps {
			if *st.dst, err = keep(mk.alloc(st.n)); err != nil {
				return fail(fmt.Sprintf("input set %d %s", i, st.what), err)
			}
		}
		x.sets = append(x.sets, s)
	}
	return x, nil
}

// idxArgs are one layer's indexer launches' arguments: the engine's (one
// projection GEMM, the steps reading its columns) and the separate GEMMs'
// (idxSeparate, alone).
type idxArgs struct {
	fused   *mla.BF16GEMMArgs     // the one GEMM of the three projections into x.proj
	step    *mla.CompressStepArgs // the compressor step into the cache, from its columns of x.proj
	wqB     *mla.GEMMArgs         // wq_b on q_norm's activation
	query   *mla.IndexerQueryArgs // the query step, weights_proj's columns of x.proj
	topk    *mla.TopKArgs         // the selection
	project *mla.BF16GEMMArgs     // separate: the compressor's own projection of the hidden rows
	sepStep *mla.CompressStepArgs // separate: the step from it
	wproj   *mla.BF16GEMMArgs     // separate: weights_proj of the hidden rows
	sepQ    *mla.IndexerQueryArgs // separate: the query step from it
}

// The columns of the projection rows (x.proj) where the indexer's outputs
// start, as the engine lays them out (engine/indexer.go).
var (
	idxKGCol = 2 * compWidth4
	idxWPCol = 2*compWidth4 + 2*idxWidth
)

// args builds layer l's arguments with the query in format f.
func (x *chainIdx) args(l int, f mla.IndexerQueryFormat) idxArgs {
	set := l % len(x.sets)
	il, s := &x.layers[l], &x.sets[set]
	hidden := chainDimsOf(x.md).hidden
	n := fusedN(compWidth4)
	step := mla.CompressStepArgs{Ratio: kvcache.DSv4IndexerRatio, Entry: mla.EntryIndexer,
		KG: x.proj, KGRows: x.in.rows, KGOffset: 4 * idxKGCol, KGStride: n, APE: il.ape, Ring: il.ring, RingRows: x.ringRows,
		Slots: x.in.m.NumSeqs, Plan: x.plan, MaxSeqs: x.in.m.NumSeqs, MaxJobs: x.maxJobs, NormWeight: il.norm, Eps: x.in.eps,
		Rope: x.in.rope, RopePositions: x.in.ropePositions, Pool: il.pool, PageSize: engine.CompressedPageSize,
		NumPages: x.pages, Scratch: x.scratch}
	sepStep := step
	sepStep.KG, sepStep.KGOffset, sepStep.KGStride = s.kg, 0, 0
	query := mla.IndexerQueryArgs{Format: f, Q: s.qIn, QStride: idxQueryN, W: x.proj, WOffset: 4 * idxWPCol, WStride: n,
		QOut: s.qOut, WOut: s.wOut, Rope: x.in.rope, RopePositions: x.in.ropePositions, Meta: x.in.meta}
	sepQ := query
	sepQ.W, sepQ.WOffset, sepQ.WStride = s.wp, 0, mla.IndexerHeads
	return idxArgs{
		fused: &mla.BF16GEMMArgs{Rows: x.in.rows, N: n, K: hidden, X: x.in.hidden[set],
			XStride: hidden, W: il.fused, Y: x.proj, YStride: n},
		step:  &step,
		wqB:   &mla.GEMMArgs{X: x.in.qn[set], W: &il.wqB, Y: s.qIn, YStride: idxQueryN},
		query: &query,
		topk: &mla.TopKArgs{TopKShape: x.tk, Q: s.qOut, W: s.wOut, Cache: il.pool, Plan: x.tkPlan,
			Scratch: x.tkScr, Out: il.out},
		project: &mla.BF16GEMMArgs{Rows: x.in.rows, N: 2 * idxWidth, K: hidden, X: x.in.hidden[set],
			XStride: hidden, W: il.wkvg, Y: s.kg, YStride: 2 * idxWidth},
		sepStep: &sepStep,
		wproj: &mla.BF16GEMMArgs{Rows: x.in.rows, N: mla.IndexerHeads, K: hidden, X: x.in.hidden[set],
			XStride: hidden, W: il.wproj, Y: s.wp, YStride: mla.IndexerHeads},
		sepQ: &sepQ,
	}
}

// mainKG is where the ratio-4 compressor's step reads its K and G in the
// engine's layout: columns [0, 2*1024) of the projection rows.
func (x *chainIdx) mainKG() (kg mla.Buffer, stride int) { return x.proj, fusedN(compWidth4) }

// validate checks every argument of the layer's launches as the backends
// do before they launch.
func (a idxArgs) validate(rows int) error {
	for _, c := range []struct {
		what string
		err  error
	}{
		{"one projection GEMM", a.fused.Validate()},
		{"indexer compressor step", a.step.Validate()},
		{"indexer wq_b GEMM", a.wqB.Validate()},
		{"indexer query", a.query.Validate(rows)},
		{"indexer top-k", a.topk.Validate()},
		{"indexer compressor projection (separate)", a.project.Validate()},
		{"indexer compressor step (separate)", a.sepStep.Validate()},
		{"indexer weights_proj GEMM (separate)", a.wproj.Validate()},
		{"indexer query (separate)", a.sepQ.Validate(rows)},
	} {
		if c.err != nil {
			return fmt.Errorf("%s: %w", c.what, c.err)
		}
	}
	return nil
}

// keys issues layer l's indexer compressor as separate work (idxSeparate,
// alone): its own projection GEMM of the hidden rows and the step from it
// into the layer's cache.
func (x *chainIdx) keys(ctx context.Context, be idxBackend, l int) error {
	a := x.args(l, mla.IndexerQueryMXFP4)
	if err := be.BF16GEMM(ctx, a.project); err != nil {
		return fmt.Errorf("indexer compressor projection: %w", err)
	}
	if err := be.CompressStep(ctx, a.sepStep); err != nil {
		return fmt.Errorf("indexer compressor step: %w", err)
	}
	return nil
}

// keyStep issues layer l's indexer compressor step into its cache from
// its columns of the projection rows (after fusedGEMM).
func (x *chainIdx) keyStep(ctx context.Context, be idxBackend, l int) error {
	if err := be.CompressStep(ctx, x.args(l, mla.IndexerQueryMXFP4).step); err != nil {
		return fmt.Errorf("indexer compressor step: %w", err)
	}
	return nil
}

// fusedN is the width of one bf16 GEMM of a ratio-4 layer's three
// projections of the hidden rows: the main compressor's [wkv; wgate] (2 *
// compWidth), the indexer compressor's (2 * 256) and weights_proj (64).
func fusedN(compWidth int) int { return 2*compWidth + 2*idxWidth + mla.IndexerHeads }

// fusedGEMM issues layer l's three bf16 projections as one GEMM into the
// projection rows x.proj, as the engine does (engine/compress.go
// compressProject): the ratio-4 compressor's step (mainKG), the indexer
// compressor's (keyStep) and the query step read their columns.
func (x *chainIdx) fusedGEMM(ctx context.Context, be idxBackend, l int, narrow bool) error {
	a := x.args(l, mla.IndexerQueryMXFP4).fused
	if narrow {
		a.N = 2 * compWidth4
	}
	if err := be.BF16GEMM(ctx, a); err != nil {
		return fmt.Errorf("the ratio-4 layer's projection GEMM: %w", err)
	}
	return nil
}

// wqBGEMM issues layer l's wq_b GEMM on q_norm's activation.
func (x *chainIdx) wqBGEMM(ctx context.Context, be idxBackend, l int) error {
	if err := be.GEMM(ctx, x.args(l, mla.IndexerQueryMXFP4).wqB); err != nil {
		return fmt.Errorf("indexer wq_b GEMM: %w", err)
	}
	return nil
}

// queryStep issues layer l's query step in format f over the launches,
// reading weights_proj's columns of the projection rows (after fusedGEMM).
func (x *chainIdx) queryStep(ctx context.Context, be idxBackend, l int, f mla.IndexerQueryFormat) error {
	if err := mla.RunIndexerQuery(ctx, be, x.in.launches, x.args(l, f).query); err != nil {
		return fmt.Errorf("indexer query: %w", err)
	}
	return nil
}

// separateQuery issues layer l's indexer query as separate work
// (idxSeparate, alone): its wq_b GEMM, the weights_proj GEMM of the hidden
// rows and the MXFP4 step from their outputs.
func (x *chainIdx) separateQuery(ctx context.Context, be idxBackend, l int) error {
	a := x.args(l, mla.IndexerQueryMXFP4)
	if err := x.wqBGEMM(ctx, be, l); err != nil {
		return err
	}
	if err := be.BF16GEMM(ctx, a.wproj); err != nil {
		return fmt.Errorf("indexer weights_proj GEMM: %w", err)
	}
	if err := mla.RunIndexerQuery(ctx, be, x.in.launches, a.sepQ); err != nil {
		return fmt.Errorf("indexer query: %w", err)
	}
	return nil
}

// topk issues layer l's selection over its cache into its indices.
func (x *chainIdx) topk(ctx context.Context, be idxBackend, l int) error {
	if err := be.IndexerTopK(ctx, x.args(l, mla.IndexerQueryMXFP4).topk); err != nil {
		return fmt.Errorf("indexer top-k: %w", err)
	}
	return nil
}

// alone issues layer l's indexer work of a mode without the chain: the
// whole prologue in order (keys, then query, with the indexer's own two
// bf16 GEMMs: alone there is no compressor projection to join), the query
// step, or the selection.
func (x *chainIdx) alone(ctx context.Context, be idxBackend, l int, mode idxMode) error {
	switch mode {
	case idxAlone:
		if err := x.keys(ctx, be, l); err != nil {
			return err
		}
		return x.separateQuery(ctx, be, l)
	case idxQueryAlone:
		return x.queryStep(ctx, be, l, mla.IndexerQueryMXFP4)
	case idxTopKAlone:
		return x.topk(ctx, be, l)
	}
	return fmt.Errorf("indexer mode %v does not run alone", mode)
}

// chainIdxStep is what chainLayer adds of the indexer, the engine's way
// (engine/chain.go runChain): on the side stream the one projection GEMM
// (fusedGEMM, in place of the compressor's own), the compressor's step
// and the indexer's key step from its columns; its wq_b GEMM after the Q
// prologue; after the join its query step (weights_proj's columns come
// from the side stream) and with topk the selection. With aux (the
// engine's way under cudatune.IndexerStreamAux), the wq_b GEMM and the
// query step go to the third stream after q_norm, the step after the side
// stream's projection GEMM (a mark), under the main wq_b GEMM and the Q
// prologue; with auxGEMM only the wq_b GEMM does. With side (not the
// engine's way: a variant to measure), the wq_b GEMM and the query step go
// to the side stream after q_norm, behind its compressor and KV work.
// With separate (the engine before its one GEMM), the compressor projects
// alone, the indexer compressor's projection and step follow it on the
// side stream, and the wq_b and weights_proj GEMMs and the query step
// follow the Q prologue before the join.
type chainIdxStep struct {
	x                    *chainIdx
	topk, side, separate bool
	aux, auxGEMM         bool
	// noKeys leaves the key step out (idxNoKeys), noQuery the query step
	// (idxNoQuery), noWqB the wq_b GEMM (idxNoWqB); narrowProj runs the
	// projection GEMM over the compressor's columns only (idxNarrowProj:
	// the steps then read stale indexer columns, a timing variant only).
	noKeys, noQuery, noWqB, narrowProj bool
}
