package compressor

import (
	"encoding/binary"
	"math"

	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// This file is a slow scalar reference of DESIGN.md section 8, written
// apart from the package's code: it reads the whole sequence's projections
// (no state), lists each channel's candidates literally (absent ones as
// logit -Inf, value 0, as the design states them), and does the norm, RoPE,
// quantization and byte layout itself. It shares with the package only the
// scalar conversions numerics tests on their own (bf16, e4m3, Exp32).

type refLayer struct {
	ratio int
	norm  []float32
	eps   float32
	rope  *dsv4.RopeTable
}

// refEntries returns every entry the sequence's complete windows give.
func refEntries(l refLayer, K, G [][]float32) [][EntryBytes]byte {
	var out [][EntryBytes]byte
	for i := 0; (i+1)*l.ratio <= len(K); i++ {
		out = append(out, refEntry(l, K, G, i))
	}
	return out
}

func refEntry(l refLayer, K, G [][]float32, i int) [EntryBytes]byte {
	negInf := float32(math.Inf(-1))
	var pooled [512]float32
	for c := 0; c < 512; c++ {
		var logit, value []float32
		if l.ratio == 4 {
			for j := 0; j < 4; j++ {
				if i == 0 {
					logit, value = append(logit, negInf), append(value, 0)
				} else {
					t := (i-1)*4 + j
					logit, value = append(logit, G[t][c]), append(value, K[t][c])
				}
			}
			for j := 0; j < 4; j++ {
				t := i*4 + j
				logit, value = append(logit, G[t][512+c]), append(value, K[t][512+c])
			}
		} else {
			for j := 0; j < 128; j++ {
				t := i*128 + j
				logit, value = append(logit, G[t][c]), append(value, K[t][c])
			}
		}
		m := negInf
		for _, g := range logit {
			if g > m {
				m = g
			}
		}
		e := make([]float32, len(logit))
		var s float32
		for j, g := range logit {
			e[j] = numerics.Exp32(float32(g - m))
			s = float32(s + e[j])
		}
		var acc float32
		for j := range logit {
			w := float32(e[j] / s)
			prod := float32(w * value[j])
			acc = float32(acc + prod)
		}
		pooled[c] = acc
	}

	// bf16, then RMSNorm: 32 lanes of 16 squares, a butterfly, the scale.
	var x [512]float32
	for c := range x {
		x[c] = numerics.F32FromBF16(numerics.BF16FromF32(pooled[c]))
	}
	var lane [32]float32
	for j := range lane {
		for c := 16 * j; c < 16*j+16; c++ {
			sq := float32(x[c] * x[c])
			lane[j] = float32(lane[j] + sq)
		}
	}
	for _, d := range []int{16, 8, 4, 2, 1} {
		var next [32]float32
		for j := range lane {
			next[j] = float32(lane[j] + lane[j^d])
		}
		lane = next
	}
	mean := float32(lane[0] / 512)
	root := float32(math.Sqrt(float64(float32(mean + l.eps))))
	r := float32(1 / root)
	var y [512]float32
	for c := range y {
		xr := float32(x[c] * r)
		y[c] = numerics.F32FromBF16(numerics.BF16FromF32(float32(xr * l.norm[c])))
	}

	// RoPE at the window's first position.
	pos := i * l.ratio
	for k := 0; k < 32; k++ {
		cs, sn := l.rope.At(pos, k)
		a, b := y[448+2*k], y[448+2*k+1]
		y0 := float32(float32(a*cs) - float32(b*sn))
		y1 := float32(float32(a*sn) + float32(b*cs))
		y[448+2*k] = numerics.F32FromBF16(numerics.BF16FromF32(y0))
		y[448+2*k+1] = numerics.F32FromBF16(numerics.BF16FromF32(y1))
	}

	// UE8M0 groups of 64, then the byte layout.
	var out [EntryBytes]byte
	for g := 0; g < 7; g++ {
		var amax float32
		for _, v := range y[64*g : 64*g+64] {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax = a
			}
		}
		if amax < 1e-4 {
			amax = 1e-4
		}
		t := float32(amax / 448)
		bits := math.Float32bits(t)
		e := int(bits >> 23 & 0xFF)
		if bits&0x7FFFFF != 0 {
			e++
		}
		e = min(e, 254)
		inv := float32(math.Ldexp(1, 127-e))
		for c := 64 * g; c < 64*g+64; c++ {
			out[c] = numerics.E4M3FromF32(float32(y[c] * inv))
		}
		out[576+g] = byte(e)
	}
	for k := 0; k < 64; k++ {
		binary.LittleEndian.PutUint16(out[448+2*k:], numerics.BF16FromF32(y[448+k]))
	}
	return out
}
