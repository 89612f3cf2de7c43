package mlatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
)

// BF16GEMMBackend is a backend with the compressor's projection GEMM.
type BF16GEMMBackend interface {
	mla.Backend
	mla.BF16GEMMBackend
}

// BF16GEMMCase is one projection GEMM: its shape and where its X and Y rows
// lie (mla.BF16GEMMArgs).
type BF16GEMMCase struct {
	Rows, N, K int
	XOffset    int // bytes
	XStride    int // elements; 0: K
	YOffset    int // bytes
	YStride    int // elements; 0: N
}

func (c BF16GEMMCase) xStride() int { return max(c.XStride, c.K) }
func (c BF16GEMMCase) yStride() int { return max(c.YStride, c.N) }

func (c BF16GEMMCase) String() string {
	s := fmt.Sprintf("m%d-n%d-k%d", c.Rows, c.N, c.K)
	if c.XStride > c.K || c.XOffset > 0 {
		s += fmt.Sprintf("-x%d+%d", c.xStride(), c.XOffset)
	}
	if c.YStride > c.N || c.YOffset > 0 {
		s += fmt.Sprintf("-y%d+%d", c.yStride(), c.YOffset)
	}
	return s
}

// bf16GEMMPoison fills Y before a run: every float32 of it is a NaN, so an
// element left unwritten fails the comparison, and every byte outside the
// rows must keep it.
const bf16GEMMPoison = 0xFF

// bf16Guard is the poisoned bytes past the last X and Y row.
const bf16Guard = 64

// RandomBF16Operands returns the case's host operands: X Gaussian (hidden
// states), W Gaussian with standard deviation 0.05 (weights), no zeros; the
// gaps of X's stride hold NaN, so a read of them poisons the output.
func RandomBF16Operands(r *rand.Rand, c BF16GEMMCase) *gemm.BF16Operands {
	xs := c.xStride()
	o := &gemm.BF16Operands{Rows: c.Rows, N: c.N, K: c.K, XStride: xs,
		X: make([]uint16, max(0, (c.Rows-1)*xs+c.K)), W: make([]uint16, c.N*c.K)}
	fill := func(v []uint16, sd float64) {
		for i := range v {
			for v[i]&0x7FFF == 0 {
				v[i] = numerics.BF16FromF32(float32(r.NormFloat64() * sd))
			}
		}
	}
	for row := 0; row < c.Rows; row++ {
		fill(o.X[row*xs:row*xs+c.K], 1)
		for i := row*xs + c.K; i < min((row+1)*xs, len(o.X)); i++ {
			o.X[i] = numerics.BF16NaN
		}
	}
	fill(o.W, 0.05)
	return o
}

// UploadBF16Operands copies o's X to a new buffer at xOffset bytes (the
// bytes before it and a guard after the last row NaN) and W to another.
func UploadBF16Operands(b mla.Backend, o *gemm.BF16Operands, xOffset int) (x, w mla.Buffer, err error) {
	xb := make([]byte, xOffset+2*len(o.X)+bf16Guard)
	for i := range xb {
		xb[i] = bf16GEMMPoison
	}
	for i, v := range o.X {
		binary.LittleEndian.PutUint16(xb[xOffset+2*i:], v)
	}
	wb := make([]byte, 2*o.N*o.K)
	for i, v := range o.W[:o.N*o.K] {
		binary.LittleEndian.PutUint16(wb[2*i:], v)
	}
	if x, err = upload(b, xb); err != nil {
		return nil, nil, err
	}
	if w, err = upload(b, wb); err != nil {
		_ = b.Free(x)
		return nil, nil, err
	}
	return x, w, nil
}

// BF16GEMMArgs is the case's arguments over uploaded X and W and a Y of
// BF16GEMMYBytes(c) bytes.
func BF16GEMMArgs(c BF16GEMMCase, x, w, y mla.Buffer) *mla.BF16GEMMArgs {
	return &mla.BF16GEMMArgs{Rows: c.Rows, N: c.N, K: c.K, X: x, XOffset: c.XOffset, XStride: c.xStride(),
		W: w, Y: y, YOffset: c.YOffset, YStride: c.yStride()}
}

// BF16GEMMYBytes is the size of the case's Y buffer: its rows and a guard.
func BF16GEMMYBytes(c BF16GEMMCase) int {
	if c.Rows == 0 {
		return c.YOffset + bf16Guard
	}
	return c.YOffset + 4*((c.Rows-1)*c.yStride()+c.N) + bf16Guard
}

// RunBF16GEMM runs b's BF16GEMM of the case from uploaded X and W into a
// new Y poisoned with NaN bytes, checks that every byte outside the rows' N
// values kept the poison, and returns Y dense [Rows][N].
func RunBF16GEMM(ctx context.Context, b BF16GEMMBackend, c BF16GEMMCase, x, w mla.Buffer) ([]float32, error) {
	size := BF16GEMMYBytes(c)
	y, err := b.Alloc(size)
	if err != nil {
		return nil, err
	}
	defer b.Free(y)
	if err := b.Fill(y, 0, size, bf16GEMMPoison); err != nil {
		return nil, err
	}
	if err := b.BF16GEMM(ctx, BF16GEMMArgs(c, x, w, y)); err != nil {
		return nil, err
	}
	if err := b.Synchronize(ctx); err != nil {
		return nil, err
	}
	host := make([]byte, size)
	if err := b.Read(host, y, 0); err != nil {
		return nil, err
	}
	return ReadBF16GEMMY(c, host)
}

