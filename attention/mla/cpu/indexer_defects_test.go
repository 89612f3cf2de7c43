package cpu

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/numerics"
)

// queryDefect is the CPU backend's IndexerQuery with one deliberate bug:
// the indexer query suite must catch each.
type queryDefect struct {
	*Backend
	defect string
}

func (d queryDefect) IndexerQuery(ctx context.Context, l mla.Launch, a *mla.IndexerQueryArgs) error {
	if err := a.Validate(l.RowBegin + l.Rows); err != nil {
		return err
	}
	m := meta{b: Bytes(a.Meta.Buf), mb: a.Meta}
	if d.defect != "launch-counts" {
		l = m.withHeader(l)
	}
	q, w, qout, wout, rope := Bytes(a.Q), Bytes(a.W), Bytes(a.QOut), Bytes(a.WOut), Bytes(a.Rope)
	const heads, dim, eb = mla.IndexerHeads, mla.IndexerDim, mla.IndexerEntryBytes
	for unit := 0; unit < l.Rows*heads; unit++ {
		local, h := unit/heads, unit%heads
		t := l.RowBegin + local
		out := qout[(t*heads+h)*eb : (t*heads+h+1)*eb]
		wo := wout[(t*heads+h)*2 : (t*heads+h+1)*2]
		_, pos, ok := m.rowPosition(l, local)
		if !ok || pos < 0 || pos >= a.RopePositions {
			if d.defect != "padding-untouched" {
				clear(out)
				clear(wo)
			}
			continue
		}
		if d.defect == "rope-next-position" && pos+1 < a.RopePositions {
			pos++
		}
		src := q[a.QOffset+(t*a.QStride+h*dim)*2:]
		var v [dim]float32
		for i := range v {
			v[i] = numerics.F32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
		}
		cs := numerics.F32sFromBytes(rope[pos*numerics.RopeDim*4 : (pos+1)*numerics.RopeDim*4])
		if d.defect == "rope-first-half" {
			for k := range numerics.RopePairs {
				v[2*k], v[2*k+1] = numerics.Rope(v[2*k], v[2*k+1], cs[2*k], cs[2*k+1])
			}
		} else {
			compressor.RopeIndexerRow(v[:], cs)
		}
		var y [dim]uint16
		for i := range v {
			y[i] = numerics.BF16FromF32(v[i])
		}
		if d.defect != "no-hadamard" {
			numerics.Hadamard128(y[:], y[:])
		}
		for i := range v {
			v[i] = numerics.F32FromBF16(y[i])
		}
		numerics.QuantizeMXFP4(out, v[:])
		if d.defect == "nibbles-swapped" {
			for i := 0; i < dim/2; i++ {
				out[i] = out[i]<<4 | out[i]>>4
			}
		}
		wv := numerics.F32sFromBytes(w[a.WOffset+(t*a.WStride+h)*4 : a.WOffset+(t*a.WStride+h+1)*4])[0]
		c := mla.IndexerWeightScale
		if d.defect == "weight-scale-hadamard" {
			c = numerics.HadamardScale
		}
		if d.defect != "weight-unrounded" {
			wv = numerics.RoundBF16(wv)
		}
		binary.LittleEndian.PutUint16(wo, numerics.BF16FromF32(float32(wv*c)))
	}
	return nil
}

