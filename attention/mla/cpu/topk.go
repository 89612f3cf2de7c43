package cpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"golang.org/x/sync/errgroup"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/numerics"
)

// The indexer's top-k selection on the host (DESIGN.md section 9,
// "Selection"): the score in the contract's fixed order, a radix select
// over the scores' keys (mla.TopKKey), the selected indices ascending.

const (
	ixHeads = mla.IndexerHeads
	ixDim   = mla.IndexerDim
	ixBlock = numerics.MXFP4Block
	ixBlks  = ixDim / ixBlock
)

// e2m1Doubled is twice the value of each e2m1 nibble (bit 3 the sign):
// small integers, so a block's dot product is an exact int32.
var e2m1Doubled = func() (t [16]int8) {
	for n := range t {
		t[n] = int8(2 * numerics.E2M1Value(uint8(n)))
	}
	return t
}()

// decodeMXFP4Row writes the doubled e2m1 values of one 68-byte row into v
// and its four scale bytes into e.
func decodeMXFP4Row(v *[ixDim]int8, e *[ixBlks]uint8, row []byte) {
	for k := range ixDim / 2 {
		b := row[k]
		v[2*k] = e2m1Doubled[b&0xF]
		v[2*k+1] = e2m1Doubled[b>>4]
	}
	copy(e[:], row[ixDim/2:mla.IndexerEntryBytes])
}

// topkBlockPartial is one block's exact dot product d of doubled values
// (so 4 times the e2m1 product sum) times its two scales 2^(eq-127) and
// 2^(ek-127), x = eq+ek-256: exact in float64, rounded once to float32.
func topkBlockPartial(d int32, x int) float32 {
	return float32(float64(d) * math.Ldexp(1, x))
}

// topkQuery is one query token's decoded rows and head weights.
type topkQuery struct {
	v [ixHeads][ixDim]int8
	e [ixHeads][ixBlks]uint8
	w [ixHeads]float32
}

// topkScore is I = sum_h w[h] * relu(dot(q[h], k)) in the contract's
// order: each head's dot is ((P0 + P1) + P2) + P3 over its block partials,
// relu keeps it when > 0 (else +0), then fl(w*r) added to the running sum
// from +0 in ascending h; every product and sum rounded to float32 on its
// own (the conversions keep the compiler from fusing them).
func topkScore(q *topkQuery, k *[ixDim]int8, ke *[ixBlks]uint8) float32 {
	var score float32
	for h := range ixHeads {
		qv := &q.v[h]
		var dot float32
		for b := range ixBlks {
			var d int32
			qs, ks := qv[b*ixBlock:(b+1)*ixBlock], k[b*ixBlock:(b+1)*ixBlock]
			for i := range qs {
				d += int32(qs[i]) * int32(ks[i])
			}
			p := topkBlockPartial(d, int(q.e[h][b])+int(ke[b])-256)
			if b == 0 {
				dot = p
			} else {
				dot = float32(dot + p)
			}
		}
		if !(dot > 0) {
			dot = 0
		}
		score = float32(score + float32(q.w[h]*dot))
	}
	return score
}

// topkSelect writes the indices of the len(out) largest keys (ties: the
// lower index) in ascending order into out, padded with -1 when fewer
// keys are given. It finds the threshold key byte by byte from the top
// (the rank-len(out) key), then takes every key above it and the first
// ones equal to it.
func topkSelect(keys []uint32, out []int32) {
	k := len(out)
	if len(keys) <= k {
		for i := range out {
			out[i] = -1
			if i < len(keys) {
				out[i] = int32(i)
			}
		}
		return
	}
	var prefix, mask uint32
	remain := k // the keys still to take at or below the prefix
	var hist [256]int
	for shift := 24; shift >= 0; shift -= 8 {
		clear(hist[:])
		for _, v := range keys {
			if v&mask == prefix {
				hist[v>>shift&0xFF]++
			}
		}
		bin := 255
		for ; bin > 0 && hist[bin] < remain; bin-- {
			remain -= hist[bin]
		}
		prefix |= uint32(bin) << shift
		mask |= 0xFF << shift
	}
	o := 0
	for i, v := range keys {
		if v > prefix || (v == prefix && remain > 0) {
			if v == prefix {
				remain--
			}
			out[o] = int32(i)
			o++
		}
	}
}

// topkRowsPerTask bounds the rows of one task: the rows of a sequence
// share its decoded keys, and a long prefill still spreads over the
// workers.
const topkRowsPerTask = 8

