package mlatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// Scenario is one batch shape of the suite.
type Scenario struct {
	Name     string
	Reqs     []metadata.Request
	Cached   map[uint64]int // tokens already cached per sequence (chunked prefill, generation)
	Heads    int
	PageSize int
	PadTo    int  // CUDA-graph padding: total rows
	Strided  bool // latent rows read from a fused [q_lora_rank | 512] row
	Special  bool // rows with NaN, Inf, huge, tiny and all-zero values
	BadSlot  bool // one block-table entry overwritten with -1 after upload
	// Eps is the rms_norm_eps of the case; 0 means numerics.DefaultEps
	// (1e-6). Scenarios with another eps fail a backend that ignores
	// LayerArgs.Eps: most random rows have a mean square small enough that
	// the eps changes their float32 inverse RMS.
	Eps float32
}

// eps is the scenario's rms_norm_eps.
func (s Scenario) eps() float32 {
	if s.Eps == 0 {
		return numerics.DefaultEps
	}
	return s.Eps
}

func ctx(seq uint64, n int) metadata.Request {
	return metadata.Request{Seq: seq, Phase: metadata.Context, NewTokens: n}
}

func gen(seq uint64, mtp int) metadata.Request {
	return metadata.Request{Seq: seq, Phase: metadata.Generation, MTP: mtp}
}

// Scenarios lists the shapes every backend must pass.
func Scenarios() []Scenario {
	genSeqs := func(n, mtp int, first uint64) ([]metadata.Request, map[uint64]int) {
		var rs []metadata.Request
		cached := map[uint64]int{}
		for i := 0; i < n; i++ {
			id := first + uint64(i)
			rs = append(rs, gen(id, mtp))
			cached[id] = 1 + 37*i%150
		}
		return rs, cached
	}
	var out []Scenario
	out = append(out,
		Scenario{Name: "context/1row", Reqs: []metadata.Request{ctx(1, 1)}, Heads: 3, PageSize: 64},
		Scenario{Name: "context/ragged", Reqs: []metadata.Request{ctx(1, 5), ctx(2, 70), ctx(3, 1), ctx(4, 129)}, Heads: 2, PageSize: 64},
		Scenario{Name: "context/eps1e-5", Reqs: []metadata.Request{ctx(1, 9), ctx(2, 40)}, Heads: 2, PageSize: 64, Eps: 1e-5},
		Scenario{Name: "context/eps1e-6-explicit", Reqs: []metadata.Request{ctx(1, 3), ctx(2, 20)}, Heads: 2, PageSize: 16, Eps: 1e-6},
		Scenario{Name: "context/chunked", Reqs: []metadata.Request{ctx(1, 33), ctx(2, 64)}, Cached: map[uint64]int{1: 31, 2: 64}, Heads: 2, PageSize: 64},
		Scenario{Name: "context/page16-edges", Reqs: []metadata.Request{ctx(1, 17), ctx(2, 16)}, Cached: map[uint64]int{1: 15}, Heads: 1, PageSize: 16},
		Scenario{Name: "context/strided-special", Reqs: []metadata.Request{ctx(1, 40), ctx(2, 9)}, Heads: 2, PageSize: 64, Strided: true, Special: true},
	)
	for _, mtp := range []int{0, 1, 2, 3} {
		rs, c := genSeqs(5, mtp, 10)
		out = append(out, Scenario{Name: fmt.Sprintf("generation/mtp%d", mtp), Reqs: rs, Cached: c, Heads: 3, PageSize: 64})
	}
	rs, c := genSeqs(1, 0, 10)
	out = append(out, Scenario{Name: "generation/1row", Reqs: rs, Cached: c, Heads: 5, PageSize: 64})
	rs, c = genSeqs(4, 1, 10)
	out = append(out, Scenario{Name: "generation/eps1e-5", Reqs: rs, Cached: c, Heads: 2, PageSize: 64, Eps: 1e-5})
	rs, c = genSeqs(3, 3, 10)
	c[10], c[11], c[12] = 60, 61, 64 // 4 new tokens straddle the 64 edge
	out = append(out, Scenario{Name: "generation/page-edge", Reqs: rs, Cached: c, Heads: 2, PageSize: 64})
	rs, c = genSeqs(6, 2, 10)
	out = append(out, Scenario{Name: "generation/padded-strided", Reqs: rs, Cached: c, Heads: 2, PageSize: 32, PadTo: 24, Strided: true})
	rs, c = genSeqs(4, 1, 10)
	out = append(out, Scenario{Name: "generation/special-badslot", Reqs: rs, Cached: c, Heads: 2, PageSize: 16, Special: true, BadSlot: true})
	rs, c = genSeqs(7, 3, 10)
	c[1] = 20
	mixed := append([]metadata.Request{ctx(1, 50), ctx(2, 3)}, rs...)
	out = append(out,
		Scenario{Name: "mixed", Reqs: mixed, Cached: c, Heads: 3, PageSize: 64},
		Scenario{Name: "mixed/padded-strided-special", Reqs: mixed, Cached: c, Heads: 2, PageSize: 16, PadTo: 120, Strided: true, Special: true, BadSlot: true},
		Scenario{Name: "mixed/eps1e-5-special", Reqs: mixed, Cached: c, Heads: 2, PageSize: 64, Special: true, Eps: 1e-5},
		Scenario{Name: "mixed/flash-heads", Reqs: []metadata.Request{ctx(5, 7), gen(10, 3), gen(11, 3)}, Cached: map[uint64]int{10: 100, 11: 3}, Heads: 64, PageSize: 64},
	)
	return out
}

