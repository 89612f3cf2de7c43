package driver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"syscall"
	"unsafe"
)

// Bytes is a kernel argument passed by value as raw bytes: a struct
// parameter, laid out by the caller exactly as the kernel's C++ struct
// (little-endian, with its padding).
type Bytes []byte

// Dim3 is a grid or block shape (x, y, z); every component must be at least 1.
type Dim3 = [3]uint32

// launchArea is memory outside the Go heap (an anonymous mapping) in which
// the owner goroutine lays out one launch at a time for the driver: the
// CUlaunchConfig, its attributes (PDL, cluster shape), the kernelParams
// pointer array and the argument values it points at. The driver copies
// all of it before the launch call returns, so each launch reuses the
// area; being outside the Go heap it needs no pinning, and a launch
// allocates nothing. Only the owner goroutine touches it.
type launchArea struct {
	mem  []byte
	n    int         // arguments laid out so far
	off  int         // where the next value goes
	call [11]uintptr // the launch call's arguments (driverAPI.launchKernel)
}

const (
	launchAreaBytes  = 64 << 10
	areaConfig       = 0    // launchConfig, 56 bytes
	areaAttrs        = 64   // maxLaunchAttrs launchAttributes, 72 bytes each
	maxLaunchAttrs   = 2    // PDL and the cluster shape
	areaParams       = 256  // kernelParams: one pointer per argument
	areaValues       = 1024 // the argument values, each 8-byte aligned
	maxKernelArgs    = (areaValues - areaParams) / 8
	maxArgValueBytes = launchAreaBytes - areaValues
)

func newLaunchArea() (*launchArea, error) {
	mem, err := syscall.Mmap(-1, 0, launchAreaBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mapping the launch area: %w", err)
	}
	return &launchArea{mem: mem}, nil
}

func (a *launchArea) free() error { return syscall.Munmap(a.mem) }

func (a *launchArea) at(off int) unsafe.Pointer { return unsafe.Pointer(&a.mem[off]) }

// reset starts a new launch's arguments.
func (a *launchArea) reset() { a.n, a.off = 0, areaValues }

// value reserves the next argument's n bytes and points the next
// kernelParams entry at them.
func (a *launchArea) value(n int) ([]byte, error) {
	if a.n == maxKernelArgs {
		return nil, fmt.Errorf("more than %d kernel arguments", maxKernelArgs)
	}
	if n >= 64 {
		// A CUtensorMap is 64-byte aligned in C; the driver copies each
		// value from where kernelParams points, so keep large ones where
		// a C caller's would be.
		a.off = (a.off + 63) &^ 63
	}
	if a.off+n > len(a.mem) {
		return nil, fmt.Errorf("kernel arguments exceed %d bytes", maxArgValueBytes)
	}
	v := a.mem[a.off : a.off+n : a.off+n]
	*(*uintptr)(a.at(areaParams + 8*a.n)) = uintptr(unsafe.Pointer(&v[0]))
	a.n++
	a.off += (n + 7) &^ 7
	return v, nil
}

// put lays out the next argument from its bytes.
func (a *launchArea) put(b []byte) error {
	v, err := a.value(len(b))
	if err == nil {
		copy(v, b)
	}
	return err
}

// params is what to pass as kernelParams: the pointer array, or nil for a
// kernel without parameters.
func (a *launchArea) params() unsafe.Pointer {
	if a.n == 0 {
		return nil
	}
	return a.at(areaParams)
}

