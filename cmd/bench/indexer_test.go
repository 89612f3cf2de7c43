package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// cpuMaker is bufMaker on the CPU backend, with host random fills of the
// same kinds as the device's (//go:norace: each fills its own new slice).
type cpuMaker struct {
	be *cpu.Backend
	r  *rand.Rand
	// filled sums the bytes of every random fill (not the plain
	// allocations and writes).
	filled int64
}

func (c *cpuMaker) alloc(n int) (mla.Buffer, error) { return c.be.Alloc(n) }
func (c *cpuMaker) write(dst mla.Buffer, off int, src []byte) error {
	return c.be.Write(dst, off, src)
}

func (c *cpuMaker) put(raw []byte) (mla.Buffer, error) {
	buf, err := c.be.Alloc(len(raw))
	if err != nil {
		return nil, err
	}
	c.filled += int64(len(raw))
	return buf, c.be.Write(buf, 0, raw)
}

//go:norace
func (c *cpuMaker) randBF16(n, rowElems int) (mla.Buffer, error) {
	raw := make([]byte, 2*n)
	scale := float32(1)
	for i := range n {
		if i%rowElems == 0 {
			scale = float32(math.Ldexp(1, c.r.IntN(4)-2))
		}
		binary.LittleEndian.PutUint16(raw[2*i:], numerics.BF16FromF32((2*c.r.Float32()-1)*scale))
	}
	return c.put(raw)
}

//go:norace
func (c *cpuMaker) randF32(n int, lo, hi float32) (mla.Buffer, error) {
	v := make([]float32, n)
	for i := range v {
		v[i] = lo + (hi-lo)*c.r.Float32()
	}
	return c.put(numerics.F32Bytes(v))
}

//go:norace
func (c *cpuMaker) randE4M3(n int) (mla.Buffer, error) {
	raw := make([]byte, n)
	for i := range raw {
		raw[i] = byte(c.r.UintN(0x70)) | byte(c.r.UintN(2))<<7 // exponent below 14: never NaN
	}
	return c.put(raw)
}

// smallFlash is V4-Flash with a narrow hidden row and q_lora_rank, so the
// CPU GEMMs are quick; the indexer's own dimensions are the model's.
func smallFlash(t *testing.T) model {
	md, err := modelNamed("flash")
	require.NoError(t, err)
	md.cfg.HiddenSize, md.cfg.QLoraRank, md.QLora = 256, 128, 128
	return md
}

func TestIndexerWeightBytes(t *testing.T) {
	for _, name := range []string{"flash", "pro"} {
		md, err := modelNamed(name)
		require.NoError(t, err)
		cd := chainDimsOf(md)
		// Each tensor of DESIGN.md section 9, counted separately.
		want := int64(8192*cd.qLora) + 4*int64(64*((cd.qLora+127)/128)) + // wq_b and its 128x128 block scales
			2*int64(64*cd.hidden) + // weights_proj
			2*2*int64(256*cd.hidden) + // compressor.wkv, compressor.wgate
			4*4*256 + 4*128 // ape, norm
		assert.Equal(t, want, indexerWeightBytes(md), name)
		assert.Equal(t, int64(2*2*1024*cd.hidden), compressWeightBytes(md, 4), name)
	}
	md, _ := modelNamed("flash")
	// Issue 23: "its weights add about 13 MB to the 40 MB of V4-Flash's chain weights".
	assert.InDelta(t, 13e6, float64(indexerWeightBytes(md)), 0.5e6)
	assert.InDelta(t, 40e6, float64(chainDimsOf(md).weightBytes()), 0.5e6)
}

