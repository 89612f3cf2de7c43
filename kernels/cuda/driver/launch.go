package driver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// Bytes is a kernel argument passed by value as raw bytes: a struct
// parameter, laid out by the caller exactly as the kernel's C++ struct
// (little-endian, with its padding).
type Bytes []byte

// Dim3 is a grid or block shape (x, y, z); every component must be at least 1.
type Dim3 = [3]uint32

// kernelArgs holds launch arguments in the form cuLaunchKernel's
// kernelParams wants: an array of pointers, one per parameter, each pointing
// at that parameter's value. Values live in one 8-byte aligned Go buffer; both
// it and the pointer array are pinned for the duration of the launch call
// (the driver copies the values before cuLaunchKernel returns).
type kernelArgs struct {
	values []uint64         // backing store, 8-byte aligned
	ptrs   []unsafe.Pointer // ptrs[i] points into values
	sizes  []int
}

// argBytes encodes launch argument i as the bytes of the C parameter.
func argBytes(i int, a any) ([]byte, error) {
	le := binary.LittleEndian
	switch v := a.(type) {
	case DevicePtr:
		return le.AppendUint64(nil, uint64(v)), nil
	case uint64:
		return le.AppendUint64(nil, v), nil
	case int64:
		return le.AppendUint64(nil, uint64(v)), nil
	case uint32:
		return le.AppendUint32(nil, v), nil
	case int32:
		return le.AppendUint32(nil, uint32(v)), nil
	case uint16:
		return le.AppendUint16(nil, v), nil
	case int16:
		return le.AppendUint16(nil, uint16(v)), nil
	case uint8:
		return []byte{v}, nil
	case int8:
		return []byte{byte(v)}, nil
	case bool:
		if v {
			return []byte{1}, nil
		}
		return []byte{0}, nil
	case float32:
		return le.AppendUint32(nil, math.Float32bits(v)), nil
	case float64:
		return le.AppendUint64(nil, math.Float64bits(v)), nil
	case Bytes:
		if len(v) == 0 {
			return nil, fmt.Errorf("kernel argument %d: Bytes value is empty", i)
		}
		return v, nil
	case int, uint, uintptr:
		return nil, fmt.Errorf("kernel argument %d has type %T, which has no fixed C width: use int32/uint32, int64/uint64 or DevicePtr", i, a)
	default:
		return nil, fmt.Errorf("kernel argument %d has unsupported type %T: use DevicePtr, a fixed-width integer, float32, float64, bool or Bytes", i, a)
	}
}

// packArgs lays out args for kernelParams. Each value starts on an 8-byte
// boundary, so every pointer is aligned for any scalar the driver reads.
func packArgs(args []any) (*kernelArgs, error) {
	encoded := make([][]byte, len(args))
	words := 0
	for i, a := range args {
		b, err := argBytes(i, a)
		if err != nil {
			return nil, err
		}
		encoded[i] = b
		words += (len(b) + 7) / 8
	}
	k := &kernelArgs{values: make([]uint64, words), ptrs: make([]unsafe.Pointer, len(args)), sizes: make([]int, len(args))}
	if words == 0 {
		return k, nil
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&k.values[0])), words*8)
	off := 0
	for i, b := range encoded {
		copy(buf[off:], b)
		k.ptrs[i] = unsafe.Pointer(&buf[off])
		k.sizes[i] = len(b)
		off += (len(b) + 7) / 8 * 8
	}
	return k, nil
}

// pin pins the value buffer and the pointer array and returns what to pass
// as kernelParams (nil for a kernel without parameters).
func (k *kernelArgs) pin(p *runtime.Pinner) unsafe.Pointer {
	if len(k.ptrs) == 0 {
		return nil
	}
	p.Pin(&k.values[0])
	p.Pin(&k.ptrs[0])
	return unsafe.Pointer(&k.ptrs[0])
}

