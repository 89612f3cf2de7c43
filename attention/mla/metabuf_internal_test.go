package mla

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestMirrorPut: put leaves the words equal to the values and widens [lo,
// hi) to exactly the first and last word that differed, for differences at
// every place relative to the 16-word runs its compare takes (first, last,
// run edges, none), on odd lengths.
func TestMirrorPut(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	for _, n := range []int{1, 2, 15, 16, 17, 31, 32, 33, 257} {
		for trial := range 200 {
			old := make([]int32, n)
			for i := range old {
				old[i] = rng.Int32()
			}
			vals := append([]int32(nil), old...)
			for range trial % 4 { // 0 to 3 changed words
				i := rng.IntN(n)
				if trial%7 == 1 {
					i = []int{0, n - 1, min(15, n-1), min(16, n-1)}[rng.IntN(4)]
				}
				vals[i] ^= 1 + rng.Int32N(1<<30)
			}
			lo, hi := n, 0 // the words that differ, found the slow way
			for i := range n {
				if vals[i] != old[i] {
					lo, hi = min(lo, i), max(hi, i+1)
				}
			}
			const pad = 5
			mm := metaMirror{words: make([]int32, n+2*pad)}
			copy(mm.words[pad:], old)
			mm.lo, mm.hi = len(mm.words), 0
			mm.put(pad, vals)
			for i, w := range mm.words[pad : pad+n] {
				if w != vals[i] {
					t.Fatalf("n=%d trial %d: word %d is %d, want %d", n, trial, i, w, vals[i])
				}
			}
			if lo >= hi {
				if mm.lo < mm.hi {
					t.Fatalf("n=%d trial %d: nothing changed, span [%d, %d)", n, trial, mm.lo, mm.hi)
				}
				continue
			}
			if mm.lo != pad+lo || mm.hi != pad+hi {
				t.Fatalf("n=%d trial %d: span [%d, %d), want [%d, %d)", n, trial, mm.lo, mm.hi, pad+lo, pad+hi)
			}
		}
	}
}