func TestIndexerDerive(t *testing.T) {
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	seed := r.Uint64()
	t.Logf("seed %d", seed)
	r = rand.New(rand.NewPCG(seed, 1))
	for _, tc := range []struct {
		name              string
		base, pro, topk   float64
		wantMet           bool
		wantPct, wantTopK float64
	}{
		{"within", 100, 110, 140, true, 10, 40},
		{"at the goal", 80, 92, 100, true, 15, 25},
		{"past the goal", 80, 92.5, 100, false, 15.625, 25},
		{"faster with it", 50, 49, 60, true, -2, 20},
		{"not measured", 0, 0, 0, false, 0, 0},
		{"base not measured", 0, 10, 20, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gbps := 3000 + 2000*r.Float64()
			res := IndexerResult{BaseUs: tc.base, PrologueUs: tc.pro, TopKUs: tc.topk, SideUs: tc.pro, MainQUs: tc.pro, AuxUs: tc.topk, AuxGEMMUs: tc.pro,
				ColdBaseUs: 2 * tc.base, ColdPrologueUs: 2 * tc.pro,
				BaseWeightBytes: 1e6 + r.Int64N(1e8), AddedWeightBytes: 1e6 + r.Int64N(3e7)}
			res.derive(gbps)
			assert.Equal(t, tc.wantMet, res.GoalMet)
			assert.InDelta(t, tc.wantPct, res.AddedPct, 1e-9)
			assert.InDelta(t, tc.wantTopK, res.TopKAddedPct, 1e-9)
			assert.InDelta(t, tc.pro-tc.base, res.AddedUs, 1e-9)
			assert.InDelta(t, tc.topk-tc.base, res.TopKAddedUs, 1e-9)
			assert.InDelta(t, tc.wantPct, res.ColdAddedPct, 1e-9, "the same share of twice the times")
			assert.InDelta(t, tc.wantPct, res.SideAddedPct, 1e-9)
			assert.InDelta(t, tc.wantPct, res.MainQAddedPct, 1e-9)
			assert.InDelta(t, tc.wantTopK, res.AuxAddedPct, 1e-9)
			assert.InDelta(t, tc.wantPct, res.AuxGEMMAddedPct, 1e-9)
			// bytes / (GB/s) in us: bytes / (gbps * 1e9) * 1e6.
			assert.InDelta(t, float64(res.AddedWeightBytes)/(gbps*1e9)*1e6, res.AddedFloorUs, 1e-9)
			assert.InDelta(t, float64(res.BaseWeightBytes)/(gbps*1e9)*1e6, res.BaseFloorUs, 1e-9)
			assert.Equal(t, float64(IndexerGoalPct), res.GoalPct)
			assert.Contains(t, res.line(), map[bool]string{true: "goal met", false: "goal missed"}[tc.wantMet])
		})
	}
	var zero IndexerResult
	zero.derive(0)
	assert.Zero(t, zero.AddedFloorUs, "no copy rate: no floor, not Inf")
}

func TestIndexerQueryBytes(t *testing.T) {
	// bf16 query rows (256 B a head) and float32 weights_proj read; 68 + 2
	// (MXFP4) or 128 + 4 (FP8) written a head.
	assert.Equal(t, int64(128*64*(256+4+68+2)), indexerQueryBytes(128, mla.IndexerQueryMXFP4))
	assert.Equal(t, int64(128*64*(256+4+128+4)), indexerQueryBytes(128, mla.IndexerQueryFP8))
	// The copy rate counts read and written bytes: 2.7 MB at 4233 GB/s.
	q := IndexerQueryResult{Bytes: indexerQueryBytes(128, mla.IndexerQueryMXFP4)}
	q.derive(4233)
	assert.InDelta(t, float64(q.Bytes)/4233e9*1e6, q.FloorUs, 1e-12)
	q.derive(0)
	assert.Zero(t, q.FloorUs)
}

