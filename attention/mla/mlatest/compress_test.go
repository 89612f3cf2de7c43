package mlatest_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// hostStepper is a second formulation of the compressor step, for checking
// the suite itself: the CPU backend's buffers, the plan decoded by
// mla.DecodeCompressPlan, each candidate gathered by position, the pooling
// and the entry bytes from package compressor (PoolChannel, FinishEntry,
// Entry.Store), which the suite's reference does not use. defect names a
// deliberate bug (empty: none) that the suite must catch.
type hostStepper struct {
	*cpu.Backend
	defect string
}

func (b hostStepper) CompressStep(ctx context.Context, a *mla.CompressStepArgs) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Entry == mla.EntryIndexer {
		// The indexer's entries: the CPU backend (package compressor) is
		// the second formulation; the defects are the main compressor's.
		return b.Backend.CompressStep(ctx, a)
	}
	planAt := a.PlanOffset
	maxSeqs := a.MaxSeqs
	if b.defect == "plan-at-0" {
		planAt = 0
	}
	if b.defect == "capacity-ignored" {
		maxSeqs = max(1, int(int32(binary.LittleEndian.Uint32(cpu.Bytes(a.Plan)[planAt+4*mla.CompressPlanHdrSeqs:]))))
	}
	plan, err := mla.DecodeCompressPlan(cpu.Bytes(a.Plan)[planAt:], maxSeqs, a.MaxJobs)
	if err != nil {
		return err
	}
	ratio, coff, w := a.Ratio, compressor.Overlap(a.Ratio), a.Width()
	rowVals := 2 * w
	kgOff, kgStride := a.KGOffset, a.KGRowStride()
	if b.defect == "kg-packed" { // KGOffset and KGStride ignored
		kgOff, kgStride = 0, rowVals
	}
	var kg, ape []float32
	if a.KGRows > 0 {
		kg = numerics.F32sFromBytes(cpu.Bytes(a.KG)[kgOff : kgOff+4*((a.KGRows-1)*kgStride+rowVals)])
	}
	if a.APE != nil && b.defect != "no-ape" {
		ape = numerics.F32sFromBytes(cpu.Bytes(a.APE)[:4*ratio*w])
	}
	ringMem := cpu.Bytes(a.Ring)
	before := numerics.F32sFromBytes(ringMem[:4*a.Slots*a.RingRows*rowVals])
	eps := a.Eps
	if b.defect == "default-eps" {
		eps = numerics.DefaultEps
	}
	cosSin := numerics.F32sFromBytes(cpu.Bytes(a.Rope)[:4*a.RopePositions*numerics.RopeDim])
	positions := a.RopePositions
	if b.defect == "rope-at-last-token" { // row p of the table is row p+r-1 (clamped)
		shifted := make([]float32, len(cosSin))
		for p := 0; p < positions; p++ {
			q := min(p+ratio-1, positions-1)
			copy(shifted[p*numerics.RopeDim:(p+1)*numerics.RopeDim], cosSin[q*numerics.RopeDim:])
		}
		cosSin = shifted
	}
	layer, err := compressor.NewLayer(compressor.Params{
		Ratio: ratio, NormWeight: numerics.F32sFromBytes(cpu.Bytes(a.NormWeight)[:4*numerics.HeadDim]), Eps: eps,
		Rope: &dsv4.RopeTable{Kind: dsv4.RopeYaRN, Mode: dsv4.RopeReference, Positions: positions, CosSin: cosSin},
	})
	if err != nil {
		return err
	}

	// rows returns position p's K and G (ape added), or ok = false when
	// they lie outside the buffers.
	rows := func(s mla.CompressPlanSeq, p int) (k, g []float32, ok bool) {
		if p < s.Start {
			slot := s.From
			if b.defect == "reads-to" {
				slot = s.To
			}
			if slot < 0 || slot >= a.Slots {
				return nil, nil, false
			}
			r := ((p % a.RingRows) + a.RingRows) % a.RingRows
			base := (slot*a.RingRows + r) * rowVals
			k, g = before[base:base+w], append([]float32(nil), before[base+w:base+rowVals]...)
			if ape != nil && b.defect == "ape-on-ring" {
				for c := range g {
					g[c] = float32(g[c] + ape[(p%ratio)*w+c])
				}
			}
			return k, g, true
		}
		r := s.Row + p - s.Start
		if r < 0 || r >= a.KGRows {
			return nil, nil, false
		}
		k, g = kg[r*kgStride:r*kgStride+w], append([]float32(nil), kg[r*kgStride+w:r*kgStride+rowVals]...)
		if ape != nil {
			for c := range g {
				g[c] = float32(g[c] + ape[(p%ratio)*w+c])
			}
		}
		return k, g, true
	}

	pool := cpu.Bytes(a.Pool)
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(a.PageSize)
jobs:
	for _, j := range plan.Jobs {
		if j.Seq < 0 || j.Seq >= len(plan.Seqs) || j.Page < 0 || j.Page >= a.NumPages || j.Offset < 0 || j.Offset >= a.PageSize || j.Index < 0 {
			continue
		}
		s := plan.Seqs[j.Seq]
		first := (j.Index - coff + 1) * ratio
		if b.defect != "entry0-reads-ring" {
			first = max(0, first)
		}
		type cand struct{ k, g []float32 }
		var cands []cand
		for p := first; p < (j.Index+1)*ratio; p++ {
			k, g, ok := rows(s, p)
			if !ok {
				continue jobs
			}
			if coff == 2 { // the previous window's "A" half, the current's "B" half
				h := 0
				if p >= j.Index*ratio {
					h = numerics.HeadDim
				}
				k, g = k[h:h+numerics.HeadDim], g[h:h+numerics.HeadDim]
			}
			cands = append(cands, cand{k, g})
		}
		var pooled [compressor.Dim]float32
		logits, values := make([]float32, len(cands)), make([]float32, len(cands))
		for c := range pooled {
			for i, cd := range cands {
				logits[i], values[i] = cd.g[c], cd.k[c]
			}
			if orderDefects[b.defect] {
				pooled[c] = poolVariant(logits, values, b.defect)
				continue
			}
			pooled[c] = compressor.PoolChannel(logits, values)
		}
		e, err := layer.FinishEntry(j.Index, &pooled)
		if err != nil {
			return err
		}
		page := pool[j.Page*pageBytes : (j.Page+1)*pageBytes]
		e.Store(page, a.PageSize, j.Offset)
		if b.defect == "pad-byte" {
			page[kvcache.FormatFP8UE8M0.ScaleOffset(a.PageSize, j.Offset)+7] = 0
		}
	}

	// The ring's writes, every read from its state before the step.
	for _, s := range plan.Seqs {
		if b.defect == "no-ring-writes" {
			break
		}
		end := s.Start + s.Rows
		lo := max(s.Start, end-a.RingRows)
		if s.To != s.From && b.defect != "new-rows-only" {
			lo = max(0, end-a.RingRows)
		}
		if s.To < 0 || s.To >= a.Slots {
			continue
		}
		for p := lo; p < end; p++ {
			k, g, ok := rows(s, p)
			if !ok {
				continue
			}
			base := 4 * (s.To*a.RingRows + p%a.RingRows) * rowVals
			copy(ringMem[base:], numerics.F32Bytes(k))
			copy(ringMem[base+4*w:], numerics.F32Bytes(g))
		}
	}
	return nil
}

