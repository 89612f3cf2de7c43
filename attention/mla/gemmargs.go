package mla

import (
	"errors"
	"fmt"
)

// GEMMBlock is the width of the FP8 scale blocks along K (activations and
// weights) and along N (weights).
const GEMMBlock = 128

// Validate checks a GEMM's shapes, strides and buffer sizes, naming the
// field and value at fault; every backend calls it before touching Y, so a
// refused GEMM writes nothing. K must be a multiple of 128 (the activation
// scale blocks); a backend may demand more (the CUDA one: N a multiple of
// 128 too).
func (a *GEMMArgs) Validate() error {
	w, x := a.W, a.X
	switch {
	case w == nil:
		return errors.New("mla: GEMMArgs.W is nil")
	case w.N <= 0:
		return fmt.Errorf("mla: GEMMArgs.W.N = %d, must be > 0", w.N)
	case w.K <= 0 || w.K%GEMMBlock != 0:
		return fmt.Errorf("mla: GEMMArgs.W.K = %d, must be a positive multiple of %d", w.K, GEMMBlock)
	case x.K != w.K:
		return fmt.Errorf("mla: GEMMArgs.X.K = %d differs from W.K = %d", x.K, w.K)
	case x.Rows < 0:
		return fmt.Errorf("mla: GEMMArgs.X.Rows = %d is negative", x.Rows)
	case x.ScaleStride < x.Rows:
		return fmt.Errorf("mla: GEMMArgs.X.ScaleStride = %d is less than Rows = %d", x.ScaleStride, x.Rows)
	case a.YOffset < 0 || a.YOffset%16 != 0:
		return fmt.Errorf("mla: GEMMArgs.YOffset = %d bytes, must be >= 0 and a multiple of 16", a.YOffset)
	case a.YStride < w.N || a.YStride%8 != 0:
		return fmt.Errorf("mla: GEMMArgs.YStride = %d elements, must be >= W.N = %d and a multiple of 8", a.YStride, w.N)
	}
	type sized struct {
		name string
		buf  Buffer
		n    int
	}
	kb := w.K / GEMMBlock
	need := []sized{
		{"W.Data", w.Data, w.N * w.K},
		{"W.Scale", w.Scale, 4 * ((w.N + GEMMBlock - 1) / GEMMBlock) * kb},
	}
	if x.Rows > 0 {
		need = append(need,
			sized{"X.Data", x.Data, x.Rows * x.K},
			sized{"X.Scale", x.Scale, 4 * ((kb-1)*x.ScaleStride + x.Rows)},
			sized{"Y", a.Y, a.YOffset + 2*((x.Rows-1)*a.YStride+w.N)})
	}
	for _, n := range need {
		if n.buf == nil {
			return fmt.Errorf("mla: GEMMArgs.%s is nil", n.name)
		}
		if n.buf.Len() < n.n {
			return fmt.Errorf("mla: GEMMArgs.%s has %d bytes, needs %d", n.name, n.buf.Len(), n.n)
		}
	}
	return nil
}