func TestWriteIndexerTable(t *testing.T) {
	rs := []IndexerResult{
		{Model: "flash", Phase: "generation", Batch: 32, MTP: 3, BaseUs: 60, PrologueUs: 66, TopKUs: 90, SideUs: 63, AddedWeightBytes: 13e6,
			Stream: "main", MainQUs: 66, AuxUs: 64.5, AuxGEMMUs: 65.1},
		{Model: "pro", Phase: "context", Tokens: 4096, BaseUs: 900, PrologueUs: 1100, TopKUs: 1200, AddedWeightBytes: 21e6},
	}
	for i := range rs {
		rs[i].derive(4000)
	}
	qs := []IndexerQueryResult{{Model: "flash", Format: "fp8", Tokens: 128, GraphUs: 6.1, WarmUs: 5.2, VLLMUs: VLLMIndexerQueryUs}}
	var b bytes.Buffer
	require.NoError(t, writeIndexerTable(&b, rs, qs))
	out := b.String()
	t.Log("\n" + out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2+len(rs)+1+2+len(qs))
	for _, tbl := range [][]string{lines[:2+len(rs)], lines[3+len(rs):]} {
		for _, l := range tbl {
			assert.Equal(t, strings.Count(tbl[0], "|"), strings.Count(l, "|"), l)
		}
	}
	assert.Contains(t, lines[2], "| flash | b=32 MTP 3 | 60.00 | 66.00 | +10.0% | <= 15%: met | main | 66.00 (+10.0%) | 64.50 (+7.5%) | 65.10 (+8.5%) | 90.00 | +50.0% | 63.00 | +5.0% |")
	assert.Contains(t, lines[3], "| pro | prefill 4096 | 900.00 | 1100.00 | +22.2% | <= 15%: missed |")
	assert.Contains(t, lines[len(lines)-1], "| 7.84 |")
}

func TestParseFlagsIndexer(t *testing.T) {
	c, err := parseFlags(nil, nil)
	require.NoError(t, err)
	assert.False(t, c.Indexer, "off unless asked")
	assert.False(t, c.IndexerNoTopK, "the selection's modes run unless left out")
	assert.Equal(t, []int{32}, c.IndexerBatches)
	assert.Equal(t, 3, c.IndexerMTP)
	assert.Equal(t, []int{4096, 16384}, c.IndexerCtxTokens)
	sh := c.indexerShapes()
	require.Len(t, sh, 3)
	assert.Equal(t, 128, sh[0].Tokens)
	assert.Equal(t, "generation", sh[0].Phase)
	assert.Equal(t, 16384, sh[2].Tokens)

	c, err = parseFlags([]string{"--indexer-only", "--models", "flash", "--graph-reps", "20", "--indexer-ctx-tokens", "none"}, nil)
	require.NoError(t, err)
	assert.True(t, c.Indexer)
	assert.False(t, c.Chain || c.Kernels || c.Iteration || c.Graph || c.HostCost)
	assert.Empty(t, c.IndexerCtxTokens)
	assert.Len(t, c.indexerShapes(), 1)

	c, err = parseFlags([]string{"--indexer-only", "--indexer-no-topk"}, nil)
	require.NoError(t, err)
	assert.True(t, c.IndexerNoTopK)

	c, err = parseFlags([]string{"--indexer", "--indexer-contexts", "65536,0", "--indexer-ctx-tokens", "4096", "--indexer-batches", "32,8"}, nil)
	require.NoError(t, err)
	sh = c.indexerShapes()
	require.Len(t, sh, 5)
	for i, want := range []struct {
		phase          string
		batch, context int
	}{{"generation", 32, 0}, {"generation", 8, 0}, {"context", 2, 0}, {"generation", 32, 65536}, {"generation", 8, 65536}} {
		assert.Equal(t, want.phase, sh[i].Phase, i)
		assert.Equal(t, want.batch, sh[i].Batch, i)
		assert.Equal(t, want.context, sh[i].Context, i)
	}
	assert.Equal(t, ropePositions, sh[0].positions())
	assert.Equal(t, 65536, sh[3].positions())

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--indexer-contexts", "100"}, "--indexer-contexts: 100 is below 128"},
		{[]string{"--indexer-contexts", "none"}, "--indexer-contexts none with --indexer-batches"},
		{[]string{"--indexer-contexts", "2000000"}, "--indexer-contexts: 2000000 is outside"},
		{[]string{"--indexer-only", "--chain-only"}, "--chain-only and --indexer-only exclude each other"},
		{[]string{"--indexer-mtp", "8"}, "--indexer-mtp = 8, must be in [0, 7]"},
		{[]string{"--indexer", "--indexer-batches", "none", "--indexer-ctx-tokens", "none"}, "--indexer with no shape"},
		{[]string{"--indexer-batches", "0"}, "--indexer-batches: 0 is outside"},
	} {
		_, err := parseFlags(tc.args, nil)
		require.ErrorContains(t, err, tc.want, tc.args)
	}
}