// TestIndexerQueryCatchesDefects: each deliberate bug fails some batch
// shape of the indexer query suite (TestIndexerQuery's cases, the header
// launches included), and the rotation check fails the one that skips the
// query's Hadamard.
func TestIndexerQueryCatchesDefects(t *testing.T) {
	if race.Enabled {
		// What it asserts is a property of the suite's cases, the same under
		// the detector; .ci/run's non-race step runs it.
		t.Skip("-race: a property of the suite's cases; .ci/run's non-race step runs it")
	}
	defects := []string{"no-hadamard", "rope-next-position", "rope-first-half", "nibbles-swapped",
		"weight-scale-hadamard", "weight-unrounded", "padding-untouched", "launch-counts"}
	for _, defect := range defects {
		t.Run(defect, func(t *testing.T) {
			bad := queryDefect{Backend: New(0), defect: defect}
			caught := ""
			for _, s := range mlatest.Scenarios() {
				seed := rand.Uint64()
				c, err := mlatest.NewIndexerQueryCase(s, seed)
				require.NoError(t, err)
				launches := mla.Plan(c.M)
				if defect == "launch-counts" {
					if ls := mla.FromHeader(launches); ls[0].FromHeader {
						ls[0].ValidRows, ls[0].NumSeqs, ls[0].SeqLen = 0, 0, 1 // only the header's counts are the batch's
						launches = ls
					} else {
						continue
					}
				}
				got, err := c.Run(bad, launches)
				require.NoError(t, err)
				if err := c.Compare(got, c.Expected()); err != nil {
					caught = s.Name
					break
				}
			}
			require.NotEmpty(t, caught, "no batch shape catches defect %s", defect)
			t.Logf("%s caught by %s", defect, caught)
		})
	}
	err := mlatest.CheckIndexerRotation(queryDefect{Backend: New(0), defect: "no-hadamard"}, rand.Uint64())
	require.Error(t, err)
}

// keyDefect runs the CPU backend's compressor step with one of its inputs
// misread: the indexer's scenarios and step series must catch each.
type keyDefect struct {
	*Backend
	defect string
}

func (d keyDefect) CompressStep(ctx context.Context, a *mla.CompressStepArgs) error {
	if a.Entry != mla.EntryIndexer {
		return d.Backend.CompressStep(ctx, a)
	}
	b := *a
	switch d.defect {
	case "no-ape":
		b.APE = nil
	case "default-eps":
		b.Eps = numerics.DefaultEps
	case "unit-norm":
		ones := make([]float32, mla.IndexerDim)
		for i := range ones {
			ones[i] = 1
		}
		b.NormWeight = &Buffer{b: numerics.F32Bytes(ones)}
	case "rope-at-last-token": // entry i rotated at 4i+3, not 4i
		cs := numerics.F32sFromBytes(Bytes(a.Rope)[:4*a.RopePositions*numerics.RopeDim])
		shifted := make([]float32, len(cs))
		for p := 0; p < a.RopePositions; p++ {
			q := min(p+a.Ratio-1, a.RopePositions-1)
			copy(shifted[p*numerics.RopeDim:(p+1)*numerics.RopeDim], cs[q*numerics.RopeDim:])
		}
		b.Rope = &Buffer{b: numerics.F32Bytes(shifted)}
	case "page-size-kv": // entries laid out at the 584-byte stride of the main pool's pages
		b.Entry = mla.EntryKV
		b.NormWeight = &Buffer{b: append(append([]byte(nil), Bytes(a.NormWeight)...), make([]byte, 4*384)...)}
		return d.Backend.CompressStep(ctx, &b) // refused or wrong: either way the suite must see it
	}
	return d.Backend.CompressStep(ctx, &b)
}

// TestIndexerKeysCatchDefects: each misread input of the indexer's
// compressor step fails one of its scenarios or step series.
func TestIndexerKeysCatchDefects(t *testing.T) {
	for _, defect := range []string{"no-ape", "default-eps", "unit-norm", "rope-at-last-token", "page-size-kv"} {
		t.Run(defect, func(t *testing.T) {
			bad := keyDefect{Backend: New(0), defect: defect}
			caught := ""
			for _, s := range mlatest.CompressScenarios() {
				if !s.Indexer {
					continue
				}
				if err := mlatest.CheckCompressStep(bad, s, rand.Uint64()); err != nil {
					caught = s.Name
					break
				}
			}
			for _, c := range mlatest.CompressChunkings() {
				if caught == "" && c.Indexer {
					if err := mlatest.CheckCompressChunking(bad, c, rand.Uint64()); err != nil {
						caught = "chunks/" + c.Name
					}
				}
			}
			require.NotEmpty(t, caught, "no indexer scenario catches defect %s", defect)
			t.Logf("%s caught by %s", defect, caught)
		})
	}
}
