package cpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"weak"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// GEMM implements the chain's FP8 block-scaled GEMM (mla.ChainBackend) with
// the host reference of package gemm: float32 accumulation, bf16 output. A
// weight is dequantized to float32 on its first use and kept while its
// mla.FP8Weight lives: a weight's buffers must not change after that.
func (b *Backend) GEMM(ctx context.Context, a *mla.GEMMArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	rows, n := a.X.Rows, a.W.N
	if rows == 0 {
		return nil
	}
	w, err := dequantized(a.W)
	if err != nil {
		return err
	}
	x, err := hostActivations(a.X)
	if err != nil {
		return err
	}
	c, err := gemm.MultiplyF32(x, w)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	y, err := span(a.Y, a.YOffset, 2*((rows-1)*a.YStride+n))
	if err != nil {
		return err
	}
	for r := 0; r < rows; r++ {
		dst := y[2*r*a.YStride:]
		for i, v := range c[r*n : (r+1)*n] {
			binary.LittleEndian.PutUint16(dst[2*i:], numerics.BF16FromF32(v))
		}
	}
	return nil
}

// hostActivations views FP8Activations in CPU buffers as gemm.Activations.
func hostActivations(x mla.FP8Activations) (*gemm.Activations, error) {
	data, err := span(x.Data, 0, x.Rows*x.K)
	if err != nil {
		return nil, err
	}
	n := (x.K/gemm.BlockSize-1)*x.ScaleStride + x.Rows
	raw, err := span(x.Scale, 0, 4*n)
	if err != nil {
		return nil, err
	}
	scale := make([]float32, n)
	for i := range scale {
		scale[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return &gemm.Activations{Rows: x.Rows, K: x.K, Data: data, Scale: scale, ScaleStride: x.ScaleStride}, nil
}

// cachedWeight is one weight's dequantized matrix and the buffers it was
// computed from.
type cachedWeight struct {
	once        sync.Once
	data, scale mla.Buffer
	dataBase    *byte
	n, k        int
	w           *gemm.Weight
	err         error
}

func (c *cachedWeight) matches(w *mla.FP8Weight) bool {
	return c.data == w.Data && c.scale == w.Scale && c.n == w.N && c.k == w.K && c.dataBase == base(w.Data)
}

func base(buf mla.Buffer) *byte {
	if hb, ok := buf.(*Buffer); ok && len(hb.b) > 0 {
		return &hb.b[0]
	}
	return nil
}

// weightCache maps live weights to their dequantized matrices; an entry
// goes when its weight is garbage collected.
var weightCache = struct {
	sync.Mutex
	m map[weak.Pointer[mla.FP8Weight]]*cachedWeight
}{m: map[weak.Pointer[mla.FP8Weight]]*cachedWeight{}}

func dequantized(w *mla.FP8Weight) (*gemm.Weight, error) {
	key := weak.Make(w)
	weightCache.Lock()
	c, ok := weightCache.m[key]
	if !ok || !c.matches(w) {
		if !ok {
			runtime.AddCleanup(w, func(k weak.Pointer[mla.FP8Weight]) {
				weightCache.Lock()
				delete(weightCache.m, k)
				weightCache.Unlock()
			}, key)
		}
		c = &cachedWeight{data: w.Data, scale: w.Scale, dataBase: base(w.Data), n: w.N, k: w.K}
		weightCache.m[key] = c
	}
	weightCache.Unlock()
	c.once.Do(func() { c.w, c.err = dequantize(w) })
	return c.w, c.err
}

func dequantize(w *mla.FP8Weight) (*gemm.Weight, error) {
	data, err := span(w.Data, 0, w.N*w.K)
	if err != nil {
		return nil, err
	}
	m := weights.FP8Matrix{N: w.N, K: w.K, Data: data}
	raw, err := span(w.Scale, 0, 4*m.ScaleRows()*m.ScaleCols())
	if err != nil {
		return nil, err
	}
	m.Scale = make([]float32, m.ScaleRows()*m.ScaleCols())
	for i := range m.Scale {
		m.Scale[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	d, err := gemm.Dequantize(&m)
	if err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	return d, nil
}