// TestIndexerLayerOnCPU issues a ratio-4 layer's indexer work, as the
// device graphs do, on the CPU backend at a small batch: every argument
// the launches take must pass their validation, the query must be written
// (real rows) and zeroed (padding), and each selection must hold
// min(index_topk, visible) ascending entries of the visible ones, then -1.
func TestIndexerLayerOnCPU(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	md := smallFlash(t)
	be := cpu.New(2)
	mk := &cpuMaker{be: be, r: rand.New(rand.NewPCG(seed, 2))}
	s := generationShape(3, 3)
	m, total, err := shapeMetadata(md, s, graphBucket(s.Tokens))
	require.NoError(t, err)
	rows := m.PaddedTokens
	require.Greater(t, rows, m.Tokens, "the shape has padding rows")
	meta, err := mla.NewMetadataBuffers(be, m.NumSeqs, m.MaxPages)
	require.NoError(t, err)
	require.NoError(t, meta.Upload(be, m, total))
	rope, err := mk.randF32(ropePositions*64, -1, 1)
	require.NoError(t, err)
	cd := chainDimsOf(md)
	in := idxInputs{m: m, launches: mla.FromHeader(mla.Plan(m)), rows: rows, rope: rope, ropePositions: ropePositions,
		meta: meta, eps: numerics.DefaultEps}
	const sets, layers = 2, 2
	for range sets {
		h, err := mk.randBF16(rows*cd.hidden, cd.hidden)
		require.NoError(t, err)
		qn := mla.FP8Activations{Rows: rows, K: cd.qLora, ScaleStride: rows}
		qn.Data, err = mk.randE4M3(rows * cd.qLora)
		require.NoError(t, err)
		qn.Scale, err = mk.randF32(cd.qLora/128*rows, 1.0/64, 1.0/16)
		require.NoError(t, err)
		in.hidden, in.qn = append(in.hidden, h), append(in.qn, qn)
	}
	before := mk.filled
	x, err := setupIndexer(mk, md, in, layers)
	require.NoError(t, err)
	require.Len(t, x.layers, layers)
	require.Len(t, x.sets, sets)
	assert.Positive(t, x.Scored, "some rows see more than index_topk entries: the selection scores them")
	assert.Less(t, x.Scored, m.Tokens, "and some select every entry")
	// The weights a layer adds are what indexerWeightBytes counts: the
	// fills minus the states (the ring of every layer) and the one
	// projection GEMM's matrix (which holds the compressor's rows too).
	ring := int64(m.NumSeqs * x.ringRows * 2 * idxWidth * 4)
	fused := int64(fusedN(compWidth4) * cd.hidden * 2)
	assert.Equal(t, int64(layers)*(indexerWeightBytes(md)+ring+fused), mk.filled-before)
	assert.Equal(t, int64(fusedN(compWidth4)*cd.hidden*2), compressWeightBytes(md, 4)+indexerWeightBytes(md)-int64(fp8WeightBytes(idxQueryN, cd.qLora))-4*4*256-4*128,
		"the fused matrix is the three bf16 projections")

	ctx := context.Background()
	for l := range layers {
		s := &x.sets[l%sets]
		for _, b := range []mla.Buffer{s.qOut, s.wOut, x.layers[l].out} {
			require.NoError(t, be.Fill(b, 0, b.Len(), 0xAB))
		}
		// The engine's way (checked against the separate GEMMs), then the
		// selection.
		checkProjectionColumns(t, be, x, l)
		require.NoError(t, x.topk(ctx, be, l))
		for _, mode := range []idxMode{idxAlone, idxQueryAlone, idxTopKAlone} {
			if l == 0 {
				require.NoError(t, x.alone(ctx, be, l, mode), mode)
			}
		}
		require.Error(t, x.alone(ctx, be, l, idxPrologue), "the prologue runs alone only as idxAlone")

		q := make([]byte, rows*64*mla.IndexerEntryBytes)
		require.NoError(t, be.Read(q, s.qOut, 0))
		rowBytes := 64 * mla.IndexerEntryBytes
		for r := range rows {
			row := q[r*rowBytes : (r+1)*rowBytes]
			if r >= m.Tokens {
				assert.Equal(t, make([]byte, rowBytes), row, "layer %d padding row %d", l, r)
			} else {
				assert.NotEqual(t, bytes.Repeat([]byte{0xAB}, rowBytes), row, "layer %d row %d written", l, r)
			}
		}
		out := make([]byte, 4*rows*x.tk.TopK)
		require.NoError(t, be.Read(out, x.layers[l].out, 0))
		for r := range rows {
			visible := 0
			if r < m.Tokens {
				_, pos, ok := m.Row(r)
				require.True(t, ok)
				visible = mla.TopKVisible(pos)
			}
			want := min(visible, x.tk.TopK)
			prev := int32(-1)
			for k := range x.tk.TopK {
				v := int32(binary.LittleEndian.Uint32(out[4*(r*x.tk.TopK+k):]))
				if k >= want {
					require.Equal(t, int32(-1), v, "layer %d row %d slot %d past the %d selected", l, r, k, want)
					continue
				}
				require.Greater(t, v, prev, "layer %d row %d slot %d: ascending", l, r, k)
				require.Less(t, int(v), visible, "layer %d row %d slot %d: a visible entry", l, r, k)
				prev = v
			}
		}
	}
}