// Config is one output configuration.
type Config struct {
	Format kvcache.Format
	QBF16  bool
}

func (c Config) String() string {
	q := "qfp8"
	if c.QBF16 {
		q = "qbf16"
	}
	return c.Format.String() + "/" + q
}

// Configs lists every cache format (kvcache.Formats, so that a new format
// cannot skip the suite) with both Q outputs.
func Configs() []Config {
	var cs []Config
	for _, f := range kvcache.Formats() {
		cs = append(cs, Config{f, false}, Config{f, true})
	}
	return cs
}

// headerCounts are the launch counts a header launch carries besides the
// header's: whatever the launch says, only the header's counts may decide
// the bytes.
var headerCounts = []struct {
	name string
	set  func(l *mla.Launch)
}{
	// Deliberately wrong counts.
	{"header", func(l *mla.Launch) { l.ValidRows, l.NumSeqs, l.SeqLen = 0, 0, 1 }},
	// The counts of a captured batch that filled its bucket: a kernel that
	// took its valid rows from the launch would turn padding into tokens.
	{"header-full", func(l *mla.Launch) { l.ValidRows = l.Rows }},
	// The counts of a captured batch of another query length: a kernel
	// that split rows into sequences by the launch's would misplace them.
	{"header-seqlen", func(l *mla.Launch) { l.SeqLen++ }},
}

