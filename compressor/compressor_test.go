package compressor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/stretchr/testify/require"
)

const tablePositions = 4096

var yarnTable = sync.OnceValue(func() *dsv4.RopeTable {
	// The datadriven digests were pinned with the exact-mode table.
	t, err := dsv4.NewRopeTable(dsv4.Flash(), dsv4.RopeYaRN, dsv4.RopeExact, tablePositions)
	if err != nil {
		panic(err)
	}
	return t
})

// newRand returns a generator and logs its seed so a failure can be replayed.
func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 10))
}

// testLayer returns a layer with a random norm weight around 1, and the
// same parameters for the reference.
func testLayer(t testing.TB, r *rand.Rand, ratio, maxDrafts int) (*Layer, refLayer) {
	norm := make([]float32, Dim)
	for i := range norm {
		norm[i] = numerics.RoundBF16(float32(1 + 0.25*r.NormFloat64()))
	}
	l, err := NewLayer(Params{Ratio: ratio, NormWeight: norm, Eps: 1e-6, Rope: yarnTable(), MaxDrafts: maxDrafts})
	require.NoError(t, err)
	return l, refLayer{ratio: ratio, norm: norm, eps: 1e-6, rope: yarnTable()}
}

// randomTokens returns n tokens' projections: K of mixed magnitudes and G
// logits spread enough that the softmax weights differ (never all zero).
func randomTokens(r *rand.Rand, n, width int) (K, G [][]float32) {
	K, G = make([][]float32, n), make([][]float32, n)
	for t := range n {
		K[t], G[t] = make([]float32, width), make([]float32, width)
		scale := math.Ldexp(1, r.IntN(6)-2)
		for c := range width {
			K[t][c] = float32(r.NormFloat64() * scale)
			G[t][c] = float32(r.NormFloat64()*3 + 0.5)
		}
	}
	return K, G
}

// run feeds the tokens in chunks of the given lengths (the last chunk
// takes the rest) and returns every entry emitted, by index.
func run(t testing.TB, l *Layer, K, G [][]float32, chunks []int) (*State, map[int][EntryBytes]byte) {
	s := l.NewState()
	got := map[int][EntryBytes]byte{}
	pos := 0
	for ci := 0; pos < len(K); ci++ {
		n := len(K) - pos
		if ci < len(chunks) {
			n = min(chunks[ci], n)
		}
		es, err := s.Append(pos, K[pos:pos+n], G[pos:pos+n])
		require.NoError(t, err)
		checkEmitted(t, l, pos, pos+n, es)
		for _, e := range es {
			got[e.Index] = e.Bytes
		}
		pos += n
		checkState(t, s, K, G)
	}
	return s, got
}

// checkEmitted: a step over [start, end) emits exactly the entries whose
// boundary token (i+1)*r-1 it holds, in order.
func checkEmitted(t testing.TB, l *Layer, start, end int, es []Entry) {
	t.Helper()
	var want []int
	for p := start; p < end; p++ {
		if (p+1)%l.Ratio() == 0 {
			want = append(want, p/l.Ratio())
		}
	}
	var idx []int
	for _, e := range es {
		idx = append(idx, e.Index)
	}
	require.Equal(t, want, idx, "entries of the step [%d, %d)", start, end)
}

// checkState: the state holds exactly the rows section 8 names at its
// length, each equal to the token's own projections, bit for bit. The
// window is computed here independently of the package.
func checkState(t testing.TB, s *State, K, G [][]float32) {
	t.Helper()
	n := s.Len()
	r := s.layer.Ratio()
	wantFirst := n / r * r // ratio 128: the current partial window
	if r == 4 {
		wantFirst = max(0, (n/4-1)*4) // plus the previous full window
	}
	first, end := s.Window()
	require.Equal(t, [2]int{wantFirst, n}, [2]int{first, end}, "state window at length %d", n)
	for pos := first; pos < end; pos++ {
		k, g, ok := s.Row(pos)
		require.True(t, ok, "position %d", pos)
		requireBits(t, K[pos], k, "K at position %d", pos)
		requireBits(t, G[pos], g, "G at position %d", pos)
	}
}