// checkBackend is idxBackend that only validates each launch's
// arguments, as the backends do first.
type checkBackend struct{ launches int }

func (c *checkBackend) GEMM(_ context.Context, a *mla.GEMMArgs) error {
	c.launches++
	return a.Validate()
}
func (c *checkBackend) BF16GEMM(_ context.Context, a *mla.BF16GEMMArgs) error {
	c.launches++
	return a.Validate()
}
func (c *checkBackend) CompressStep(_ context.Context, a *mla.CompressStepArgs) error {
	c.launches++
	return a.Validate()
}
func (c *checkBackend) IndexerQuery(_ context.Context, l mla.Launch, a *mla.IndexerQueryArgs) error {
	c.launches++
	return a.Validate(l.RowBegin + l.Rows)
}
func (c *checkBackend) IndexerTopK(_ context.Context, a *mla.TopKArgs) error {
	c.launches++
	return a.Validate()
}

// sizedBuf is a buffer of a size and no memory: what the launches'
// validation reads.
type sizedBuf int

func (b sizedBuf) Len() int { return int(b) }

// sizeMaker is bufMaker of sizedBuf: a layout at full size costs nothing.
type sizeMaker struct{ writes int }

func (*sizeMaker) alloc(n int) (mla.Buffer, error) { return sizedBuf(n), nil }
func (m *sizeMaker) write(dst mla.Buffer, off int, src []byte) error {
	if off < 0 || off+len(src) > dst.Len() {
		return fmt.Errorf("write of %d bytes at %d into %d", len(src), off, dst.Len())
	}
	m.writes++
	return nil
}
func (*sizeMaker) randBF16(n, _ int) (mla.Buffer, error)           { return sizedBuf(2 * n), nil }
func (*sizeMaker) randF32(n int, _, _ float32) (mla.Buffer, error) { return sizedBuf(4 * n), nil }
func (*sizeMaker) randE4M3(n int) (mla.Buffer, error)              { return sizedBuf(n), nil }