// Test runs every scenario in every configuration on the backend; a
// generation-only scenario runs again with its launch reading the counts
// from the device header (the CUDA-graph path) under each of
// headerCounts' launch counts (the first in every configuration, the rest
// in the first).
func Test(t *testing.T, b mla.Backend) {
	for _, s := range Scenarios() {
		for ci, c := range Configs() {
			t.Run(s.Name+"/"+c.String(), func(t *testing.T) {
				seed := Seed(t)
				if err := Check(b, s, c, seed); err != nil {
					t.Fatal(err)
				}
			})
			if !generationOnly(s) {
				continue
			}
			for hi, hc := range headerCounts {
				if hi > 0 && ci > 0 {
					break
				}
				t.Run(s.Name+"/"+c.String()+"/"+hc.name, func(t *testing.T) {
					seed := Seed(t)
					cs, err := NewCase(s, c, seed)
					if err != nil {
						t.Fatal(err)
					}
					ls := mla.FromHeader(mla.Plan(cs.M))
					if !ls[0].FromHeader {
						t.Fatalf("generation-only batch planned as %v", ls)
					}
					hc.set(&ls[0])
					got, err := cs.Run(b, ls)
					if err != nil {
						t.Fatal(err)
					}
					if err := cs.Compare(got, cs.Expected()); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// inputs are the host copies of one layer's inputs.
type inputs struct {
	heads                      int
	eps                        float32
	latent, qin, weight, rope  []byte
	latentOffset, latentStride int
	ropePositions              int
}

// Case is a scenario prepared with concrete inputs: reusable by other
// tests (the mixed-batch tests in package tests run its parts alone).
type Case struct {
	S      Scenario
	C      Config
	M      *metadata.Metadata
	in     *inputs
	cfg    kvcache.Config
	qScale float32
	sched  metadata.SchedulerParams
	poison []byte // the pool's bytes before the run
	bad    map[int]bool
	badAt  int // metadata byte offset of the poisoned block-table entry, or -1
}

// NewCase builds the metadata and random inputs of a scenario.
func NewCase(s Scenario, c Config, seed uint64) (*Case, error) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	p := metadata.Params{Heads: s.Heads, PageSize: s.PageSize, MaxPositions: 1 << 20, PadTokensTo: s.PadTo, Scheduler: metadata.SchedulerParams{
		QDeq: 0.5 + r.Float32(), KVDeq: 0.5 + r.Float32(), QScaling: 0.5 + r.Float32(), OScale: 0.5 + r.Float32(),
	}}
	lookup := func(seq uint64) (int, bool, error) {
		n, ok := s.Cached[seq]
		return n, ok, nil
	}
	plan, err := metadata.NewPlan(s.Reqs, lookup, p)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	needs := plan.Needs()
	total := 0
	for _, n := range needs {
		total += (n.Length + s.PageSize - 1) / s.PageSize
	}
	numPages := total + 3 // spare pages that nothing may touch
	perm := r.Perm(numPages)
	tables := map[uint64][]int32{}
	for _, n := range needs {
		k := (n.Length + s.PageSize - 1) / s.PageSize
		for i := 0; i < k; i++ {
			tables[n.Seq] = append(tables[n.Seq], int32(perm[0]))
			perm = perm[1:]
		}
	}
	m, err := plan.Build(func(seq uint64) ([]int32, error) { return tables[seq], nil })
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	cs := &Case{S: s, C: c, M: m, badAt: -1, bad: map[int]bool{}, sched: p.Scheduler}
	cs.cfg = kvcache.Config{Format: c.Format, PageSize: s.PageSize, NumPages: numPages, KVScale: 0.25 + 2*r.Float32()}
	cs.qScale = 0.25 + 2*r.Float32()
	maxPos := 0
	for _, kv := range m.KVLen {
		maxPos = max(maxPos, int(kv))
	}
	in := &inputs{heads: s.Heads, eps: s.eps(), ropePositions: maxPos + 5, latentStride: 512}
	if s.Strided {
		in.latentStride = 1536 + 512
		in.latentOffset = 1536 * 2
	}
	rows := m.PaddedTokens
	in.latent = make([]byte, in.latentOffset+rows*in.latentStride*2)
	randomBF16(r, in.latent) // also fills the q_lora part, which must not be read
	in.qin = make([]byte, rows*s.Heads*1024)
	randomBF16(r, in.qin)
	if s.Special {
		for t := 0; t < m.Tokens; t += 3 {
			specialRow(r, in.latent[in.latentOffset+t*in.latentStride*2:][:1024], t)
			specialRow(r, in.qin[t*s.Heads*1024:][:1024], t+1)
		}
	}
	in.weight = make([]byte, 512*4)
	for i := 0; i < 512; i++ {
		binary.LittleEndian.PutUint32(in.weight[4*i:], math.Float32bits(float32(1+0.5*r.NormFloat64())))
	}
	in.rope = make([]byte, in.ropePositions*64*4)
	for i := 0; i < in.ropePositions*32; i++ {
		a := r.Float64() * 2 * math.Pi
		binary.LittleEndian.PutUint32(in.rope[8*i:], math.Float32bits(float32(math.Cos(a))))
		binary.LittleEndian.PutUint32(in.rope[8*i+4:], math.Float32bits(float32(math.Sin(a))))
	}
	cs.in = in
	cs.poison = make([]byte, cs.cfg.PoolBytes())
	for i := range cs.poison {
		cs.poison[i] = byte(r.Uint32())
	}
	if s.BadSlot {
		// Break one generation token's block-table entry: every token of
		// that sequence on that page must be skipped.
		t := m.Tokens - 1 - r.IntN(max(1, m.GenTokens))
		b, pos, _ := m.Row(t)
		lp := pos / s.PageSize
		for u := 0; u < m.Tokens; u++ {
			if bu, pu, ok := m.Row(u); ok && bu == b && pu/s.PageSize == lp {
				cs.bad[u] = true
			}
		}
		cs.badAt = b*(m.MaxPages+1) + lp // index in the uploaded tables (stride MaxPages+1)
	}
	return cs, nil
}

// randomBF16 fills p with bf16 values whose magnitudes vary per 1 KiB row, so
// the UE8M0 exponents and the RMS scales cover a wide range.
func randomBF16(r *rand.Rand, p []byte) {
	var scale float64
	for i := 0; i+1 < len(p); i += 2 {
		if i%1024 == 0 {
			scale = math.Ldexp(1, r.IntN(40)-20)
		}
		v := float32(r.NormFloat64() * scale)
		if r.IntN(64) == 0 {
			v *= 100 // outliers make groups with different maxima
		}
		binary.LittleEndian.PutUint16(p[i:], uint16(math.Float32bits(v)>>16)) // truncation: any bf16 is a valid input
	}
}

// specialRow plants non-finite and extreme values in one 512-value row.
func specialRow(r *rand.Rand, row []byte, kind int) {
	put := func(i int, bits uint16) { binary.LittleEndian.PutUint16(row[2*i:], bits) }
	switch kind % 6 {
	case 0:
		put(r.IntN(512), 0x7FC0) // NaN: the whole row's norm becomes NaN
	case 1:
		put(r.IntN(448), 0x7F80) // +Inf in a nope group
	case 2:
		put(448+r.IntN(64), 0xFF80) // -Inf in the rope tail
	case 3:
		clear(row) // all zeros: the eps and the UE8M0 floor decide
	case 4:
		for i := 0; i < 512; i++ {
			put(i, 0x7F7F) // largest finite bf16: the sum of squares overflows
		}
	case 5:
		for i := 0; i < 512; i++ {
			put(i, uint16(0x0001+r.IntN(0x7F))) // subnormal bf16 values
		}
	}
}

// Outputs are what a backend produced for a case.
type Outputs struct {
	Q, Pool   []byte
	Scheduler metadata.SchedulerScalars
}

// Run executes the case on b with the given launches (nil: mla.Plan of the
// whole batch) and returns the outputs read back.
func (cs *Case) Run(b mla.Backend, launches []mla.Launch) (*Outputs, error) {
	in, m := cs.in, cs.M
	if launches == nil {
		launches = mla.Plan(m)
	}
	ctx := context.Background()
	dev := &deviceBuffers{b: b}
	defer dev.free()
	alloc := dev.alloc
	a := &mla.LayerArgs{
		Heads: in.heads, LatentOffset: in.latentOffset, LatentStride: in.latentStride,
		RopePositions: in.ropePositions, CacheConfig: cs.cfg, QScale: cs.qScale,
		Eps: in.eps, Scheduler: cs.sched,
	}
	if cs.C.QBF16 {
		a.QFormat = mla.QBF16
	}
	var err error
	qBytes := m.PaddedTokens * in.heads * 512 * a.QFormat.ElemBytes()
	steps := []struct {
		dst  *mla.Buffer
		n    int
		data []byte
	}{
		{&a.Latent, len(in.latent), in.latent},
		{&a.QIn, len(in.qin), in.qin},
		{&a.QOut, qBytes, nil},
		{&a.KVWeight, len(in.weight), in.weight},
		{&a.Rope, len(in.rope), in.rope},
		{&a.Cache, len(cs.poison), cs.poison},
	}
	for _, s := range steps {
		if *s.dst, err = alloc(s.n, s.data); err != nil {
			return nil, err
		}
	}
	if err := b.Fill(a.QOut, 0, qBytes, 0xA5); err != nil {
		return nil, err
	}
	if a.Meta, err = mla.NewMetadataBuffers(b, m.NumSeqs, m.MaxPages+1); err != nil {
		return nil, err
	}
	dev.bufs = append(dev.bufs, a.Meta.Buf)
	if err := a.Meta.Upload(b, m, cs.cfg.NumPages); err != nil {
		return nil, err
	}
	if cs.badAt >= 0 {
		minus1 := []byte{0xFF, 0xFF, 0xFF, 0xFF}
		if err := b.Write(a.Meta.Buf, a.Meta.OffBlockTables+4*cs.badAt, minus1); err != nil {
			return nil, err
		}
	}
	if err := mla.RunLayer(ctx, b, launches, a); err != nil {
		return nil, err
	}
	if err := b.Synchronize(ctx); err != nil {
		return nil, err
	}
	out := &Outputs{Q: make([]byte, qBytes), Pool: make([]byte, len(cs.poison))}
	if err := b.Read(out.Q, a.QOut, 0); err != nil {
		return nil, err
	}
	if err := b.Read(out.Pool, a.Cache, 0); err != nil {
		return nil, err
	}
	if out.Scheduler, err = a.Meta.ReadScheduler(b); err != nil {
		return nil, err
	}
	return out, nil
}

// Expected computes the reference outputs.
func (cs *Case) Expected() *Outputs {
	es := 1
	if cs.C.QBF16 {
		es = 2
	}
	out := &Outputs{
		Q:         make([]byte, cs.M.PaddedTokens*cs.in.heads*512*es),
		Pool:      append([]byte(nil), cs.poison...),
		Scheduler: metadata.ComputeSchedulerScalars(cs.sched),
	}
	refLayer(cs.in, cs.M, cs.cfg, out.Pool, out.Q, cs.C.QBF16, cs.qScale, cs.bad)
	return out
}

// Compare reports every differing region of two outputs, up to a limit.
func (cs *Case) Compare(got, want *Outputs) error {
	var diffs []string
	const limit = 8
	es := 1
	if cs.C.QBF16 {
		es = 2
	}
	for i := range want.Q {
		if got.Q[i] != want.Q[i] {
			if len(diffs) < limit {
				row := i / (512 * es)
				diffs = append(diffs, fmt.Sprintf("Q byte %d (token %d head %d elem %d): got %#02x want %#02x",
					i, row/cs.in.heads, row%cs.in.heads, i%(512*es)/es, got.Q[i], want.Q[i]))
			} else {
				diffs = append(diffs, "")
			}
		}
	}
	pageBytes := cs.cfg.Format.PageBytes(cs.cfg.PageSize)
	for i := range want.Pool {
		if got.Pool[i] != want.Pool[i] {
			if len(diffs) < limit {
				diffs = append(diffs, fmt.Sprintf("cache byte %d (page %d offset %d): got %#02x want %#02x (poison %#02x)",
					i, i/pageBytes, i%pageBytes, got.Pool[i], want.Pool[i], cs.poison[i]))
			} else {
				diffs = append(diffs, "")
			}
		}
	}
	if got.Scheduler != want.Scheduler {
		diffs = append(diffs, fmt.Sprintf("scheduler scalars: got %+v want %+v", got.Scheduler, want.Scheduler))
	}
	if len(diffs) == 0 {
		return nil
	}
	shown := diffs
	if len(shown) > limit {
		shown = shown[:limit]
	}
	return fmt.Errorf("%s/%s: %d differing bytes; first:\n  %s", cs.S.Name, cs.C, len(diffs), joinLines(shown))
}

func joinLines(s []string) string {
	out := ""
	for i, l := range s {
		if i > 0 {
			out += "\n  "
		}
		out += l
	}
	return out
}

// Check runs one scenario in one configuration and compares every byte.
func Check(b mla.Backend, s Scenario, c Config, seed uint64) error {
	cs, err := NewCase(s, c, seed)
	if err != nil {
		return err
	}
	got, err := cs.Run(b, nil)
	if err != nil {
		return err
	}
	return cs.Compare(got, cs.Expected())
}

// Poison returns the pool's bytes before any launch ran.
func (cs *Case) Poison() []byte { return cs.poison }

func generationOnly(s Scenario) bool {
	for _, r := range s.Reqs {
		if r.Phase != metadata.Generation {
			return false
		}
	}
	return true
}
