package mlatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/numerics"
)

// The chain's bit-exact steps (DESIGN.md section 7 steps 1 and 3): act_quant
// and q_norm fused with act_quant. The reference below is written from the
// design text, scalar and in float64 wherever the result is exact; it
// shares only the bf16 and e4m3 conversions with the backends.

// QuantBackend is a backend with the chain's two bit-exact kernels (the
// ActQuant and NormQuant methods of mla.ChainBackend).
type QuantBackend interface {
	mla.Backend
	ActQuant(ctx context.Context, a *mla.ActQuantArgs) error
	NormQuant(ctx context.Context, a *mla.NormQuantArgs) error
}

// QuantShape is one call shape of the chain kernels' suite.
type QuantShape struct {
	Name        string
	Rows, K     int
	XOffset     int // bytes
	XStride     int // elements
	ScaleStride int
	Eps         float32 // NormQuant
	Special     bool    // rows with NaN, Inf, huge, subnormal, zero and edge values
}

// QuantShapes lists the shapes every backend must pass: each width the
// chain meets (one block, V4-Flash's and V4-Pro's q_lora_rank and hidden
// sizes) at 1, 2, 33 and 300 rows, dense, and strided as q_norm reads the
// fused [q_lora_rank + 512] row, with padded scale columns and special rows.
func QuantShapes() []QuantShape {
	var out []QuantShape
	for _, k := range []int{128, 1024, 1536, 4096, 7168} {
		for _, rows := range []int{1, 2, 33, 300} {
			if rows == 300 && k > 1024 && race.Enabled {
				continue // big-dimension: .ci/run's non-race step runs it; K 128 and 1024 keep 300 rows under -race
			}
			out = append(out,
				QuantShape{Name: fmt.Sprintf("K%d/rows%d/dense", k, rows), Rows: rows, K: k, XStride: k, ScaleStride: rows, Eps: 1e-6},
				QuantShape{Name: fmt.Sprintf("K%d/rows%d/strided-special", k, rows), Rows: rows, K: k,
					XOffset: 48, XStride: k + 520, ScaleStride: rows + 3, Eps: 1e-5, Special: true},
			)
		}
	}
	return out
}

// quantCase is a shape with concrete inputs and poisoned outputs.
type quantCase struct {
	s                 QuantShape
	x                 []byte // the whole X buffer
	weight            []byte // NormQuant: K float32
	data, scale       []byte // poison of the output buffers
	dataLen, scaleLen int
}

func newQuantCase(s QuantShape, seed uint64) *quantCase {
	r := rand.New(rand.NewPCG(seed, 0x5bd1e995))
	c := &quantCase{s: s}
	c.x = make([]byte, s.XOffset+((s.Rows-1)*s.XStride+s.K)*2+64)
	for i := 0; i < len(c.x); i += 2 { // gaps between rows and the tail too: none may be read
		binary.LittleEndian.PutUint16(c.x[i:], uint16(r.Uint32()))
	}
	for row := 0; row < s.Rows; row++ {
		vals := c.x[s.XOffset+2*row*s.XStride:][:2*s.K]
		quantRandomRow(r, vals)
		if s.Special && row%3 == 1 {
			quantSpecialRow(r, vals, row/3)
		}
	}
	c.weight = make([]byte, 4*s.K)
	for i := 0; i < s.K; i++ {
		w := float32(1 + 0.5*r.NormFloat64())
		switch r.IntN(50) {
		case 0:
			w = 0
		case 1:
			w = -w
		}
		binary.LittleEndian.PutUint32(c.weight[4*i:], math.Float32bits(w))
	}
	tuneWeights(r, c, s)
	c.dataLen = s.Rows*s.K + 48
	c.scaleLen = ((s.K/128-1)*s.ScaleStride+s.Rows)*4 + 20
	c.data = make([]byte, c.dataLen)
	c.scale = make([]byte, c.scaleLen)
	for i := range c.data {
		c.data[i] = byte(r.Uint32())
	}
	for i := range c.scale {
		c.scale[i] = byte(r.Uint32())
	}
	return c
}