// TestIndexerArgsAtDeviceShapes lays out the indexer at the shapes and
// dimensions the device run times (run.sh's flags; V4-Flash and V4-Pro)
// and validates every launch's arguments in both query formats, as the
// backends do before a launch: a device run cannot fail on a size or a
// plan. Buffers are sizes only (sizeMaker); TestIndexerLayerOnCPU runs
// the launches.
func TestIndexerArgsAtDeviceShapes(t *testing.T) {
	c, err := parseFlags([]string{"--indexer-only", "--indexer-contexts", "0,65536"}, nil)
	require.NoError(t, err)
	for _, md := range c.Models {
		for _, s := range c.indexerShapes() {
			t.Run(fmt.Sprintf("%s/%s-%d-at-%d", md.Name, s.Phase, s.Tokens, s.Context), func(t *testing.T) {
				padTo := 0
				if s.Phase == "generation" {
					padTo = graphBucket(s.Tokens)
				}
				m, _, err := shapeMetadata(md, s, padTo)
				require.NoError(t, err)
				launches := mla.Plan(m)
				if padTo > 0 {
					launches = mla.FromHeader(launches)
				}
				rows := m.PaddedTokens
				cd := chainDimsOf(md)
				const sets, layers = 2, 3
				in := idxInputs{m: m, launches: launches, rows: rows, rope: sizedBuf(s.positions() * 64 * 4), ropePositions: s.positions(),
					meta: &mla.MetadataBuffers{}, eps: numerics.DefaultEps}
				for range sets {
					in.hidden = append(in.hidden, sizedBuf(rows*cd.hidden*2))
					in.qn = append(in.qn, mla.FP8Activations{Rows: rows, K: cd.qLora, ScaleStride: rows,
						Data: sizedBuf(rows * cd.qLora), Scale: sizedBuf(cd.qLora / 128 * rows * 4)})
				}
				mk := &sizeMaker{}
				x, err := setupIndexer(mk, md, in, layers)
				require.NoError(t, err)
				assert.Equal(t, 2+layers, mk.writes, "the two plans and every layer's history")
				ctx := context.Background()
				for l := range layers {
					for _, f := range []mla.IndexerQueryFormat{mla.IndexerQueryMXFP4, mla.IndexerQueryFP8} {
						require.NoError(t, x.args(l, f).validate(rows), "layer %d %v", l, f)
					}
					// Every launch the modes issue, through the code that issues it.
					be := &checkBackend{}
					require.NoError(t, x.fusedGEMM(ctx, be, l, false))
					require.NoError(t, x.keyStep(ctx, be, l))
					require.NoError(t, x.wqBGEMM(ctx, be, l))
					require.NoError(t, x.queryStep(ctx, be, l, mla.IndexerQueryMXFP4))
					require.NoError(t, x.queryStep(ctx, be, l, mla.IndexerQueryFP8))
					require.NoError(t, x.topk(ctx, be, l))
					require.NoError(t, x.keys(ctx, be, l))
					require.NoError(t, x.separateQuery(ctx, be, l))
					for _, mode := range []idxMode{idxAlone, idxQueryAlone, idxTopKAlone} {
						require.NoError(t, x.alone(ctx, be, l, mode))
					}
					// The ratio-4 compressor's step reads its columns of the
					// same rows (chainLayer's compressStep from mainKG).
					kg, stride := x.mainKG()
					main := &mla.CompressStepArgs{Ratio: 4, KG: kg, KGRows: rows, KGStride: stride, APE: sizedBuf(4 * compWidth4 * 4),
						Ring: sizedBuf(m.NumSeqs * x.ringRows * 2 * compWidth4 * 4), RingRows: x.ringRows, Slots: m.NumSeqs, Plan: x.plan,
						MaxSeqs: m.NumSeqs, MaxJobs: x.maxJobs, NormWeight: sizedBuf(4 * 512), Eps: numerics.DefaultEps, Rope: in.rope,
						RopePositions: in.ropePositions, Pool: sizedBuf(x.pages * kvcache.FormatFP8UE8M0.PageBytes(engine.CompressedPageSize)), PageSize: engine.CompressedPageSize, NumPages: x.pages,
						Scratch: sizedBuf(mla.CompressScratchBytes(x.maxJobs))}
					require.NoError(t, main.Validate(), "layer %d ratio-4 compressor step", l)
					main.KGStride = 2 * compWidth4
					require.NoError(t, main.Validate())
					main.KGStride = 2 * stride
					require.Error(t, main.Validate(), "a wider stride passes the projection rows' end")
					// The engine's way: one GEMM, the key step, wq_b, a step a
					// launch in each format, top-k 1; separate: keys 2, query 2
					// + the steps; alone: 4 + the steps, the steps, 1.
					n := len(launches)
					assert.Equal(t, 3+2*n+1+2+(2+n)+(4+n)+n+1, be.launches, "layer %d", l)
				}
				assert.Equal(t, md.cfg.IndexTopK, x.tk.TopK)
				if md.Name == "flash" || s.Context > 0 {
					assert.Positive(t, x.Scored, "the selection scores rows at this shape")
				}
				if s.Context > 0 {
					assert.Equal(t, m.Tokens, x.Scored, "every row of a long context scores")
					assert.LessOrEqual(t, x.Visible, mla.TopKVisible(s.Context-1))
					assert.Greater(t, x.Visible, mla.TopKVisible(s.Context-1-64-(1+s.MTP)))
				}
				t.Logf("%d rows, visible <= %d entries, %d rows score against index_topk %d", rows, x.Visible, x.Scored, x.tk.TopK)
			})
		}
	}
}

