package mlatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/numerics"
)

// TopKKeys says how a scenario draws the indexer cache's entries.
type TopKKeys int

const (
	// KeysRandom: random nibbles, scale bytes in [124, 130].
	KeysRandom TopKKeys = iota
	// KeysTies: every entry one of six distinct random entries: exact ties
	// at the threshold.
	KeysTies
	// KeysEqual: every entry the same bytes: all scores equal.
	KeysEqual
	// KeysExtreme: scale bytes anywhere in [0, 255] in queries and keys
	// (subnormal and overflowing block partials, Inf and NaN scores).
	KeysExtreme
	// KeysNarrow: as KeysRandom, but the four scale bytes of a row (query
	// head or key) within 2 of a base drawn per row in [122, 127], as the
	// blocks of a Hadamard-rotated vector have them, except one key in 512
	// drawn as KeysRandom draws them.
	KeysNarrow
)

// TopKWeights says how a scenario draws the head weights.
type TopKWeights int

const (
	// WeightsNormal: bf16 of N(0, 1), signs mixed.
	WeightsNormal TopKWeights = iota
	// WeightsNaN: as WeightsNormal, and every other row has one NaN head
	// weight: its every score is NaN, so it selects entries 0..TopK-1.
	WeightsNaN
	// WeightsInf: as WeightsNormal, and every other row has a head weight
	// of ±Inf: its scores mix ±Inf (dot > 0) and NaN (Inf * 0).
	WeightsInf
)

// TopKSeqSpec is one sequence of a scenario: Rows query tokens at
// positions [Start, Start+Rows).
type TopKSeqSpec struct{ Start, Rows int }

// TopKScenario is one selection's shape and inputs.
type TopKScenario struct {
	Name     string
	TopK     int
	PageSize int
	Seqs     []TopKSeqSpec
	PadRows  int // rows past the sequences' (padding, written -1)
	Keys     TopKKeys
	Weights  TopKWeights
	// Planted: each sequence's last row has TopK planted entries among the
	// ones it sees (when it sees more than TopK), entry Visible-1 always
	// among them: each a copy of one of the row's query head rows, with
	// positive head weights and the other entries' scales at least 2^10
	// times smaller, so the planted entries are exactly the row's selection.
	Planted bool
}

// TopKScenarios are the conformance suite's selections: both models'
// index_topk (512, 1024), decode with and without MTP, chunked prefill
// from a cached offset, mixed batches with padding, page sizes whose
// edges the contexts cross, fewer visible entries than index_topk, exact
// ties, equal scores, NaN and Inf head weights, extreme scales and the
// narrow ones of rotated vectors.
func TopKScenarios() []TopKScenario {
	return []TopKScenario{
		{Name: "decode/flash/planted", TopK: 512, PageSize: 64, Planted: true,
			Seqs: []TopKSeqSpec{{2500, 1}, {3001, 1}, {700, 1}, {2051, 1}}},
		{Name: "boundary/flash/planted", TopK: 512, PageSize: 64, Planted: true,
			Seqs: []TopKSeqSpec{{4*600 + 2, 2}, {4*513 + 2, 2}, {4*512 + 2, 2}}},
		{Name: "decode-mtp/pro", TopK: 1024, PageSize: 64,
			Seqs: []TopKSeqSpec{{4603, 4}, {1000, 2}, {4098, 4}}},
		{Name: "prefill-chunk/flash", TopK: 512, PageSize: 64, PadRows: 3,
			Seqs: []TopKSeqSpec{{2040, 12}, {0, 40}}},
		{Name: "mixed/pro", TopK: 1024, PageSize: 64, PadRows: 2,
			Seqs: []TopKSeqSpec{{4094, 7}, {0, 8}, {4500, 2}}},
		{Name: "pages16/flash", TopK: 512, PageSize: 16, PadRows: 1,
			Seqs: []TopKSeqSpec{{2300, 2}, {2801, 3}, {2047, 3}}},
		{Name: "ties/flash", TopK: 512, PageSize: 64, Keys: KeysTies,
			Seqs: []TopKSeqSpec{{3000, 2}, {2600, 1}}},
		{Name: "equal/pro", TopK: 1024, PageSize: 64, Keys: KeysEqual,
			Seqs: []TopKSeqSpec{{4500, 1}, {5000, 2}}},
		{Name: "nan-weight/flash", TopK: 512, PageSize: 64, Weights: WeightsNaN,
			Seqs: []TopKSeqSpec{{2500, 3}, {3000, 1}}},
		{Name: "inf-weight/flash", TopK: 512, PageSize: 64, Weights: WeightsInf,
			Seqs: []TopKSeqSpec{{2500, 3}, {3000, 1}}},
		{Name: "extreme-scales/flash", TopK: 512, PageSize: 32, Keys: KeysExtreme,
			Seqs: []TopKSeqSpec{{2600, 2}, {2100, 2}}},
		{Name: "few-visible/pro", TopK: 1024, PageSize: 64, PadRows: 2,
			Seqs: []TopKSeqSpec{{0, 5}, {1, 3}, {2, 2}, {4000, 4}, {4092, 4}}},
		{Name: "narrow-scales/flash", TopK: 512, PageSize: 64, Keys: KeysNarrow, PadRows: 1,
			Seqs: []TopKSeqSpec{{4603, 4}, {3001, 4}, {2300, 2}}},
	}
}

