package mlatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// GEMMBackend is a backend with the chain's GEMM (the part of
// mla.ChainBackend that TestGEMM exercises).
type GEMMBackend interface {
	mla.Backend
	GEMM(ctx context.Context, a *mla.GEMMArgs) error
}

// GEMMShape is a weight's shape: N outputs, K inputs.
type GEMMShape struct {
	Name string
	N, K int
}

// FlashGEMMs are V4-Flash's two chain GEMMs: the fused [wq_a; wkv]
// (q_lora_rank 1024 + 512 outputs from hidden 4096) and wq_b (64 heads x
// 512 from q_lora_rank 1024).
var FlashGEMMs = []GEMMShape{{"flash-wqa-wkv", 1536, 4096}, {"flash-wqb", 32768, 1024}}

// ProGEMMs are V4-Pro's: [wq_a; wkv] 1536 + 512 from 7168, wq_b 128 x 512
// from 1536.
var ProGEMMs = []GEMMShape{{"pro-wqa-wkv", 2048, 7168}, {"pro-wqb", 65536, 1536}}

// ScaledGEMMs divides every N by div (keeping multiples of 128): the
// Flash-like shapes at a size the host reference handles in a test.
func ScaledGEMMs(shapes []GEMMShape, div int) []GEMMShape {
	out := make([]GEMMShape, len(shapes))
	for i, s := range shapes {
		n := max(128, s.N/div/128*128)
		out[i] = GEMMShape{Name: fmt.Sprintf("%s-n%d", s.Name, n), N: n, K: s.K}
	}
	return out
}

// GEMMRows are the batch sizes every shape runs with (cuBLASLt refuses 1
// and 2; 33 and 300 cross tile edges).
var GEMMRows = []int{1, 2, 3, 16, 33, 128, 300}

// RandomFP8Weight returns an e4m3 weight with Gaussian values (no NaN)
// and block scales that vary from block to block: powers of two in
// [2^-12, 2^-5] for half the blocks, arbitrary float32 in that range for
// the others, so that a block read from the wrong place shows.
func RandomFP8Weight(r *rand.Rand, n, k int) *weights.FP8Matrix {
	w := &weights.FP8Matrix{N: n, K: k, Data: make([]byte, n*k)}
	for i := range w.Data {
		w.Data[i] = numerics.E4M3FromF32(float32(r.NormFloat64() * 64))
	}
	w.Scale = make([]float32, w.ScaleRows()*w.ScaleCols())
	for i := range w.Scale {
		s := math.Ldexp(1, -5-r.IntN(8))
		if r.IntN(2) == 0 {
			s *= 1 + r.Float64()
		}
		w.Scale[i] = float32(s)
	}
	return w
}

// RandomActivations returns e4m3 rows with Gaussian values and UE8M0-like
// power-of-two scales in [2^-12, 2^-3] per row and 128-block; the scale
// slots of rows >= rows (the stride's padding) hold NaN, so reading them
// poisons the output.
func RandomActivations(r *rand.Rand, rows, k, scaleStride int) *gemm.Activations {
	x := &gemm.Activations{Rows: rows, K: k, ScaleStride: scaleStride, Data: make([]byte, rows*k)}
	for i := range x.Data {
		x.Data[i] = numerics.E4M3FromF32(float32(r.NormFloat64() * 64))
	}
	x.Scale = make([]float32, k/gemm.BlockSize*scaleStride)
	for i := range x.Scale {
		if i%scaleStride < rows {
			x.Scale[i] = float32(math.Ldexp(1, -3-r.IntN(10)))
		} else {
			x.Scale[i] = float32(math.NaN())
		}
	}
	return x
}

func upload(b mla.Backend, data []byte) (mla.Buffer, error) {
	buf, err := b.Alloc(len(data))
	if err != nil {
		return nil, err
	}
	return buf, b.Write(buf, 0, data)
}

// deviceBuffers are one run's buffers on a backend, freed together (also
// one whose write failed).
type deviceBuffers struct {
	b    mla.Backend
	bufs []mla.Buffer
}

