package numerics_test

import (
	"fmt"

	"github.com/dsv4mla/prologue/numerics"
)

func ExampleE4M3FromF32() {
	for _, v := range []float32{1, 1.0625, 448, 1000, -0.001953125} {
		fmt.Printf("%g -> %#02x\n", v, numerics.E4M3FromF32(v))
	}
	// Output:
	// 1 -> 0x38
	// 1.0625 -> 0x38
	// 448 -> 0x7e
	// 1000 -> 0x7e
	// -0.001953125 -> 0x81
}

func ExampleUE8M0() {
	e, inv := numerics.UE8M0(300) // the group's largest |value|
	fmt.Println(e, inv, numerics.UE8M0Scale(e))
	// Output: 127 1 1
}

func ExampleActQuantBlock() {
	x := []float32{900, -3, 0.25} // a block's values; 900 sets the scale
	q := make([]uint8, len(x))
	scale := numerics.ActQuantBlock(x, q)
	fmt.Println(scale)
	for i := range q {
		fmt.Printf("%#02x dequantizes to %g\n", q[i], numerics.F32FromE4M3(q[i])*scale)
	}
	// Output:
	// 4
	// 0x76 dequantizes to 896
	// 0xb4 dequantizes to -3
	// 0x18 dequantizes to 0.25
}

func ExampleQuantizeMXFP4() {
	v := make([]float32, numerics.MXFP4Block) // one block; 12 sets the scale 2^1
	v[0], v[1], v[2], v[3] = 12, -1, 0.5, 5   // 0.5 and 5 scale to the ties 0.25 and 2.5
	dst := make([]byte, numerics.MXFP4Block/2+1)
	numerics.QuantizeMXFP4(dst, v)
	fmt.Printf("nibbles % x, scale byte %d\n", dst[:2], dst[numerics.MXFP4Block/2])
	back := make([]float32, numerics.MXFP4Block)
	numerics.DequantizeMXFP4(back, dst)
	fmt.Println(back[:4])
	// Output:
	// nibbles 97 40, scale byte 128
	// [12 -1 0 4]
}

func ExampleHadamard128() {
	src := make([]uint16, numerics.HadamardDim)
	src[1] = numerics.BF16FromF32(1) // a unit vector: every output is ±c
	dst := make([]uint16, numerics.HadamardDim)
	numerics.Hadamard128(dst, src)
	for _, b := range dst[:4] {
		fmt.Printf("%.6f ", numerics.F32FromBF16(b))
	}
	fmt.Println()
	// Output: 0.088379 -0.088379 0.088379 -0.088379
}
