package mlatest

import (
	"encoding/binary"
	"math"

	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// This file is the reference: scalar, one row at a time, every offset spelled
// out from docs/DESIGN.md sections 3 to 5. It shares only the scalar conversions
// (bf16, e4m3, which numerics tests exhaustively) with the backends.

func bf16At(p []byte, i int) float32 {
	return math.Float32frombits(uint32(binary.LittleEndian.Uint16(p[2*i:])) << 16)
}

func f32At(p []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:])) }

// refSumSquares: 32 lanes of 16 ascending squares, then the xor butterfly.
func refSumSquares(x []float32) float32 {
	lanes := make([]float32, 32)
	for j := 0; j < 32; j++ {
		for i := 16 * j; i < 16*j+16; i++ {
			sq := float32(x[i] * x[i])
			lanes[j] = float32(lanes[j] + sq)
		}
	}
	for _, d := range []int{16, 8, 4, 2, 1} {
		next := make([]float32, 32)
		for j := range lanes {
			next[j] = float32(lanes[j] + lanes[j^d])
		}
		lanes = next
	}
	return lanes[0]
}

func refRInv(x []float32, eps float32) float32 {
	s := refSumSquares(x)
	mean := float32(s / 512)
	v := float32(mean + eps)
	root := float32(math.Sqrt(float64(v)))
	return float32(1 / root)
}

func refRope(y []float32, table []byte, pos int) {
	for k := 0; k < 32; k++ {
		c := f32At(table, pos*64+2*k)
		s := f32At(table, pos*64+2*k+1)
		y0, y1 := y[448+2*k], y[448+2*k+1]
		a := float32(y0 * c)
		b := float32(y1 * s)
		e := float32(y0 * s)
		f := float32(y1 * c)
		y[448+2*k] = numerics.RoundBF16(float32(a - b))
		y[448+2*k+1] = numerics.RoundBF16(float32(e + f))
	}
}

// refKVRow computes the 512 post-norm, post-RoPE values of one latent row.
func refKVRow(latent []byte, w []byte, table []byte, pos int, eps float32) []float32 {
	x := make([]float32, 512)
	for i := range x {
		x[i] = bf16At(latent, i)
	}
	r := refRInv(x, eps)
	y := make([]float32, 512)
	for i := range y {
		y[i] = numerics.RoundBF16(float32(float32(x[i]*r) * f32At(w, i)))
	}
	refRope(y, table, pos)
	return y
}

// refStore writes one token into the pool as docs/DESIGN.md section 3 lays it out.
func refStore(pool []byte, cfg kvcache.Config, slot int64, y []float32) {
	P := int64(cfg.PageSize)
	page, off := slot/P, int(slot%P)
	switch cfg.Format {
	case kvcache.FormatFP8UE8M0:
		pageBytes := int64((584*cfg.PageSize + 575) / 576 * 576)
		base := pool[page*pageBytes:]
		vals := base[off*576:]
		scales := base[576*cfg.PageSize+off*8:]
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
			e := math.Float32bits(t) >> 23 & 0xFF
			if math.Float32bits(t)&0x7FFFFF != 0 {
				e++
			}
			if e > 254 {
				e = 254
			}
			inv := float32(math.Ldexp(1, 127-int(e)))
			scales[g] = byte(e)
			for i := 64 * g; i < 64*g+64; i++ {
				vals[i] = numerics.E4M3FromF32(float32(y[i] * inv))
			}
		}
		for i := 448; i < 512; i++ {
			binary.LittleEndian.PutUint16(vals[448+2*(i-448):], numerics.BF16FromF32(y[i]))
		}
	case kvcache.FormatBF16:
		base := pool[page*1024*P+int64(off)*1024:]
		for i := 0; i < 512; i++ {
			binary.LittleEndian.PutUint16(base[2*i:], numerics.BF16FromF32(y[i]))
		}
	case kvcache.FormatFP8PerTensor:
		base := pool[page*512*P+int64(off)*512:]
		for i := 0; i < 512; i++ {
			base[i] = numerics.E4M3FromF32(float32(y[i] * cfg.KVScale))
		}
	default:
		panic("mlatest: unknown cache format")
	}
}

// refQRow computes one (token, head) Q row's output bytes.
func refQRow(qin []byte, table []byte, pos int, eps float32, bf16Out bool, scale float32, out []byte) {
	x := make([]float32, 512)
	for i := range x {
		x[i] = bf16At(qin, i)
	}
	r := refRInv(x, eps)
	y := make([]float32, 512)
	for i := range y {
		y[i] = numerics.RoundBF16(float32(x[i] * r))
	}
	refRope(y, table, pos)
	for i, v := range y {
		if bf16Out {
			binary.LittleEndian.PutUint16(out[2*i:], numerics.BF16FromF32(v))
		} else {
			out[i] = numerics.E4M3FromF32(float32(v * scale))
		}
	}
}

// refLayer applies one layer to host copies of the outputs.
func refLayer(in *inputs, m *metadata.Metadata, cfg kvcache.Config, pool, qout []byte, bf16Q bool, qScale float32, badSlots map[int]bool) {
	es := 1
	if bf16Q {
		es = 2
	}
	for t := 0; t < m.PaddedTokens; t++ {
		_, pos, ok := m.Row(t)
		for h := 0; h < in.heads; h++ {
			out := qout[(t*in.heads+h)*512*es : (t*in.heads+h+1)*512*es]
			if !ok {
				clear(out)
				continue
			}
			row := in.qin[(t*in.heads+h)*1024:]
			refQRow(row, in.rope, pos, in.eps, bf16Q, qScale, out)
		}
		if !ok || badSlots[t] {
			continue
		}
		slot := m.Slot(t)
		if slot < 0 {
			continue
		}
		y := refKVRow(in.latent[in.latentOffset+t*in.latentStride*2:], in.weight, in.rope, pos, in.eps)
		refStore(pool, cfg, slot, y)
	}
}
