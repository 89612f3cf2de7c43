package mlatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// The indexer's query prologue (mla.IndexerQuerier, DESIGN.md section 9)
// against refIndexerQueryRow and refIndexerWeight, over the batch shapes of
// Scenarios (their metadata: phases, padding, chunked prefill, header
// launches), every byte of both outputs.

// IndexerQueryCase is one scenario's metadata with random indexer inputs.
type IndexerQueryCase struct {
	S    Scenario
	Seed uint64
	M    *metadata.Metadata
	// Format is the query layout the case runs and expects (the zero
	// value, MXFP4, unless the caller sets it).
	Format           mla.IndexerQueryFormat
	qOffset, qStride int
	wOffset, wStride int
	q, w, rope       []byte
	ropePositions    int
	rows             int // the output buffers' token rows
}

// qOutBytes and wOutLen are the output buffers' sizes in the case's format.
func (c *IndexerQueryCase) qOutBytes() int { return c.rows * mla.IndexerHeads * c.Format.RowBytes() }
func (c *IndexerQueryCase) wOutLen() int   { return c.rows * mla.IndexerHeads * c.Format.WeightBytes() }

// IndexerQueryOutputs are the query rows and head weights read back.
type IndexerQueryOutputs struct{ Q, W []byte }

// NewIndexerQueryCase builds the inputs of a scenario (its Heads is not
// used: the indexer has 64 heads). A Strided scenario reads Q from a fused
// [wq_b; indexer wq_b] row and W from a column slice of a wider GEMM
// output; a Special one plants NaN, Inf, zero, huge and subnormal rows.
func NewIndexerQueryCase(s Scenario, seed uint64) (*IndexerQueryCase, error) {
	base, err := NewCase(s, Configs()[0], seed)
	if err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(seed, 0x1d1ce5))
	m := base.M
	rows := m.PaddedTokens
	const hd = mla.IndexerHeads * mla.IndexerDim
	c := &IndexerQueryCase{S: s, Seed: seed, M: m, qStride: hd, wStride: mla.IndexerHeads}
	if s.Strided {
		c.qOffset, c.qStride = 2*512*2, 2*512+hd // after 2 heads of the main wq_b
		c.wOffset, c.wStride = 4*256, 256+mla.IndexerHeads+12
	}
	c.q = make([]byte, c.qOffset+rows*c.qStride*2)
	randomBF16(r, c.q)
	if s.Special {
		for t := 0; t < m.Tokens; t += 2 {
			h := r.IntN(mla.IndexerHeads)
			indexerSpecialRow(r, c.q[c.qOffset+(t*c.qStride+h*128)*2:][:256], t/2)
		}
	}
	wv := make([]float32, c.wOffset/4+rows*c.wStride)
	for i := range wv {
		wv[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(20)-10))
	}
	if s.Special {
		for t := 0; t < m.Tokens; t++ {
			i := c.wOffset/4 + t*c.wStride + r.IntN(mla.IndexerHeads)
			wv[i] = []float32{float32(math.NaN()), float32(math.Inf(-1)), 0, math.MaxFloat32, 1e-40, -0.0}[t%6]
		}
	}
	c.w = numerics.F32Bytes(wv)
	maxPos := 0
	for _, kv := range m.KVLen {
		maxPos = max(maxPos, int(kv))
	}
	c.ropePositions = maxPos + 3
	table, err := compressRopeTable(c.ropePositions)
	if err != nil {
		return nil, err
	}
	c.rope = table
	c.rows = rows
	return c, nil
}

// indexerSpecialRow plants non-finite and extreme values in one 128-value
// head row.
func indexerSpecialRow(r *rand.Rand, row []byte, kind int) {
	put := func(i int, bits uint16) { binary.LittleEndian.PutUint16(row[2*i:], bits) }
	switch kind % 6 {
	case 0:
		put(r.IntN(128), 0x7FC0) // NaN: the whole row's transform is NaN
	case 1:
		put(r.IntN(64), 0x7F80) // +Inf in the nope half
	case 2:
		put(64+r.IntN(64), 0xFF80) // -Inf in the rope half
	case 3:
		clear(row) // all zeros: every scale byte is 1
	case 4:
		for i := 0; i < 128; i++ {
			put(i, 0x7F7F) // largest finite bf16: the butterflies overflow
		}
	case 5:
		for i := 0; i < 128; i++ {
			put(i, uint16(0x0001+r.IntN(0x7F))) // subnormal bf16 values
		}
	}
}

