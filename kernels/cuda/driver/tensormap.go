package driver

import (
	"errors"
	"fmt"
	"runtime"
)

// TensorMap is a CUtensorMap: the 128 opaque bytes (64-byte aligned in
// C) that describe a global tensor to the tensor memory accelerator
// (cp.async.bulk.tensor). EncodeTiled makes one; a kernel takes it by
// value as a `const __grid_constant__` parameter, so it is a launch
// argument like any other (Launch lays it out 64-byte aligned).
type TensorMap [128]byte

// TensorDataType is CUtensorMapDataType.
type TensorDataType uint32

// TensorDataUint8 is CU_TENSOR_MAP_DATA_TYPE_UINT8: one-byte elements (FP8
// operands are moved as bytes).
const TensorDataUint8 TensorDataType = 0

// TensorSwizzle is CUtensorMapSwizzle: how a box's rows are laid out in
// shared memory.
type TensorSwizzle uint32

// The shared-memory swizzles (cuda.h values).
const (
	SwizzleNone TensorSwizzle = 0
	Swizzle32B  TensorSwizzle = 1
	Swizzle64B  TensorSwizzle = 2
	Swizzle128B TensorSwizzle = 3
)

// TensorL2Promotion is CUtensorMapL2promotion.
type TensorL2Promotion uint32

// The L2 promotions (cuda.h values).
const (
	L2PromotionNone TensorL2Promotion = 0
	L2Promotion64B  TensorL2Promotion = 1
	L2Promotion128B TensorL2Promotion = 2
	L2Promotion256B TensorL2Promotion = 3
)

// TiledTensor is what cuTensorMapEncodeTiled takes, innermost dimension
// first: a tensor of Dims elements at Addr whose dimension i+1 starts every
// Strides[i] bytes, copied in boxes of Box elements. Out-of-bounds
// elements of a box read as zero; interleave is none and every element
// stride 1.
type TiledTensor struct {
	DataType    TensorDataType
	Addr        DevicePtr
	Dims        []uint64
	Strides     []uint64 // len(Dims) - 1 byte strides
	Box         []uint32
	Swizzle     TensorSwizzle
	L2Promotion TensorL2Promotion
}

// ErrNoTensorMaps: the driver does not export cuTensorMapEncodeTiled
// (drivers before CUDA 12.0).
var ErrNoTensorMaps = errors.New("cuda driver: cuTensorMapEncodeTiled is not exported (needs a CUDA 12 driver)")

const maxTensorRank = 5

// check refuses what the driver documents as invalid before calling it,
// so the error names the field.
func (t *TiledTensor) check() error {
	r := len(t.Dims)
	switch {
	case r < 1 || r > maxTensorRank:
		return fmt.Errorf("TiledTensor: %d dimensions, want 1 to %d", r, maxTensorRank)
	case len(t.Strides) != r-1:
		return fmt.Errorf("TiledTensor: %d strides for %d dimensions, want %d", len(t.Strides), r, r-1)
	case len(t.Box) != r:
		return fmt.Errorf("TiledTensor: %d box sizes for %d dimensions", len(t.Box), r)
	case t.Addr%16 != 0:
		return fmt.Errorf("TiledTensor: address %#x is not 16-byte aligned", uint64(t.Addr))
	}
	for i, s := range t.Strides {
		if s%16 != 0 {
			return fmt.Errorf("TiledTensor: stride %d (%d bytes) is not a multiple of 16", i, s)
		}
	}
	for i, b := range t.Box {
		if b == 0 || b > 256 {
			return fmt.Errorf("TiledTensor: box size %d is %d, want 1 to 256", i, b)
		}
	}
	return nil
}

// EncodeTiled encodes t as a tensor map (cuTensorMapEncodeTiled). It
// allocates nothing on the device and may run during a stream capture.
func (c *Context) EncodeTiled(t TiledTensor) (TensorMap, error) {
	var m TensorMap
	if err := t.check(); err != nil {
		return m, err
	}
	if c.api.cuTensorMapEncodeTiled == nil {
		return m, ErrNoTensorMaps
	}
	// One block of Go memory, pinned for the call (the package's pinning
	// rule): the map the driver writes and the arrays it reads.
	a := new(struct {
		m             TensorMap
		dims, strides [maxTensorRank]uint64
		box, elem     [maxTensorRank]uint32
	})
	copy(a.dims[:], t.Dims)
	copy(a.strides[:], t.Strides)
	copy(a.box[:], t.Box)
	for i := range a.elem {
		a.elem[i] = 1
	}
	var pin runtime.Pinner
	pin.Pin(a)
	defer pin.Unpin()
	err := c.Do(func() error {
		return c.api.check("cuTensorMapEncodeTiled", c.api.cuTensorMapEncodeTiled(&a.m, uint32(t.DataType), uint32(len(t.Dims)),
			uint64(t.Addr), &a.dims[0], &a.strides[0], &a.box[0], &a.elem[0], 0, uint32(t.Swizzle), uint32(t.L2Promotion), 0))
	})
	return a.m, err
}