// ReadBF16GEMMY extracts the case's Y rows from the bytes of its Y buffer,
// dense [Rows][N], checking that every other byte holds the poison.
func ReadBF16GEMMY(c BF16GEMMCase, host []byte) ([]float32, error) {
	dense, err := outputRows(host, bf16GEMMPoison, c.Rows, c.YOffset, 4*c.yStride(), 4*c.N)
	if err != nil {
		return nil, fmt.Errorf("Y: %w", err)
	}
	return numerics.F32sFromBytes(dense), nil
}

// BF16GEMMCases are small projection GEMMs for a host reference: odd row
// counts, the narrowest N and K, strided and offset X and Y.
var BF16GEMMCases = []BF16GEMMCase{
	{Rows: 1, N: 8, K: 8},
	{Rows: 0, N: 64, K: 64},
	{Rows: 3, N: 64, K: 256, XOffset: 16, XStride: 264, YOffset: 32, YStride: 68},
	{Rows: 17, N: 40, K: 1024},
	{Rows: 5, N: 1024, K: 512, XStride: 1536, YStride: 2048, YOffset: 4096},
	{Rows: 130, N: 24, K: 136, XOffset: 48, XStride: 200},
}

// TestBF16GEMMRefusals checks that b refuses bad BF16GEMMArgs with an
// error naming the field, before writing anything: Y keeps its bytes.
func TestBF16GEMMRefusals(t *testing.T, b BF16GEMMBackend) {
	c := BF16GEMMCase{Rows: 3, N: 16, K: 32, XStride: 40, YStride: 20, YOffset: 16}
	o := RandomBF16Operands(rand.New(rand.NewPCG(5, 6)), c)
	x, w, err := UploadBF16Operands(b, o, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(x)
	defer b.Free(w)
	size := BF16GEMMYBytes(c)
	y, err := b.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(y)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		edit func(a *mla.BF16GEMMArgs)
		want string
	}{
		{"negative rows", func(a *mla.BF16GEMMArgs) { a.Rows = -1 }, "Rows = -1"},
		{"N not a multiple of 8", func(a *mla.BF16GEMMArgs) { a.N = 12 }, "N = 12"},
		{"K zero", func(a *mla.BF16GEMMArgs) { a.K = 0 }, "K = 0"},
		{"X offset misaligned", func(a *mla.BF16GEMMArgs) { a.XOffset = 8 }, "XOffset = 8"},
		{"X stride below K", func(a *mla.BF16GEMMArgs) { a.XStride = 24 }, "XStride = 24"},
		{"Y offset misaligned", func(a *mla.BF16GEMMArgs) { a.YOffset = 4 }, "YOffset = 4"},
		{"Y stride below N", func(a *mla.BF16GEMMArgs) { a.YStride = 8 }, "YStride = 8"},
		{"Y stride odd", func(a *mla.BF16GEMMArgs) { a.YStride = 18 }, "YStride = 18"},
		{"X too small", func(a *mla.BF16GEMMArgs) { a.Rows = 4 }, "X has"},
		{"Y too small", func(a *mla.BF16GEMMArgs) { a.YOffset = 96 }, "Y has"},
		{"W too small", func(a *mla.BF16GEMMArgs) { a.N, a.YStride = 24, 24 }, "W has"},
		{"W nil", func(a *mla.BF16GEMMArgs) { a.W = nil }, "W is nil"},
		{"Y nil", func(a *mla.BF16GEMMArgs) { a.Y = nil }, "Y is nil"},
	} {
		if err := b.Fill(y, 0, size, 0x5A); err != nil {
			t.Fatal(err)
		}
		a := BF16GEMMArgs(c, x, w, y)
		tc.edit(a)
		err := b.BF16GEMM(ctx, a)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
		if err := b.Synchronize(ctx); err != nil {
			t.Fatal(err)
		}
		host := make([]byte, size)
		if err := b.Read(host, y, 0); err != nil {
			t.Fatal(err)
		}
		for i, v := range host {
			if v != 0x5A {
				t.Fatalf("%s: the refused call wrote Y byte %d: %#02x", tc.name, i, v)
			}
		}
	}
	// A cancelled context is refused before anything runs.
	if err := b.Fill(y, 0, size, 0x5A); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.BF16GEMM(cancelled, BF16GEMMArgs(c, x, w, y)); err == nil {
		t.Error("a cancelled context was not refused")
	}
	host := make([]byte, size)
	if err := b.Read(host, y, 0); err != nil {
		t.Fatal(err)
	}
	for i, v := range host {
		if v != 0x5A {
			t.Fatalf("cancelled: Y byte %d written: %#02x", i, v)
		}
	}
}
