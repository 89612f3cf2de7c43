package cpu_test

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/numerics"
)

func TestTopKConformance(t *testing.T) { mlatest.TestTopK(t, cpu.New(0)) }

// TestTopKOneWorker: the scenarios whose sequences have several rows
// (several tasks) with one worker: the tasks' split must not change a
// byte.
func TestTopKOneWorker(t *testing.T) {
	if testing.Short() || race.Enabled {
		t.Skip("-short or -race: the conformance run covers the selection (one worker starts no goroutine to race)")
	}
	b := cpu.New(1)
	for _, s := range mlatest.TopKScenarios() {
		if s.Name != "prefill-chunk/flash" && s.Name != "decode-mtp/pro" {
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			require.NoError(t, mlatest.CheckTopK(b, s, seed))
		})
	}
}

// bruteForce scores every visible entry of row t in float64 straight
// from the dequantized values (sum over heads of w * max(0, q . k)) and
// returns the TopK best by a full sort, ascending, and whether the
// boundary between the last one kept and the first one dropped is clear
// of float32 rounding: a gap of 1e-5 of the largest sum of the terms'
// magnitudes (the float32 sum's error is below 70 * 2^-24 of it).
func bruteForce(c *mlatest.TopKCase, q mla.TopKPlanSeq, t int) ([]int32, bool) {
	k, ps := c.Shape.TopK, c.Shape.PageSize
	vis := mla.TopKVisible(q.Start + t - q.Row)
	deq := func(row []byte) []float64 {
		out := make([]float64, 128)
		for i := range out {
			nib := row[i/2] >> (4 * uint(i&1)) & 0xF
			out[i] = float64(numerics.E2M1Value(nib)) * math.Pow(2, float64(int(row[64+i/32])-127))
		}
		return out
	}
	type sc struct {
		s float64
		i int32
	}
	all := make([]sc, vis)
	var qs [][]float64
	var ws []float64
	for h := range mla.IndexerHeads {
		o := (t*mla.IndexerHeads + h) * mla.IndexerEntryBytes
		qs = append(qs, deq(c.Q[o:o+mla.IndexerEntryBytes]))
		ws = append(ws, float64(numerics.F32FromBF16(binary.LittleEndian.Uint16(c.W[2*(t*mla.IndexerHeads+h):]))))
	}
	big := 0.0
	for e := range vis {
		o := int(q.Table[e/ps])*c.Shape.PageBytes() + e%ps*mla.IndexerEntryBytes
		kv := deq(c.Cache[o : o+mla.IndexerEntryBytes])
		s, abs := 0.0, 0.0
		for h := range qs {
			d, da := 0.0, 0.0
			for i := range kv {
				d += qs[h][i] * kv[i]
				da += math.Abs(qs[h][i] * kv[i])
			}
			s += ws[h] * math.Max(0, d)
			abs += math.Abs(ws[h]) * da
		}
		all[e] = sc{s, int32(e)}
		big = math.Max(big, abs)
	}
	sort.SliceStable(all, func(a, b int) bool { return all[a].s > all[b].s })
	clear := vis <= k || all[k-1].s-all[k].s > 1e-5*big
	out := make([]int32, 0, k)
	for j := range min(k, vis) {
		out = append(out, all[j].i)
	}
	slices.Sort(out)
	for len(out) < k {
		out = append(out, -1)
	}
	return out, clear
}

// TestTopKBruteForce: on random selections (no ties by construction),
// the backend's indices equal an independent float64 scoring with a full
// sort wherever that scoring's boundary is clear of rounding.
func TestTopKBruteForce(t *testing.T) {
	if race.Enabled {
		t.Skip("-race: arithmetic, run at full size in the non-race run")
	}
	b := cpu.New(0)
	for _, s := range []mlatest.TopKScenario{
		{Name: "decode", TopK: 512, PageSize: 64, Seqs: []mlatest.TopKSeqSpec{{Start: 2300, Rows: 2}, {Start: 2900, Rows: 2}}},
		{Name: "chunk", TopK: 1024, PageSize: 16, Seqs: []mlatest.TopKSeqSpec{{Start: 4200, Rows: 3}}},
	} {
		t.Run(s.Name, func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			c, err := mlatest.NewTopKCase(s, seed)
			require.NoError(t, err)
			got, err := c.Run(b)
			require.NoError(t, err)
			compared, rows := 0, 0
			for _, q := range c.Plan.Seqs {
				for t0 := q.Row; t0 < q.Row+q.Rows; t0++ {
					rows++
					want, clear := bruteForce(c, q, t0)
					if !clear {
						continue
					}
					compared++
					require.Equal(t, want, got[t0*s.TopK:(t0+1)*s.TopK], "row %d", t0)
				}
			}
			t.Logf("%d of %d rows compared", compared, rows)
			require.GreaterOrEqual(t, 2*compared, rows, "too few rows clear of rounding to compare")
		})
	}
}