// alloc allocates n bytes on the backend, data written to them when not nil.
func (d *deviceBuffers) alloc(n int, data []byte) (mla.Buffer, error) {
	buf, err := d.b.Alloc(n)
	if err != nil {
		return nil, err
	}
	d.bufs = append(d.bufs, buf)
	if data != nil {
		return buf, d.b.Write(buf, 0, data)
	}
	return buf, nil
}

// upload is alloc of data's size with data written.
func (d *deviceBuffers) upload(data []byte) (mla.Buffer, error) { return d.alloc(len(data), data) }

// free releases every buffer.
func (d *deviceBuffers) free() {
	for _, buf := range d.bufs {
		_ = d.b.Free(buf)
	}
	d.bufs = nil
}

// UploadFP8Weight copies a host weight into b's memory.
func UploadFP8Weight(b mla.Backend, w *weights.FP8Matrix) (*mla.FP8Weight, error) {
	data, err := upload(b, w.Data)
	if err != nil {
		return nil, err
	}
	scale, err := upload(b, numerics.F32Bytes(w.Scale))
	if err != nil {
		return nil, err
	}
	return &mla.FP8Weight{N: w.N, K: w.K, Data: data, Scale: scale}, nil
}

// UploadActivations copies host activations into b's memory.
func UploadActivations(b mla.Backend, x *gemm.Activations) (mla.FP8Activations, error) {
	data, err := upload(b, x.Data)
	if err != nil {
		return mla.FP8Activations{}, err
	}
	scale, err := upload(b, numerics.F32Bytes(x.Scale))
	if err != nil {
		return mla.FP8Activations{}, err
	}
	return mla.FP8Activations{Rows: x.Rows, K: x.K, Data: data, Scale: scale, ScaleStride: x.ScaleStride}, nil
}

// FreeGEMMBuffers releases what UploadFP8Weight and UploadActivations made.
func FreeGEMMBuffers(b mla.Backend, w *mla.FP8Weight, x mla.FP8Activations) {
	for _, buf := range []mla.Buffer{w.Data, w.Scale, x.Data, x.Scale} {
		if buf != nil {
			_ = b.Free(buf)
		}
	}
}

const gemmPoison = 0xA5

// RunGEMM runs b's GEMM into a Y buffer poisoned with 0xA5, with rows at
// yOffset bytes and yStride elements apart, checks that every byte outside
// the rows' N values kept the poison, and returns Y dense [Rows][N].
func RunGEMM(b GEMMBackend, x mla.FP8Activations, w *mla.FP8Weight, yOffset, yStride int) ([]uint16, error) {
	const guard = 64
	size := yOffset + guard
	if x.Rows > 0 {
		size = yOffset + 2*((x.Rows-1)*yStride+w.N) + guard
	}
	y, err := b.Alloc(size)
	if err != nil {
		return nil, err
	}
	defer b.Free(y)
	if err := b.Fill(y, 0, size, gemmPoison); err != nil {
		return nil, err
	}
	ctx := context.Background()
	if err := b.GEMM(ctx, &mla.GEMMArgs{X: x, W: w, Y: y, YOffset: yOffset, YStride: yStride}); err != nil {
		return nil, err
	}
	if err := b.Synchronize(ctx); err != nil {
		return nil, err
	}
	host := make([]byte, size)
	if err := b.Read(host, y, 0); err != nil {
		return nil, err
	}
	dense, err := outputRows(host, gemmPoison, x.Rows, yOffset, 2*yStride, 2*w.N)
	if err != nil {
		return nil, err
	}
	out := make([]uint16, x.Rows*w.N)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(dense[2*i:])
	}
	return out, nil
}

// outputRows returns the rows (rowBytes each, the first at offset, then
// every stride bytes) of an output buffer's bytes, dense, checking that
// every other byte still holds poison.
func outputRows(host []byte, poison byte, rows, offset, stride, rowBytes int) ([]byte, error) {
	out := make([]byte, 0, rows*rowBytes)
	pos := 0
	for r := 0; r < rows; r++ {
		start := offset + r*stride
		if err := checkPoison(host[pos:start], pos, poison); err != nil {
			return nil, fmt.Errorf("before row %d: %w", r, err)
		}
		out = append(out, host[start:start+rowBytes]...)
		pos = start + rowBytes
	}
	if err := checkPoison(host[pos:], pos, poison); err != nil {
		return nil, fmt.Errorf("after the last row: %w", err)
	}
	return out, nil
}

