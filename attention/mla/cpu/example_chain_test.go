package cpu_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/numerics"
)

// q_norm fused with act_quant on two rows of q_lora_rank = 1024 values read
// from the fused [q_lora_rank + 512] projection output: FP8 values and one
// scale per 128-block, the block scales of both rows side by side.
func ExampleBackend_NormQuant() {
	const rows, qLora = 2, 1024
	b := cpu.New(0)
	alloc := func(n int) mla.Buffer { buf, _ := b.Alloc(n); return buf }
	x := alloc(rows * (qLora + 512) * 2)
	for r := 0; r < rows; r++ {
		for i := 0; i < qLora; i++ { // row r holds the values r+1 everywhere
			binary.LittleEndian.PutUint16(cpu.Bytes(x)[2*(r*(qLora+512)+i):], numerics.BF16FromF32(float32(r+1)))
		}
	}
	w := alloc(qLora * 4)
	for i := 0; i < qLora; i++ {
		binary.LittleEndian.PutUint32(cpu.Bytes(w)[4*i:], math.Float32bits(float32(1+i/128)))
	}
	out := mla.FP8Activations{Rows: rows, K: qLora, Data: alloc(rows * qLora), Scale: alloc(qLora / 128 * rows * 4), ScaleStride: rows}
	err := b.NormQuant(context.Background(), &mla.NormQuantArgs{X: x, XStride: qLora + 512, Weight: w, Eps: 1e-6, Out: out})
	if err != nil {
		panic(err)
	}
	data, scale := cpu.Bytes(out.Data), cpu.Bytes(out.Scale)
	for blk := 0; blk < 3; blk++ {
		s := math.Float32frombits(binary.LittleEndian.Uint32(scale[4*(blk*rows):]))
		v := numerics.F32FromE4M3(data[blk*128])
		fmt.Printf("block %d: scale %g, value %g x %g = %g\n", blk, s, v, s, v*s)
	}
	// Output:
	// block 0: scale 0.00390625, value 256 x 0.00390625 = 1
	// block 1: scale 0.0078125, value 256 x 0.0078125 = 2
	// block 2: scale 0.0078125, value 384 x 0.0078125 = 3
}
