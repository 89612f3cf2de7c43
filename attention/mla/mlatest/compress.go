package mlatest

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// CompressSeqSpec is one sequence of a compressor-step scenario: its new
// rows are positions [Start, Start+Rows).
type CompressSeqSpec struct {
	Start, Rows int
	// Move puts the sequence's rows into a fresh slot (To != From, the
	// older rows it keeps copied). A sequence with more rows than
	// mla.InPlaceRows always moves.
	Move bool
}

// CompressScenario is one plan shape of the compressor-step suite.
type CompressScenario struct {
	Name      string
	Ratio     int
	MaxDrafts int // the ring has mla.RingRows(Ratio, MaxDrafts) rows a slot
	PageSize  int
	Seqs      []CompressSeqSpec
	// SpareSeqs and SpareJobs are the plan's capacity beyond what it uses
	// (0 and 0: a full plan).
	SpareSeqs, SpareJobs int
	APE                  bool // an APE buffer (else KG's G already includes it)
	NaNLogits            bool // a few NaN logits among the new and the ring's rows
	// Cancel sets each entry's K values so that the weighted terms
	// fl(w_j*K_j) are about +-2^20 in turn and cancel: what remains is
	// rounding, so any other order of the sums (or another exp, or an
	// FMA) changes the entry's bytes.
	Cancel     bool
	PlanOffset int // bytes of other data before the plan in its buffer
	// SmallK scales the K values down to about 2^-10, so that the pooled
	// values' mean square is near eps and the eps decides the inverse RMS.
	SmallK bool
	// InterleaveJobs mixes the sequences' jobs in the plan (each
	// sequence's still ascending), as the plan's contract allows.
	InterleaveJobs bool
	Eps            float32
	// Indexer runs the indexer's compressor (mla.EntryIndexer; ratio 4).
	Indexer bool
	// KGLead and KGTrail (float32 values, multiples of 4) put other
	// columns before and after each KG row: the step reads its rows at
	// KGOffset = 4*KGLead with KGStride = KGLead + 2*Width + KGTrail, as
	// the engine's steps read their columns of a ratio-4 layer's one
	// projection GEMM (0, 0: packed rows).
	KGLead, KGTrail int
}

func (s CompressScenario) entry() mla.CompressEntry {
	if s.Indexer {
		return mla.EntryIndexer
	}
	return mla.EntryKV
}

func (s CompressScenario) eps() float32 {
	if s.Eps == 0 {
		return numerics.DefaultEps
	}
	return s.Eps
}