// TopKCase is a scenario with concrete inputs on the host.
type TopKCase struct {
	S     TopKScenario
	Seed  uint64
	Shape mla.TopKShape
	Plan  *mla.TopKPlan
	Q     []byte // [Rows][64][68]
	W     []byte // [Rows][64] bf16
	Cache []byte
	// Planted lists, per row, the entries planted for it (ascending), nil
	// where none are.
	Planted [][]int32
	// RowKeysHint picks Run's TopKArgs.MaxRowKeys: 0 the plan's own bound
	// (TopKPlan.MaxRowKeys, as the engine's eager iterations pass it),
	// negative none (a graph's launch), positive that value (one below
	// the plan's rows: they must still select exactly).
	RowKeysHint int
}

// randomMXFP4Row fills a 68-byte row: random nibbles, scale bytes drawn
// by scale.
func randomMXFP4Row(r *rand.Rand, row []byte, scale func() uint8) {
	for i := range 64 {
		row[i] = byte(r.Uint32())
	}
	for b := range 4 {
		row[64+b] = scale()
	}
}

// NewTopKCase draws a scenario's inputs: pages handed out in a shuffled
// order, extra pages and every entry past a sequence's last visible one
// filled with copies of query rows at large scales (which a visibility or
// paging bug would select).
func NewTopKCase(s TopKScenario, seed uint64) (*TopKCase, error) {
	r := rand.New(rand.NewPCG(seed, 0x709C))
	rows := s.PadRows
	pages := 0
	for _, q := range s.Seqs {
		rows += q.Rows
		pages += (refVisible(q.Start+q.Rows-1) + s.PageSize - 1) / s.PageSize
	}
	c := &TopKCase{S: s, Seed: seed, Plan: &mla.TopKPlan{}}
	c.Shape = mla.TopKShape{TopK: s.TopK, Rows: rows, MaxSeqs: len(s.Seqs) + 1, PageSize: s.PageSize, NumPages: pages + 3}
	for _, q := range s.Seqs {
		c.Shape.PageStride = max(c.Shape.PageStride, (refVisible(q.Start+q.Rows-1)+s.PageSize-1)/s.PageSize+1)
	}
	c.Q = make([]byte, rows*mla.IndexerHeads*mla.IndexerEntryBytes)
	c.W = make([]byte, rows*mla.IndexerHeads*2)
	c.Cache = make([]byte, c.Shape.NumPages*c.Shape.PageBytes())
	c.Planted = make([][]int32, rows)
	normal := func() uint8 { return uint8(124 + r.IntN(7)) }
	extreme := func() uint8 {
		switch u := r.IntN(8); u {
		case 0:
			return uint8(r.IntN(8)) // 2^-127..2^-120: subnormal partials, zeros
		case 1:
			return uint8(248 + r.IntN(8)) // 2^121..2^128: Inf partials
		}
		return uint8(r.IntN(256))
	}
	// narrow draws a row's four scale bytes in turn (randomMXFP4Row's
	// calls) around a base drawn for the row.
	narrowBase, narrowLeft := 0, 0
	narrow := func() uint8 {
		if narrowLeft == 0 {
			narrowBase, narrowLeft = 122+r.IntN(6), 4
		}
		narrowLeft--
		return uint8(narrowBase + r.IntN(3))
	}
	qScale := normal
	switch s.Keys {
	case KeysExtreme:
		qScale = extreme
	case KeysNarrow:
		qScale = narrow
	}
	for i := 0; i < len(c.Q); i += mla.IndexerEntryBytes {
		randomMXFP4Row(r, c.Q[i:i+mla.IndexerEntryBytes], qScale)
	}
	for t := range rows {
		for h := range mla.IndexerHeads {
			w := float32(r.NormFloat64())
			binary.LittleEndian.PutUint16(c.W[2*(t*mla.IndexerHeads+h):], numerics.BF16FromF32(w))
		}
		if t%2 == 1 && (s.Weights == WeightsNaN || s.Weights == WeightsInf) {
			h := r.IntN(mla.IndexerHeads)
			v := uint16(0x7FC0) // NaN
			if s.Weights == WeightsInf {
				v = 0x7F80 | uint16(r.IntN(2))<<15
			}
			binary.LittleEndian.PutUint16(c.W[2*(t*mla.IndexerHeads+h):], v)
		}
	}
	// Every byte of the cache starts as a lure: a query row at a large
	// scale. The sequences' visible entries are then drawn over it.
	for e := 0; e < len(c.Cache); e += mla.IndexerEntryBytes {
		src := r.IntN(rows*mla.IndexerHeads) * mla.IndexerEntryBytes
		copy(c.Cache[e:e+mla.IndexerEntryBytes], c.Q[src:src+mla.IndexerEntryBytes])
		for b := range 4 {
			c.Cache[e+64+b] = 140
		}
	}
	perm := r.Perm(c.Shape.NumPages)
	var pool [6][mla.IndexerEntryBytes]byte
	for i := range pool {
		randomMXFP4Row(r, pool[i][:], normal)
	}
	next, row := 0, 0
	for _, q := range s.Seqs {
		n := refVisible(q.Start + q.Rows - 1)
		np := (n + s.PageSize - 1) / s.PageSize
		table := make([]int32, np)
		for j := range table {
			table[j] = int32(perm[next])
			next++
		}
		c.Plan.Seqs = append(c.Plan.Seqs, mla.TopKPlanSeq{Row: row, Rows: q.Rows, Start: q.Start, Table: table})
		entry := func(e int) []byte {
			o := int(table[e/s.PageSize])*c.Shape.PageBytes() + e%s.PageSize*mla.IndexerEntryBytes
			return c.Cache[o : o+mla.IndexerEntryBytes]
		}
		keyScale := normal
		if s.Planted {
			keyScale = func() uint8 { return uint8(112 + r.IntN(3)) }
		}
		for e := range n {
			switch s.Keys {
			case KeysRandom:
				randomMXFP4Row(r, entry(e), keyScale)
			case KeysExtreme:
				randomMXFP4Row(r, entry(e), extreme)
			case KeysNarrow:
				if r.IntN(512) == 0 {
					randomMXFP4Row(r, entry(e), normal)
				} else {
					randomMXFP4Row(r, entry(e), narrow)
				}
			case KeysTies:
				copy(entry(e), pool[r.IntN(len(pool))][:])
			case KeysEqual:
				copy(entry(e), pool[0][:])
			}
		}
		last := row + q.Rows - 1
		if s.Planted && q.Rows > 0 && n > s.TopK {
			chosen := append(r.Perm(n - 1)[:s.TopK-1], n-1)
			slices.Sort(chosen)
			for _, e := range chosen {
				h := r.IntN(mla.IndexerHeads)
				src := (last*mla.IndexerHeads + h) * mla.IndexerEntryBytes
				copy(entry(e), c.Q[src:src+mla.IndexerEntryBytes])
				c.Planted[last] = append(c.Planted[last], int32(e))
			}
			for h := range mla.IndexerHeads {
				w := float32(0.5 + r.Float64())
				binary.LittleEndian.PutUint16(c.W[2*(last*mla.IndexerHeads+h):], numerics.BF16FromF32(w))
			}
		}
		row += q.Rows
	}
	c.Shape.ScratchEntries = int(c.Plan.ScratchEntries(s.TopK)) + r.IntN(5)
	if _, err := c.Plan.Encode(&c.Shape); err != nil {
		return nil, fmt.Errorf("top-k scenario %s: %w", s.Name, err)
	}
	return c, nil
}

