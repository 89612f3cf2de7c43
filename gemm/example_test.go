package gemm_test

import (
	"fmt"

	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// One token, one 128x128 weight block: every activation 1.0 (e4m3 0x38)
// with scale 1/2, every weight 0.5 (0x30) with scale 2, so each output is
// 128 x 0.5 x 1 = 64.
func ExampleReference() {
	x := &gemm.Activations{Rows: 1, K: 128, ScaleStride: 1, Data: make([]byte, 128), Scale: []float32{0.5}}
	w := &weights.FP8Matrix{N: 128, K: 128, Data: make([]byte, 128*128), Scale: []float32{2}}
	for i := range x.Data {
		x.Data[i] = 0x38
	}
	for i := range w.Data {
		w.Data[i] = 0x30
	}
	y, err := gemm.Reference(x, w)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(y), numerics.F32FromBF16(y[0]), numerics.F32FromBF16(y[127]))
	// A GPU result one bf16 ulp away is within the bound.
	got := append([]uint16(nil), y...)
	got[5]++
	fmt.Println(gemm.CheckBound(x, w, y, got))
	// Output:
	// 128 64 64
	// <nil>
}
