package main

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// The KV compressor's cost in the chain (DESIGN.md section 8, issue 10):
// each layer of a chain graph also issues its compressor the way the
// engine does (engine/compress.go): the projection GEMM of the hidden rows
// ([wkv; wgate], bf16, float32 out) and one compress_step launch, both on
// the side stream before act_quant, so they run under the layer's own
// GEMMs. Every layer has its own projection weights and its own ring of
// states; the plan is the shape's (every sequence at its cached length,
// the entries its rows complete).

// benchMaxDrafts is the MTP drafts the rings are sized for (the engine's
// default).
const benchMaxDrafts = engine.DefaultMaxDrafts

// chainComp is one shape's compressor of one ratio.
type chainComp struct {
	ratio, width     int
	wkvg             []mla.Buffer // per layer: [2*width][hidden] bf16
	rings            []mla.Buffer // per layer
	ape, norm        mla.Buffer
	kg, plan, pool   mla.Buffer
	scratch          mla.Buffer
	maxSeqs, maxJobs int
	ringRows, pages  int
	bufs             []mla.Buffer
	// late forks the compressor after the layer's [wq_a; wkv] GEMM, not
	// before its act_quant (the engine's order).
	late bool
}

func (d *device) freeComp(c *chainComp) { d.freeBufs(c.bufs) }

// setupComp lays out the compressor of a ratio for cl's shape and layers
// layers.
func (d *device) setupComp(md model, cl *chainLayout, ratio, layers int) (_ *chainComp, err error) {
	m := cl.ls.m
	c := &chainComp{ratio: ratio, width: compressor.Overlap(ratio) * compressor.Dim, maxSeqs: m.NumSeqs,
		ringRows: mla.RingRows(ratio, benchMaxDrafts)}
	c.maxJobs = mla.MaxCompressJobs(ratio, m.NumSeqs, cl.rows)
	defer func() {
		if err != nil {
			d.freeComp(c)
		}
	}()
	keep := func(buf mla.Buffer, err error) (mla.Buffer, error) {
		if err == nil {
			c.bufs = append(c.bufs, buf)
		}
		return buf, err
	}
	hidden := chainDimsOf(md).hidden
	for l := range layers {
		w, err := keep(d.randBF16(2*c.width*hidden, hidden))
		if err != nil {
			return nil, fmt.Errorf("layer %d compressor weights: %w", l, err)
		}
		c.wkvg = append(c.wkvg, w)
		ring, err := keep(d.randF32(m.NumSeqs*c.ringRows*2*c.width, -1, 1))
		if err != nil {
			return nil, fmt.Errorf("layer %d compressor states: %w", l, err)
		}
		c.rings = append(c.rings, ring)
	}
	if c.ape, err = keep(d.randF32(ratio*c.width, -0.02, 0.02)); err != nil {
		return nil, err
	}
	if c.norm, err = keep(d.randF32(numerics.HeadDim, 0.5, 1.5)); err != nil {
		return nil, err
	}
	if c.kg, err = keep(d.be.Alloc(cl.rows * 2 * c.width * 4)); err != nil {
		return nil, err
	}
	if c.scratch, err = keep(d.be.Alloc(mla.CompressScratchBytes(c.maxJobs))); err != nil {
		return nil, err
	}
	// The plan: sequence b at its cached length in slot b, its entries at
	// consecutive pages of one pool.
	p, _, pages, err := ratioTables(m, ratio)
	if err != nil {
		return nil, err
	}
	c.pages = pages
	raw, err := p.Encode(c.maxSeqs, c.maxJobs)
	if err != nil {
		return nil, err
	}
	if c.plan, err = keep(d.be.Alloc(len(raw))); err != nil {
		return nil, err
	}
	if err := d.be.Write(c.plan, 0, raw); err != nil {
		return nil, err
	}
	if c.pool, err = keep(d.be.Alloc(c.pages * kvcache.FormatFP8UE8M0.PageBytes(engine.CompressedPageSize))); err != nil {
		return nil, err
	}
	return c, d.be.Synchronize(context.Background())
}

// ratioTables plans the ratio-r compressor step of m's batch as setupComp
// does: sequence b at its cached length in ring slot b, its entries on
// consecutive pages of one pool (one page more than its entries fill). It
// returns the plan, each sequence's block table by entry index and the
// pages used.
func ratioTables(m *metadata.Metadata, ratio int) (*mla.CompressPlan, [][]int32, int, error) {
	p := &mla.CompressPlan{}
	tables := make([][]int32, m.NumSeqs)
	pages := 0
	for b := range m.NumSeqs {
		start, rows := int(m.Cached[b]), int(m.QLen[b])
		p.Seqs = append(p.Seqs, mla.CompressPlanSeq{Row: int(m.CuQ[b]), Rows: rows, Start: start, From: b, To: b})
		entries := (start + rows) / ratio
		table := make([]int32, (entries+engine.CompressedPageSize-1)/engine.CompressedPageSize+1)
		for j := range table {
			table[j] = int32(pages)
			pages++
		}
		tables[b] = table
	}
	for b := range m.NumSeqs {
		if err := p.PlanEntries(b, ratio, int(m.Cached[b]), int(m.QLen[b]), tables[b], engine.CompressedPageSize, pages); err != nil {
			return nil, nil, 0, err
		}
	}
	return p, tables, pages, nil
}

// compressLayer issues layer l's compressor on the current stream: the
// projection GEMM of the hidden rows (with project) and the step (with
// step) from its own projections.
func (d *device) compressLayer(ctx context.Context, md model, cl *chainLayout, c *chainComp, l int, project, step bool) error {
	set := l % len(cl.sets)
	hidden := chainDimsOf(md).hidden
	if project {
		if err := d.be.BF16GEMM(ctx, &mla.BF16GEMMArgs{Rows: cl.rows, N: 2 * c.width, K: hidden, X: cl.sets[set].hidden,
			XStride: hidden, W: c.wkvg[l], Y: c.kg, YStride: 2 * c.width}); err != nil {
			return fmt.Errorf("compressor GEMM: %w", err)
		}
	}
	if !step {
		return nil
	}
	return d.compressStep(ctx, cl, c, l, c.kg, 0)
}

// compressStep issues layer l's compressor step from KG rows kgStride
// float32 apart (0: packed), its K and G first in each row: its own
// projections, or the ratio-4 layer's one projection GEMM with the
// indexer's (chainIdx.mainKG).
func (d *device) compressStep(ctx context.Context, cl *chainLayout, c *chainComp, l int, kg mla.Buffer, kgStride int) error {
	a := cl.ls.args[l%len(cl.sets)]
	if err := d.be.CompressStep(ctx, &mla.CompressStepArgs{Ratio: c.ratio, KG: kg, KGRows: cl.rows, KGStride: kgStride, APE: c.ape,
		Ring: c.rings[l], RingRows: c.ringRows, Slots: cl.ls.m.NumSeqs, Plan: c.plan, MaxSeqs: c.maxSeqs, MaxJobs: c.maxJobs,
		NormWeight: c.norm, Eps: numerics.DefaultEps, Rope: a.Rope, RopePositions: a.RopePositions,
		Pool: c.pool, PageSize: engine.CompressedPageSize, NumPages: c.pages, Scratch: c.scratch}); err != nil {
		return fmt.Errorf("compressor step: %w", err)
	}
	return nil
}