// orderDefects change the float32 pooling's order or rounding.
var orderDefects = map[string]bool{"descending-e": true, "descending-s": true, "fma": true}

// poolVariant is section 8's pooling of one channel with one defect.
func poolVariant(logits, values []float32, defect string) float32 {
	m := float32(math.Inf(-1))
	for _, g := range logits {
		if g > m {
			m = g
		}
	}
	n := len(logits)
	e := make([]float32, n)
	var s float32
	for j, g := range logits {
		e[j] = numerics.Exp32(float32(g - m))
	}
	for j := range e {
		if defect == "descending-s" {
			j = n - 1 - j
		}
		s = float32(s + e[j])
	}
	var acc float32
	for j := range e {
		if defect == "descending-e" {
			j = n - 1 - j
		}
		q := float32(e[j] / s)
		if defect == "fma" {
			acc = float32(math.FMA(float64(q), float64(values[j]), float64(acc)))
		} else {
			acc = float32(acc + float32(q*values[j]))
		}
	}
	return acc
}

var _ mla.CompressStepper = hostStepper{}

// TestCompressStepHost runs the suite on the second formulation: the
// reference and package compressor's entry math agree on every scenario.
func TestCompressStepHost(t *testing.T) {
	skipUnderRace(t)
	mlatest.TestCompressStep(t, hostStepper{Backend: cpu.New(0)})
}