// argSize is the width of launch argument i as a C parameter, or an error
// for a Go type without a fixed C width.
func argSize(i int, x any) (int, error) {
	switch v := x.(type) {
	case DevicePtr, uint64, int64, float64:
		return 8, nil
	case uint32, int32, float32:
		return 4, nil
	case uint16, int16:
		return 2, nil
	case uint8, int8, bool:
		return 1, nil
	case TensorMap:
		return len(v), nil
	case Bytes:
		if len(v) == 0 {
			return 0, fmt.Errorf("kernel argument %d: Bytes value is empty", i)
		}
		return len(v), nil
	case int, uint, uintptr:
		return 0, fmt.Errorf("kernel argument %d has type %T, which has no fixed C width: use int32/uint32, int64/uint64 or DevicePtr", i, x)
	default:
		return 0, fmt.Errorf("kernel argument %d has unsupported type %T: use DevicePtr, a fixed-width integer, float32, float64, bool, Bytes or TensorMap", i, x)
	}
}

// checkArgs refuses arguments without a fixed C width, before any
// hand-over.
func checkArgs(args []any) error {
	for i, x := range args {
		if _, err := argSize(i, x); err != nil {
			return err
		}
	}
	return nil
}

// putAny lays out argument i as the bytes of its C parameter
// (little-endian).
func (a *launchArea) putAny(i int, x any) error {
	n, err := argSize(i, x)
	if err != nil {
		return err
	}
	v, err := a.value(n)
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	switch x := x.(type) {
	case DevicePtr:
		le.PutUint64(v, uint64(x))
	case uint64:
		le.PutUint64(v, x)
	case int64:
		le.PutUint64(v, uint64(x))
	case float64:
		le.PutUint64(v, math.Float64bits(x))
	case uint32:
		le.PutUint32(v, x)
	case int32:
		le.PutUint32(v, uint32(x))
	case float32:
		le.PutUint32(v, math.Float32bits(x))
	case uint16:
		le.PutUint16(v, x)
	case int16:
		le.PutUint16(v, uint16(x))
	case uint8:
		v[0] = x
	case int8:
		v[0] = byte(x)
	case bool:
		v[0] = 0
		if x {
			v[0] = 1
		}
	case TensorMap:
		copy(v, x[:])
	case Bytes:
		copy(v, x)
	}
	return nil
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
	attrs                           uintptr // *CUlaunchAttribute, in the launchArea
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

// CUlaunchAttributeID values (cuda.h, CUDA 12.0 through 13.0).
const (
	// CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: its value is the union member
	// `struct { unsigned int x, y, z; } clusterDim` at offset 0.
	launchAttributeClusterDimension = 4
	// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: its value is the
	// union member `int programmaticStreamSerializationAllowed` at offset 0.
	launchAttributeProgrammaticStreamSerialization = 6
)

// LaunchOptions are the launch attributes of LaunchWith and
// LaunchValuesWith; the zero value is an ordinary launch.
type LaunchOptions struct {
	// PDL asks for programmatic dependent launch, as LaunchPDL does (an
	// ordinary launch where cuLaunchKernelEx is missing).
	PDL bool
	// Cluster is the thread-block cluster shape in blocks (x, y, z); the
	// zero value launches without clusters. Every grid dimension must be a
	// multiple of the cluster's (ErrClusterShape otherwise). Clusters need
	// compute capability 9.0 and cuLaunchKernelEx: without the symbol the
	// launch fails with ErrNoClusterLaunch, since a kernel that shares
	// memory across its cluster would compute wrong results in one-block
	// clusters. More than 8 blocks a cluster is non-portable (16 at most on
	// the H200) and needs FuncNonPortableClusterSizeAllowed set to 1 on the
	// function first; the driver refuses it otherwise
	// (CUDA_ERROR_INVALID_CLUSTER_SIZE).
	Cluster Dim3
}

// clustered reports whether the launch asks for a cluster shape.
func (o LaunchOptions) clustered() bool { return o.Cluster != Dim3{} }

// ErrClusterShape: a cluster shape with a zero component, or one that does
// not divide the grid.
var ErrClusterShape = errors.New("cuda driver: invalid thread-block cluster shape")

// ErrNoClusterLaunch: a cluster launch asked of a driver without
// cuLaunchKernelEx (CUDA 12.0 or later), which has no other way to set the
// cluster shape.
var ErrNoClusterLaunch = errors.New("cuda driver: thread-block cluster launches need cuLaunchKernelEx (a CUDA 12 driver)")

// validateOptions checks opts against the grid and this driver, before any
// hand-over to the owner.
func (c *Context) validateOptions(grid Dim3, opts LaunchOptions) error {
	if !opts.clustered() {
		return nil
	}
	for i, v := range opts.Cluster {
		if v == 0 {
			return fmt.Errorf("%w: cluster %v: cluster[%d] is 0 (every dimension at least 1, or all 0 for no cluster)", ErrClusterShape, opts.Cluster, i)
		}
		if grid[i]%v != 0 {
			return fmt.Errorf("%w: grid %v is not a multiple of cluster %v in dimension %d", ErrClusterShape, grid, opts.Cluster, i)
		}
	}
	if c.api == nil || c.api.cuLaunchKernelEx == 0 {
		return ErrNoClusterLaunch
	}
	return nil
}

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
	return c.LaunchWith(fn, grid, block, sharedBytes, s, LaunchOptions{}, args...)
}

