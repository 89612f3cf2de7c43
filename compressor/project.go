package compressor

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
)

// Projection holds a compressor's projection weights from the checkpoint
// (layers.{i}.attn.compressor.*): Out = coff*512 output rows of Hidden
// values each.
type Projection struct {
	Ratio  int       // compress_ratio: 4 or 128
	Hidden int       // hidden_size
	WKV    []uint16  // wkv.weight, bf16 [Out][Hidden]
	WGate  []uint16  // wgate.weight, bf16 [Out][Hidden]
	APE    []float32 // ape, float32 [Ratio][Out]
}

// Out returns the values per projected row, coff*512.
func (p *Projection) Out() int { return Overlap(p.Ratio) * Dim }

// Validate checks the ratio and every weight's size.
func (p *Projection) Validate() error {
	if Overlap(p.Ratio) == 0 {
		return fmt.Errorf("compressor: projection ratio %d has no compressor (want 4 or 128)", p.Ratio)
	}
	if p.Hidden <= 0 {
		return fmt.Errorf("compressor: projection hidden size %d must be positive", p.Hidden)
	}
	out := p.Out()
	for _, w := range []struct {
		name string
		got  int
		want int
	}{
		{"wkv", len(p.WKV), out * p.Hidden},
		{"wgate", len(p.WGate), out * p.Hidden},
		{"ape", len(p.APE), p.Ratio * out},
	} {
		if w.got != w.want {
			return fmt.Errorf("compressor: %s has %d values, want %d", w.name, w.got, w.want)
		}
	}
	return nil
}

// projectChunk is the number of (token, output row) dot products a
// goroutine takes at a time.
const projectChunk = 256

// Project computes the projections of T tokens at positions startPos,
// startPos+1, ..., from their hidden states x (bf16, T rows of Hidden
// values, row-major): K[t][n] = x_t . wkv_n and G[t][n] = fl(x_t . wgate_n +
// ape[(startPos+t) mod r][n]), float32 products and a float32 accumulation
// over ascending hidden index (bf16 values widen exactly).
//
// It is a GEMM (DESIGN.md section 7): another backend may accumulate in
// another order, within that section's bound, and the compressor's output
// is then checked byte for byte from the same projections. This simple
// parallel loop is the CPU's; a blocked GEMM may replace it.
func (p *Projection) Project(x []uint16, startPos int) (K, G [][]float32, err error) {
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	if len(x)%p.Hidden != 0 {
		return nil, nil, fmt.Errorf("compressor: hidden states have %d values, not a multiple of hidden size %d", len(x), p.Hidden)
	}
	if startPos < 0 {
		return nil, nil, fmt.Errorf("compressor: start position %d is negative", startPos)
	}
	T, out := len(x)/p.Hidden, p.Out()
	K, G = make([][]float32, T), make([][]float32, T)
	for t := range T {
		K[t], G[t] = make([]float32, out), make([]float32, out)
	}
	units := T * out
	workers := min(runtime.GOMAXPROCS(0), (units+projectChunk-1)/projectChunk)
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			xs := make([]float32, p.Hidden)
			lastT := -1
			for {
				mu.Lock()
				lo := next
				next += projectChunk
				mu.Unlock()
				if lo >= units {
					return
				}
				for u := lo; u < min(lo+projectChunk, units); u++ {
					t, n := u/out, u%out
					if t != lastT {
						for h, b := range x[t*p.Hidden : (t+1)*p.Hidden] {
							xs[h] = numerics.F32FromBF16(b)
						}
						lastT = t
					}
					K[t][n] = gemm.DotBF16(xs, p.WKV[n*p.Hidden:(n+1)*p.Hidden])
					ape := p.APE[(startPos+t)%p.Ratio*out+n]
					G[t][n] = float32(gemm.DotBF16(xs, p.WGate[n*p.Hidden:(n+1)*p.Hidden]) + ape)
				}
			}
		})
	}
	wg.Wait()
	return K, G, nil
}