// TestCompressStepSkipsWithoutStepper: a backend without the interface is
// skipped, not failed.
func TestCompressStepSkipsWithoutStepper(t *testing.T) {
	type plain struct{ mla.Backend }
	skipped := false
	t.Run("inner", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		mlatest.TestCompressStep(t, plain{cpu.New(0)})
	})
	require.True(t, skipped)
}

// TestCompressStepCatchesDefects: every deliberate bug fails some scenario
// of the suite.
func TestCompressStepCatchesDefects(t *testing.T) {
	skipUnderRace(t)
	defects := []string{
		"no-ape", "ape-on-ring", "entry0-reads-ring", "new-rows-only", "reads-to", "rope-at-last-token",
		"pad-byte", "default-eps", "descending-e", "descending-s", "fma", "plan-at-0", "capacity-ignored", "kg-packed",
	}
	for _, d := range defects {
		t.Run(d, func(t *testing.T) {
			bad := hostStepper{Backend: cpu.New(0), defect: d}
			for _, s := range mlatest.CompressScenarios() {
				seed := rand.Uint64()
				if err := mlatest.CheckCompressStep(bad, s, seed); err != nil {
					t.Logf("%s fails %s (seed %d): %v", d, s.Name, seed, firstLine(err))
					return
				}
			}
			t.Fatalf("no scenario catches defect %s", d)
		})
	}
}

// TestCompressChunkingsCatchDefects: the step series fail a backend that
// keeps the wrong rows in the ring, even though only the pool is compared.
func TestCompressChunkingsCatchDefects(t *testing.T) {
	skipUnderRace(t)
	for _, d := range []string{"no-ring-writes", "new-rows-only", "reads-to", "entry0-reads-ring", "no-ape"} {
		t.Run(d, func(t *testing.T) {
			bad := hostStepper{Backend: cpu.New(0), defect: d}
			for _, c := range mlatest.CompressChunkings() {
				seed := rand.Uint64()
				if err := mlatest.CheckCompressChunking(bad, c, seed); err != nil {
					t.Logf("%s fails %s (seed %d): %v", d, c.Name, seed, firstLine(err))
					return
				}
			}
			t.Fatalf("no step series catches defect %s", d)
		})
	}
}

