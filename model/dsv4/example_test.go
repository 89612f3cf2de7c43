package dsv4_test

import (
	"fmt"
	"log"

	"github.com/dsv4mla/prologue/model/dsv4"
)

func ExampleFlash() {
	c := dsv4.Flash()
	fmt.Println(c.Name, c.HiddenSize, c.NumLayers, c.NumHeads, c.QLoraRank)
	for _, layer := range []int{0, 2, 3, 43} {
		kind, err := c.LayerRope(layer)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("layer %d: compress_ratio %d, %v RoPE\n", layer, c.CompressRatios[layer], kind)
	}
	// Output:
	// DeepSeek-V4-Flash 4096 43 64 1024
	// layer 0: compress_ratio 0, plain RoPE
	// layer 2: compress_ratio 4, yarn RoPE
	// layer 3: compress_ratio 128, yarn RoPE
	// layer 43: compress_ratio 0, plain RoPE
}

func ExampleLoad() {
	c, err := dsv4.Load("testdata/valid/pro.json")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(c.HiddenSize, c.NumLayers, c.NumHeads, c.QLoraRank, c.KVLoraRank+c.QKRopeHeadDim)

	_, err = dsv4.Load("testdata/invalid/kv_lora_rank_v3.json")
	fmt.Println(err)
	// Output:
	// 7168 61 128 1536 512
	// testdata/invalid/kv_lora_rank_v3.json: dsv4: config field "kv_lora_rank" = 512: kv_lora_rank + qk_rope_head_dim (64) = 576, must be 512: the latent row includes its rope part
}

func ExampleNewRopeTable() {
	table, err := dsv4.NewRopeTable(dsv4.Flash(), dsv4.RopePlain, dsv4.RopeReference, 4096)
	if err != nil {
		log.Fatal(err)
	}
	cos, sin := table.At(1, 0) // pair 0 turns by one radian per position
	fmt.Println(cos, sin)
	fmt.Println(len(table.Row(1)), len(table.Bytes()))
	fmt.Println(table.CheckPosition(4096))
	// Output:
	// 0.5403023 0.84147096
	// 64 1048576
	// dsv4: position 4096 outside the plain RoPE table of 4096 positions
}

func ExampleConfig_RopeTables() {
	c := dsv4.Flash()
	set, err := c.RopeTables(dsv4.RopeReference, 1024)
	if err != nil {
		log.Fatal(err)
	}
	for _, layer := range []int{1, 2} {
		table, err := set.ForLayer(layer)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("layer %d reads the %v table\n", layer, table.Kind)
	}
	// Output:
	// layer 1 reads the plain table
	// layer 2 reads the yarn table
}
