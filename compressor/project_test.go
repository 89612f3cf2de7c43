package compressor

import (
	"fmt"
	"math"
	"testing"

	"github.com/dsv4mla/prologue/numerics"
	"github.com/stretchr/testify/require"
)

func randomProjection(t testing.TB, ratio, hidden int) *Projection {
	r := newRand(t)
	out := Overlap(ratio) * Dim
	p := &Projection{Ratio: ratio, Hidden: hidden,
		WKV: make([]uint16, out*hidden), WGate: make([]uint16, out*hidden), APE: make([]float32, ratio*out)}
	for i := range p.WKV {
		p.WKV[i] = numerics.BF16FromF32(float32(r.NormFloat64() * 0.05))
		p.WGate[i] = numerics.BF16FromF32(float32(r.NormFloat64() * 0.05))
	}
	for i := range p.APE {
		p.APE[i] = float32(r.NormFloat64())
	}
	return p
}

// TestProject checks every output against a direct loop: products rounded
// to float32, accumulated over ascending hidden index, then ape of the
// token's position mod r added once.
func TestProject(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct{ ratio, hidden, tokens, start int }{
		{4, 96, 1, 0}, {4, 200, 7, 5}, {128, 64, 3, 126}, {128, 130, 2, 1000},
	} {
		t.Run(fmt.Sprintf("ratio %d hidden %d tokens %d from %d", c.ratio, c.hidden, c.tokens, c.start), func(t *testing.T) {
			p := randomProjection(t, c.ratio, c.hidden)
			x := make([]uint16, c.tokens*c.hidden)
			for i := range x {
				x[i] = numerics.BF16FromF32(float32(r.NormFloat64() * 2))
			}
			K, G, err := p.Project(x, c.start)
			require.NoError(t, err)
			require.Len(t, K, c.tokens)
			out := p.Out()
			for tok := range c.tokens {
				apeRow := (c.start + tok) % c.ratio
				for n := range out {
					var k, g float32
					for h := range c.hidden {
						xv := numerics.F32FromBF16(x[tok*c.hidden+h])
						pk := float32(xv * numerics.F32FromBF16(p.WKV[n*c.hidden+h]))
						pg := float32(xv * numerics.F32FromBF16(p.WGate[n*c.hidden+h]))
						k, g = float32(k+pk), float32(g+pg)
					}
					g = float32(g + p.APE[apeRow*out+n])
					require.Equal(t, math.Float32bits(k), math.Float32bits(K[tok][n]), "K[%d][%d]", tok, n)
					require.Equal(t, math.Float32bits(g), math.Float32bits(G[tok][n]), "G[%d][%d]", tok, n)
				}
			}
		})
	}
}

func TestProjectRefusals(t *testing.T) {
	p := randomProjection(t, 4, 64)
	x := make([]uint16, 64)
	cases := []struct {
		name   string
		mutate func(p *Projection)
		x      []uint16
		start  int
		msg    string
	}{
		{"ratio", func(p *Projection) { p.Ratio = 0 }, x, 0, "projection ratio 0 has no compressor"},
		{"hidden", func(p *Projection) { p.Hidden = 0 }, x, 0, "hidden size 0 must be positive"},
		{"wkv", func(p *Projection) { p.WKV = p.WKV[1:] }, x, 0, "wkv has 65535 values, want 65536"},
		{"wgate", func(p *Projection) { p.WGate = nil }, x, 0, "wgate has 0 values, want 65536"},
		{"ape", func(p *Projection) { p.APE = p.APE[:1024] }, x, 0, "ape has 1024 values, want 4096"},
		{"x", func(*Projection) {}, x[:63], 0, "hidden states have 63 values, not a multiple of hidden size 64"},
		{"start", func(*Projection) {}, x, -1, "start position -1 is negative"},
	}
	for _, c := range cases {
		q := *p
		c.mutate(&q)
		_, _, err := q.Project(c.x, c.start)
		require.ErrorContains(t, err, c.msg, c.name)
	}
	K, G, err := p.Project(nil, 0)
	require.NoError(t, err)
	require.Empty(t, K)
	require.Empty(t, G)
}

func BenchmarkProject(b *testing.B) {
	p := randomProjection(b, 4, 4096)
	x := make([]uint16, 4*4096)
	for i := range x {
		x[i] = numerics.BF16FromF32(float32(i%7) - 3)
	}
	for b.Loop() {
		if _, _, err := p.Project(x, 0); err != nil {
			b.Fatal(err)
		}
	}
}