// launchConfig mirrors CUlaunchConfig from cuda.h (CUDA 12.0 through 13.0,
// LP64):
//
//	typedef struct CUlaunchConfig_st {
//	    unsigned int gridDimX, gridDimY, gridDimZ;
//	    unsigned int blockDimX, blockDimY, blockDimZ;
//	    unsigned int sharedMemBytes;
//	    CUstream hStream;            // offset 32 after 4 bytes of padding
//	    CUlaunchAttribute *attrs;    // offset 40
//	    unsigned int numAttrs;       // offset 48; sizeof == 56
//	} CUlaunchConfig;
//
// TestLaunchConfigLayout pins these offsets.
type launchConfig struct {
	gridDimX, gridDimY, gridDimZ    uint32
	blockDimX, blockDimY, blockDimZ uint32
	sharedMemBytes                  uint32
	_                               uint32
	hStream                         handle
	attrs                           *launchAttribute
	numAttrs                        uint32
	_                               uint32
}

// launchAttribute mirrors CUlaunchAttribute from cuda.h:
//
//	typedef struct CUlaunchAttribute_st {
//	    CUlaunchAttributeID id;                      // 4-byte enum
//	    char pad[8 - sizeof(CUlaunchAttributeID)];
//	    CUlaunchAttributeValue value;                // union, char pad[64], 8-aligned
//	} CUlaunchAttribute;                             // sizeof == 72
type launchAttribute struct {
	id    uint32
	_     [4]byte
	value [8]uint64
}

// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: its value is the
// union member `int programmaticStreamSerializationAllowed` at offset 0.
const launchAttributeProgrammaticStreamSerialization = 6

func validateDims(what string, d Dim3) error {
	for i, v := range d {
		if v == 0 {
			return fmt.Errorf("%s[%d] is 0: every dimension must be at least 1", what, i)
		}
	}
	return nil
}

// Launch enqueues fn on s (nil: the legacy default stream) with the given
// grid, block, dynamic shared memory and arguments. Arguments are Go values
// whose types fix the parameter widths: DevicePtr or uint64 for pointers,
// int32/uint32/int64/uint16/..., float32, float64, bool, or Bytes for a struct
// passed by value. Launch errors (bad configuration, missing resources) are
// returned; faults inside the kernel surface at the next synchronization.
func (c *Context) Launch(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, args ...any) error {
	return c.launch(fn, grid, block, sharedBytes, s, false, args)
}

// LaunchPDL is Launch with programmatic dependent launch: the kernel may be
// scheduled before the previous kernel on s finishes and must execute
// `griddepcontrol.wait` (cudaGridDependencySynchronize) before reading that
// kernel's output. Needs compute capability 9.0 and cuLaunchKernelEx; without
// the symbol it degrades to an ordinary launch, which is still correct
// because griddepcontrol.wait then returns at once.
func (c *Context) LaunchPDL(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, args ...any) error {
	return c.launch(fn, grid, block, sharedBytes, s, true, args)
}

func (c *Context) launch(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, pdl bool, args []any) error {
	if fn == nil {
		return errors.New("Launch: function is nil")
	}
	if err := validateDims("grid", grid); err != nil {
		return fmt.Errorf("launch %s: %w", fn.Name, err)
	}
	if err := validateDims("block", block); err != nil {
		return fmt.Errorf("launch %s: %w", fn.Name, err)
	}
	k, err := packArgs(args)
	if err != nil {
		return fmt.Errorf("launch %s: %w", fn.Name, err)
	}
	err = c.Do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		params := k.pin(&pin)
		if pdl && c.api.cuLaunchKernelEx != nil {
			attr := &launchAttribute{id: launchAttributeProgrammaticStreamSerialization}
			attr.value[0] = 1 // programmaticStreamSerializationAllowed = 1
			cfg := &launchConfig{
				gridDimX: grid[0], gridDimY: grid[1], gridDimZ: grid[2],
				blockDimX: block[0], blockDimY: block[1], blockDimZ: block[2],
				sharedMemBytes: sharedBytes, hStream: s.raw(), attrs: attr, numAttrs: 1,
			}
			pin.Pin(attr)
			pin.Pin(cfg)
			return c.api.check("cuLaunchKernelEx", c.api.cuLaunchKernelEx(unsafe.Pointer(cfg), fn.h, params, nil))
		}
		return c.api.check("cuLaunchKernel", c.api.cuLaunchKernel(fn.h,
			grid[0], grid[1], grid[2], block[0], block[1], block[2], sharedBytes, s.raw(), params, nil))
	})
	if err != nil {
		return fmt.Errorf("launch %s grid %v block %v shared %d: %w", fn.Name, grid, block, sharedBytes, err)
	}
	return nil
}
