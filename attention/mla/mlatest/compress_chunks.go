package mlatest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/numerics"
)

// CompressChunk is one step of a CompressChunking: Rows new rows, of which
// the last Rejected are drafts the verification rejects (the next step
// starts after the accepted ones).
type CompressChunk struct{ Rows, Rejected int }

// CompressChunking feeds one sequence's prompt through a series of steps on
// the same ring and pool, as an engine does: chunks in place or moved to
// the other slot, token by token, MTP steps with rejected drafts.
// DESIGN.md section 8: every entry must then equal the one-step result.
type CompressChunking struct {
	Name                       string
	Ratio, MaxDrafts, PageSize int
	APE                        bool
	Steps                      []CompressChunk
	// Indexer runs the indexer's compressor (mla.EntryIndexer; ratio 4).
	Indexer bool
}

// CompressChunkings lists the step series every mla.CompressStepper must
// pass.
func CompressChunkings() []CompressChunking {
	ones := func(n int) []CompressChunk {
		out := make([]CompressChunk, n)
		for i := range out {
			out[i].Rows = 1
		}
		return out
	}
	cat := func(parts ...[]CompressChunk) []CompressChunk {
		var out []CompressChunk
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	return []CompressChunking{
		{Name: "r4/token-by-token", Ratio: 4, MaxDrafts: 0, PageSize: 8, APE: true, Steps: ones(23)},
		{Name: "r4/chunks", Ratio: 4, MaxDrafts: 3, PageSize: 16,
			Steps: []CompressChunk{{3, 0}, {5, 0}, {7, 0}, {13, 0}, {2, 0}, {41, 0}, {1, 0}, {4, 0}}},
		{Name: "r4/mtp", Ratio: 4, MaxDrafts: 3, PageSize: 4, APE: true,
			Steps: []CompressChunk{{10, 0}, {4, 2}, {4, 3}, {4, 0}, {4, 1}, {4, 0}, {2, 1}, {4, 3}, {20, 0}}},
		{Name: "r128/chunks", Ratio: 128, MaxDrafts: 3, PageSize: 2, APE: true,
			Steps: []CompressChunk{{127, 0}, {1, 0}, {1, 0}, {50, 0}, {77, 0}, {1, 0}, {130, 0}}},
		{Name: "r128/mtp", Ratio: 128, MaxDrafts: 7, PageSize: 1,
			Steps: cat([]CompressChunk{{120, 0}, {8, 5}, {8, 0}, {8, 7}, {8, 2}, {8, 0}}, ones(5), []CompressChunk{{200, 0}})},
		// The indexer's compressor (DESIGN.md section 9): token by token,
		// chunks ending at 1, 2 and 3 mod 4, rejected drafts across a
		// window's boundary, and prompts of length 3 mod 4 followed by
		// decode (the serving engines' wrong token).
		{Name: "indexer/token-by-token", Ratio: 4, MaxDrafts: 0, PageSize: 8, APE: true, Indexer: true, Steps: ones(23)},
		{Name: "indexer/chunks-mod4", Ratio: 4, MaxDrafts: 3, PageSize: 16, Indexer: true,
			Steps: []CompressChunk{{1, 0}, {1, 0}, {3, 0}, {6, 0}, {7, 0}, {2, 0}, {41, 0}, {5, 0}, {130, 0}}},
		{Name: "indexer/mtp-boundary", Ratio: 4, MaxDrafts: 3, PageSize: 4, APE: true, Indexer: true,
			Steps: []CompressChunk{{10, 0}, {4, 3}, {4, 2}, {4, 1}, {4, 3}, {4, 0}, {2, 1}, {4, 3}, {4, 2}, {20, 0}}},
		{Name: "indexer/prompt3mod4-decode", Ratio: 4, MaxDrafts: 3, PageSize: 8, APE: true, Indexer: true,
			Steps: cat([]CompressChunk{{127, 0}}, ones(9), []CompressChunk{{4, 1}, {4, 0}})},
		{Name: "indexer/prompt7-decode", Ratio: 4, MaxDrafts: 0, PageSize: 2, Indexer: true,
			Steps: cat([]CompressChunk{{7, 0}}, ones(6))},
	}
}

// CheckCompressChunking runs a step series on b and compares every byte of
// the pool with the reference of the whole prompt in one step.
func CheckCompressChunking(b mla.Backend, c CompressChunking, seed uint64) error {
	st, ok := b.(mla.CompressStepper)
	if !ok {
		return fmt.Errorf("backend %s does not implement mla.CompressStepper", b.Name())
	}
	if c.Ratio != 4 && c.Ratio != 128 || c.Indexer && c.Ratio != 4 {
		return fmt.Errorf("compress chunking %s: ratio %d (indexer %v)", c.Name, c.Ratio, c.Indexer)
	}
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	geom := &compressHost{ratio: c.Ratio, pageSize: c.PageSize, indexer: c.Indexer}
	dim := geom.dim()
	w := refOverlap(c.Ratio) * dim
	entry := mla.EntryKV
	if c.Indexer {
		entry = mla.EntryIndexer
	}
	ringRows := mla.RingRows(c.Ratio, c.MaxDrafts)
	inPlace := mla.InPlaceRows(c.Ratio, ringRows)

	// The accepted length, and the furthest position any step reaches.
	length, reach, maxRows := 0, 0, 0
	for _, s := range c.Steps {
		if s.Rows < 1 || s.Rejected < 0 || s.Rejected >= s.Rows || (s.Rejected > 0 && s.Rows > c.MaxDrafts+1) {
			return fmt.Errorf("compress chunking %s: step %+v (MaxDrafts %d)", c.Name, s, c.MaxDrafts)
		}
		reach = max(reach, length+s.Rows)
		length += s.Rows - s.Rejected
		maxRows = max(maxRows, s.Rows)
	}
	if reach/c.Ratio > length/c.Ratio {
		// A rejected draft's entry is rewritten only when the sequence
		// gets there again.
		return fmt.Errorf("compress chunking %s: drafts complete entry %d, the accepted %d positions only %d entries", c.Name, reach/c.Ratio-1, length, length/c.Ratio)
	}

	prompt := make([]float32, length*2*w)
	for p := 0; p < length; p++ {
		randomKGRow(r, prompt[p*2*w:(p+1)*2*w], false)
	}
	var ape []float32
	if c.APE {
		ape = make([]float32, c.Ratio*w)
		for i := range ape {
			ape[i] = nonZero(float32(r.NormFloat64()))
		}
	}
	nw := make([]float32, dim)
	for i := range nw {
		nw[i] = nonZero(float32(1 + 0.5*r.NormFloat64()))
	}
	entries := reach / c.Ratio
	ropePositions := max(1, entries*c.Ratio) + r.IntN(3)
	rope, err := compressRopeTable(ropePositions)
	if err != nil {
		return err
	}
	tablePages := (entries + c.PageSize - 1) / c.PageSize
	numPages := tablePages + 2
	table := r.Perm(numPages)[:tablePages]
	pageBytes := geom.pageBytes()
	pool := make([]byte, numPages*pageBytes)
	for i := range pool {
		pool[i] = compressPoison
	}
	const slots = 3
	ring := make([]byte, slots*ringRows*2*w*4)
	for i := range ring {
		ring[i] = compressPoison // a new sequence: no state
	}
	jobsFor := func(plan *mla.CompressPlan, seq, start, rows int) {
		for idx := start / c.Ratio; (idx+1)*c.Ratio <= start+rows; idx++ {
			plan.Jobs = append(plan.Jobs, mla.CompressPlanJob{Index: idx, Seq: seq, Page: table[idx/c.PageSize], Offset: idx % c.PageSize})
		}
	}

	// The device's buffers, kept across the steps.
	dev := &deviceBuffers{b: b}
	defer dev.free()
	upload := dev.upload
	maxJobs := maxRows/c.Ratio + 1
	a := &mla.CompressStepArgs{
		Ratio: c.Ratio, Entry: entry, KGRows: maxRows + 1, RingRows: ringRows, Slots: slots, MaxSeqs: 1, MaxJobs: maxJobs,
		Eps: numerics.DefaultEps, RopePositions: ropePositions, PageSize: c.PageSize, NumPages: numPages,
	}
	for _, u := range []struct {
		dst  *mla.Buffer
		data []byte
	}{
		{&a.KG, make([]byte, a.KGRows*2*w*4)}, {&a.Ring, ring}, {&a.Plan, make([]byte, mla.CompressPlanBytes(1, maxJobs))},
		{&a.NormWeight, numerics.F32Bytes(nw)}, {&a.Rope, rope}, {&a.Pool, pool},
		{&a.Scratch, make([]byte, mla.CompressScratchBytes(maxJobs))},
	} {
		if *u.dst, err = upload(u.data); err != nil {
			return err
		}
	}
	if ape != nil {
		if a.APE, err = upload(numerics.F32Bytes(ape)); err != nil {
			return err
		}
	}

	ctx := context.Background()
	slotOrder := r.Perm(slots)
	cur, other := slotOrder[0], slotOrder[1]
	start := 0
	for i, s := range c.Steps {
		kg := make([]float32, s.Rows*2*w)
		for p := start; p < start+s.Rows; p++ {
			dst := kg[(p-start)*2*w : (p-start+1)*2*w]
			if p < start+s.Rows-s.Rejected {
				copy(dst, prompt[p*2*w:(p+1)*2*w])
			} else {
				randomKGRow(r, dst, false) // a draft that is rejected
			}
		}
		row := r.IntN(a.KGRows - s.Rows + 1)
		seq := mla.CompressPlanSeq{Row: row, Rows: s.Rows, Start: start, From: cur, To: cur}
		if s.Rows > inPlace || r.IntN(4) == 0 {
			seq.To = other
		}
		plan := &mla.CompressPlan{Seqs: []mla.CompressPlanSeq{seq}}
		jobsFor(plan, 0, start, s.Rows)
		enc, err := plan.Encode(1, maxJobs)
		if err != nil {
			return err
		}
		if err := b.Write(a.KG, row*2*w*4, numerics.F32Bytes(kg)); err != nil {
			return err
		}
		if err := b.Write(a.Plan, 0, enc); err != nil {
			return err
		}
		if err := st.CompressStep(ctx, a); err != nil {
			return fmt.Errorf("compress chunking %s step %d: %w", c.Name, i, err)
		}
		// The next step's inputs overwrite this one's: wait for it.
		if err := b.Synchronize(ctx); err != nil {
			return err
		}
		if seq.To != seq.From {
			cur, other = other, cur
		}
		start += s.Rows - s.Rejected
	}
	got := make([]byte, len(pool))
	if err := b.Read(got, a.Pool, 0); err != nil {
		return err
	}
	// The state: the ring slot holds the accepted positions an entry may
	// still read, (K, G + ape) of the prompt, whatever the drafts wrote.
	gotRing := make([]byte, slots*ringRows*2*w*4)
	if err := b.Read(gotRing, a.Ring, 0); err != nil {
		return err
	}
	coff := refOverlap(c.Ratio)
	for p := max(0, (length/c.Ratio-coff+1)*c.Ratio); p < length; p++ {
		want := append([]float32(nil), prompt[p*2*w:(p+1)*2*w]...)
		if ape != nil {
			for i := 0; i < w; i++ {
				want[w+i] = float32(want[w+i] + ape[p%c.Ratio*w+i])
			}
		}
		base := (cur*ringRows + p%ringRows) * 2 * w * 4
		if gotRow := gotRing[base : base+2*w*4]; !bytes.Equal(gotRow, numerics.F32Bytes(want)) {
			return fmt.Errorf("compress chunking %s (seed %d): the state's row of position %d (ring slot %d row %d) differs from the prompt's", c.Name, seed, p, cur, p%ringRows)
		}
	}

	// The reference: the whole prompt in one step from a fresh slot.
	whole := &mla.CompressPlan{Seqs: []mla.CompressPlanSeq{{Row: 0, Rows: length, Start: 0, From: 0, To: 1}}}
	jobsFor(whole, 0, 0, length)
	h := &compressHost{
		ratio: c.Ratio, kg: prompt, ape: ape, ring: make([]float32, 2*ringRows*2*w), ringRows: ringRows, plan: whole,
		normWeight: numerics.F32Bytes(nw), eps: numerics.DefaultEps, rope: rope, pool: pool, pageSize: c.PageSize, indexer: c.Indexer,
	}
	_, want := refCompressStep(h)
	cs := &CompressCase{S: CompressScenario{Name: "chunking " + c.Name, Ratio: c.Ratio, PageSize: c.PageSize}, Seed: seed, Plan: whole, h: h}
	return cs.Compare(&CompressOutputs{Pool: got}, &CompressOutputs{Pool: want})
}