func checkPoison(p []byte, off int, poison byte) error {
	for j, c := range p {
		if c != poison {
			return fmt.Errorf("byte %d outside the output was overwritten: %#02x", off+j, c)
		}
	}
	return nil
}

// GEMMCase is one GEMM of the suite.
type GEMMCase struct {
	Shape       GEMMShape
	Rows        int
	ScaleStride int // 0: Rows
	YOffset     int // bytes
	YStride     int // elements; 0: N
	NaN         bool
}

func (c GEMMCase) String() string {
	s := fmt.Sprintf("%s/m%d", c.Shape.Name, c.Rows)
	if c.ScaleStride > c.Rows {
		s += fmt.Sprintf("-ss%d", c.ScaleStride)
	}
	if c.YStride > c.Shape.N || c.YOffset > 0 {
		s += fmt.Sprintf("-y%d+%d", c.YStride, c.YOffset)
	}
	if c.NaN {
		s += "-nan"
	}
	return s
}

// GEMMCases are TestGEMM's cases for shapes: every size of GEMMRows, odd
// ones with a padded scale stride and a strided, offset Y; and the smallest
// shape on its own with 1, 3 and 127 rows and with NaN inputs.
func GEMMCases(shapes []GEMMShape) []GEMMCase {
	var cs []GEMMCase
	small := GEMMShape{"n128-k128", 128, 128}
	for _, m := range []int{1, 3, 127} {
		cs = append(cs, GEMMCase{Shape: small, Rows: m})
	}
	cs = append(cs,
		GEMMCase{Shape: GEMMShape{"n384-k256", 384, 256}, Rows: 5, ScaleStride: 8, YOffset: 32, YStride: 392},
		GEMMCase{Shape: GEMMShape{"n256-k384", 256, 384}, Rows: 7, NaN: true})
	for _, s := range shapes {
		for i, m := range GEMMRows {
			c := GEMMCase{Shape: s, Rows: m}
			if i%2 == 1 {
				c.ScaleStride = m + 3
				c.YOffset = 48
				c.YStride = s.N + 24
			}
			cs = append(cs, c)
		}
	}
	return cs
}

// CheckGEMM runs one case on b with inputs from seed and compares the
// output with the host reference within gemm's bound.
func CheckGEMM(b GEMMBackend, c GEMMCase, seed uint64) (gemm.Comparison, error) {
	r := rand.New(rand.NewPCG(seed, 0x6a09e667f3bcc909))
	ss := max(c.ScaleStride, c.Rows)
	ys := c.YStride
	if ys == 0 {
		ys = c.Shape.N
	}
	hw := RandomFP8Weight(r, c.Shape.N, c.Shape.K)
	hx := RandomActivations(r, c.Rows, c.Shape.K, ss)
	if c.NaN {
		hx.Data[(c.Rows/2)*c.Shape.K+r.IntN(c.Shape.K)] = 0x7F        // one row all NaN
		hw.Data[r.IntN(c.Shape.N)*c.Shape.K+r.IntN(c.Shape.K)] = 0xFF // one column all NaN
	}
	w, err := UploadFP8Weight(b, hw)
	if err != nil {
		return gemm.Comparison{}, err
	}
	x, err := UploadActivations(b, hx)
	defer FreeGEMMBuffers(b, w, x)
	if err != nil {
		return gemm.Comparison{}, err
	}
	got, err := RunGEMM(b, x, w, c.YOffset, ys)
	if err != nil {
		return gemm.Comparison{}, err
	}
	want, err := gemm.Reference(hx, hw)
	if err != nil {
		return gemm.Comparison{}, err
	}
	cmp, err := gemm.Compare(hx, hw, want, got)
	if err != nil {
		return cmp, err
	}
	if cmp.Violations > 0 {
		return cmp, fmt.Errorf("%s: %v", c, cmp)
	}
	if c.NaN {
		for i, v := range got {
			if numerics.F32FromBF16(want[i]) != numerics.F32FromBF16(want[i]) && v != numerics.BF16NaN {
				return cmp, fmt.Errorf("%s: element [%d][%d] is %#04x, want the canonical NaN %#04x", c, i/c.Shape.N, i%c.Shape.N, v, numerics.BF16NaN)
			}
		}
	}
	return cmp, nil
}

