package mlatest

import (
	"encoding/binary"
	"math"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// The reference of one compressor step (DESIGN.md section 8 and the doc of
// mla.CompressStepArgs), scalar and one entry at a time. It shares nothing
// with package compressor: the pooling is spelled out here from the text,
// the entry's norm, RoPE and UE8M0 bytes are this package's KV reference
// (refKVRow, refStore), and only the scalar conversions and Exp32 (part of
// the contract) come from numerics.

// compressHost holds the host copies of a CompressStepArgs' buffers.
type compressHost struct {
	ratio      int
	kg         []float32 // KGRows rows of 2*width: K then G
	ape        []float32 // [ratio][width], nil when G already includes ape
	ring       []float32 // slots x ringRows rows of 2*width
	ringRows   int
	plan       *mla.CompressPlan
	normWeight []byte // dim float32
	// indexer selects the indexer's entries (DESIGN.md section 9): rows of
	// 128 channels a half, 68-byte MXFP4 entries; else the main
	// compressor's 512 channels and 584-byte fp8_ue8m0 entries.
	indexer bool
	// keysPre, when not nil, receives each indexer entry's key before the
	// Hadamard (refIndexerKey), by entry index.
	keysPre  map[int][]float32
	eps      float32
	rope     []byte // [positions][32]{cos, sin} float32
	pool     []byte
	pageSize int
}

// coff is the number of r-token windows an entry reads.
func refOverlap(ratio int) int {
	if ratio == 4 {
		return 2
	}
	return 1
}

func (h *compressHost) width() int { return refOverlap(h.ratio) * h.dim() }

// dim is the channels of one pooled row.
func (h *compressHost) dim() int {
	if h.indexer {
		return 128
	}
	return 512
}

// pageBytes is one pool page.
func (h *compressHost) pageBytes() int {
	if h.indexer {
		return 68 * h.pageSize
	}
	return kvcache.FormatFP8UE8M0.PageBytes(h.pageSize)
}

// refCompressStep returns the ring and the pool after the step.
func refCompressStep(h *compressHost) (ring []float32, pool []byte) {
	w, dim := h.width(), h.dim()
	before := h.ring // every read sees the ring before the step
	ring = append([]float32(nil), h.ring...)
	pool = append([]byte(nil), h.pool...)

	// row returns position p's K and G (ape added) for plan sequence s.
	row := func(s mla.CompressPlanSeq, p int) (k, g []float32) {
		if p < s.Start {
			base := (s.From*h.ringRows + p%h.ringRows) * 2 * w
			return before[base : base+w], before[base+w : base+2*w]
		}
		base := (s.Row + p - s.Start) * 2 * w
		k = h.kg[base : base+w]
		g = make([]float32, w)
		copy(g, h.kg[base+w:base+2*w])
		if h.ape != nil {
			a := h.ape[(p%h.ratio)*w:]
			for c := range g {
				g[c] = float32(g[c] + a[c])
			}
		}
		return k, g
	}

	cfg := kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: h.pageSize}
	for _, j := range h.plan.Jobs {
		s := h.plan.Seqs[j.Seq]
		// Candidates in the order of section 8: ratio 4, the previous
		// window's four tokens (columns [0, dim), absent for entry 0:
		// logit -Inf, value 0) then the current window's four (columns
		// [dim, 2*dim)); ratio 128, the window's 128 tokens.
		type cand struct {
			k, g []float32 // the channel's value and logit are k[c], g[c]
		}
		var cands []cand
		absent := 0
		if h.ratio == 4 {
			for t := 0; t < 4; t++ {
				if j.Index == 0 {
					absent++
					continue
				}
				k, g := row(s, (j.Index-1)*4+t)
				cands = append(cands, cand{k[:dim], g[:dim]})
			}
			for t := 0; t < 4; t++ {
				k, g := row(s, j.Index*4+t)
				cands = append(cands, cand{k[dim:], g[dim:]})
			}
		} else {
			for t := 0; t < h.ratio; t++ {
				k, g := row(s, j.Index*h.ratio+t)
				cands = append(cands, cand{k, g})
			}
		}
		logits := make([]float32, absent+len(cands))
		values := make([]float32, absent+len(cands))
		for i := 0; i < absent; i++ {
			logits[i] = float32(math.Inf(-1))
		}
		latent := make([]byte, 2*dim)
		pooled := make([]float32, dim)
		for c := 0; c < dim; c++ {
			for i, cd := range cands {
				logits[absent+i], values[absent+i] = cd.g[c], cd.k[c]
			}
			pooled[c] = refSoftmaxPool(logits, values)
			binary.LittleEndian.PutUint16(latent[2*c:], numerics.BF16FromF32(pooled[c]))
		}
		if h.indexer {
			e := refIndexerEntry(pooled, h.normWeight, h.rope, j.Index*h.ratio, h.eps)
			copy(pool[j.Page*h.pageBytes()+j.Offset*68:], e)
			if h.keysPre != nil {
				h.keysPre[j.Index] = refIndexerKey(pooled, h.normWeight, h.rope, j.Index*h.ratio, h.eps)
			}
			continue
		}
		y := refKVRow(latent, h.normWeight, h.rope, j.Index*h.ratio, h.eps)
		refStore(pool, cfg, int64(j.Page)*int64(h.pageSize)+int64(j.Offset), y)
	}

	for _, s := range h.plan.Seqs {
		end := s.Start + s.Rows
		lo := max(s.Start, end-h.ringRows)
		if s.To != s.From {
			lo = max(0, end-h.ringRows)
		}
		for p := lo; p < end; p++ {
			k, g := row(s, p)
			base := (s.To*h.ringRows + p%h.ringRows) * 2 * w
			copy(ring[base:base+w], k)
			copy(ring[base+w:base+2*w], g)
		}
	}
	return ring, pool
}

// refSoftmaxPool is one channel's softmax-weighted sum, section 8's loops
// in their order: m = max (a NaN logit never wins the comparison),
// e_j = exp(fl(G_j - m)), s = sum e_j ascending, E = sum fl(fl(e_j/s)*K_j)
// ascending, every sum starting from +0.
func refSoftmaxPool(logits, values []float32) float32 {
	m := float32(math.Inf(-1))
	for _, g := range logits {
		if g > m {
			m = g
		}
	}
	e := make([]float32, len(logits))
	var s float32
	for j, g := range logits {
		e[j] = numerics.Exp32(float32(g - m))
		s = float32(s + e[j])
	}
	var acc float32
	for j := range logits {
		q := float32(e[j] / s)
		acc = float32(acc + float32(q*values[j]))
	}
	return acc
}