// topkPoison fills Out before a run.
const topkPoison = 0x5A

// Run runs the case on b (a mla.TopKSelector), the plan at a 16-byte
// offset after poison, and returns Out's int32 values.
func (c *TopKCase) Run(b mla.Backend) ([]int32, error) {
	sel, ok := b.(mla.TopKSelector)
	if !ok {
		return nil, fmt.Errorf("backend %s does not implement mla.TopKSelector", b.Name())
	}
	plan, err := c.Plan.Encode(&c.Shape)
	if err != nil {
		return nil, err
	}
	const planOffset = 32
	planBuf := append(slices.Repeat([]byte{0xEE}, planOffset), plan...)
	dev := &deviceBuffers{b: b}
	defer dev.free()
	a := &mla.TopKArgs{TopKShape: c.Shape, PlanOffset: planOffset, MaxRowKeys: c.Plan.MaxRowKeys(c.Shape.TopK)}
	switch {
	case c.RowKeysHint < 0:
		a.MaxRowKeys = 0
	case c.RowKeysHint > 0:
		a.MaxRowKeys = c.RowKeysHint
	}
	outBytes := 4 * c.Shape.Rows * c.Shape.TopK
	scratch := make([]byte, 4*c.Shape.ScratchEntries)
	for i := range scratch {
		scratch[i] = byte(i * 131)
	}
	for _, u := range []struct {
		dst  *mla.Buffer
		data []byte
	}{
		{&a.Q, c.Q}, {&a.W, c.W}, {&a.Cache, c.Cache}, {&a.Plan, planBuf}, {&a.Scratch, scratch},
		{&a.Out, slices.Repeat([]byte{topkPoison}, outBytes)},
	} {
		if *u.dst, err = dev.upload(u.data); err != nil {
			return nil, err
		}
	}
	ctx := context.Background()
	if err := sel.IndexerTopK(ctx, a); err != nil {
		return nil, err
	}
	if err := b.Synchronize(ctx); err != nil {
		return nil, err
	}
	raw := make([]byte, outBytes)
	if err := b.Read(raw, a.Out, 0); err != nil {
		return nil, err
	}
	out := make([]int32, len(raw)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out, nil
}

// refVisible is the entries the token at position p sees: floor((p+1)/4).
func refVisible(p int) int { return (p + 1) / 4 }

// topkDequant dequantizes a 68-byte row into float64 (exact: an e2m1 value
// times 2^(e-127), for every scale byte).
func topkDequant(row []byte) (v [128]float64) {
	for i := range v {
		nib := row[i/2] >> (4 * (i % 2)) & 0xF
		v[i] = float64(numerics.E2M1Value(nib)) * math.Ldexp(1, int(row[64+i/32])-127)
	}
	return v
}

// RefTopKScore is DESIGN.md section 9's score of one entry for one row,
// written from the contract: per head, each 32-value block's dot product
// of the dequantized values (exact in float64) rounded once to float32,
// the four added in order, relu (a dot that is not > 0 counts +0), times
// the head weight, added from +0 in ascending h, each step in float32.
func RefTopKScore(q [][128]float64, w []float32, k *[128]float64) float32 {
	var score float32
	for h := range q {
		var dot float32
		for b := range 4 {
			var d float64
			for i := b * 32; i < (b+1)*32; i++ {
				d += q[h][i] * k[i]
			}
			if b == 0 {
				dot = float32(d)
			} else {
				dot += float32(d)
			}
		}
		if !(dot > 0) {
			dot = 0
		}
		score += float32(w[h] * dot)
	}
	return score
}

// Expected is the reference selection, [Rows][TopK]: for each row its
// visible entries' scores (RefTopKScore), ordered by mla.TopKKey
// descending then index ascending by a full sort, the first
// min(TopK, visible) taken and sorted ascending, then -1.
func (c *TopKCase) Expected() []int32 {
	k := c.Shape.TopK
	out := slices.Repeat([]int32{-1}, c.Shape.Rows*k)
	for _, q := range c.Plan.Seqs {
		n := refVisible(q.Start + q.Rows - 1)
		var keys [][128]float64
		if n > k {
			keys = make([][128]float64, n)
			for e := range n {
				o := int(q.Table[e/c.Shape.PageSize])*c.Shape.PageBytes() + e%c.Shape.PageSize*mla.IndexerEntryBytes
				keys[e] = topkDequant(c.Cache[o : o+mla.IndexerEntryBytes])
			}
		}
		for i := range q.Rows {
			t := q.Row + i
			vis := refVisible(q.Start + i)
			dst := out[t*k : (t+1)*k]
			if vis <= k {
				for e := range vis {
					dst[e] = int32(e)
				}
				continue
			}
			qv := make([][128]float64, mla.IndexerHeads)
			w := make([]float32, mla.IndexerHeads)
			for h := range qv {
				o := (t*mla.IndexerHeads + h) * mla.IndexerEntryBytes
				qv[h] = topkDequant(c.Q[o : o+mla.IndexerEntryBytes])
				w[h] = numerics.F32FromBF16(binary.LittleEndian.Uint16(c.W[2*(t*mla.IndexerHeads+h):]))
			}
			type scored struct {
				key uint32
				idx int32
			}
			all := make([]scored, vis)
			for e := range vis {
				all[e] = scored{mla.TopKKey(RefTopKScore(qv, w, &keys[e])), int32(e)}
			}
			slices.SortFunc(all, func(a, b scored) int {
				if a.key != b.key {
					if a.key > b.key {
						return -1
					}
					return 1
				}
				return int(a.idx - b.idx)
			})
			for j := range k {
				dst[j] = all[j].idx
			}
			slices.Sort(dst)
		}
	}
	return out
}

// Compare reports the rows of got that differ from want, the first few
// with where they lie.
func (c *TopKCase) Compare(got, want []int32) error {
	k := c.Shape.TopK
	if len(got) != len(want) {
		return fmt.Errorf("top-k %s: %d indices, want %d", c.S.Name, len(got), len(want))
	}
	var msgs []string
	bad := 0
	for t := range c.Shape.Rows {
		g, w := got[t*k:(t+1)*k], want[t*k:(t+1)*k]
		if slices.Equal(g, w) {
			continue
		}
		bad++
		if len(msgs) < 4 {
			j := 0
			for g[j] == w[j] {
				j++
			}
			msgs = append(msgs, fmt.Sprintf("row %d (%s): first difference at %d: got %d, want %d (got %v..., want %v...)",
				t, c.rowInfo(t), j, g[j], w[j], g[j:min(k, j+6)], w[j:min(k, j+6)]))
		}
	}
	if bad == 0 {
		return nil
	}
	return fmt.Errorf("top-k %s (seed %d): %d of %d rows differ; first:\n  %s", c.S.Name, c.Seed, bad, c.Shape.Rows, joinLines(msgs))
}

// rowInfo names row t's sequence, position and visible entries.
func (c *TopKCase) rowInfo(t int) string {
	for i, q := range c.Plan.Seqs {
		if t >= q.Row && t < q.Row+q.Rows {
			p := q.Start + t - q.Row
			return fmt.Sprintf("sequence %d, position %d, %d visible", i, p, refVisible(p))
		}
	}
	return "padding"
}

// CheckPlanted checks the scenario's own expectations on a backend's
// output, independent of the reference: a planted row selects exactly its
// planted entries; no row selects an entry it cannot see or repeats one;
// a row seeing at most TopK entries selects them all; a row with a NaN
// head weight selects 0..TopK-1.
func (c *TopKCase) CheckPlanted(got []int32) error {
	k := c.Shape.TopK
	for t := range c.Shape.Rows {
		g := got[t*k : (t+1)*k]
		vis := 0
		for _, q := range c.Plan.Seqs {
			if t >= q.Row && t < q.Row+q.Rows {
				vis = refVisible(q.Start + t - q.Row)
			}
		}
		sel := min(k, vis)
		for j, e := range g {
			switch {
			case j >= sel && e != -1:
				return fmt.Errorf("row %d (%s): slot %d = %d, want -1 past the %d selected", t, c.rowInfo(t), j, e, sel)
			case j < sel && (e < 0 || int(e) >= vis):
				return fmt.Errorf("row %d (%s): slot %d = %d, outside the %d visible entries", t, c.rowInfo(t), j, e, vis)
			case j < sel && j > 0 && e <= g[j-1]:
				return fmt.Errorf("row %d (%s): slot %d = %d after %d: not ascending", t, c.rowInfo(t), j, e, g[j-1])
			}
		}
		if vis <= k {
			for j := range sel {
				if g[j] != int32(j) {
					return fmt.Errorf("row %d (%s): %d visible entries, at most TopK = %d, slot %d = %d: want every entry", t, c.rowInfo(t), vis, k, j, g[j])
				}
			}
			continue
		}
		if p := c.Planted[t]; p != nil && !slices.Equal(g, p) {
			return fmt.Errorf("row %d (%s): selected %v..., planted %v...", t, c.rowInfo(t), g[:min(8, k)], p[:min(8, k)])
		}
		if c.S.Weights == WeightsNaN && t%2 == 1 {
			for j := range k {
				if g[j] != int32(j) {
					return fmt.Errorf("row %d (%s) has a NaN head weight: slot %d = %d, want entries 0..%d (NaN scores tie, the lower index first)", t, c.rowInfo(t), j, g[j], k-1)
				}
			}
		}
	}
	return nil
}

// CheckTopK runs one scenario on b and compares every index with the
// reference, then checks the scenario's own expectations.
func CheckTopK(b mla.Backend, s TopKScenario, seed uint64) error {
	return checkTopKHint(b, s, seed, 0)
}

// checkTopKHint is CheckTopK with the case's RowKeysHint.
func checkTopKHint(b mla.Backend, s TopKScenario, seed uint64, hint int) error {
	c, err := NewTopKCase(s, seed)
	if err != nil {
		return err
	}
	c.RowKeysHint = hint
	got, err := c.Run(b)
	if err != nil {
		return err
	}
	if err := c.Compare(got, c.Expected()); err != nil {
		return err
	}
	return c.CheckPlanted(got)
}

// TestTopK runs every top-k scenario on b, which must implement
// mla.TopKSelector (the test skips otherwise).
func TestTopK(t *testing.T, b mla.Backend) {
	if _, ok := b.(mla.TopKSelector); !ok {
		t.Skipf("backend %s does not implement mla.TopKSelector", b.Name())
	}
	for i, s := range TopKScenarios() {
		t.Run(s.Name, func(t *testing.T) {
			seed := Seed(t)
			if err := CheckTopK(b, s, seed); err != nil {
				t.Fatal(err)
			}
		})
		if i%4 != 0 {
			continue
		}
		// Every fourth scenario also without the size hint (a graph's
		// launch) and with one too small for its rows.
		for _, h := range []struct {
			name string
			hint int
		}{{"no-hint", -1}, {"short-hint", s.TopK + 4}} {
			t.Run(s.Name+"/"+h.name, func(t *testing.T) {
				seed := Seed(t)
				if err := checkTopKHint(b, s, seed, h.hint); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