// IndexerTopK implements mla.TopKSelector on the host: rows are resolved
// from the encoded plan as the device does (mla.ResolveTopKRow), so a
// plan the encoder would refuse behaves the same on both backends. The
// work is spread over the workers by sequence, a long sequence's rows in
// chunks.
func (c *Backend) IndexerTopK(ctx context.Context, a *mla.TopKArgs) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, b := range []mla.Buffer{a.Q, a.W, a.Cache, a.Plan, a.Scratch, a.Out} {
		if b == nil {
			continue
		}
		if _, ok := b.(*Buffer); !ok {
			return fmt.Errorf("cpu: indexer top-k: buffer of type %T is not a CPU buffer", b)
		}
	}
	planBytes := Bytes(a.Plan)[a.PlanOffset : a.PlanOffset+a.PlanBytes()]
	words := make([]int32, len(planBytes)/4)
	for i := range words {
		words[i] = int32(binary.LittleEndian.Uint32(planBytes[4*i:]))
	}
	rows := make([]mla.TopKRow, a.Rows)
	for r := range rows {
		rows[r] = mla.ResolveTopKRow(words, &a.TopKShape, r)
	}
	var out []byte
	if a.Rows > 0 {
		out = Bytes(a.Out)
	}
	// Tasks: runs of at most topkRowsPerTask consecutive rows of one
	// sequence (padding rows alone).
	type task struct{ lo, hi int }
	var tasks []task
	for r := 0; r < a.Rows; {
		hi := r + 1
		for hi < a.Rows && hi-r < topkRowsPerTask && rows[r].Valid && rows[hi].Valid && rows[hi].Seq == rows[r].Seq {
			hi++
		}
		tasks = append(tasks, task{r, hi})
		r = hi
	}
	var g errgroup.Group
	g.SetLimit(c.workers)
	for _, t := range tasks {
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			c.topkTask(a, words, rows, t.lo, t.hi, out)
			return nil
		})
	}
	return g.Wait()
}

// topkTask selects rows [lo, hi), all of one sequence or one padding row.
func (c *Backend) topkTask(a *mla.TopKArgs, words []int32, rows []mla.TopKRow, lo, hi int, out []byte) {
	idx := make([]int32, a.TopK)
	write := func(r int) {
		o := out[4*r*a.TopK : 4*(r+1)*a.TopK]
		for i, v := range idx {
			binary.LittleEndian.PutUint32(o[4*i:], uint32(v))
		}
	}
	// The entries the task's rows score: the most any of them sees.
	n := 0
	for r := lo; r < hi; r++ {
		if rows[r].Valid && rows[r].Visible > a.TopK {
			n = max(n, rows[r].Visible)
		}
	}
	var keysV [][ixDim]int8
	var keysE [][ixBlks]uint8
	var keyOK []bool
	if n > 0 {
		cache, pageBytes := Bytes(a.Cache), a.PageBytes()
		keysV, keysE, keyOK = make([][ixDim]int8, n), make([][ixBlks]uint8, n), make([]bool, n)
		for s := range n {
			pg := mla.TopKPage(words, &a.TopKShape, rows[lo].Seq, s)
			if pg < 0 {
				continue
			}
			o := pg*pageBytes + s%a.PageSize*mla.IndexerEntryBytes
			decodeMXFP4Row(&keysV[s], &keysE[s], cache[o:o+mla.IndexerEntryBytes])
			keyOK[s] = true
		}
	}
	var q topkQuery
	var keys []uint32
	for r := lo; r < hi; r++ {
		t := rows[r]
		if !t.Valid || t.Visible <= a.TopK {
			vis := 0
			if t.Valid {
				vis = t.Visible
			}
			topkSelect(make([]uint32, vis), idx)
			write(r)
			continue
		}
		qb := Bytes(a.Q)[r*ixHeads*mla.IndexerEntryBytes:]
		wb := Bytes(a.W)[r*ixHeads*2:]
		for h := range ixHeads {
			decodeMXFP4Row(&q.v[h], &q.e[h], qb[h*mla.IndexerEntryBytes:])
			q.w[h] = numerics.F32FromBF16(binary.LittleEndian.Uint16(wb[2*h:]))
		}
		if cap(keys) < t.Visible {
			keys = make([]uint32, t.Visible)
		}
		keys = keys[:t.Visible]
		for s := range keys {
			keys[s] = 0 // an entry without a page scores NaN
			if keyOK[s] {
				keys[s] = mla.TopKKey(topkScore(&q, &keysV[s], &keysE[s]))
			}
		}
		topkSelect(keys, idx)
		write(r)
	}
}

var _ mla.TopKSelector = (*Backend)(nil)