// CompressScenarios lists the plans every mla.CompressStepper must pass.
func CompressScenarios() []CompressScenario {
	var out []CompressScenario
	prompts := []int{1, 3, 4, 5, 7, 8, 127, 128, 129, 255, 256, 257}
	for _, ratio := range []int{4, 128} {
		page := 16 // ratio 4: up to 5 pages a prompt
		if ratio == 128 {
			page = 1 // every entry on its own page, at offset 0
		}
		for i, n := range prompts {
			out = append(out, CompressScenario{
				Name: fmt.Sprintf("r%d/prompt%d", ratio, n), Ratio: ratio, MaxDrafts: 3, PageSize: page,
				Seqs: []CompressSeqSpec{{Start: 0, Rows: n}}, SpareSeqs: i % 3, SpareJobs: 2 * (i % 2), APE: i%2 == 0,
				PlanOffset: 16 * (i % 4),
			})
		}
	}
	out = append(out,
		// Chunks that start mid-window, with earlier rows in the ring.
		CompressScenario{Name: "r4/mid-window-in-place", Ratio: 4, MaxDrafts: 3, PageSize: 16, APE: true, SpareSeqs: 2, SpareJobs: 3,
			Seqs: []CompressSeqSpec{{1, 3, false}, {2, 4, false}, {3, 1, false}, {5, 4, false}, {66, 2, false}, {103, 1, false}, {250, 4, false}}},
		CompressScenario{Name: "r4/mid-window-moved", Ratio: 4, MaxDrafts: 3, PageSize: 16, SpareJobs: 1,
			Seqs: []CompressSeqSpec{{1, 7, false}, {2, 11, false}, {3, 12, false}, {129, 5, false}, {130, 2, true}, {251, 40, false}}},
		CompressScenario{Name: "r128/mid-window", Ratio: 128, MaxDrafts: 5, PageSize: 2, APE: true, SpareSeqs: 1, SpareJobs: 1, PlanOffset: 32,
			Seqs: []CompressSeqSpec{{1, 6, false}, {127, 1, false}, {129, 3, false}, {255, 2, true}, {100, 200, false}, {383, 6, false}}},
		CompressScenario{Name: "r128/mid-window-no-ape", Ratio: 128, MaxDrafts: 2, PageSize: 4,
			Seqs: []CompressSeqSpec{{1, 130, false}, {127, 2, true}, {385, 127, false}, {513, 3, false}}},
		// Decode steps of 1..8 rows in place.
		CompressScenario{Name: "r4/decode", Ratio: 4, MaxDrafts: 7, PageSize: 8, APE: true, SpareSeqs: 3, SpareJobs: 4,
			Seqs: []CompressSeqSpec{{37, 1, false}, {40, 2, false}, {61, 3, false}, {127, 4, false}, {128, 5, false}, {201, 6, false}, {255, 7, false}, {300, 8, false}}},
		CompressScenario{Name: "r4/decode-no-ape", Ratio: 4, MaxDrafts: 1, PageSize: 64, Eps: 1e-5, SmallK: true,
			Seqs: []CompressSeqSpec{{3, 1, false}, {4, 2, false}, {11, 1, false}, {252, 2, false}}},
		CompressScenario{Name: "r128/decode", Ratio: 128, MaxDrafts: 7, PageSize: 2, APE: true, SpareJobs: 2,
			Seqs: []CompressSeqSpec{{127, 1, false}, {128, 8, false}, {250, 7, false}, {383, 1, false}, {509, 4, false}, {1000, 3, false}}},
		CompressScenario{Name: "r128/decode-no-ape", Ratio: 128, MaxDrafts: 0, PageSize: 1, SpareSeqs: 4, Eps: 1e-5, SmallK: true,
			Seqs: []CompressSeqSpec{{127, 1, false}, {255, 1, false}, {300, 1, false}}},
		// Long chunks to a fresh slot: longer than the ring, and shorter
		// (the older rows copied from the old slot).
		CompressScenario{Name: "r4/long-moved", Ratio: 4, MaxDrafts: 3, PageSize: 16, APE: true, SpareJobs: 2,
			Seqs: []CompressSeqSpec{{130, 300, false}, {9, 8, false}, {64, 9, true}}},
		CompressScenario{Name: "r128/long-moved", Ratio: 128, MaxDrafts: 3, PageSize: 2, SpareSeqs: 2,
			Seqs: []CompressSeqSpec{{129, 400, false}, {200, 100, false}, {256, 2, true}}},
		// Page edges: entries 63 and 64 of a sequence on two pages of 64.
		CompressScenario{Name: "r4/page-edge", Ratio: 4, MaxDrafts: 3, PageSize: 64, APE: true, SpareJobs: 1,
			Seqs: []CompressSeqSpec{{250, 10, false}, {255, 1, false}, {256, 4, false}}},
		CompressScenario{Name: "r128/page-edge", Ratio: 128, MaxDrafts: 3, PageSize: 64, PlanOffset: 48,
			Seqs: []CompressSeqSpec{{8100, 300, false}, {8191, 1, false}}},
		// Several sequences of every kind in one full plan (jobs up to the
		// capacity), and the same plan with room to spare.
		CompressScenario{Name: "r4/mixed-full", Ratio: 4, MaxDrafts: 3, PageSize: 8, APE: true, SmallK: true, InterleaveJobs: true,
			Seqs: []CompressSeqSpec{{0, 57, false}, {17, 3, false}, {18, 20, false}, {99, 1, false}, {30, 4, true}, {0, 2, false}}},
		CompressScenario{Name: "r128/mixed-spare", Ratio: 128, MaxDrafts: 3, PageSize: 2, SpareSeqs: 5, SpareJobs: 7, PlanOffset: 16, InterleaveJobs: true,
			Seqs: []CompressSeqSpec{{0, 255, false}, {127, 2, false}, {131, 125, false}, {40, 3, false}}},
		// A few NaN logits: the entries that pool them are NaN, the others
		// not.
		// Sums whose result is their rounding: the order is checked.
		CompressScenario{Name: "r4/cancel", Ratio: 4, MaxDrafts: 3, PageSize: 16, APE: true, Cancel: true,
			Seqs: []CompressSeqSpec{{0, 33, false}, {61, 9, false}, {6, 2, false}}},
		CompressScenario{Name: "r128/cancel", Ratio: 128, MaxDrafts: 3, PageSize: 2, Cancel: true,
			Seqs: []CompressSeqSpec{{0, 256, false}, {100, 30, false}}},
		CompressScenario{Name: "r4/nan-logits", Ratio: 4, MaxDrafts: 3, PageSize: 16, NaNLogits: true,
			Seqs: []CompressSeqSpec{{0, 40, false}, {61, 9, false}, {80, 3, false}}},
		CompressScenario{Name: "r128/nan-logits", Ratio: 128, MaxDrafts: 3, PageSize: 4, NaNLogits: true,
			Seqs: []CompressSeqSpec{{0, 256, false}, {126, 3, false}}},
	)
	// The indexer's compressor (ratio 4, 128 channels, MXFP4 entries):
	// every ratio-4 shape again.
	for _, s := range out {
		if s.Ratio == 4 && !s.Indexer {
			s.Name = "indexer/" + s.Name
			s.Indexer = true
			out = append(out, s)
		}
	}
	// Rows that are columns of wider rows: the engine's ratio-4 layer with
	// the indexer (one GEMM's rows of 2*1024 + 2*256 + 64 values: the
	// compressor's first, the indexer's after them), and a ratio-128 layer
	// with a small margin either side.
	seqs := []CompressSeqSpec{{0, 9, false}, {2, 11, false}, {129, 5, false}, {130, 2, true}, {61, 40, false}}
	out = append(out,
		CompressScenario{Name: "r4/fused-columns", Ratio: 4, MaxDrafts: 3, PageSize: 16, APE: true, SpareJobs: 1,
			Seqs: seqs, KGTrail: 2*256 + 64},
		CompressScenario{Name: "indexer/r4/fused-columns", Ratio: 4, MaxDrafts: 3, PageSize: 16, APE: true, Indexer: true, SpareSeqs: 1,
			Seqs: seqs, KGLead: 2 * 1024, KGTrail: 64},
		CompressScenario{Name: "r128/strided", Ratio: 128, MaxDrafts: 3, PageSize: 2, APE: true, PlanOffset: 16,
			Seqs: []CompressSeqSpec{{0, 130, false}, {127, 2, false}, {250, 9, true}}, KGLead: 4, KGTrail: 12},
	)
	return out
}