func requireBits(t testing.TB, want, got []float32, msg string, args ...any) {
	t.Helper()
	require.Equal(t, len(want), len(got), fmt.Sprintf(msg, args...))
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "bits differ", "%s: value %d: %#08x, want %#08x", fmt.Sprintf(msg, args...), i,
				math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
}

// requireEntries: got holds exactly the reference's entries, every byte.
func requireEntries(t testing.TB, want [][EntryBytes]byte, got map[int][EntryBytes]byte, what string) {
	t.Helper()
	require.Len(t, got, len(want), "%s: entry count", what)
	for i, w := range want {
		g, ok := got[i]
		require.True(t, ok, "%s: entry %d missing", what, i)
		if g != w {
			for b := range w {
				require.Equalf(t, w[b], g[b], "%s: entry %d byte %d", what, i, b)
			}
		}
	}
}

func TestEmissionPromptLengths(t *testing.T) {
	r := newRand(t)
	for _, ratio := range []int{4, 128} {
		l, ref := testLayer(t, r, ratio, 0)
		K, G := randomTokens(r, 257, l.Width())
		want := refEntries(ref, K, G)
		for _, n := range []int{1, 3, 4, 5, 7, 8, 127, 128, 129, 255, 256, 257} {
			t.Run(fmt.Sprintf("ratio %d length %d", ratio, n), func(t *testing.T) {
				s, got := run(t, l, K[:n], G[:n], nil)
				require.Len(t, got, n/ratio)
				require.Equal(t, n, s.Len())
				requireEntries(t, want[:n/ratio], got, "one-shot prefill")
			})
		}
	}
}

// TestFirstEntryHasNoPreviousWindow: ratio 4's entry 0 pools only the four
// B-half candidates of positions 0..3; their A halves first count in entry 1.
func TestFirstEntryHasNoPreviousWindow(t *testing.T) {
	r := newRand(t)
	l, ref := testLayer(t, r, 4, 0)
	K, G := randomTokens(r, 8, l.Width())
	_, base := run(t, l, K, G, nil)
	requireEntries(t, refEntries(ref, K, G), base, "8 tokens")

	// Entry 0 is the 4-candidate softmax of the B halves, written directly.
	var pooled [Dim]float32
	for c := range Dim {
		var logits, values [4]float32
		for j := range 4 {
			logits[j], values[j] = G[j][Dim+c], K[j][Dim+c]
		}
		pooled[c] = PoolChannel(logits[:], values[:])
	}
	e0, err := l.FinishEntry(0, &pooled)
	require.NoError(t, err)
	require.Equal(t, base[0], e0.Bytes)

	// Changing the A halves of positions 0..3 leaves entry 0 and changes entry 1.
	K2, G2 := randomTokens(r, 8, l.Width())
	for p := range 8 {
		if p < 4 {
			copy(K2[p][Dim:], K[p][Dim:])
			copy(G2[p][Dim:], G[p][Dim:])
		} else {
			K2[p], G2[p] = K[p], G[p]
		}
	}
	_, changed := run(t, l, K2, G2, nil)
	require.Equal(t, base[0], changed[0], "entry 0 reads no A half")
	require.NotEqual(t, base[1], changed[1], "entry 1 reads the A halves of positions 0..3")
}

