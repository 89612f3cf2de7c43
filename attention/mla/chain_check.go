package mla

import (
	"fmt"
	"math"
)

// MaxNormQuantK is the widest row NormQuant takes (q_lora_rank is 1024 for
// V4-Flash, 1536 for V4-Pro); a GPU warp stages one row in shared memory.
const MaxNormQuantK = 8192

// quantBlock is the width of one act_quant block (numerics.ActQuantBlockSize).
const quantBlock = 128

// Validate checks an ActQuant call's shapes, alignment and buffer sizes.
func (a *ActQuantArgs) Validate() error {
	if err := checkQuantInput("ActQuantArgs", a.X, a.XOffset, a.XStride, &a.Out); err != nil {
		return err
	}
	return checkQuantOut("ActQuantArgs", &a.Out)
}

// Validate checks a NormQuant call like ActQuantArgs.Validate, plus the
// weight, Eps and the width limit.
func (a *NormQuantArgs) Validate() error {
	if err := checkQuantInput("NormQuantArgs", a.X, a.XOffset, a.XStride, &a.Out); err != nil {
		return err
	}
	if err := checkQuantOut("NormQuantArgs", &a.Out); err != nil {
		return err
	}
	switch {
	case a.Out.K > MaxNormQuantK:
		return fmt.Errorf("mla: NormQuantArgs.Out.K = %d exceeds %d", a.Out.K, MaxNormQuantK)
	case !(a.Eps >= 0) || math.IsInf(float64(a.Eps), 1):
		return fmt.Errorf("mla: NormQuantArgs.Eps = %g, must be finite and >= 0", a.Eps)
	case a.Weight == nil:
		return fmt.Errorf("mla: NormQuantArgs.Weight is nil")
	case a.Weight.Len() < a.Out.K*4:
		return fmt.Errorf("mla: NormQuantArgs.Weight holds %d bytes, K = %d float32 need %d", a.Weight.Len(), a.Out.K, a.Out.K*4)
	}
	return nil
}

func checkQuantInput(what string, x Buffer, off, stride int, out *FP8Activations) error {
	switch {
	case out.K <= 0 || out.K%quantBlock != 0:
		return fmt.Errorf("mla: %s.Out.K = %d, must be a positive multiple of %d", what, out.K, quantBlock)
	case out.Rows < 0:
		return fmt.Errorf("mla: %s.Out.Rows = %d, must be >= 0", what, out.Rows)
	case int64(out.Rows)*int64(out.K) > math.MaxInt32:
		return fmt.Errorf("mla: %s.Out: Rows = %d x K = %d values exceed 2^31", what, out.Rows, out.K)
	case off < 0 || off%16 != 0:
		return fmt.Errorf("mla: %s.XOffset = %d bytes breaks 16-byte alignment", what, off)
	case stride < out.K || stride%8 != 0 || stride > math.MaxInt32/2:
		return fmt.Errorf("mla: %s.XStride = %d elements, must be >= K = %d and a multiple of 8 (16-byte rows)", what, stride, out.K)
	case x == nil:
		return fmt.Errorf("mla: %s.X is nil", what)
	}
	if out.Rows == 0 {
		return nil
	}
	if need := off + ((out.Rows-1)*stride+out.K)*2; x.Len() < need {
		return fmt.Errorf("mla: %s.X holds %d bytes, %d rows at offset %d, stride %d, K %d need %d",
			what, x.Len(), out.Rows, off, stride, out.K, need)
	}
	return nil
}

func checkQuantOut(what string, out *FP8Activations) error {
	switch {
	case out.ScaleStride < out.Rows || out.ScaleStride > math.MaxInt32:
		return fmt.Errorf("mla: %s.Out.ScaleStride = %d, must be >= Rows = %d", what, out.ScaleStride, out.Rows)
	case out.Data == nil:
		return fmt.Errorf("mla: %s.Out.Data is nil", what)
	case out.Scale == nil:
		return fmt.Errorf("mla: %s.Out.Scale is nil", what)
	}
	if out.Rows == 0 {
		return nil
	}
	if need := out.Rows * out.K; out.Data.Len() < need {
		return fmt.Errorf("mla: %s.Out.Data holds %d bytes, %d rows of K = %d need %d", what, out.Data.Len(), out.Rows, out.K, need)
	}
	if need := ((out.K/quantBlock-1)*out.ScaleStride + out.Rows) * 4; out.Scale.Len() < need {
		return fmt.Errorf("mla: %s.Out.Scale holds %d bytes, %d blocks of ScaleStride %d need %d",
			what, out.Scale.Len(), out.K/quantBlock, out.ScaleStride, need)
	}
	return nil
}