// quantRandomRow fills a row with bf16 values whose magnitude changes per
// 128-block (so the scales span a wide range) with occasional outliers.
func quantRandomRow(r *rand.Rand, row []byte) {
	var mag float64
	for i := 0; i < len(row)/2; i++ {
		if i%128 == 0 {
			mag = math.Ldexp(1, r.IntN(48)-24)
		}
		v := float32(r.NormFloat64() * mag)
		if r.IntN(64) == 0 {
			v *= 300
		}
		binary.LittleEndian.PutUint16(row[2*i:], uint16(math.Float32bits(v)>>16))
	}
}

// quantSpecialRow plants non-finite, extreme and boundary values.
func quantSpecialRow(r *rand.Rand, row []byte, kind int) {
	n := len(row) / 2
	put := func(i int, bits uint16) { binary.LittleEndian.PutUint16(row[2*i:], bits) }
	fill := func(f func(i int) uint16) {
		for i := 0; i < n; i++ {
			put(i, f(i))
		}
	}
	switch kind % 12 {
	case 0:
		put(r.IntN(n), 0x7FC0) // NaN: act_quant ignores it in the block maximum
	case 1, 2:
		// ±Inf: that block's exponent clamps to 254 and its inverse scale
		// is 2^-127, a subnormal: huge finite neighbours must still come
		// out non-zero (a flush-to-zero would make them 0).
		i := r.IntN(n)
		put(i, 0x7F80|uint16(kind%12-1)<<15)
		blk := i / 128 * 128
		put(blk+(i+1)%128, 0x7F00)   // 2^127 -> 1
		put(blk+(i+2)%128, 0xFE00)   // -2^125 -> -0.25
		put(blk+(i+3)%128, 0x7C00+1) // 2^121 * 1.0078 -> 2^-6, the smallest normal e4m3
	case 3:
		fill(func(int) uint16 { return 0 }) // all zeros: the 1e-4 floor (and eps) decide
	case 4:
		fill(func(int) uint16 { return 0x8000 }) // all -0
	case 5:
		fill(func(i int) uint16 { return 0x7F7F | uint16(i%2)<<15 }) // ±largest finite: squares overflow
	case 6:
		fill(func(int) uint16 { return uint16(1+r.IntN(0x7F)) | uint16(r.IntN(2))<<15 }) // subnormals
	case 7:
		put(r.IntN(n), 0x7F7F) // one huge value among ordinary ones
	case 8:
		put(r.IntN(n), 0x5E5E) // one value near 4e18: its square is finite and dominates
	case 9:
		// Block maxima exactly at 448*2^k (no ceil) or one bf16 above (ceil).
		for b := 0; b < n/128; b++ {
			v := float32(448 * math.Ldexp(1, r.IntN(60)-30))
			bits := uint16(math.Float32bits(v) >> 16)
			for i := b * 128; i < (b+1)*128; i++ {
				put(i, uint16(math.Float32bits(float32(r.Float64()*float64(v)*0.9))>>16))
			}
			put(b*128+r.IntN(128), bits+uint16(b%2)|uint16(r.IntN(2))<<15)
		}
	case 10:
		// Block maxima around the 1e-4 floor.
		floor := uint16(math.Float32bits(1e-4) >> 16)
		for b := 0; b < n/128; b++ {
			for i := b * 128; i < (b+1)*128; i++ {
				put(i, floor-uint16(r.IntN(8)))
			}
			put(b*128+r.IntN(128), floor+uint16(r.IntN(3)))
		}
	case 11:
		put(r.IntN(n), 0xFFC0) // negative NaN and a NaN with a payload
		put(r.IntN(n), 0x7F81)
	}
}

// refQuantBlock is act_quant of one block: the scale from a float64 max and
// the exponent of t = fl(a/448) by math.Frexp; each value divided by the
// scale in float64 (exact: the scale is a power of two) and rounded once to
// float32, then to e4m3.
func refQuantBlock(y []float32, q []byte) float32 {
	var amax float64
	for _, v := range y {
		if a := math.Abs(float64(v)); a > amax { // false for NaN
			amax = a
		}
	}
	amax = max(amax, float64(float32(1e-4)))
	t := float32(float32(amax) / 448)
	e := 254
	if !math.IsInf(float64(t), 1) {
		frac, exp := math.Frexp(float64(t)) // t = frac * 2^exp, frac in [0.5, 1)
		if frac == 0.5 {
			e = 127 + exp - 1
		} else {
			e = 127 + exp
		}
		e = min(e, 254)
	}
	s := math.Ldexp(1, e-127)
	for i, v := range y {
		q[i] = numerics.E4M3FromF32(float32(float64(v) / s))
	}
	return float32(s)
}