// TestGEMM runs the GEMM conformance cases on b at V4-Flash's full shapes.
func TestGEMM(t *testing.T, b GEMMBackend) { TestGEMMShapes(t, b, FlashGEMMs) }

// TestGEMMShapes runs GEMMCases(shapes) and the refusals on b.
func TestGEMMShapes(t *testing.T, b GEMMBackend, shapes []GEMMShape) {
	for _, c := range GEMMCases(shapes) {
		t.Run(c.String(), func(t *testing.T) {
			seed := Seed(t)
			cmp, err := CheckGEMM(b, c, seed)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("worst element %.3g of the bound; accumulation difference %.3g S (bound %.3g S)", cmp.Worst, cmp.AccumRel, gemm.Bound(c.Shape.K))
		})
	}
	t.Run("refusals", func(t *testing.T) { testGEMMRefusals(t, b) })
}

// testGEMMRefusals checks that bad arguments are refused with an error and
// leave Y untouched.
func testGEMMRefusals(t *testing.T, b GEMMBackend) {
	r := rand.New(rand.NewPCG(1, 2))
	hw := RandomFP8Weight(r, 256, 256)
	hx := RandomActivations(r, 4, 256, 4)
	w, err := UploadFP8Weight(b, hw)
	if err != nil {
		t.Fatal(err)
	}
	x, err := UploadActivations(b, hx)
	defer FreeGEMMBuffers(b, w, x)
	if err != nil {
		t.Fatal(err)
	}
	const ySize = 4 * 256 * 2
	y, err := b.Alloc(ySize)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(y)
	ok := mla.GEMMArgs{X: x, W: w, Y: y, YStride: 256}
	w300 := *w
	w300.K = 300
	wShort := *w
	wShort.N = 512
	bad := map[string]func(a *mla.GEMMArgs){
		"nil W":              func(a *mla.GEMMArgs) { a.W = nil },
		"K not 128-aligned":  func(a *mla.GEMMArgs) { a.W = &w300; a.X.K = 300 },
		"X.K != W.K":         func(a *mla.GEMMArgs) { a.X.K = 128 },
		"YStride < N":        func(a *mla.GEMMArgs) { a.YStride = 248 },
		"YStride odd":        func(a *mla.GEMMArgs) { a.YStride = 260 },
		"YOffset unaligned":  func(a *mla.GEMMArgs) { a.YOffset = 8 },
		"Y too small":        func(a *mla.GEMMArgs) { a.YOffset = 16 },
		"ScaleStride < Rows": func(a *mla.GEMMArgs) { a.X.ScaleStride = 3 },
		"X.Data too small":   func(a *mla.GEMMArgs) { a.X.Rows = 5; a.X.ScaleStride = 5 },
		"W.Data too small":   func(a *mla.GEMMArgs) { a.W = &wShort; a.YStride = 512 },
	}
	ctx := context.Background()
	for name, f := range bad {
		if err := b.Fill(y, 0, ySize, gemmPoison); err != nil {
			t.Fatal(err)
		}
		a := ok
		f(&a)
		err := b.GEMM(ctx, &a)
		if err == nil {
			t.Errorf("%s: GEMM accepted %+v", name, a)
			continue
		}
		t.Logf("%s: %v", name, err)
		host := make([]byte, ySize)
		if err := b.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.Read(host, y, 0); err != nil {
			t.Fatal(err)
		}
		if err := checkPoison(host, 0, gemmPoison); err != nil {
			t.Errorf("%s: refused GEMM wrote Y: %v", name, err)
		}
	}
}
