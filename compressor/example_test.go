package compressor_test

import (
	"fmt"

	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/model/dsv4"
)

// A ratio-4 layer's state through a 6-token prefill, then an MTP verify
// step of 1 + 3 tokens of which 2 are accepted.
func ExampleState() {
	rope, err := dsv4.NewRopeTable(dsv4.Flash(), dsv4.RopeYaRN, dsv4.RopeReference, 64)
	if err != nil {
		panic(err)
	}
	norm := make([]float32, compressor.Dim)
	for i := range norm {
		norm[i] = 1
	}
	layer, err := compressor.NewLayer(compressor.Params{Ratio: 4, NormWeight: norm, Eps: 1e-6, Rope: rope, MaxDrafts: 3})
	if err != nil {
		panic(err)
	}
	tokens := func(n int) (K, G [][]float32) {
		for t := range n {
			k, g := make([]float32, layer.Width()), make([]float32, layer.Width())
			for c := range k {
				k[c], g[c] = float32(c%7+t)-3, float32(c%5)*0.25
			}
			K, G = append(K, k), append(G, g)
		}
		return K, G
	}
	s := layer.NewState()
	K, G := tokens(6)
	entries, _ := s.Append(0, K, G) // positions 0..5: window 0 completes at 3
	fmt.Println("prefill:", len(entries), "entry, index", entries[0].Index, "of", len(entries[0].Bytes), "bytes")

	K, G = tokens(4)
	entries, _ = s.Append(6, K, G) // positions 6..9: window 1 completes at 7
	fmt.Println("verify step:", len(entries), "entry, index", entries[0].Index)
	dropped, _ := s.Accept(8) // positions 6 and 7 accepted: entry 1 stands
	fmt.Println("accepted 2: length", s.Len(), "drop", dropped.Len(), "entries")
	dropped, _ = s.Accept(8)
	fmt.Println(dropped)

	s2 := layer.NewState()
	K, G = tokens(9)
	if _, err := s2.Append(0, K, G); err != nil {
		panic(err)
	}
	dropped, _ = s2.Accept(7) // the boundary token 7 rejected
	fmt.Println("rejected at the boundary: drop entries", dropped.Begin, "to", dropped.End)
	// Output:
	// prefill: 1 entry, index 0 of 584 bytes
	// verify step: 1 entry, index 1
	// accepted 2: length 8 drop 0 entries
	// {2 2}
	// rejected at the boundary: drop entries 1 to 2
}
