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

// Two tokens through a 2-output bf16 projection: the float32 results of
// another accumulation order are within BoundBF16(K) * sum |x||w| of the
// reference, while reading the wrong weight row is not.
func ExampleCheckBoundF32() {
	const k = 8
	o := &gemm.BF16Operands{Rows: 2, N: 2, K: k, XStride: k, X: make([]uint16, 2*k), W: make([]uint16, 2*k)}
	for i := range k {
		o.X[i] = numerics.BF16FromF32(float32(i + 1))       // token 0: 1..8
		o.X[k+i] = numerics.BF16FromF32(-0.5)               // token 1: -0.5
		o.W[i] = numerics.BF16FromF32(0.25)                 // output 0
		o.W[k+i] = numerics.BF16FromF32(float32(i%2) - 0.5) // output 1: -0.5, 0.5, ...
	}
	y, err := gemm.ReferenceBF16(o)
	if err != nil {
		panic(err)
	}
	fmt.Println(y)
	fmt.Println(gemm.CheckBoundF32(o, y, []float32{9, 2, -1, 0}))
	fmt.Println(gemm.CheckBoundF32(o, y, []float32{2, 9, 0, -1}) != nil)
	// Output:
	// [9 2 -1 0]
	// <nil>
	// true
}