// TestTopKRefusals: a plan the shape cannot hold is refused before
// anything runs, with the sentinel errors for the scratch space and the
// context limit.
func TestTopKRefusals(t *testing.T) {
	shape := mla.TopKShape{TopK: 512, Rows: 8, MaxSeqs: 2, PageStride: 4200, PageSize: 64, NumPages: 4200, ScratchEntries: 4 * 3000}
	table := make([]int32, 4200)
	for i := range table {
		table[i] = int32(i)
	}
	ok := &mla.TopKPlan{Seqs: []mla.TopKPlanSeq{{Row: 0, Rows: 4, Start: 11996, Table: table}}}
	_, err := ok.Encode(&shape)
	require.NoError(t, err)
	require.Equal(t, int64(4*3000), ok.ScratchEntries(512))

	over := &mla.TopKPlan{Seqs: []mla.TopKPlanSeq{{Row: 0, Rows: 4, Start: 12000, Table: table}}}
	_, err = over.Encode(&shape)
	require.True(t, errors.Is(err, mla.ErrTopKScratch), "%v", err)

	long := &mla.TopKPlan{Seqs: []mla.TopKPlanSeq{{Row: 0, Rows: 2, Start: mla.MaxTopKPositions - 1, Table: table}}}
	big := shape
	big.ScratchEntries = mla.MaxTopKScratchEntries
	_, err = long.Encode(&big)
	require.True(t, errors.Is(err, mla.ErrTopKContext), "%v", err)
	// The model's last position is accepted: 2^18 entries on 4096 pages.
	long.Seqs[0].Rows = 1
	_, err = long.Encode(&big)
	require.NoError(t, err)

	for name, p := range map[string]*mla.TopKPlan{
		"overlap":    {Seqs: []mla.TopKPlanSeq{{Row: 0, Rows: 4, Start: 0}, {Row: 3, Rows: 1, Start: 0}}},
		"rows":       {Seqs: []mla.TopKPlanSeq{{Row: 6, Rows: 4, Start: 0}}},
		"sequences":  {Seqs: []mla.TopKPlanSeq{{Row: 0, Rows: 1}, {Row: 1, Rows: 1}, {Row: 2, Rows: 1}}},
		"no page":    {Seqs: []mla.TopKPlanSeq{{Row: 0, Rows: 1, Start: 4000, Table: table[:10]}}},
		"page range": {Seqs: []mla.TopKPlanSeq{{Row: 0, Rows: 1, Start: 4000, Table: append(slices.Clone(table[:15]), -1)}}},
	} {
		dst := slices.Repeat([]byte{7}, shape.PlanBytes())
		require.Error(t, p.EncodeTo(dst, &shape), "%s", name)
		require.Equal(t, slices.Repeat([]byte{7}, shape.PlanBytes()), dst, "%s: a refused plan wrote its buffer", name)
	}
	// A batch of 1M-token contexts: 32 sequences' 4 rows need 32 * 4 * 2^18
	// keys (128 MiB), more than a 64 MiB scratch space holds.
	full := make([]int32, mla.MaxTopKEntries/64)
	decode := &mla.TopKPlan{}
	for s := range 32 {
		decode.Seqs = append(decode.Seqs, mla.TopKPlanSeq{Row: 4 * s, Rows: 4, Start: mla.MaxTopKPositions - 4, Table: full})
	}
	sh := mla.TopKShape{TopK: 1024, Rows: 128, MaxSeqs: 32, PageStride: len(full), PageSize: 64, NumPages: 1, ScratchEntries: 1 << 24}
	require.Equal(t, int64(32*4*mla.MaxTopKEntries), decode.ScratchEntries(1024))
	_, err = decode.Encode(&sh)
	require.True(t, errors.Is(err, mla.ErrTopKScratch), "%v", err)
}

// TestTopKKeyOrder: the key map preserves the order of the numbers, puts
// both zeros on one key and every NaN below -Inf.
func TestTopKKeyOrder(t *testing.T) {
	vals := []float32{float32(math.Inf(-1)), -3e38, -1, -1e-45, 0, 1e-45, 1, 3e38, float32(math.Inf(1))}
	for i := 1; i < len(vals); i++ {
		require.Less(t, mla.TopKKey(vals[i-1]), mla.TopKKey(vals[i]), "%g < %g", vals[i-1], vals[i])
	}
	require.Equal(t, mla.TopKKey(0), mla.TopKKey(float32(math.Copysign(0, -1))))
	for _, nan := range []uint32{0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF} {
		require.Zero(t, mla.TopKKey(math.Float32frombits(nan)))
	}
	require.Less(t, uint32(0), mla.TopKKey(float32(math.Inf(-1))))
}