// Run executes the case's launches (nil: mla.Plan of the whole batch) on b
// with poisoned outputs and reads both outputs back.
func (c *IndexerQueryCase) Run(b mla.Backend, launches []mla.Launch) (*IndexerQueryOutputs, error) {
	iq, ok := b.(mla.IndexerQuerier)
	if !ok {
		return nil, fmt.Errorf("backend %s does not implement mla.IndexerQuerier", b.Name())
	}
	if launches == nil {
		launches = mla.Plan(c.M)
	}
	a, free, err := c.Upload(b)
	if err != nil {
		return nil, err
	}
	defer free()
	ctx := context.Background()
	if err := mla.RunIndexerQuery(ctx, iq, launches, a); err != nil {
		return nil, err
	}
	if err := b.Synchronize(ctx); err != nil {
		return nil, err
	}
	out := &IndexerQueryOutputs{Q: make([]byte, c.qOutBytes()), W: make([]byte, c.wOutLen())}
	if err := b.Read(out.Q, a.QOut, 0); err != nil {
		return nil, err
	}
	if err := b.Read(out.W, a.WOut, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// Upload copies the case's inputs and metadata to b, with both outputs
// poisoned (0xA5), and returns the arguments and a function that frees
// their buffers.
func (c *IndexerQueryCase) Upload(b mla.Backend) (*mla.IndexerQueryArgs, func(), error) {
	dev := &deviceBuffers{b: b}
	a, err := c.upload(dev)
	if err != nil {
		dev.free()
		return nil, nil, err
	}
	return a, dev.free, nil
}

func (c *IndexerQueryCase) upload(dev *deviceBuffers) (*mla.IndexerQueryArgs, error) {
	b := dev.b
	a := &mla.IndexerQueryArgs{Format: c.Format, QOffset: c.qOffset, QStride: c.qStride, WOffset: c.wOffset, WStride: c.wStride, RopePositions: c.ropePositions}
	var err error
	for _, u := range []struct {
		dst  *mla.Buffer
		n    int
		data []byte
	}{{&a.Q, len(c.q), c.q}, {&a.W, len(c.w), c.w}, {&a.Rope, len(c.rope), c.rope}, {&a.QOut, c.qOutBytes(), nil}, {&a.WOut, c.wOutLen(), nil}} {
		if *u.dst, err = dev.alloc(u.n, u.data); err != nil {
			return nil, err
		}
	}
	if err := b.Fill(a.QOut, 0, c.qOutBytes(), 0xA5); err != nil {
		return nil, err
	}
	if err := b.Fill(a.WOut, 0, c.wOutLen(), 0xA5); err != nil {
		return nil, err
	}
	if a.Meta, err = mla.NewMetadataBuffers(b, c.M.NumSeqs, c.M.MaxPages+1); err != nil {
		return nil, err
	}
	dev.bufs = append(dev.bufs, a.Meta.Buf)
	if err := a.Meta.Upload(b, c.M, 1<<20); err != nil {
		return nil, err
	}
	return a, nil
}

// Expected computes the reference outputs: padding rows (and tokens past
// the table) are zeros.
func (c *IndexerQueryCase) Expected() *IndexerQueryOutputs {
	out := &IndexerQueryOutputs{Q: make([]byte, c.qOutBytes()), W: make([]byte, c.wOutLen())}
	for t := 0; t < c.M.PaddedTokens; t++ {
		_, pos, ok := c.M.Row(t)
		if !ok || pos >= c.ropePositions {
			continue
		}
		for h := 0; h < mla.IndexerHeads; h++ {
			row := c.q[c.qOffset+(t*c.qStride+h*128)*2:]
			w := f32At(c.w, c.wOffset/4+t*c.wStride+h)
			i := t*mla.IndexerHeads + h
			if c.Format == mla.IndexerQueryFP8 {
				q, wf := refIndexerQueryFP8(row, c.rope, pos, w)
				copy(out.Q[i*128:], q)
				copy(out.W[i*4:], wf)
				continue
			}
			copy(out.Q[i*68:], refIndexerQueryRow(row, c.rope, pos, true))
			copy(out.W[i*2:], refIndexerWeight(w))
		}
	}
	return out
}

// Compare reports the differing bytes, the first few with where they lie.
func (c *IndexerQueryCase) Compare(got, want *IndexerQueryOutputs) error {
	const limit = 8
	var shown []string
	count := 0
	rb, wb := c.Format.RowBytes(), c.Format.WeightBytes()
	for i := range want.Q {
		if got.Q[i] != want.Q[i] {
			count++
			if len(shown) < limit {
				row, b := i/rb, i%rb
				what := fmt.Sprintf("nibbles of values %d, %d", 2*b, 2*b+1)
				switch {
				case c.Format == mla.IndexerQueryFP8:
					what = fmt.Sprintf("e4m3 value %d", b)
				case b >= 64:
					what = fmt.Sprintf("scale %d", b-64)
				}
				shown = append(shown, fmt.Sprintf("query byte %d (token %d head %d, %s): got %#02x want %#02x", i, row/64, row%64, what, got.Q[i], want.Q[i]))
			}
		}
	}
	for i := range want.W {
		if got.W[i] != want.W[i] {
			count++
			if len(shown) < limit {
				shown = append(shown, fmt.Sprintf("weight byte %d (token %d head %d): got %#02x want %#02x", i, i/(64*wb), i/wb%64, got.W[i], want.W[i]))
			}
		}
	}
	if count == 0 {
		return nil
	}
	return fmt.Errorf("indexer query %s, %v (seed %d): %d differing bytes; first:\n  %s", c.S.Name, c.Format, c.Seed, count, joinLines(shown))
}

// TestIndexerQuery runs every scenario's batch through b's indexer query in
// both formats (it skips when b does not implement mla.IndexerQuerier); generation-only
// batches again with the launch reading the device header under each of
// headerCounts' launch counts.
func TestIndexerQuery(t *testing.T, b mla.Backend) {
	if _, ok := b.(mla.IndexerQuerier); !ok {
		t.Skipf("backend %s does not implement mla.IndexerQuerier", b.Name())
	}
	for i, s := range Scenarios() {
		for j, f := range []mla.IndexerQueryFormat{mla.IndexerQueryMXFP4, mla.IndexerQueryFP8} {
			t.Run(s.Name+"/"+f.String(), func(t *testing.T) {
				skipUnderRace(t, 2*i+j)
				testIndexerQuery(t, b, s, f)
			})
		}
	}
}

func testIndexerQuery(t *testing.T, b mla.Backend, s Scenario, f mla.IndexerQueryFormat) {
	seed := Seed(t)
	c, err := NewIndexerQueryCase(s, seed)
	if err != nil {
		t.Fatal(err)
	}
	c.Format = f
	got, err := c.Run(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Compare(got, c.Expected()); err != nil {
		t.Fatal(err)
	}
	if !generationOnly(s) {
		return
	}
	for _, hc := range headerCounts {
		ls := mla.FromHeader(mla.Plan(c.M))
		hc.set(&ls[0])
		got, err := c.Run(b, ls)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Compare(got, c.Expected()); err != nil {
			t.Fatalf("%s: %v", hc.name, err)
		}
	}
}

// TestIndexerRotation is "rotate both or neither" (DESIGN.md section 9) on
// b: the indexer cache entries of a 257-token prompt come from b's
// compressor step, and sixteen query tokens from b's indexer query, each
// planted on one entry (every head's input is that entry's key before the
// Hadamard; the query's RoPE table is the identity). Scored as the
// selection does (sum over heads of w * relu(q . k), dequantized), every
// planted entry must be its query's best. The same check on reference
// bytes with the rotation skipped on both sides passes too, and with it
// skipped on one side only (the key or the query) fails: so a backend
// that skips the Hadamard on either side fails this test.
func TestIndexerRotation(t *testing.T, b mla.Backend) {
	_, ok1 := b.(mla.IndexerQuerier)
	_, ok2 := b.(mla.CompressStepper)
	if !ok1 || !ok2 {
		t.Skipf("backend %s lacks the indexer query or the compressor step", b.Name())
	}
	seed := Seed(t)
	if err := CheckIndexerRotation(b, seed); err != nil {
		t.Fatal(err)
	}
}

// CheckIndexerRotation is TestIndexerRotation's check.
func CheckIndexerRotation(b mla.Backend, seed uint64) error {
	// The keys: the backend's indexer entries, and the reference's keys
	// before the rotation, per entry index.
	s := CompressScenario{Name: "rotation", Ratio: 4, MaxDrafts: 3, PageSize: 16, APE: true, Indexer: true,
		Seqs: []CompressSeqSpec{{Start: 0, Rows: 257}}}
	cs, err := NewCompressCase(s, seed)
	if err != nil {
		return err
	}
	cs.h.keysPre = map[int][]float32{}
	want := cs.Expected()
	got, err := cs.Run(b)
	if err != nil {
		return err
	}
	if err := cs.Compare(got, want); err != nil {
		return err
	}
	type key struct {
		rotated, plain []byte // the entry's bytes, and its MXFP4 without the Hadamard
		pre            []float32
	}
	keys := make([]key, len(cs.Plan.Jobs))
	for _, j := range cs.Plan.Jobs {
		o := j.Page*cs.h.pageBytes() + j.Offset*68
		pre := cs.h.keysPre[j.Index]
		plain := make([]byte, 68)
		refMXFP4(pre, plain)
		keys[j.Index] = key{rotated: got.Pool[o : o+68], plain: plain, pre: pre}
	}

	// The queries: sixteen tokens of one context sequence, token i planted on
	// entry planted[i], the RoPE table the identity at every position.
	r := rand.New(rand.NewPCG(seed, 0x707a7e))
	const tokens = 16
	planted := r.Perm(len(keys))[:tokens]
	plan, err := metadata.NewPlan([]metadata.Request{{Seq: 1, Phase: metadata.Context, NewTokens: tokens}},
		func(uint64) (int, bool, error) { return 0, false, nil }, metadata.Params{Heads: 1, PageSize: 64, MaxPositions: 1 << 20, Scheduler: metadata.DefaultSchedulerParams()})
	if err != nil {
		return err
	}
	m, err := plan.Build(func(uint64) ([]int32, error) { return []int32{0}, nil })
	if err != nil {
		return err
	}
	const hd = mla.IndexerHeads * mla.IndexerDim
	c := &IndexerQueryCase{S: Scenario{Name: "rotation"}, Seed: seed, M: m, qStride: hd, wStride: mla.IndexerHeads,
		ropePositions: tokens, rows: tokens}
	c.q = make([]byte, tokens*hd*2)
	for t, e := range planted {
		for h := 0; h < mla.IndexerHeads; h++ {
			for i, v := range keys[e].pre {
				binary.LittleEndian.PutUint16(c.q[(t*hd+h*128+i)*2:], numerics.BF16FromF32(v))
			}
		}
	}
	wv := make([]float32, tokens*mla.IndexerHeads)
	for i := range wv {
		wv[i] = float32(0.5 + r.Float64())
	}
	c.w = numerics.F32Bytes(wv)
	c.rope = make([]byte, tokens*64*4)
	for i := 0; i < tokens*32; i++ {
		binary.LittleEndian.PutUint32(c.rope[8*i:], math.Float32bits(1))
	}
	q, err := c.Run(b, nil)
	if err != nil {
		return err
	}
	if err := c.Compare(q, c.Expected()); err != nil {
		return err
	}
	plainQ := make([][]byte, tokens)
	for t := range plainQ {
		plainQ[t] = refIndexerQueryRow(c.q[t*hd*2:], c.rope, t, false)
	}

	// hits counts the queries whose planted entry scores highest.
	hits := func(rotatedQ, rotatedK bool) int {
		n := 0
		for t, e := range planted {
			best, bestScore := -1, math.Inf(-1)
			for s := range keys {
				k := keys[s].plain
				if rotatedK {
					k = keys[s].rotated
				}
				kv := refDequantMXFP4(k)
				var score float64
				for h := 0; h < mla.IndexerHeads; h++ {
					qrow := plainQ[t]
					if rotatedQ {
						qrow = q.Q[(t*mla.IndexerHeads+h)*68 : (t*mla.IndexerHeads+h+1)*68]
					}
					qv := refDequantMXFP4(qrow)
					var dot float64
					for i := range qv {
						dot += qv[i] * kv[i]
					}
					w := float64(numerics.F32FromBF16(binary.LittleEndian.Uint16(q.W[(t*mla.IndexerHeads+h)*2:])))
					score += w * math.Max(dot, 0)
				}
				if score > bestScore {
					best, bestScore = s, score
				}
			}
			if best == e {
				n++
			}
		}
		return n
	}
	if n := hits(true, true); n != tokens {
		return fmt.Errorf("rotation (seed %d): both rotated by %s: %d of %d planted entries score highest", seed, b.Name(), n, tokens)
	}
	if n := hits(false, false); n != tokens {
		return fmt.Errorf("rotation (seed %d): neither rotated (reference): %d of %d planted entries score highest", seed, n, tokens)
	}
	if n := hits(true, false); n > tokens/2 {
		return fmt.Errorf("rotation (seed %d): only the query rotated, %d of %d planted entries still score highest: the check cannot see a missing key rotation", seed, n, tokens)
	}
	if n := hits(false, true); n > tokens/2 {
		return fmt.Errorf("rotation (seed %d): only the key rotated, %d of %d planted entries still score highest: the check cannot see a missing query rotation", seed, n, tokens)
	}
	return nil
}