// refNormRow is q_norm of one row: the canonical sum of squares (32 lanes
// of K/32 ascending squares, then the xor butterfly), the inverse RMS, and
// y = bf16(fl(fl(x*r)*w)).
func refNormRow(x, w []float32, eps float32) []float32 {
	r := refRMSInvK(x, eps)
	y := make([]float32, len(x))
	for i := range y {
		y[i] = numerics.RoundBF16(float32(float32(x[i]*r) * w[i]))
	}
	return y
}

// refRMSInvK is r = fl(1/fl(sqrt(fl(fl(S/K) + eps)))) with S summed in the
// canonical order.
func refRMSInvK(x []float32, eps float32) float32 {
	k := len(x)
	lanes := make([]float32, 32)
	for j := range lanes {
		for i := j * k / 32; i < (j+1)*k/32; i++ {
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
	mean := float32(lanes[0] / float32(k))
	v := float32(mean + eps)
	root := float32(math.Sqrt(float64(v)))
	return float32(1 / root)
}

// tuneWeights makes the norm's output bytes depend on the last bit of r in
// some rows. A rounding of r one ulp off (another summation order, a fused
// multiply-add) usually vanishes in the bf16 and e4m3 roundings that
// follow; here the weights of each block are chosen, for one "tuned" row,
// so that fl(fl(x*r)*w) lands on (or one ulp past) the bf16 midpoint just
// above an e4m3 tie whose even neighbour is the lower one: the exact r
// gives the lower code (or the upper), and a product one ulp larger or
// smaller flips the byte. One element per block (the largest |x*r|) gets a
// weight that makes it the block's maximum, which fixes the scale.
func tuneWeights(r *rand.Rand, c *quantCase, s QuantShape) {
	var tuned []int // rows whose r is known exactly; not special rows
	for row := 0; row < s.Rows && len(tuned) < 8; row++ {
		if !(s.Special && row%3 == 1) && (row%3 == 2 || s.Rows < 3) {
			tuned = append(tuned, row)
		}
	}
	if len(tuned) == 0 {
		return
	}
	setW := func(i int, w float32) { binary.LittleEndian.PutUint32(c.weight[4*i:], math.Float32bits(w)) }
	for b := 0; b < s.K/128; b++ {
		row := tuned[b%len(tuned)]
		x := make([]float32, s.K)
		for i := range x {
			x[i] = bf16At(c.x[s.XOffset+2*row*s.XStride:], i)
		}
		rinv := refRMSInvK(x, s.Eps)
		m := make([]float64, 128)
		anchor := 0
		for i := range m {
			m[i] = float64(float32(x[128*b+i] * rinv))
			if math.Abs(m[i]) > math.Abs(m[anchor]) {
				anchor = i
			}
		}
		if m[anchor] == 0 || math.IsInf(m[anchor], 0) || math.IsNaN(m[anchor]) {
			continue
		}
		wa := float32(4.4)
		setW(128*b+anchor, wa)
		ya := numerics.RoundBF16(float32(float32(m[anchor]) * wa))
		_, invF := numerics.UE8M0(float32(math.Abs(float64(ya))))
		inv := float64(invF)
		for i := range m {
			if i == anchor || m[i] == 0 {
				continue
			}
			z := math.Abs(m[i]) * (0.5 + 1.5*r.Float64()) * inv // the scaled value to aim near
			if z < math.Ldexp(1, -6) {
				continue // e4m3 subnormal range: leave the random weight
			}
			_, e := math.Frexp(z)
			step := math.Ldexp(1, e-1-3) // e4m3 spacing in [2^(e-1), 2^e)
			k := 2 * math.Floor(z/step/2)
			tie := (k + 0.5) * step / inv // the bf16 value y that is an e4m3 tie (even code below)
			_, et := math.Frexp(tie)
			mid := math.Copysign(tie+math.Ldexp(1, et-1-8), m[i]) // the bf16 midpoint above it
			target := float32(mid)
			if r.IntN(2) == 0 {
				target = math.Nextafter32(target, float32(math.Copysign(math.Inf(1), mid)))
			}
			w := float32(mid / m[i])
			for d := 0; d < 8 && float32(float32(m[i])*w) != target; d++ {
				if math.Abs(float64(float32(float32(m[i])*w))) < math.Abs(float64(target)) {
					w = math.Nextafter32(w, float32(math.Inf(1)))
				} else {
					w = math.Nextafter32(w, 0)
				}
			}
			setW(128*b+i, w)
		}
	}
}

// expected returns the output buffers after the call: the poison with every
// row's values and scales written.
func (c *quantCase) expected(norm bool) (data, scale []byte) {
	s := c.s
	data = append([]byte(nil), c.data...)
	scale = append([]byte(nil), c.scale...)
	w := make([]float32, s.K)
	for i := range w {
		w[i] = f32At(c.weight, i)
	}
	for row := 0; row < s.Rows; row++ {
		x := make([]float32, s.K)
		for i := range x {
			x[i] = bf16At(c.x[s.XOffset+2*row*s.XStride:], i)
		}
		if norm {
			x = refNormRow(x, w, s.Eps)
		}
		for b := 0; b < s.K/128; b++ {
			sc := refQuantBlock(x[128*b:128*(b+1)], data[row*s.K+128*b:])
			binary.LittleEndian.PutUint32(scale[4*(b*s.ScaleStride+row):], math.Float32bits(sc))
		}
	}
	return data, scale
}

// quantBuffers are a call's device buffers.
type quantBuffers struct {
	b                 mla.Backend
	x, w, data, scale mla.Buffer
	all               []mla.Buffer
}

func (c *quantCase) upload(b mla.Backend) (*quantBuffers, error) {
	qb := &quantBuffers{b: b}
	for _, u := range []struct {
		dst  *mla.Buffer
		data []byte
	}{{&qb.x, c.x}, {&qb.w, c.weight}, {&qb.data, c.data}, {&qb.scale, c.scale}} {
		buf, err := b.Alloc(len(u.data))
		if err != nil {
			qb.free()
			return nil, err
		}
		qb.all = append(qb.all, buf)
		*u.dst = buf
		if err := b.Write(buf, 0, u.data); err != nil {
			qb.free()
			return nil, err
		}
	}
	return qb, nil
}

func (qb *quantBuffers) free() {
	for _, buf := range qb.all {
		_ = qb.b.Free(buf)
	}
}

func (c *quantCase) out(qb *quantBuffers) mla.FP8Activations {
	return mla.FP8Activations{Rows: c.s.Rows, K: c.s.K, Data: qb.data, Scale: qb.scale, ScaleStride: c.s.ScaleStride}
}

func (c *quantCase) actArgs(qb *quantBuffers) *mla.ActQuantArgs {
	return &mla.ActQuantArgs{X: qb.x, XOffset: c.s.XOffset, XStride: c.s.XStride, Out: c.out(qb)}
}

func (c *quantCase) normArgs(qb *quantBuffers) *mla.NormQuantArgs {
	return &mla.NormQuantArgs{X: qb.x, XOffset: c.s.XOffset, XStride: c.s.XStride, Weight: qb.w, Eps: c.s.Eps, Out: c.out(qb)}
}

// readBack returns the three buffers a call may touch (X must not change).
func (qb *quantBuffers) readBack(c *quantCase) (x, data, scale []byte, err error) {
	if err = qb.b.Synchronize(context.Background()); err != nil {
		return
	}
	x, data, scale = make([]byte, len(c.x)), make([]byte, c.dataLen), make([]byte, c.scaleLen)
	for _, r := range []struct {
		dst []byte
		src mla.Buffer
	}{{x, qb.x}, {data, qb.data}, {scale, qb.scale}} {
		if err = qb.b.Read(r.dst, r.src, 0); err != nil {
			return
		}
	}
	return
}

// compare reports the differing bytes of a call's outputs, up to a limit.
func (c *quantCase) compare(gotX, gotData, gotScale, wantData, wantScale []byte) error {
	s := c.s
	var diffs []string
	n := 0
	add := func(msg string) {
		if n < 8 {
			diffs = append(diffs, msg)
		}
		n++
	}
	for i := range c.x {
		if gotX[i] != c.x[i] {
			add(fmt.Sprintf("X byte %d changed: %#02x, was %#02x", i, gotX[i], c.x[i]))
		}
	}
	for i := range wantData {
		if gotData[i] != wantData[i] {
			where := "past the last row (must stay poison)"
			if i < s.Rows*s.K {
				where = fmt.Sprintf("row %d value %d (block %d)", i/s.K, i%s.K, i%s.K/128)
			}
			add(fmt.Sprintf("Data byte %d, %s: got %#02x want %#02x", i, where, gotData[i], wantData[i]))
		}
	}
	for i := 0; i < len(wantScale); i += 4 {
		g, w := binary.LittleEndian.Uint32(gotScale[i:]), binary.LittleEndian.Uint32(wantScale[i:])
		if g != w {
			j := i / 4
			where := fmt.Sprintf("block %d row %d", j/s.ScaleStride, j%s.ScaleStride)
			if j%s.ScaleStride >= s.Rows || j/s.ScaleStride >= s.K/128 {
				where += " (padding: must stay poison)"
			}
			add(fmt.Sprintf("Scale entry %d, %s: got %#08x (%g) want %#08x (%g)", j, where,
				g, math.Float32frombits(g), w, math.Float32frombits(w)))
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%s: %d differences; first:\n  %s", s.Name, n, strings.Join(diffs, "\n  "))
}

// CheckQuant runs one shape on b (NormQuant when norm, else ActQuant) with
// the inputs of seed and compares every byte of X, Data and Scale.
func CheckQuant(b QuantBackend, s QuantShape, norm bool, seed uint64) error {
	c := newQuantCase(s, seed)
	qb, err := c.upload(b)
	if err != nil {
		return err
	}
	defer qb.free()
	ctx := context.Background()
	if norm {
		err = b.NormQuant(ctx, c.normArgs(qb))
	} else {
		err = b.ActQuant(ctx, c.actArgs(qb))
	}
	if err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	x, data, scale, err := qb.readBack(c)
	if err != nil {
		return err
	}
	wantData, wantScale := c.expected(norm)
	return c.compare(x, data, scale, wantData, wantScale)
}

// TestActQuant runs act_quant on every shape of QuantShapes.
func TestActQuant(t *testing.T, b QuantBackend) { testQuant(t, b, false) }

// TestNormQuant runs q_norm fused with act_quant on every shape.
func TestNormQuant(t *testing.T, b QuantBackend) { testQuant(t, b, true) }

func testQuant(t *testing.T, b QuantBackend, norm bool) {
	for _, s := range QuantShapes() {
		t.Run(s.Name, func(t *testing.T) {
			seed := Seed(t)
			if err := CheckQuant(b, s, norm, seed); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestQuantRefusals checks that each bad argument is refused with an error
// naming the field and that a refused call writes nothing; and that a call
// of zero rows writes nothing either.
func TestQuantRefusals(t *testing.T, b QuantBackend) {
	s := QuantShape{Name: "refusals", Rows: 5, K: 256, XOffset: 16, XStride: 264, ScaleStride: 7, Eps: 1e-6}
	seed := Seed(t)
	c := newQuantCase(s, seed)
	qb, err := c.upload(b)
	if err != nil {
		t.Fatal(err)
	}
	defer qb.free()
	small := func(n int) mla.Buffer {
		buf, err := b.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		qb.all = append(qb.all, buf)
		return buf
	}
	xNeed := s.XOffset + ((s.Rows-1)*s.XStride+s.K)*2
	scaleNeed := (s.ScaleStride + s.Rows) * 4
	type mutation struct {
		name, field string
		act         func(a *mla.ActQuantArgs)
		norm        func(a *mla.NormQuantArgs) // nil: the act mutation on the shared fields
	}
	shared := func(f func(x *mla.Buffer, off, stride *int, out *mla.FP8Activations)) (func(*mla.ActQuantArgs), func(*mla.NormQuantArgs)) {
		return func(a *mla.ActQuantArgs) { f(&a.X, &a.XOffset, &a.XStride, &a.Out) },
			func(a *mla.NormQuantArgs) { f(&a.X, &a.XOffset, &a.XStride, &a.Out) }
	}
	var ms []mutation
	addShared := func(name, field string, f func(x *mla.Buffer, off, stride *int, out *mla.FP8Activations)) {
		act, norm := shared(f)
		ms = append(ms, mutation{name, field, act, norm})
	}
	addShared("K not a multiple of 128", "K", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.K = 200 })
	addShared("K zero", "K", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.K = 0 })
	addShared("negative rows", "Rows", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.Rows = -1 })
	addShared("misaligned offset", "XOffset", func(_ *mla.Buffer, off, _ *int, _ *mla.FP8Activations) { *off = 8 })
	addShared("negative offset", "XOffset", func(_ *mla.Buffer, off, _ *int, _ *mla.FP8Activations) { *off = -16 })
	addShared("stride below K", "XStride", func(_ *mla.Buffer, _, st *int, _ *mla.FP8Activations) { *st = 248 })
	addShared("stride not a multiple of 8", "XStride", func(_ *mla.Buffer, _, st *int, _ *mla.FP8Activations) { *st = 260 })
	addShared("X one byte short", "X", func(x *mla.Buffer, _, _ *int, _ *mla.FP8Activations) { *x = small(xNeed - 1) })
	addShared("X nil", "X", func(x *mla.Buffer, _, _ *int, _ *mla.FP8Activations) { *x = nil })
	addShared("ScaleStride below Rows", "ScaleStride", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.ScaleStride = 4 })
	addShared("Data one byte short", "Data", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.Data = small(s.Rows*s.K - 1) })
	addShared("Data nil", "Data", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.Data = nil })
	addShared("Scale one entry short", "Scale", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.Scale = small(scaleNeed - 4) })
	addShared("Scale nil", "Scale", func(_ *mla.Buffer, _, _ *int, o *mla.FP8Activations) { o.Scale = nil })
	ms = append(ms,
		mutation{"Weight nil", "Weight", nil, func(a *mla.NormQuantArgs) { a.Weight = nil }},
		mutation{"Weight short", "Weight", nil, func(a *mla.NormQuantArgs) { a.Weight = small(4*s.K - 4) }},
		mutation{"Eps NaN", "Eps", nil, func(a *mla.NormQuantArgs) { a.Eps = float32(math.NaN()) }},
		mutation{"Eps negative", "Eps", nil, func(a *mla.NormQuantArgs) { a.Eps = -1e-6 }},
		mutation{"Eps infinite", "Eps", nil, func(a *mla.NormQuantArgs) { a.Eps = float32(math.Inf(1)) }},
		mutation{"K past the NormQuant limit", "K", nil, func(a *mla.NormQuantArgs) {
			a.Out.K, a.XStride, a.Out.Rows, a.Out.ScaleStride = mla.MaxNormQuantK+128, mla.MaxNormQuantK+128, 1, 1
			a.X, a.Out.Data, a.Out.Scale = small(2*a.Out.K), small(a.Out.K), small(4*a.Out.K/128)
			a.Weight = small(4 * a.Out.K)
		}},
	)
	ctx := context.Background()
	untouched := func(t *testing.T) {
		t.Helper()
		x, data, scale, err := qb.readBack(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.compare(x, data, scale, c.data, c.scale); err != nil {
			t.Fatalf("a refused call wrote: %v", err)
		}
	}
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			if m.act != nil {
				a := c.actArgs(qb)
				m.act(a)
				err := b.ActQuant(ctx, a)
				if err == nil || !strings.Contains(err.Error(), m.field) {
					t.Fatalf("ActQuant: got error %v, want one naming %s", err, m.field)
				}
				untouched(t)
			}
			a := c.normArgs(qb)
			m.norm(a)
			err := b.NormQuant(ctx, a)
			if err == nil || !strings.Contains(err.Error(), m.field) {
				t.Fatalf("NormQuant: got error %v, want one naming %s", err, m.field)
			}
			untouched(t)
		})
	}
	t.Run("zero rows write nothing", func(t *testing.T) {
		a := c.actArgs(qb)
		a.Out.Rows = 0
		if err := b.ActQuant(ctx, a); err != nil {
			t.Fatal(err)
		}
		n := c.normArgs(qb)
		n.Out.Rows = 0
		if err := b.NormQuant(ctx, n); err != nil {
			t.Fatal(err)
		}
		untouched(t)
	})
}