// TestRopePosition: entry i's rope values are the normed values rotated by
// the table's row i*r, not the boundary token's row.
func TestRopePosition(t *testing.T) {
	r := newRand(t)
	for _, ratio := range []int{4, 128} {
		l, _ := testLayer(t, r, ratio, 0)
		K, G := randomTokens(r, 3*ratio, l.Width())
		_, got := run(t, l, K, G, nil)
		for i := range 3 {
			var pooled [Dim]float32
			src := func(pos int) ([]float32, []float32) { return K[pos], G[pos] }
			l.pool(i, src, &pooled)
			e, err := l.FinishEntry(i, &pooled)
			require.NoError(t, err)
			require.Equal(t, got[i], e.Bytes)
			// The stored rope values are exactly the normed tail rotated by the
			// row of i*r, and not by the boundary token's row.
			page := make([]byte, kvcache.FormatFP8UE8M0.PageBytes(1))
			e.Store(page, 1, 0)
			y, err := kvcache.DecodeToken(kvcache.FormatFP8UE8M0, page, 1, 0, 0)
			require.NoError(t, err)
			for _, pos := range []int{i * ratio, (i+1)*ratio - 1} {
				match := ropeMatches(l, &pooled, &y, pos)
				require.Equal(t, pos == i*ratio, match, "ratio %d entry %d: rope at position %d", ratio, i, pos)
			}
		}
	}
}

// ropeMatches recomputes the norm and rotates the tail by the row of pos.
func ropeMatches(l *Layer, pooled, y *[Dim]float32, pos int) bool {
	var x [Dim]float32
	for c := range x {
		x[c] = numerics.RoundBF16(pooled[c])
	}
	rs := numerics.RMSInv(numerics.SumSquares(x[:]), l.eps)
	for k := range numerics.RopePairs {
		i := numerics.NopeDim + 2*k
		a := numerics.RoundBF16(float32(float32(x[i]*rs) * l.norm[i]))
		b := numerics.RoundBF16(float32(float32(x[i+1]*rs) * l.norm[i+1]))
		c, s := l.rope.At(pos, k)
		y0, y1 := numerics.Rope(a, b, c, s)
		if y0 != y[i] || y1 != y[i+1] {
			return false
		}
	}
	return true
}

// TestChunkInvariance: one prompt fed in one chunk, token by token, split at
// positions 1, 2, 3 mod 4 and 1, 127 mod 128, in chunks shorter than r and
// longer than 256: every entry byte equals the reference and every state
// row equals the token's projections after every chunk.
func TestChunkInvariance(t *testing.T) {
	r := newRand(t)
	const n = 700
	cutsToChunks := func(cuts ...int) []int {
		var c []int
		prev := 0
		for _, x := range cuts {
			c = append(c, x-prev)
			prev = x
		}
		return c
	}
	ones := make([]int, n)
	for i := range ones {
		ones[i] = 1
	}
	var short []int
	for len(short) < n {
		short = append(short, 1, 2, 3, 2, 1, 3)
	}
	var random []int
	for sum := 0; sum < n; {
		c := 1 + r.IntN(40)
		random = append(random, c)
		sum += c
	}
	splits := []struct {
		name   string
		chunks []int
	}{
		{"one shot", nil},
		{"token by token", ones},
		{"cuts 1 mod 4", cutsToChunks(1, 13, 97, 301, 545)},
		{"cuts 2 mod 4", cutsToChunks(2, 14, 98, 302, 546)},
		{"cuts 3 mod 4", cutsToChunks(3, 15, 99, 303, 547)},
		{"cuts 1 mod 128", cutsToChunks(1, 129, 257, 385, 641)},
		{"cuts 127 mod 128", cutsToChunks(127, 255, 383, 511, 639)},
		{"chunks shorter than 4", short},
		{"a chunk longer than 256", cutsToChunks(5, 300, 301, 640)},
		{"random chunks", random},
	}
	for _, ratio := range []int{4, 128} {
		l, ref := testLayer(t, r, ratio, 0)
		K, G := randomTokens(r, n, l.Width())
		want := refEntries(ref, K, G)
		for _, sp := range splits {
			t.Run(fmt.Sprintf("ratio %d %s", ratio, sp.name), func(t *testing.T) {
				_, got := run(t, l, K, G, sp.chunks)
				requireEntries(t, want, got, sp.name)
			})
		}
	}
}

