package replay

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
)

// PoisonBF16 fills the q_lora_rank part of every synthetic fused A row: a
// quiet NaN, so a kernel that reads the latent at the wrong offset produces
// NaNs that --verify and any numeric check catch at once.
const PoisonBF16 = 0x7FC0

// Activations synthesizes one layer's inputs for tokens rows: fusedA is
// [tokens][qLoraRank+512] bf16 with the q_lora_rank part set to PoisonBF16
// and a synthetic latent in the last 512, q is [tokens][heads*512] bf16.
//
// Values are finite bf16 with varying magnitudes: each 512-value row draws a
// base exponent in [-6, 6], each 64-value group an offset in [-4, 4] (so the
// UE8M0 groups of a row get different scales), each value a jitter in
// [-2, 1], a random sign and a random 7-bit mantissa. Row t draws from
// math/rand/v2's PCG seeded with (seed, a mix of iteration, layer and t), so
// the bytes depend only on those and not on how the work is split.
func Activations(seed uint64, iteration, layer, tokens, qLoraRank, heads int) (fusedA, q []byte) {
	fusedRow := (qLoraRank + 512) * 2
	qRow := heads * 512 * 2
	fusedA = make([]byte, tokens*fusedRow)
	q = make([]byte, tokens*qRow)
	workers := min(runtime.GOMAXPROCS(0), max(1, tokens/8))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for t := w; t < tokens; t += workers {
				rng := rand.New(rand.NewPCG(seed, rowStream(iteration, layer, t)))
				f := fusedA[t*fusedRow : (t+1)*fusedRow]
				for i := 0; i < qLoraRank; i++ {
					binary.LittleEndian.PutUint16(f[2*i:], PoisonBF16)
				}
				fillRow(rng, f[2*qLoraRank:])
				for h := range heads {
					fillRow(rng, q[t*qRow+h*1024:t*qRow+(h+1)*1024])
				}
			}
		})
	}
	wg.Wait()
	return fusedA, q
}

// rowStream mixes the coordinates of a row (splitmix64 finalizer) into the
// PCG stream selector.
func rowStream(iteration, layer, row int) uint64 {
	z := uint64(iteration)<<40 ^ uint64(layer)<<24 ^ uint64(row)
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

// fillRow writes 512 bf16 values (1024 bytes).
func fillRow(rng *rand.Rand, dst []byte) {
	base := 127 + int(rng.IntN(13)) - 6
	for g := range 8 {
		exp := base + int(rng.IntN(9)) - 4
		var bits uint64
		left := 0
		for i := g * 64; i < (g+1)*64; i++ {
			if left < 10 {
				bits, left = rng.Uint64(), 64
			}
			sign := uint16(bits&1) << 15
			mant := uint16(bits>>1) & 0x7F
			e := uint16(exp + int(bits>>8&3) - 2)
			bits >>= 10
			left -= 10
			binary.LittleEndian.PutUint16(dst[2*i:], sign|e<<7|mant)
		}
	}
}

// CompressorActivations synthesizes a compressed layer's compressor
// projections for tokens rows (the projected path): k and g are
// [tokens][width] little-endian float32, K normal with a per-row power of
// two scale in [2^-2, 2^3], G normal around 0.5 with deviation 3 (logits
// far enough apart that the softmax weights differ). Row t draws from a
// stream of its own (seed, a mix of iteration, layer and t), apart from
// Activations' streams.
func CompressorActivations(seed uint64, iteration, layer, tokens, width int) (k, g []byte) {
	k, g = make([]byte, 4*tokens*width), make([]byte, 4*tokens*width)
	for t := range tokens {
		rng := rand.New(rand.NewPCG(seed^0x636f6d7072657373, rowStream(iteration, layer, t)))
		scale := math.Ldexp(1, rng.IntN(6)-2)
		for i := range width {
			o := 4 * (t*width + i)
			binary.LittleEndian.PutUint32(k[o:], math.Float32bits(float32(rng.NormFloat64()*scale)))
			binary.LittleEndian.PutUint32(g[o:], math.Float32bits(float32(rng.NormFloat64()*3+0.5)))
		}
	}
	return k, g
}
