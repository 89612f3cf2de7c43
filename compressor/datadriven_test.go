package compressor

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"
)

// The files under testdata/ are github.com/cockroachdb/datadriven scripts
// (run with -rewrite to print the actual output into them; every rewritten
// expectation must then be checked by hand).
// Tokens are a pure function of (position, variant), so the same entry
// reached by different paths prints the same digest. Commands:
//
//	layer ratio=R drafts=D     a new layer (fixed norm weight) and empty sequences
//	append SEQ N [variant=V] [true=J] [at=P]
//	                           N tokens at SEQ's length (or at P, to test a
//	                           refusal); variant 0 (default) is the true
//	                           token, others are drafts to reject; with true=J
//	                           the first J tokens are true and the rest V;
//	                           prints the entries emitted as index:digest
//	accept SEQ LEN             prints the dropped range and the length
//	state SEQ                  the state's window and the entries held
//	entries SEQ                every entry held (after drops), index:digest
//
// A refused command prints "error: ..." and must change nothing.
func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runScript(t, file) })
	}
}

type scriptSeq struct {
	s       *State
	entries map[int][EntryBytes]byte
}

type script struct {
	layer *Layer
	seqs  map[string]*scriptSeq
}

func runScript(t *testing.T, file string) {
	st := &script{}
	datadriven.RunTest(t, file, func(t *testing.T, d *datadriven.TestData) string {
		got, err := st.run(strings.Fields(d.FullCmd()))
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		return got
	})
}

// scriptToken is the projection of the token at pos: each value a
// splitmix64 hash of (pos, variant, channel) mapped to K in [-2, 2) and G
// in [-4, 4).
func scriptToken(width, pos, variant int) (k, g []float32) {
	k, g = make([]float32, width), make([]float32, width)
	for c := range width {
		h := splitmix(uint64(pos)<<32 ^ uint64(variant)<<20 ^ uint64(c))
		k[c] = float32(int32(h)) * 0x1p-30
		g[c] = float32(int32(h>>32)) * 0x1p-29
	}
	return k, g
}

func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}

func digest(b [EntryBytes]byte) string {
	s := sha256.Sum256(b[:])
	return fmt.Sprintf("%x", s[:4])
}

func (st *script) seq(name string) *scriptSeq {
	q, ok := st.seqs[name]
	if !ok {
		q = &scriptSeq{s: st.layer.NewState(), entries: map[int][EntryBytes]byte{}}
		st.seqs[name] = q
	}
	return q
}

func (st *script) run(f []string) (string, error) {
	if len(f) == 0 {
		return "", fmt.Errorf("empty command")
	}
	if f[0] != "layer" && st.layer == nil {
		return "", fmt.Errorf("%s before layer", f[0])
	}
	kv := map[string]int{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return "", err
			}
			kv[k] = n
		} else {
			pos = append(pos, a)
		}
	}
	arg := func(i int) (int, error) {
		if i >= len(pos) {
			return 0, fmt.Errorf("missing argument %d", i)
		}
		return strconv.Atoi(pos[i])
	}
	switch f[0] {
	case "layer":
		norm := make([]float32, Dim)
		for i := range norm {
			norm[i] = 0.75 + float32(i%8)*0.0625
		}
		l, err := NewLayer(Params{Ratio: kv["ratio"], NormWeight: norm, Eps: 1e-6, Rope: yarnTable(), MaxDrafts: kv["drafts"]})
		if err != nil {
			return "error: " + err.Error(), nil
		}
		st.layer, st.seqs = l, map[string]*scriptSeq{}
		return fmt.Sprintf("width %d, candidates %d, state rows %d (%d bytes)", l.Width(), l.Candidates(), l.StateRows(), l.StateBytes()), nil
	case "append":
		n, err := arg(1)
		if err != nil {
			return "", err
		}
		q := st.seq(pos[0])
		start := q.s.Len()
		if at, ok := kv["at"]; ok {
			start = at
		}
		trueCount, ok := kv["true"]
		if !ok {
			trueCount = 0
		}
		var K, G [][]float32
		for p := start; p < start+n; p++ {
			variant := kv["variant"]
			if p-start < trueCount {
				variant = 0
			}
			k, g := scriptToken(st.layer.Width(), max(p, 0), variant)
			K, G = append(K, k), append(G, g)
		}
		f0, e0 := q.s.Window()
		es, err := q.s.Append(start, K, G)
		if err != nil {
			if f1, e1 := q.s.Window(); f1 != f0 || e1 != e0 {
				return "", fmt.Errorf("refused append changed the state")
			}
			return "error: " + err.Error(), nil
		}
		var b strings.Builder
		fmt.Fprintf(&b, "len %d, entries", q.s.Len())
		if len(es) == 0 {
			b.WriteString(" none")
		}
		for _, e := range es {
			q.entries[e.Index] = e.Bytes
			fmt.Fprintf(&b, " %d:%s", e.Index, digest(e.Bytes))
		}
		return b.String(), nil
	case "accept":
		n, err := arg(1)
		if err != nil {
			return "", err
		}
		q := st.seq(pos[0])
		d, err := q.s.Accept(n)
		if err != nil {
			return "error: " + err.Error(), nil
		}
		for i := d.Begin; i < d.End; i++ {
			delete(q.entries, i)
		}
		return fmt.Sprintf("dropped [%d, %d), len %d", d.Begin, d.End, q.s.Len()), nil
	case "state":
		q := st.seq(pos[0])
		first, end := q.s.Window()
		var sum uint64
		for p := first; p < end; p++ {
			k, g, _ := q.s.Row(p)
			for c := range k {
				sum = splitmix(sum ^ uint64(math.Float32bits(k[c]))<<32 ^ uint64(math.Float32bits(g[c])))
			}
		}
		var h [8]byte
		binary.LittleEndian.PutUint64(h[:], sum)
		return fmt.Sprintf("window [%d, %d), rows %x, entries %d", first, end, h[:4], len(q.entries)), nil
	case "entries":
		q := st.seq(pos[0])
		var b strings.Builder
		for i := 0; i < len(q.entries); i++ {
			e, ok := q.entries[i]
			if !ok {
				return "", fmt.Errorf("entry %d missing while %d are held", i, len(q.entries))
			}
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%d:%s", i, digest(e))
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("unknown command %q", f[0])
}
