package weights_test

import (
	"fmt"
	"log"
	"os"

	"github.com/dsv4mla/prologue/weights"
)

func ExampleLoad() {
	dir, err := os.MkdirTemp("", "ck")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// A tiny synthetic checkpoint: 3 layers (ratios 0, 4, 128) + 1 MTP layer.
	cfg := weights.TinyConfig()
	if err := weights.WriteSynthetic(dir, &cfg, 42, weights.SyntheticOptions{ScaleFormat: weights.ScaleE8M0}); err != nil {
		log.Fatal(err)
	}

	// Tensor-parallel rank 1 of 2: head 1 only; layers 1 and 2 only. The
	// config comes from the directory's config.json.
	ck, err := weights.Load(dir, nil, weights.LoadOptions{Layers: []int{1, 2}, Heads: weights.HeadRange{Begin: 1, End: 2}})
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range ck.Layers {
		fmt.Printf("layer %d ratio %d: wq_a %dx%d, wkv %dx%d, wq_b %dx%d (scales %dx%d), compressor coff %d, ape %d\n",
			l.Index, l.CompressRatio, l.WQA.N, l.WQA.K, l.WKV.N, l.WKV.K, l.WQB.N, l.WQB.K,
			l.WQB.ScaleRows(), l.WQB.ScaleCols(), l.Compressor.Coff, len(l.Compressor.APE))
		// The ratio-4 layer's lightning indexer: all its heads on every rank.
		if x := l.Indexer; x != nil {
			fmt.Printf("  indexer: %d heads of %d, wq_b %dx%d, weights_proj %dx%d, compressor dim %d coff %d, ape %d\n",
				x.Heads, x.HeadDim, x.WQB.N, x.WQB.K, x.WeightsProj.N, x.WeightsProj.K, x.Compressor.Dim, x.Compressor.Coff, len(x.Compressor.APE))
		}
	}

	// A head range outside the config is refused before any file is read.
	_, err = weights.Load(dir, nil, weights.LoadOptions{Layers: []int{0}, Heads: weights.HeadRange{Begin: 0, End: 3}})
	fmt.Println(err)
	// Output:
	// layer 1 ratio 4: wq_a 256x256, wkv 512x256, wq_b 512x256 (scales 4x2), compressor coff 2, ape 4096
	//   indexer: 64 heads of 128, wq_b 8192x256, weights_proj 64x256, compressor dim 128 coff 2, ape 1024
	// layer 2 ratio 128: wq_a 256x256, wkv 512x256, wq_b 512x256 (scales 4x2), compressor coff 1, ape 65536
	// weights: head range [0, 3) is not a non-empty range inside [0, 2) (num_attention_heads)
}