// mtpRun is a sequence whose accepted tokens are truth[K, G]; speculative
// steps append drafts that are the truth up to the accepted count and
// garbage after it.
type mtpRun struct {
	t       testing.TB
	l       *Layer
	s       *State
	K, G    [][]float32
	entries map[int][EntryBytes]byte
	r       *rand.Rand
}

func (m *mtpRun) step(n int) {
	m.t.Helper()
	pos := m.s.Len()
	es, err := m.s.Append(pos, m.K[pos:pos+n], m.G[pos:pos+n])
	require.NoError(m.t, err)
	checkEmitted(m.t, m.l, pos, pos+n, es)
	for _, e := range es {
		m.entries[e.Index] = e.Bytes
	}
}

// verify runs 1+d tokens of which the first accepted are right, then
// accepts them and drops the entries Accept names.
func (m *mtpRun) verify(d, accepted int) {
	m.t.Helper()
	pos := m.s.Len()
	K, G := randomTokens(m.r, 1+d, m.l.Width())
	for j := range accepted {
		K[j], G[j] = m.K[pos+j], m.G[pos+j]
	}
	es, err := m.s.Append(pos, K, G)
	require.NoError(m.t, err)
	checkEmitted(m.t, m.l, pos, pos+1+d, es)
	for _, e := range es {
		m.entries[e.Index] = e.Bytes
	}
	dropped, err := m.s.Accept(pos + accepted)
	require.NoError(m.t, err)
	ratio := m.l.Ratio()
	require.Equal(m.t, EntryRange{(pos + accepted) / ratio, (pos + 1 + d) / ratio}, dropped)
	for i := dropped.Begin; i < dropped.End; i++ {
		_, ok := m.entries[i]
		require.True(m.t, ok, "dropped entry %d was emitted", i)
		delete(m.entries, i)
	}
	require.Equal(m.t, pos+accepted, m.s.Len())
}

// TestMTPAcceptance: verify steps of 1+d tokens (d = 1..7) at every start
// around the boundaries, with every accepted count (rejections before, at
// and after a boundary token, inside a ratio-128 window, full acceptance),
// then a continuation past the next boundary: entries and state equal a run
// that never speculated.
func TestMTPAcceptance(t *testing.T) {
	r := newRand(t)
	for _, ratio := range []int{4, 128} {
		l, ref := testLayer(t, r, ratio, 7)
		n := 2*ratio + 24
		K, G := randomTokens(r, n, l.Width())
		want := refEntries(ref, K, G)
		starts := []int{0, 1, 2, 3, 4, 5, 6, 7, 8}
		if ratio == 128 {
			starts = []int{0, 60, 121, 124, 126, 127, 128, 129}
			if testing.Short() || race.Enabled { // .ci/run's non-race step runs every start
				starts = []int{124, 127}
			}
		}
		for _, start := range starts {
			for d := 1; d <= 7; d++ {
				for acc := 1; acc <= d+1; acc++ {
					m := &mtpRun{t: t, l: l, s: l.NewState(), K: K, G: G, entries: map[int][EntryBytes]byte{}, r: r}
					if start > 0 {
						m.step(start)
					}
					m.verify(d, acc)
					checkState(t, m.s, K, G)
					// Continue: a decode token, then the rest in one chunk.
					m.step(1)
					m.step(n - m.s.Len())
					checkState(t, m.s, K, G)
					requireEntries(t, want, m.entries, fmt.Sprintf("ratio %d start %d drafts %d accepted %d", ratio, start, d, acc))
				}
			}
		}
	}
}