// LaunchPDL is Launch with programmatic dependent launch: the kernel may be
// scheduled before the previous kernel on s finishes and must execute
// `griddepcontrol.wait` (cudaGridDependencySynchronize) before reading that
// kernel's output. Needs compute capability 9.0 and cuLaunchKernelEx; without
// the symbol it degrades to an ordinary launch, which is still correct
// because griddepcontrol.wait then returns at once.
func (c *Context) LaunchPDL(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, args ...any) error {
	return c.LaunchWith(fn, grid, block, sharedBytes, s, LaunchOptions{PDL: true}, args...)
}

// LaunchWith is Launch with the launch attributes of opts: programmatic
// dependent launch and a thread-block cluster shape (see LaunchOptions).
func (c *Context) LaunchWith(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, opts LaunchOptions, args ...any) error {
	if err := c.validateLaunch(fn, grid, block, opts); err != nil {
		return err
	}
	if err := checkArgs(args); err != nil {
		return fmt.Errorf("launch %s: %w", fn.Name, err)
	}
	issue := func() error {
		c.area.reset()
		for i, x := range args {
			if err := c.area.putAny(i, x); err != nil {
				return err
			}
		}
		return c.issue(fn, grid, block, sharedBytes, s, opts)
	}
	return c.wrapLaunch(fn, grid, block, sharedBytes, c.Do(issue))
}

// LaunchValues is Launch (or, with pdl, LaunchPDL) with each argument
// given as the bytes of its C parameter, laid out as the kernel reads it
// (little-endian; a struct with its padding). Called on the owner thread
// (inside Do, where a batch of launches belongs) it allocates nothing: the
// values are copied into memory outside the Go heap that the driver reads.
func (c *Context) LaunchValues(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, pdl bool, args ...[]byte) error {
	return c.LaunchValuesWith(fn, grid, block, sharedBytes, s, LaunchOptions{PDL: pdl}, args...)
}

// LaunchValuesWith is LaunchValues with the launch attributes of opts (see
// LaunchOptions); on the owner thread it allocates nothing either.
func (c *Context) LaunchValuesWith(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, opts LaunchOptions, args ...[]byte) error {
	if err := c.validateLaunch(fn, grid, block, opts); err != nil {
		return err
	}
	for i, b := range args {
		if len(b) == 0 {
			return fmt.Errorf("launch %s: kernel argument %d is empty", fn.Name, i)
		}
	}
	if c.onOwner() {
		if c.closed.Load() {
			return ErrClosed
		}
		return c.wrapLaunch(fn, grid, block, sharedBytes, c.issueValues(fn, grid, block, sharedBytes, s, opts, args))
	}
	// From another goroutine: the values travel in one buffer of their
	// own, so the caller's slices stay theirs.
	n := 0
	for _, b := range args {
		n += len(b)
	}
	buf, copied := make([]byte, 0, n), make([][]byte, len(args))
	for i, b := range args {
		buf = append(buf, b...)
		copied[i] = buf[len(buf)-len(b):]
	}
	err := c.Do(func() error { return c.issueValues(fn, grid, block, sharedBytes, s, opts, copied) })
	return c.wrapLaunch(fn, grid, block, sharedBytes, err)
}