// TestCompressStep runs every compressor-step scenario, then every step
// series (CompressChunkings, under "chunks/"), on b, which must implement
// mla.CompressStepper (the test skips otherwise).
func TestCompressStep(t *testing.T, b mla.Backend) {
	if _, ok := b.(mla.CompressStepper); !ok {
		t.Skipf("backend %s does not implement mla.CompressStepper", b.Name())
	}
	for i, s := range CompressScenarios() {
		t.Run(s.Name, func(t *testing.T) {
			skipUnderRace(t, i)
			seed := Seed(t)
			if err := CheckCompressStep(b, s, seed); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("refusals", func(t *testing.T) { checkCompressStepRefusals(t, b) })
	for i, c := range CompressChunkings() {
		t.Run("chunks/"+c.Name, func(t *testing.T) {
			skipUnderRace(t, i)
			seed := Seed(t)
			if err := CheckCompressChunking(b, c, seed); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkCompressStepRefusals: KG rows outside their buffer or misaligned
// are refused naming the field, before anything runs: the ring and the
// pool keep every byte.
func checkCompressStepRefusals(t *testing.T, b mla.Backend) {
	var s CompressScenario
	for _, x := range CompressScenarios() {
		if x.Name == "r4/fused-columns" {
			s = x
		}
	}
	cs, err := NewCompressCase(s, Seed(t))
	if err != nil {
		t.Fatal(err)
	}
	a, free, err := cs.Upload(b)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		edit func(a *mla.CompressStepArgs)
		want string
	}{
		{"KG offset misaligned", func(a *mla.CompressStepArgs) { a.KGOffset += 8 }, "KGOffset = 8 bytes"},
		{"KG offset negative", func(a *mla.CompressStepArgs) { a.KGOffset = -16 }, "KGOffset = -16 bytes"},
		{"KG stride below 2*Width", func(a *mla.CompressStepArgs) { a.KGStride = 2*a.Width() - 4 }, fmt.Sprintf("KGStride = %d", 2*cs.h.width()-4)},
		{"KG stride not a multiple of 4", func(a *mla.CompressStepArgs) { a.KGStride += 2 }, "KGStride ="},
		{"KG rows past the buffer", func(a *mla.CompressStepArgs) { a.KGOffset = a.KG.Len() - 16 }, "KG has"},
		{"KG stride past the buffer", func(a *mla.CompressStepArgs) { a.KGStride *= 2 }, "KG has"},
	} {
		e := *a
		tc.edit(&e)
		err := b.(mla.CompressStepper).CompressStep(ctx, &e)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
		if err := b.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			what string
			buf  mla.Buffer
			want []byte
		}{{"ring", a.Ring, cs.ringBytes}, {"pool", a.Pool, cs.h.pool}} {
			got := make([]byte, len(c.want))
			if err := b.Read(got, c.buf, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Fatalf("%s: the refused step changed the %s", tc.name, c.what)
			}
		}
	}
}

// CheckCompressStep runs one scenario on b and compares every byte of the
// ring and the pool with the reference.
func CheckCompressStep(b mla.Backend, s CompressScenario, seed uint64) error {
	cs, err := NewCompressCase(s, seed)
	if err != nil {
		return err
	}
	got, err := cs.Run(b)
	if err != nil {
		return err
	}
	return cs.Compare(got, cs.Expected())
}

// CompressCase is a scenario with concrete inputs.
type CompressCase struct {
	S                    CompressScenario
	Seed                 uint64
	Plan                 *mla.CompressPlan
	MaxSeqs, MaxJobs     int
	KGRows, Slots        int
	RingRows, NumPages   int
	RopePositions        int
	h                    *compressHost
	planBuf              []byte // PlanOffset bytes, the encoded plan, trailing bytes
	kgBytes, apeBytes    []byte // KG: h.kg's rows laid out with S.KGLead and S.KGTrail
	ringBytes, ropeBytes []byte
}

// CompressOutputs are the ring's and the pool's bytes after a step.
type CompressOutputs struct{ Ring, Pool []byte }

// compressPoison fills the ring's and the pool's bytes nothing wrote.
const compressPoison = 0xA5

// NewCompressCase builds the plan and the random inputs of a scenario.
func NewCompressCase(s CompressScenario, seed uint64) (*CompressCase, error) {
	coff := refOverlap(s.Ratio)
	if s.Ratio != 4 && s.Ratio != 128 {
		return nil, fmt.Errorf("compress scenario %s: ratio %d", s.Name, s.Ratio)
	}
	if s.Indexer && s.Ratio != 4 {
		return nil, fmt.Errorf("compress scenario %s: the indexer's compressor at ratio %d", s.Name, s.Ratio)
	}
	if s.KGLead < 0 || s.KGTrail < 0 || s.KGLead%4 != 0 || s.KGTrail%4 != 0 {
		return nil, fmt.Errorf("compress scenario %s: KGLead, KGTrail = %d, %d: want multiples of 4", s.Name, s.KGLead, s.KGTrail)
	}
	if s.NaNLogits && s.APE {
		// NaN + ape keeps the NaN's bits on the CPU, not on the GPU: the
		// ring's bytes would differ where the contract says nothing.
		return nil, fmt.Errorf("compress scenario %s: NaN logits with an APE buffer", s.Name)
	}
	r := rand.New(rand.NewPCG(seed, 0x2545f4914f6cdd1d))
	h := &compressHost{ratio: s.Ratio, ringRows: mla.RingRows(s.Ratio, s.MaxDrafts), eps: s.eps(), pageSize: s.PageSize, indexer: s.Indexer}
	w := coff * h.dim()
	ringRows := mla.RingRows(s.Ratio, s.MaxDrafts)
	inPlace := mla.InPlaceRows(s.Ratio, ringRows)
	n := len(s.Seqs)

	// Slots: each sequence's own, plus a fresh one for each that moves,
	// plus spare slots (other sequences' states: neither read nor written).
	moves := make([]bool, n)
	slotsNeeded := n
	for i, q := range s.Seqs {
		moves[i] = q.Move || q.Rows > inPlace
		if moves[i] {
			slotsNeeded++
		}
	}
	slots := slotsNeeded + 2
	slotPerm := r.Perm(slots)
	plan := &mla.CompressPlan{Seqs: make([]mla.CompressPlanSeq, n)}
	for i := range plan.Seqs {
		plan.Seqs[i].From, plan.Seqs[i].To = slotPerm[0], slotPerm[0]
		slotPerm = slotPerm[1:]
		if moves[i] {
			plan.Seqs[i].To = slotPerm[0]
			slotPerm = slotPerm[1:]
		}
	}
	spareSlots := slotPerm

	// KG rows: the sequences in a random order, with unread rows between.
	row := r.IntN(2)
	for _, i := range r.Perm(n) {
		plan.Seqs[i].Row, plan.Seqs[i].Rows, plan.Seqs[i].Start = row, s.Seqs[i].Rows, s.Seqs[i].Start
		row += s.Seqs[i].Rows + r.IntN(3)
	}
	kgRows := row + 1 + r.IntN(2)

	// Entries: entry i when position (i+1)r-1 is among the new rows, on
	// the sequence's own random pages.
	type need struct{ seq, pages int }
	var needs []need
	totalPages := 0
	for i, q := range s.Seqs {
		last := (q.Start+q.Rows)/s.Ratio - 1 // the last entry the sequence has
		if last < 0 {
			continue
		}
		k := last/s.PageSize + 1
		needs = append(needs, need{i, k})
		totalPages += k
	}
	numPages := totalPages + 2
	pagePerm := r.Perm(numPages)
	maxRope := 1
	for _, nd := range needs {
		table := pagePerm[:nd.pages]
		pagePerm = pagePerm[nd.pages:]
		q := s.Seqs[nd.seq]
		for idx := q.Start / s.Ratio; (idx+1)*s.Ratio <= q.Start+q.Rows; idx++ {
			plan.Jobs = append(plan.Jobs, mla.CompressPlanJob{Index: idx, Seq: nd.seq, Page: table[idx/s.PageSize], Offset: idx % s.PageSize})
			maxRope = max(maxRope, idx*s.Ratio+1)
		}
	}
	if s.InterleaveJobs {
		// A random merge of the sequences' job lists.
		perSeq := map[int][]mla.CompressPlanJob{}
		for _, j := range plan.Jobs {
			perSeq[j.Seq] = append(perSeq[j.Seq], j)
		}
		plan.Jobs = plan.Jobs[:0]
		for len(perSeq) > 0 {
			k := r.IntN(n)
			if q, ok := perSeq[k]; ok {
				plan.Jobs = append(plan.Jobs, q[0])
				if len(q) == 1 {
					delete(perSeq, k)
				} else {
					perSeq[k] = q[1:]
				}
			}
		}
	}
	maxSeqs, maxJobs := n+s.SpareSeqs, max(1, len(plan.Jobs)+s.SpareJobs)
	enc, err := plan.Encode(maxSeqs, maxJobs)
	if err != nil {
		return nil, fmt.Errorf("compress scenario %s: %w", s.Name, err)
	}

	cs := &CompressCase{S: s, Seed: seed, Plan: plan, MaxSeqs: maxSeqs, MaxJobs: maxJobs, KGRows: kgRows, Slots: slots,
		RingRows: ringRows, NumPages: numPages, RopePositions: maxRope + r.IntN(4)}
	h.plan = plan

	randomRow := func(dst []float32) { randomKGRow(r, dst, s.SmallK) }
	h.kg = make([]float32, kgRows*2*w)
	for i := 0; i < kgRows; i++ {
		randomRow(h.kg[i*2*w : (i+1)*2*w])
	}
	if s.APE {
		h.ape = make([]float32, s.Ratio*w)
		for i := range h.ape {
			h.ape[i] = nonZero(float32(r.NormFloat64()))
		}
	}
	// The ring: poison, then each sequence's earlier rows (the ring slot
	// full, older positions too) and other sequences' rows in spare slots.
	h.ring = make([]float32, slots*ringRows*2*w)
	poison := math.Float32frombits(compressPoison * 0x01010101)
	for i := range h.ring {
		h.ring[i] = poison
	}
	for i, q := range s.Seqs {
		for p := max(0, q.Start-ringRows); p < q.Start; p++ {
			base := (plan.Seqs[i].From*ringRows + p%ringRows) * 2 * w
			randomRow(h.ring[base : base+2*w])
		}
	}
	for _, sl := range spareSlots {
		for rr := 0; rr < ringRows; rr++ {
			base := (sl*ringRows + rr) * 2 * w
			randomRow(h.ring[base : base+2*w])
		}
	}
	if s.NaNLogits {
		// Logits of a few channels, in new rows and in rows the ring
		// holds for a sequence that starts mid-window.
		nan := float32(math.NaN())
		for k := 0; k < 6; k++ {
			i := r.IntN(kgRows)
			h.kg[i*2*w+w+r.IntN(w)] = nan
		}
		for i, q := range s.Seqs {
			if q.Start > 0 {
				p := q.Start - 1 - r.IntN(min(q.Start, 3))
				base := (plan.Seqs[i].From*ringRows + p%ringRows) * 2 * w
				h.ring[base+w+r.IntN(w)] = nan
			}
		}
	}

	if s.Cancel {
		cancelSums(h)
	}

	nw := make([]float32, h.dim())
	for i := range nw {
		nw[i] = nonZero(float32(1 + 0.5*r.NormFloat64()))
	}
	h.normWeight = numerics.F32Bytes(nw)
	table, err := compressRopeTable(cs.RopePositions)
	if err != nil {
		return nil, err
	}
	h.rope = table
	h.pool = make([]byte, numPages*h.pageBytes())
	for i := range h.pool {
		h.pool[i] = compressPoison
	}
	cs.h = h

	cs.planBuf = make([]byte, s.PlanOffset+len(enc)+16)
	for i := range cs.planBuf {
		cs.planBuf[i] = byte(r.Uint32())
	}
	copy(cs.planBuf[s.PlanOffset:], enc)
	cs.kgBytes = numerics.F32Bytes(h.kg)
	if s.KGLead+s.KGTrail > 0 {
		// The other columns hold rows of their own (a step that reads them
		// computes other entries).
		stride := s.KGLead + 2*w + s.KGTrail
		wide := make([]float32, kgRows*stride)
		for i := range kgRows {
			row := wide[i*stride : (i+1)*stride]
			randomKGRow(r, row[:s.KGLead], s.SmallK)
			randomKGRow(r, row[s.KGLead+2*w:], s.SmallK)
			copy(row[s.KGLead:], h.kg[i*2*w:(i+1)*2*w])
		}
		cs.kgBytes = numerics.F32Bytes(wide)
	}
	if h.ape != nil {
		cs.apeBytes = numerics.F32Bytes(h.ape)
	}
	cs.ringBytes = numerics.F32Bytes(h.ring)
	cs.ropeBytes = table
	return cs, nil
}

// randomKGRow fills one row of 2*w values, K then G: K values of a per-row
// magnitude (about 2^-10 when small), logits around 0 with some at +-80
// (the max subtraction decides), never zero.
func randomKGRow(r *rand.Rand, dst []float32, small bool) {
	w := len(dst) / 2
	scale := math.Ldexp(1, r.IntN(9)-4)
	if small {
		scale = math.Ldexp(1, r.IntN(3)-11)
	}
	for c := 0; c < w; c++ {
		dst[c] = nonZero(float32(r.NormFloat64() * scale))
		switch g := r.IntN(200); {
		case g == 0:
			dst[w+c] = 80 + float32(r.Float64())
		case g == 1:
			dst[w+c] = -80 - float32(r.Float64())
		default:
			dst[w+c] = nonZero(float32(3 * r.NormFloat64()))
		}
	}
}

// compressRopeTable is the YaRN table every compressed layer reads.
func compressRopeTable(positions int) ([]byte, error) {
	t, err := dsv4.NewRopeTable(dsv4.Flash(), dsv4.RopeYaRN, dsv4.RopeReference, positions)
	if err != nil {
		return nil, err
	}
	return t.Bytes(), nil
}

func nonZero(v float32) float32 {
	if v == 0 {
		return 1.0 / 1024
	}
	return v
}

// Run executes the step on b (which must implement mla.CompressStepper)
// and reads the ring and the pool back.
func (cs *CompressCase) Run(b mla.Backend) (*CompressOutputs, error) {
	st, ok := b.(mla.CompressStepper)
	if !ok {
		return nil, fmt.Errorf("backend %s does not implement mla.CompressStepper", b.Name())
	}
	a, free, err := cs.Upload(b)
	if err != nil {
		return nil, err
	}
	defer free()
	ctx := context.Background()
	if err := st.CompressStep(ctx, a); err != nil {
		return nil, err
	}
	if err := b.Synchronize(ctx); err != nil {
		return nil, err
	}
	out := &CompressOutputs{Ring: make([]byte, len(cs.ringBytes)), Pool: make([]byte, len(cs.h.pool))}
	if err := b.Read(out.Ring, a.Ring, 0); err != nil {
		return nil, err
	}
	if err := b.Read(out.Pool, a.Pool, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// Upload copies the case's inputs to b and returns the step's arguments
// and a function that frees their buffers (benchmarks run the step on them
// repeatedly: it rewrites the same bytes each time).
func (cs *CompressCase) Upload(b mla.Backend) (*mla.CompressStepArgs, func(), error) {
	dev := &deviceBuffers{b: b}
	upload := dev.upload
	h := cs.h
	a := &mla.CompressStepArgs{
		Ratio: cs.S.Ratio, Entry: cs.S.entry(), KGRows: cs.KGRows, RingRows: cs.RingRows, Slots: cs.Slots,
		PlanOffset: cs.S.PlanOffset, MaxSeqs: cs.MaxSeqs, MaxJobs: cs.MaxJobs, Eps: h.eps,
		RopePositions: cs.RopePositions, PageSize: cs.S.PageSize, NumPages: cs.NumPages,
	}
	if cs.S.KGLead+cs.S.KGTrail > 0 {
		a.KGOffset, a.KGStride = 4*cs.S.KGLead, cs.S.KGLead+2*h.width()+cs.S.KGTrail
	}
	var err error
	for _, u := range []struct {
		dst  *mla.Buffer
		data []byte
	}{
		{&a.KG, cs.kgBytes}, {&a.APE, cs.apeBytes}, {&a.Ring, cs.ringBytes}, {&a.Plan, cs.planBuf},
		{&a.NormWeight, h.normWeight}, {&a.Rope, cs.ropeBytes}, {&a.Pool, h.pool},
		{&a.Scratch, make([]byte, mla.CompressScratchBytes(cs.MaxJobs))},
	} {
		if u.data == nil {
			continue // APE nil
		}
		if *u.dst, err = upload(u.data); err != nil {
			dev.free()
			return nil, nil, err
		}
	}
	return a, dev.free, nil
}

// Expected computes the reference outputs.
func (cs *CompressCase) Expected() *CompressOutputs {
	ring, pool := refCompressStep(cs.h)
	return &CompressOutputs{Ring: numerics.F32Bytes(ring), Pool: pool}
}

// Compare reports the differing bytes of two outputs, the first few with
// where they lie (ring slot, row, K or G, value; pool page, entry, region).
func (cs *CompressCase) Compare(got, want *CompressOutputs) error {
	if len(got.Ring) != len(want.Ring) || len(got.Pool) != len(want.Pool) {
		return fmt.Errorf("compress %s: got %d ring and %d pool bytes, want %d and %d", cs.S.Name, len(got.Ring), len(got.Pool), len(want.Ring), len(want.Pool))
	}
	const limit = 8
	var shown []string
	count := 0
	w := cs.h.width()
	for i := range want.Ring {
		if got.Ring[i] == want.Ring[i] {
			continue
		}
		count++
		if len(shown) < limit {
			shown = append(shown, cs.describeRing(i, got.Ring, want.Ring, w))
		}
	}
	for i := range want.Pool {
		if got.Pool[i] == want.Pool[i] {
			continue
		}
		count++
		if len(shown) < limit {
			shown = append(shown, cs.describePool(i, got.Pool[i], want.Pool[i]))
		}
	}
	if count == 0 {
		return nil
	}
	return fmt.Errorf("compress %s (seed %d): %d differing bytes; first:\n  %s", cs.S.Name, cs.Seed, count, joinLines(shown))
}

func (cs *CompressCase) describeRing(i int, got, want []byte, w int) string {
	v := i / 4
	rowVals := 2 * w
	slot, rr, c := v/rowVals/cs.RingRows, v/rowVals%cs.RingRows, v%rowVals
	half := "K"
	if c >= w {
		half, c = "G", c-w
	}
	who := "a spare slot"
	for si, s := range cs.Plan.Seqs {
		switch {
		case s.To == slot && s.From == slot:
			who = fmt.Sprintf("sequence %d's slot (in place)", si)
		case s.To == slot:
			who = fmt.Sprintf("sequence %d's new slot", si)
		case s.From == slot:
			who = fmt.Sprintf("sequence %d's old slot", si)
		}
	}
	gv, wv := numerics.F32sFromBytes(got[4*v : 4*v+4])[0], numerics.F32sFromBytes(want[4*v : 4*v+4])[0]
	return fmt.Sprintf("ring byte %d (slot %d = %s, row %d, %s[%d]): got %#02x want %#02x (values %g, want %g; before the step %#02x)",
		i, slot, who, rr, half, c, got[i], want[i], gv, wv, cs.ringBytes[i])
}

func (cs *CompressCase) describePool(i int, got, want byte) string {
	P := cs.S.PageSize
	pb := cs.h.pageBytes()
	page, o := i/pb, i%pb
	var where string
	off := -1
	switch {
	case cs.h.indexer:
		off = o / 68
		if b := o % 68; b < 64 {
			where = fmt.Sprintf("offset %d, nibbles of values %d and %d", off, 2*b, 2*b+1)
		} else {
			where = fmt.Sprintf("offset %d, MXFP4 scale %d", off, b-64)
		}
	case o < 576*P:
		off = o / 576
		b := o % 576
		if b < 448 {
			where = fmt.Sprintf("offset %d, nope value %d (e4m3)", off, b)
		} else {
			where = fmt.Sprintf("offset %d, rope value %d byte %d (bf16)", off, (b-448)/2, (b-448)%2)
		}
	case o < 576*P+8*P:
		off = (o - 576*P) / 8
		if s := (o - 576*P) % 8; s < 7 {
			where = fmt.Sprintf("offset %d, UE8M0 scale %d", off, s)
		} else {
			where = fmt.Sprintf("offset %d, padding byte (never written)", off)
		}
	default:
		where = "page tail (never written)"
	}
	job := "no entry of the plan"
	for _, j := range cs.Plan.Jobs {
		if j.Page == page && j.Offset == off {
			job = fmt.Sprintf("entry %d of sequence %d", j.Index, j.Seq)
		}
	}
	return fmt.Sprintf("pool byte %d (page %d, %s; %s): got %#02x want %#02x (poison %#02x)", i, page, where, job, got, want, byte(compressPoison))
}

// cancelSums rewrites the K values that the plan's entries pool so that, in
// every channel whose logits lie in [-20, 20], the candidates' weighted
// terms are about +2^20 and -2^20 in turn (K_j = +-2^20 / w_j with the
// weights w_j of a float64 softmax): the pooled value is then the rounding
// of the float32 sums.
func cancelSums(h *compressHost) {
	w := h.width()
	coff := refOverlap(h.ratio)
	// rowAt returns position p's K and G rows (G without ape) in the
	// host buffers, where the step reads them.
	rowAt := func(s mla.CompressPlanSeq, p int) (k, g []float32) {
		base := (s.Row + p - s.Start) * 2 * w
		buf := h.kg
		if p < s.Start {
			base, buf = (s.From*h.ringRows+p%h.ringRows)*2*w, h.ring
		}
		return buf[base : base+w], buf[base+w : base+2*w]
	}
	const big = 1 << 20
	dim := h.dim()
	for _, j := range h.plan.Jobs {
		s := h.plan.Seqs[j.Seq]
		first := max(0, (j.Index-coff+1)*h.ratio)
		end := (j.Index + 1) * h.ratio
		for c := 0; c < dim; c++ {
			type cand struct {
				k     *float32
				logit float64
			}
			var cands []cand
			ok := true
			for p := first; p < end; p++ {
				col := c
				if coff == 2 && p >= j.Index*h.ratio {
					col = dim + c
				}
				k, g := rowAt(s, p)
				logit := g[col]
				if h.ape != nil {
					logit = float32(logit + h.ape[(p%h.ratio)*w+col])
				}
				ok = ok && logit >= -20 && logit <= 20
				cands = append(cands, cand{&k[col], float64(logit)})
			}
			if !ok {
				continue
			}
			m := math.Inf(-1)
			for _, cd := range cands {
				m = math.Max(m, cd.logit)
			}
			var sum float64
			for _, cd := range cands {
				sum += math.Exp(cd.logit - m)
			}
			for i, cd := range cands {
				sign := float64(1 - 2*(i%2))
				*cd.k = float32(sign * big * sum / math.Exp(cd.logit-m))
			}
		}
	}
}