func TestLongGenerationShape(t *testing.T) {
	for _, tc := range []struct{ nb, mtp, context int }{{32, 3, 65536}, {1, 0, 128}, {5, 7, 4099}} {
		s := longGenerationShape(tc.nb, tc.mtp, tc.context)
		require.Len(t, s.reqs, tc.nb)
		assert.Equal(t, tc.nb*(1+tc.mtp), s.Tokens)
		md, err := modelNamed("flash")
		require.NoError(t, err)
		m, _, err := shapeMetadata(md, s, graphBucket(s.Tokens))
		require.NoError(t, err, "every position lies inside the table")
		for r := range m.Tokens {
			_, pos, ok := m.Row(r)
			require.True(t, ok)
			assert.Less(t, pos, tc.context)
			assert.GreaterOrEqual(t, pos, tc.context-64-(1+tc.mtp), "near the end")
		}
	}
}

// checkProjectionColumns: layer l's indexer steps read their columns of
// the one projection GEMM's rows, as the engine lays them out. From the
// same cache and states, the engine's way (the one GEMM, the key step
// from its columns, wq_b, the query step from weights_proj's columns) and
// the separate GEMMs with the one matrix's rows as their weights (the CPU
// GEMM's per-element order does not depend on N) write the same cache,
// states, query and head weights, every byte.
func checkProjectionColumns(t *testing.T, be *cpu.Backend, x *chainIdx, l int) {
	t.Helper()
	ctx := context.Background()
	il, s := &x.layers[l], &x.sets[l%len(x.sets)]
	rb := 2 * chainDimsOf(x.md).hidden
	fused := cpu.Bytes(il.fused)
	require.NoError(t, be.Write(il.wkvg, 0, fused[idxKGCol*rb:idxWPCol*rb]))
	require.NoError(t, be.Write(il.wproj, 0, fused[idxWPCol*rb:fusedN(compWidth4)*rb]))
	snap := func() [][]byte {
		var out [][]byte
		for _, b := range []mla.Buffer{il.pool, il.ring, s.qOut, s.wOut} {
			out = append(out, append([]byte(nil), cpu.Bytes(b)...))
		}
		return out
	}
	restore := func(st [][]byte) {
		for i, b := range []mla.Buffer{il.pool, il.ring, s.qOut, s.wOut} {
			require.NoError(t, be.Write(b, 0, st[i]))
		}
	}
	before := snap()
	require.NoError(t, x.fusedGEMM(ctx, be, l, false))
	require.NoError(t, x.keyStep(ctx, be, l))
	require.NoError(t, x.wqBGEMM(ctx, be, l))
	require.NoError(t, x.queryStep(ctx, be, l, mla.IndexerQueryMXFP4))
	engineWay := snap()
	restore(before)
	require.NoError(t, x.keys(ctx, be, l))
	require.NoError(t, x.separateQuery(ctx, be, l))
	separate := snap()
	for i, what := range []string{"cache", "states", "query", "head weights"} {
		require.Equal(t, separate[i], engineWay[i], "layer %d %s: the one GEMM's columns against the separate GEMMs", l, what)
		require.NotEqual(t, before[i], engineWay[i], "layer %d %s written", l, what)
	}
}