// TestMTPRepeatedRejections: several sequences, each a random mix of
// prefill chunks, plain decode and verify steps with random accepted counts
// (repeated rejections included), interleaved: each ends equal to a run
// that never speculated.
func TestMTPRepeatedRejections(t *testing.T) {
	r := newRand(t)
	for _, ratio := range []int{4, 128} {
		l, ref := testLayer(t, r, ratio, 7)
		const n = 420
		var runs []*mtpRun
		var wants [][][EntryBytes]byte
		for range 3 {
			K, G := randomTokens(r, n+8, l.Width())
			runs = append(runs, &mtpRun{t: t, l: l, s: l.NewState(), K: K, G: G, entries: map[int][EntryBytes]byte{}, r: r})
			wants = append(wants, refEntries(ref, K[:n], G[:n]))
		}
		for active := len(runs); active > 0; {
			active = 0
			for _, m := range runs {
				left := n - m.s.Len()
				if left <= 0 {
					continue
				}
				active++
				switch op := r.IntN(4); {
				case op == 0:
					m.step(min(left, 1+r.IntN(150)))
				case op == 1 || left < 9:
					m.step(1)
				default:
					d := 1 + r.IntN(7)
					m.verify(d, 1+r.IntN(d+1))
				}
			}
		}
		for i, m := range runs {
			checkState(t, m.s, m.K, m.G)
			requireEntries(t, wants[i], m.entries, fmt.Sprintf("ratio %d sequence %d", ratio, i))
		}
	}
}

func TestRefusals(t *testing.T) {
	r := newRand(t)
	l, _ := testLayer(t, r, 4, 3)
	K, G := randomTokens(r, 20, l.Width())
	cases := []struct {
		name string
		do   func(s *State) error
		msg  string
	}{
		{"gap", func(s *State) error { _, err := s.Append(11, K[11:12], G[11:12]); return err },
			"Append at position 11, but the sequence has 10 positions"},
		{"overlap", func(s *State) error { _, err := s.Append(9, K[9:12], G[9:12]); return err },
			"Append at position 9, but the sequence has 10 positions"},
		{"K and G counts", func(s *State) error { _, err := s.Append(10, K[10:12], G[10:11]); return err },
			"2 K rows but 1 G rows"},
		{"row width", func(s *State) error {
			_, err := s.Append(10, [][]float32{K[10][:Dim]}, G[10:11])
			return err
		}, "token 0 (position 10): K has 512 values and G 1024, want 1024 each"},
		{"accept past the end", func(s *State) error { _, err := s.Accept(11); return err },
			"Accept length 11 outside [7, 10]"},
		{"accept before the step", func(s *State) error { _, err := s.Accept(6); return err },
			"Accept length 6 outside [7, 10]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := l.NewState()
			_, err := s.Append(0, K[:7], G[:7])
			require.NoError(t, err)
			_, err = s.Append(7, K[7:10], G[7:10])
			require.NoError(t, err)
			require.ErrorContains(t, c.do(s), c.msg)
			// Nothing changed: the state is whole and the run goes on exactly.
			require.Equal(t, 10, s.Len())
			checkState(t, s, K, G)
			_, err = s.Accept(7) // the last step is still rollback-able
			require.NoError(t, err)
			m := &mtpRun{t: t, l: l, s: s, K: K, G: G, entries: map[int][EntryBytes]byte{}, r: r}
			m.step(13)
			checkState(t, s, K, G)
		})
	}
	t.Run("accept after accept", func(t *testing.T) {
		s := l.NewState()
		_, err := s.Append(0, K[:5], G[:5])
		require.NoError(t, err)
		_, err = s.Accept(3)
		require.NoError(t, err)
		_, err = s.Accept(2)
		require.ErrorContains(t, err, "Accept length 2 outside [3, 3]")
	})
	t.Run("rollback limited to MaxDrafts", func(t *testing.T) {
		s := l.NewState()
		_, err := s.Append(0, K[:10], G[:10])
		require.NoError(t, err)
		_, err = s.Accept(6)
		require.ErrorContains(t, err, "Accept length 6 outside [7, 10]")
	})
	t.Run("entry past the rope table", func(t *testing.T) {
		small, err := dsv4.NewRopeTable(dsv4.Flash(), dsv4.RopeYaRN, dsv4.RopeReference, 6)
		require.NoError(t, err)
		ls, err := NewLayer(Params{Ratio: 4, NormWeight: make([]float32, Dim), Eps: 1e-6, Rope: small})
		require.NoError(t, err)
		s := ls.NewState()
		_, err = s.Append(0, K[:7], G[:7]) // entry 1 sits at position 4: fine
		require.NoError(t, err)
		_, err = s.Append(7, K[7:12], G[7:12]) // entry 2 at position 8: outside
		require.ErrorContains(t, err, "entry 2: dsv4: position 8 outside the yarn RoPE table of 6 positions")
		require.Equal(t, 7, s.Len())
		checkState(t, s, K, G)
	})
}