// TestCompressCancelCatchesOrder: the cancelling scenarios fail, on every
// seed, a backend that sums in another order or fuses a multiply-add.
func TestCompressCancelCatchesOrder(t *testing.T) {
	skipUnderRace(t)
	for _, s := range mlatest.CompressScenarios() {
		if !s.Cancel || s.Indexer { // hostStepper's defects are the main compressor's
			continue
		}
		for d := range orderDefects {
			for range 3 {
				seed := rand.Uint64()
				err := mlatest.CheckCompressStep(hostStepper{Backend: cpu.New(0), defect: d}, s, seed)
				require.Error(t, err, "%s seed %d: defect %s passed", s.Name, seed, d)
				require.Contains(t, err.Error(), "differing bytes")
				t.Logf("%s %s: %s", s.Name, d, firstLine(err))
			}
		}
	}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// TestCompressCompareReportsOneByte: a single flipped byte of the ring or
// the pool is reported with where it lies.
func TestCompressCompareReportsOneByte(t *testing.T) {
	seed := mlatest.Seed(t)
	var s mlatest.CompressScenario
	for _, c := range mlatest.CompressScenarios() {
		if c.Name == "r4/page-edge" {
			s = c
		}
	}
	require.NotEmpty(t, s.Name)
	cs, err := mlatest.NewCompressCase(s, seed)
	require.NoError(t, err)
	want := cs.Expected()
	require.NoError(t, cs.Compare(want, want))
	r := rand.New(rand.NewPCG(seed, 1))
	for _, which := range []string{"ring", "pool"} {
		got := &mlatest.CompressOutputs{Ring: append([]byte(nil), want.Ring...), Pool: append([]byte(nil), want.Pool...)}
		buf := got.Ring
		if which == "pool" {
			buf = got.Pool
		}
		i := r.IntN(len(buf))
		buf[i] ^= 1 << r.IntN(8)
		err := cs.Compare(got, want)
		require.Error(t, err)
		require.Contains(t, err.Error(), "1 differing bytes")
		require.Contains(t, err.Error(), fmt.Sprintf("%s byte %d (", which, i))
		t.Log(firstLine(err), strings.SplitN(err.Error(), "\n", 2)[1])
	}
}

// TestCompressScenariosCover: the table holds what the suite promises.
func TestCompressScenariosCover(t *testing.T) {
	type key struct {
		ratio int
		what  string
	}
	seen := map[key]bool{}
	for _, s := range mlatest.CompressScenarios() {
		cs, err := mlatest.NewCompressCase(s, 1)
		require.NoError(t, err, s.Name)
		inPlace := mla.InPlaceRows(s.Ratio, cs.RingRows)
		mark := func(what string) { seen[key{s.Ratio, what}] = true }
		if s.APE {
			mark("ape")
		} else {
			mark("no-ape")
		}
		if s.NaNLogits {
			mark("nan")
		}
		if len(cs.Plan.Jobs) == cs.MaxJobs && len(cs.Plan.Seqs) == cs.MaxSeqs && len(cs.Plan.Jobs) > 0 {
			mark("full-plan")
		}
		for _, q := range cs.Plan.Seqs {
			require.True(t, q.From == q.To || q.Rows > 0, s.Name)
			if q.From == q.To {
				require.LessOrEqual(t, q.Rows, inPlace, "%s: in place beyond InPlaceRows", s.Name)
			}
			switch {
			case q.Start == 0:
				mark(fmt.Sprintf("prompt%d", q.Rows))
			case q.From == q.To:
				mark(fmt.Sprintf("in-place-start-mod-%d", q.Start%s.Ratio))
			case q.Start+q.Rows-cs.RingRows < q.Start:
				mark("moved-copies-old-rows")
			default:
				mark("moved-longer-than-ring")
			}
		}
		for _, j := range cs.Plan.Jobs {
			if j.Offset == s.PageSize-1 && s.PageSize == 64 {
				mark("page-end")
			}
			if j.Offset == 0 && j.Index > 0 && s.PageSize == 64 {
				mark("page-start")
			}
		}
	}
	for _, ratio := range []int{4, 128} {
		for _, n := range []int{1, 3, 4, 5, 7, 8, 127, 128, 129, 255, 256, 257} {
			require.True(t, seen[key{ratio, fmt.Sprintf("prompt%d", n)}], "ratio %d prompt %d", ratio, n)
		}
		for _, w := range []string{"ape", "no-ape", "nan", "moved-copies-old-rows", "moved-longer-than-ring", "page-end", "page-start", "in-place-start-mod-1", fmt.Sprintf("in-place-start-mod-%d", ratio-1)} {
			require.True(t, seen[key{ratio, w}], "ratio %d: %s", ratio, w)
		}
	}
	require.True(t, seen[key{4, "full-plan"}])
	require.True(t, seen[key{4, "in-place-start-mod-2"}])
}