func (c *Context) issueValues(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, opts LaunchOptions, args [][]byte) error {
	c.area.reset()
	for _, b := range args {
		if err := c.area.put(b); err != nil {
			return err
		}
	}
	return c.issue(fn, grid, block, sharedBytes, s, opts)
}

func (c *Context) validateLaunch(fn *Function, grid, block Dim3, opts LaunchOptions) error {
	if fn == nil {
		return errors.New("Launch: function is nil")
	}
	if err := validateDims("grid", grid); err != nil {
		return fmt.Errorf("launch %s: %w", fn.Name, err)
	}
	if err := validateDims("block", block); err != nil {
		return fmt.Errorf("launch %s: %w", fn.Name, err)
	}
	if err := c.validateOptions(grid, opts); err != nil {
		return fmt.Errorf("launch %s: %w", fn.Name, err)
	}
	return nil
}

func (c *Context) wrapLaunch(fn *Function, grid, block Dim3, sharedBytes uint32, err error) error {
	if err != nil {
		return fmt.Errorf("launch %s grid %v block %v shared %d: %w", fn.Name, grid, block, sharedBytes, err)
	}
	return nil
}

// issue calls the driver with the arguments laid out in the launch area,
// on the owner goroutine. opts has been validated (validateOptions).
func (c *Context) issue(fn *Function, grid, block Dim3, sharedBytes uint32, s *Stream, opts LaunchOptions) error {
	a := c.area
	if c.api.cuLaunchKernelEx != 0 {
		if cfg := a.config(grid, block, sharedBytes, s.raw(), opts); cfg != nil {
			return c.api.check("cuLaunchKernelEx", c.api.launchKernelEx(&a.call, unsafe.Pointer(cfg), fn.h, a.params()))
		}
	}
	return c.api.check("cuLaunchKernel", c.api.launchKernel(&a.call, fn.h, grid, block, sharedBytes, s.raw(), a.params()))
}

// config lays out the CUlaunchConfig of a launch with the attributes opts
// asks for, in the launch area, or returns nil when it asks for none (the
// launch is then an ordinary cuLaunchKernel).
func (a *launchArea) config(grid, block Dim3, sharedBytes uint32, s handle, opts LaunchOptions) *launchConfig {
	attrs := (*[maxLaunchAttrs]launchAttribute)(a.at(areaAttrs))
	n := uint32(0)
	if opts.PDL {
		attrs[n] = launchAttribute{id: launchAttributeProgrammaticStreamSerialization}
		attrs[n].value[0] = 1 // programmaticStreamSerializationAllowed = 1
		n++
	}
	if opts.clustered() {
		attrs[n] = launchAttribute{id: launchAttributeClusterDimension}
		attrs[n].value[0] = uint64(opts.Cluster[0]) | uint64(opts.Cluster[1])<<32 // clusterDim.x, .y
		attrs[n].value[1] = uint64(opts.Cluster[2])                               // clusterDim.z
		n++
	}
	if n == 0 {
		return nil
	}
	cfg := (*launchConfig)(a.at(areaConfig))
	*cfg = launchConfig{
		gridDimX: grid[0], gridDimY: grid[1], gridDimZ: grid[2],
		blockDimX: block[0], blockDimY: block[1], blockDimZ: block[2],
		sharedMemBytes: sharedBytes, hStream: s, attrs: uintptr(unsafe.Pointer(&attrs[0])), numAttrs: n,
	}
	return cfg
}