func TestNewLayerRefusals(t *testing.T) {
	plain, err := dsv4.NewRopeTable(dsv4.Flash(), dsv4.RopePlain, dsv4.RopeReference, 8)
	require.NoError(t, err)
	ok := Params{Ratio: 4, NormWeight: make([]float32, Dim), Eps: 1e-6, Rope: yarnTable()}
	cases := []struct {
		name   string
		mutate func(*Params)
		msg    string
	}{
		{"ratio 0", func(p *Params) { p.Ratio = 0 }, "ratio 0 has no compressor"},
		{"ratio 8", func(p *Params) { p.Ratio = 8 }, "ratio 8 has no compressor"},
		{"norm size", func(p *Params) { p.NormWeight = p.NormWeight[:448] }, "norm weight has 448 values, want 512"},
		{"eps zero", func(p *Params) { p.Eps = 0 }, "eps 0 must be finite and positive"},
		{"eps NaN", func(p *Params) { p.Eps = float32(math.NaN()) }, "eps NaN must be finite"},
		{"no table", func(p *Params) { p.Rope = nil }, "no RoPE table"},
		{"plain table", func(p *Params) { p.Rope = plain }, "RoPE table is plain, compressed layers use yarn"},
		{"drafts", func(p *Params) { p.MaxDrafts = -1 }, "MaxDrafts -1 out of range [0, 64]"},
	}
	for _, c := range cases {
		p := ok
		c.mutate(&p)
		_, err := NewLayer(p)
		require.ErrorContains(t, err, c.msg, c.name)
	}
	_, err = NewLayer(ok)
	require.NoError(t, err)
}

// TestStateMemory: the ring never holds more than StateRows positions, and
// a long chunk keeps only the rows a later entry or a rollback reads.
func TestStateMemory(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct{ ratio, drafts, rows int }{{4, 0, 8}, {4, 7, 15}, {128, 3, 131}} {
		l, _ := testLayer(t, r, c.ratio, c.drafts)
		require.Equal(t, c.rows, l.StateRows())
		require.Equal(t, c.rows*l.Width()*8, l.StateBytes())
		K, G := randomTokens(r, 600, l.Width())
		s := l.NewState()
		for pos := 0; pos < 600; {
			n := min(600-pos, 1+r.IntN(300))
			_, err := s.Append(pos, K[pos:pos+n], G[pos:pos+n])
			require.NoError(t, err)
			pos += n
			require.LessOrEqual(t, s.Len()-s.first, l.StateRows()-1)
			require.Equal(t, l.firstNeeded(max(pos-n, pos-c.drafts)), s.first)
		}
	}
}

