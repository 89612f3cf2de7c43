package main

import (
	"context"
	"fmt"
	"github.com/dsv4mla/prologue/numerics"
	"math/rand/v2"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// layerSpec says how to lay out one shape's layers.
type layerSpec struct {
	// sets is the number of layers with distinct inputs, outputs, weights
	// and cache pools wanted; memBytes (0: no bound) may lower it.
	sets     int
	memBytes int64
	// cacheFormat sizes each pool: the largest format a launch will write.
	cacheFormat kvcache.Format
	// padTo pads the batch to this many rows (a CUDA-graph bucket; 0: none)
	// and fromHeader makes generation launches read their counts from the
	// metadata header, as the engine's graphs do.
	padTo      int
	fromHeader bool
}

// layers is one model and shape's buffers: the batch's metadata and RoPE
// table, shared by every layer as in the engine, and one LayerArgs per
// input set, each with its own latent, Q input and output, weight and
// cache pool.
type layers struct {
	m        *metadata.Metadata
	launches []mla.Launch
	pages    int
	rowElems int
	args     []mla.LayerArgs
	bufs     []mla.Buffer
}

// perSetBytes is the device memory of one input set.
func perSetBytes(md model, rows, rowElems, pages int, f kvcache.Format) int64 {
	return int64(rows)*int64(rowElems)*2 + // latent (fused rows)
		2*int64(rows)*int64(md.Heads)*512*2 + // Q input, Q output (bf16-sized)
		int64(pages)*int64(f.PageBytes(pageSize)) + 512*4
}

// setsWithin is how many of want sets fit in memBytes (at least one).
func setsWithin(want int, perSet, memBytes int64) int {
	if memBytes <= 0 || perSet <= 0 {
		return want
	}
	return max(1, min(want, int(memBytes/perSet)))
}

// shapeMetadata plans and builds the shape's metadata; every sequence's
// pages are distinct random pages of a pool that holds exactly them.
func shapeMetadata(md model, s shape, padTo int) (*metadata.Metadata, int, error) {
	plan, err := metadata.NewPlan(s.reqs, func(id uint64) (int, bool, error) { n, ok := s.cached[id]; return n, ok, nil },
		metadata.Params{Heads: md.Heads, PageSize: pageSize, MaxPositions: s.positions(), PadTokensTo: padTo,
			Scheduler: metadata.DefaultSchedulerParams()})
	if err != nil {
		return nil, 0, err
	}
	total := 0
	for _, n := range plan.Needs() {
		total += (n.Length + pageSize - 1) / pageSize
	}
	perm := rand.New(rand.NewPCG(uint64(total), 3)).Perm(total)
	tables := map[uint64][]int32{}
	for _, n := range plan.Needs() {
		for range (n.Length + pageSize - 1) / pageSize {
			tables[n.Seq] = append(tables[n.Seq], int32(perm[0]))
			perm = perm[1:]
		}
	}
	m, err := plan.Build(func(id uint64) ([]int32, error) { return tables[id], nil })
	return m, total, err
}

func (d *device) free(ls *layers) {
	for _, buf := range ls.bufs {
		_ = d.be.Free(buf)
	}
	ls.bufs = nil
}

// setupLayers allocates and fills a shape's layers on the device.
func (d *device) setupLayers(md model, s shape, spec layerSpec) (_ *layers, err error) {
	m, total, err := shapeMetadata(md, s, spec.padTo)
	if err != nil {
		return nil, err
	}
	ls := &layers{m: m, pages: total, launches: mla.Plan(m), rowElems: md.QLora + 512}
	if spec.fromHeader {
		ls.launches = mla.FromHeader(ls.launches)
	}
	if d.contiguousLatent {
		ls.rowElems = 512
	}
	defer func() {
		if err != nil {
			d.free(ls)
		}
	}()
	keep := func(buf mla.Buffer, err error) (mla.Buffer, error) {
		if err == nil {
			ls.bufs = append(ls.bufs, buf)
		}
		return buf, err
	}
	T := m.PaddedTokens
	sets := setsWithin(max(spec.sets, 1), perSetBytes(md, T, ls.rowElems, total, spec.cacheFormat), spec.memBytes)
	rope, err := keep(d.randF32(s.positions()*64, -1, 1))
	if err != nil {
		return nil, err
	}
	meta, err := mla.NewMetadataBuffers(d.be, m.NumSeqs, m.MaxPages)
	if err != nil {
		return nil, err
	}
	ls.bufs = append(ls.bufs, meta.Buf)
	if err := meta.Upload(d.be, m, total); err != nil {
		return nil, err
	}
	for range sets {
		a := mla.LayerArgs{
			Heads: md.Heads, LatentOffset: (ls.rowElems - 512) * 2, LatentStride: ls.rowElems,
			Rope: rope, RopePositions: s.positions(), QFormat: mla.QFP8, QScale: 1, Eps: numerics.DefaultEps,
			Scheduler:   metadata.DefaultSchedulerParams(),
			CacheConfig: kvcache.Config{Format: spec.cacheFormat, PageSize: pageSize, NumPages: total, KVScale: 1},
			Meta:        meta,
		}
		steps := []struct {
			name string
			do   func() error
		}{
			{"latent", func() (err error) { a.Latent, err = keep(d.randBF16(T*ls.rowElems, ls.rowElems)); return }},
			{"Q input", func() (err error) { a.QIn, err = keep(d.randBF16(T*md.Heads*512, 512)); return }},
			{"Q output", func() (err error) { a.QOut, err = keep(d.be.Alloc(T * md.Heads * 512 * 2)); return }},
			{"weight", func() (err error) { a.KVWeight, err = keep(d.randF32(512, 0.5, 1.5)); return }},
			{"cache", func() (err error) {
				a.Cache, err = keep(d.be.Alloc(spec.cacheFormat.PageBytes(pageSize) * total))
				return
			}},
		}
		for _, st := range steps {
			if err := st.do(); err != nil {
				return nil, fmt.Errorf("%s %s %d tokens, input set %d of %d: %s: %w", md.Name, s.Phase, s.Tokens, len(ls.args)+1, sets, st.name, err)
			}
		}
		ls.args = append(ls.args, a)
	}
	return ls, d.be.Synchronize(context.Background())
}

// withFormats is layer set i's arguments writing cache format f and Q
// format q.
func (ls *layers) withFormats(i int, f kvcache.Format, q mla.QFormat) mla.LayerArgs {
	a := ls.args[i%len(ls.args)]
	a.CacheConfig.Format = f
	a.QFormat = q
	return a
}