func TestPoolChannel(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	// Equal logits: equal weights, exactly 1/4 each.
	require.Equal(t, float32(2.5), PoolChannel([]float32{3, 3, 3, 3}, []float32{1, 2, 3, 4}))
	// One dominant logit: its value alone.
	require.Equal(t, float32(7), PoolChannel([]float32{-200, 0}, []float32{5, 7}))
	// An absent candidate (-Inf, 0) changes nothing.
	g, k := []float32{0.3, -1.2, 2}, []float32{1.5, -2, 0.25}
	require.Equal(t, math.Float32bits(PoolChannel(g, k)),
		math.Float32bits(PoolChannel(append([]float32{-inf}, g...), append([]float32{0}, k...))))
	// NaN in, NaN out; +Inf logits give NaN (Inf - Inf).
	require.True(t, math.IsNaN(float64(PoolChannel([]float32{1, nan}, []float32{1, 1}))))
	require.True(t, math.IsNaN(float64(PoolChannel([]float32{inf, 0}, []float32{1, 1}))))
	// Order matters and is ascending: compare with a direct loop.
	r := newRand(t)
	for range 1000 {
		n := 1 + r.IntN(128)
		gs, ks := make([]float32, n), make([]float32, n)
		for j := range n {
			gs[j], ks[j] = float32(r.NormFloat64()*4), float32(r.NormFloat64())
		}
		var want float64
		var sum float64
		mx := math.Inf(-1)
		for _, v := range gs {
			mx = math.Max(mx, float64(v))
		}
		for j := range n {
			w := math.Exp(float64(gs[j]) - mx)
			sum += w
			want += w * float64(ks[j])
		}
		want /= sum
		var scale float64
		for _, v := range ks {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		require.InDelta(t, want, float64(PoolChannel(gs, ks)), 1e-5*scale*float64(n))
	}
}

func TestEntryStore(t *testing.T) {
	r := newRand(t)
	l, _ := testLayer(t, r, 4, 0)
	K, G := randomTokens(r, 8, l.Width())
	_, got := run(t, l, K, G, nil)
	f := kvcache.FormatFP8UE8M0
	page := make([]byte, f.PageBytes(64))
	for i := range page {
		page[i] = 0xA5 // poison
	}
	e := Entry{Index: 1, Bytes: got[1]}
	e.Store(page, 64, 17)
	vo, so := f.ValueOffset(64, 17), f.ScaleOffset(64, 17)
	for i, b := range page {
		switch {
		case i >= vo && i < vo+576:
			require.Equal(t, got[1][i-vo], b, "value byte %d", i-vo)
		case i >= so && i < so+7:
			require.Equal(t, got[1][576+i-so], b, "scale byte %d", i-so)
		default:
			require.Equal(t, byte(0xA5), b, "page byte %d outside the entry", i)
		}
	}
	require.Equal(t, byte(0), got[1][EntryBytes-1], "padding byte")
}

func BenchmarkAppendDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, ratio := range []int{4, 128} {
		b.Run(fmt.Sprintf("ratio %d", ratio), func(b *testing.B) {
			l, _ := testLayer(b, r, ratio, 3)
			K, G := randomTokens(r, ratio, l.Width())
			s := l.NewState()
			for b.Loop() {
				for i := range ratio { // one entry per r tokens
					if _, err := s.Append(s.Len(), K[i:i+1], G[i:i+1]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// TestClone: a clone taken before a step is the state without the step:
// continuing from it gives the entries and rows of a run that never took it.
func TestClone(t *testing.T) {
	r := newRand(t)
	for _, ratio := range []int{4, 128} {
		l, ref := testLayer(t, r, ratio, 3)
		n := 2*ratio + 5
		K, G := randomTokens(r, n, l.Width())
		want := refEntries(ref, K, G)
		s := l.NewState()
		_, err := s.Append(0, K[:ratio+1], G[:ratio+1])
		require.NoError(t, err)
		saved := s.Clone()
		// A long step the state cannot roll back with Accept.
		_, err = s.Append(ratio+1, K[ratio+1:n-1], G[ratio+1:n-1])
		require.NoError(t, err)
		_, err = s.Accept(ratio + 1)
		require.Error(t, err)
		require.Equal(t, ratio+1, saved.Len())
		got := map[int][EntryBytes]byte{}
		for i := range (ratio + 1) / ratio {
			got[i] = want[i]
		}
		es, err := saved.Append(ratio+1, K[ratio+1:], G[ratio+1:])
		require.NoError(t, err)
		for _, e := range es {
			got[e.Index] = e.Bytes
		}
		checkState(t, saved, K, G)
		requireEntries(t, want, got, fmt.Sprintf("ratio %d", ratio))
	}
}
