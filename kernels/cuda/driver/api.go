package driver

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Handles are the driver's opaque pointers (CUcontext, CUstream, ...). They
// are never dereferenced in Go, so uintptr is the honest type.
type handle = uintptr

// driverAPI is the subset of libcuda this package calls. Field comments give
// the C prototype (cuda.h, CUDA 12.x/13.0); every symbol is exported by
// driver 580 (CUDA 13.0) and by older drivers back to CUDA 12.0.
type driverAPI struct {
	path string

	cuInit             func(flags uint32) Result                    // CUresult cuInit(unsigned int)
	cuDriverGetVersion func(version *int32) Result                  // (int*)
	cuGetErrorName     func(r Result, str **byte) Result            // (CUresult, const char**)
	cuGetErrorString   func(r Result, str **byte) Result            // (CUresult, const char**)
	cuDeviceGetCount   func(count *int32) Result                    // (int*)
	cuDeviceGet        func(dev *int32, ordinal int32) Result       // (CUdevice*, int)
	cuDeviceGetName    func(name *byte, n int32, dev int32) Result  // (char*, int, CUdevice)
	cuDeviceGetAttr    func(v *int32, attr int32, dev int32) Result // cuDeviceGetAttribute(int*, CUdevice_attribute, CUdevice)
	cuDeviceTotalMem   func(bytes *uint64, dev int32) Result        // cuDeviceTotalMem_v2(size_t*, CUdevice)
	cuPrimaryRetain    func(ctx *handle, dev int32) Result          // cuDevicePrimaryCtxRetain(CUcontext*, CUdevice)
	cuPrimaryRelease   func(dev int32) Result                       // cuDevicePrimaryCtxRelease_v2(CUdevice)
	cuCtxSetCurrent    func(ctx handle) Result                      // (CUcontext)
	cuCtxSynchronize   func() Result                                // (void)
	cuMemGetInfo       func(free, total *uint64) Result             // cuMemGetInfo_v2(size_t*, size_t*)
	cuMemAlloc         func(p *DevicePtr, n uint64) Result          // cuMemAlloc_v2(CUdeviceptr*, size_t)
	cuMemFree          func(p DevicePtr) Result                     // cuMemFree_v2(CUdeviceptr)
	cuMemAllocHost     func(p *unsafe.Pointer, n uint64) Result     // cuMemAllocHost_v2(void**, size_t)
	cuMemFreeHost      func(p unsafe.Pointer) Result                // (void*)
	cuMemcpyHtoD       func(dst DevicePtr, src unsafe.Pointer, n uint64) Result
	cuMemcpyDtoH       func(dst unsafe.Pointer, src DevicePtr, n uint64) Result
	cuMemcpyDtoD       func(dst, src DevicePtr, n uint64) Result
	cuMemcpyHtoDAsync  func(dst DevicePtr, src unsafe.Pointer, n uint64, s handle) Result
	cuMemcpyDtoHAsync  func(dst unsafe.Pointer, src DevicePtr, n uint64, s handle) Result
	cuMemcpyDtoDAsync  func(dst, src DevicePtr, n uint64, s handle) Result
	cuMemsetD8         func(dst DevicePtr, v uint8, n uint64) Result           // cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t)
	cuMemsetD8Async    func(dst DevicePtr, v uint8, n uint64, s handle) Result // (CUdeviceptr, unsigned char, size_t, CUstream)
	cuStreamCreate     func(s *handle, flags uint32) Result                    // (CUstream*, unsigned int)
	cuStreamDestroy    func(s handle) Result                                   // cuStreamDestroy_v2(CUstream)
	cuStreamSync       func(s handle) Result                                   // cuStreamSynchronize(CUstream)
	cuStreamWaitEvent  func(s, e handle, flags uint32) Result                  // (CUstream, CUevent, unsigned int)
	cuEventCreate      func(e *handle, flags uint32) Result                    // (CUevent*, unsigned int)
	cuEventRecord      func(e, s handle) Result                                // (CUevent, CUstream)
	cuEventSync        func(e handle) Result                                   // cuEventSynchronize(CUevent)
	cuEventElapsed     func(ms *float32, start, end handle) Result             // cuEventElapsedTime[_v2](float*, CUevent, CUevent)
	cuEventDestroy     func(e handle) Result                                   // cuEventDestroy_v2(CUevent)
	cuModuleLoadData   func(m *handle, image unsafe.Pointer) Result            // (CUmodule*, const void*)
	cuModuleUnload     func(m handle) Result                                   // (CUmodule)
	cuModuleGetFunc    func(f *handle, m handle, name *byte) Result            // cuModuleGetFunction(CUfunction*, CUmodule, const char*)
	cuFuncGetAttr      func(v *int32, attr int32, f handle) Result             // cuFuncGetAttribute(int*, CUfunction_attribute, CUfunction)
	cuFuncSetAttr      func(f handle, attr int32, v int32) Result              // cuFuncSetAttribute(CUfunction, CUfunction_attribute, int)
	// The launches are raw symbols called through purego.SyscallN
	// (launchKernel, launchKernelEx): RegisterFunc's reflection costs more
	// than the rest of an eager launch's host path.
	// cuLaunchKernel(CUfunction f, unsigned gridX, gridY, gridZ, blockX, blockY, blockZ,
	//                unsigned sharedMemBytes, CUstream, void** kernelParams, void** extra)
	cuLaunchKernel uintptr
	// cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void** kernelParams, void** extra); optional.
	cuLaunchKernelEx uintptr
	// cuOccupancyMaxActiveClusters(int* numClusters, CUfunction, const CUlaunchConfig*); optional
	// (CUDA 12.0). Raw too, so a query on the owner allocates nothing.
	cuOccupancyMaxActiveClusters uintptr
	cuBeginCapture               func(s handle, mode int32) Result              // cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode)
	cuEndCapture                 func(s handle, g *handle) Result               // cuStreamEndCapture(CUstream, CUgraph*)
	cuGraphInstantiate           func(e *handle, g handle, flags uint64) Result // cuGraphInstantiateWithFlags(CUgraphExec*, CUgraph, unsigned long long)
	cuGraphLaunch                func(e, s handle) Result                       // (CUgraphExec, CUstream)
	cuGraphExecDestroy           func(e handle) Result                          // (CUgraphExec)
	cuGraphDestroy               func(g handle) Result                          // (CUgraph)
	// cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t rank, void* globalAddress,
	//     const cuuint64_t* globalDim, const cuuint64_t* globalStrides, const cuuint32_t* boxDim,
	//     const cuuint32_t* elementStrides, CUtensorMapInterleave, CUtensorMapSwizzle,
	//     CUtensorMapL2promotion, CUtensorMapFloatOOBfill); optional (CUDA 12.0 drivers on).
	cuTensorMapEncodeTiled func(m *TensorMap, dtype, rank uint32, addr uint64, dims, strides *uint64, box, elem *uint32,
		interleave, swizzle, l2, oob uint32) Result

	elapsedName string // which cuEventElapsedTime symbol was bound
}

func (a *driverAPI) bindings() []binding {
	req := func(fptr any, name string) binding { return binding{fptr: fptr, names: []string{name}} }
	return []binding{
		req(&a.cuInit, "cuInit"),
		req(&a.cuDriverGetVersion, "cuDriverGetVersion"),
		req(&a.cuGetErrorName, "cuGetErrorName"),
		req(&a.cuGetErrorString, "cuGetErrorString"),
		req(&a.cuDeviceGetCount, "cuDeviceGetCount"),
		req(&a.cuDeviceGet, "cuDeviceGet"),
		req(&a.cuDeviceGetName, "cuDeviceGetName"),
		req(&a.cuDeviceGetAttr, "cuDeviceGetAttribute"),
		req(&a.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
		req(&a.cuPrimaryRetain, "cuDevicePrimaryCtxRetain"),
		req(&a.cuPrimaryRelease, "cuDevicePrimaryCtxRelease_v2"),
		req(&a.cuCtxSetCurrent, "cuCtxSetCurrent"),
		req(&a.cuCtxSynchronize, "cuCtxSynchronize"),
		req(&a.cuMemGetInfo, "cuMemGetInfo_v2"),
		req(&a.cuMemAlloc, "cuMemAlloc_v2"),
		req(&a.cuMemFree, "cuMemFree_v2"),
		req(&a.cuMemAllocHost, "cuMemAllocHost_v2"),
		req(&a.cuMemFreeHost, "cuMemFreeHost"),
		req(&a.cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
		req(&a.cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
		req(&a.cuMemcpyDtoD, "cuMemcpyDtoD_v2"),
		req(&a.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
		req(&a.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
		req(&a.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
		req(&a.cuMemsetD8, "cuMemsetD8_v2"),
		req(&a.cuMemsetD8Async, "cuMemsetD8Async"),
		req(&a.cuStreamCreate, "cuStreamCreate"),
		req(&a.cuStreamDestroy, "cuStreamDestroy_v2"),
		req(&a.cuStreamSync, "cuStreamSynchronize"),
		req(&a.cuStreamWaitEvent, "cuStreamWaitEvent"),
		req(&a.cuEventCreate, "cuEventCreate"),
		req(&a.cuEventRecord, "cuEventRecord"),
		req(&a.cuEventSync, "cuEventSynchronize"),
		// CUDA 12.8 added _v2; CUDA 13 headers map cuEventElapsedTime to it.
		{fptr: &a.cuEventElapsed, names: []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}, bound: &a.elapsedName},
		req(&a.cuEventDestroy, "cuEventDestroy_v2"),
		req(&a.cuModuleLoadData, "cuModuleLoadData"),
		req(&a.cuModuleUnload, "cuModuleUnload"),
		req(&a.cuModuleGetFunc, "cuModuleGetFunction"),
		req(&a.cuFuncGetAttr, "cuFuncGetAttribute"),
		req(&a.cuFuncSetAttr, "cuFuncSetAttribute"),
		{sym: &a.cuLaunchKernel, names: []string{"cuLaunchKernel"}},
		{sym: &a.cuLaunchKernelEx, names: []string{"cuLaunchKernelEx"}, optional: true},
		{sym: &a.cuOccupancyMaxActiveClusters, names: []string{"cuOccupancyMaxActiveClusters"}, optional: true},
		req(&a.cuBeginCapture, "cuStreamBeginCapture_v2"),
		req(&a.cuEndCapture, "cuStreamEndCapture"),
		// cuGraphInstantiate is a macro for cuGraphInstantiateWithFlags since CUDA 12.0.
		req(&a.cuGraphInstantiate, "cuGraphInstantiateWithFlags"),
		req(&a.cuGraphLaunch, "cuGraphLaunch"),
		req(&a.cuGraphExecDestroy, "cuGraphExecDestroy"),
		req(&a.cuGraphDestroy, "cuGraphDestroy"),
		{fptr: &a.cuTensorMapEncodeTiled, names: []string{"cuTensorMapEncodeTiled"}, optional: true},
	}
}

// launchKernel calls cuLaunchKernel; params points outside the Go heap
// (launchArea), so nothing needs pinning. The call's arguments go through
// the owner's call slice: a variadic list would be allocated each call.
func (a *driverAPI) launchKernel(call *[11]uintptr, f handle, grid, block Dim3, shared uint32, s handle, params unsafe.Pointer) Result {
	*call = [11]uintptr{f, uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]), uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(shared), s, uintptr(params), 0}
	r, _, _ := purego.SyscallN(a.cuLaunchKernel, call[:]...)
	return Result(int32(r)) // CUresult is a C int: the upper half of the register is not defined
}

// launchKernelEx calls cuLaunchKernelEx (the caller checks that it exists);
// cfg and params point outside the Go heap (launchArea).
func (a *driverAPI) launchKernelEx(call *[11]uintptr, cfg unsafe.Pointer, f handle, params unsafe.Pointer) Result {
	*call = [11]uintptr{uintptr(cfg), f, uintptr(params), 0}
	r, _, _ := purego.SyscallN(a.cuLaunchKernelEx, call[:4]...)
	return Result(int32(r))
}

// maxActiveClusters calls cuOccupancyMaxActiveClusters (the caller checks
// that it exists); n and cfg point outside the Go heap (launchArea).
func (a *driverAPI) maxActiveClusters(call *[11]uintptr, n *int32, f handle, cfg unsafe.Pointer) Result {
	*call = [11]uintptr{uintptr(unsafe.Pointer(n)), f, uintptr(cfg)}
	r, _, _ := purego.SyscallN(a.cuOccupancyMaxActiveClusters, call[:3]...)
	return Result(int32(r))
}

// describe asks the driver to name a code; see describeFunc.
func (a *driverAPI) describe(r Result) (string, string, bool) {
	var name, desc *byte
	if a.cuGetErrorName(r, &name) != ResultSuccess || a.cuGetErrorString(r, &desc) != ResultSuccess {
		return "", "", false
	}
	return goString(name), goString(desc), true
}

// check turns a CUresult into nil or an *Error naming call.
func (a *driverAPI) check(call string, r Result) error {
	if r == ResultSuccess {
		return nil
	}
	return newError(call, r, a.describe)
}

var (
	driverOnce   sync.Once
	driverLoaded *driverAPI
	driverErr    error
)

// loadDriver opens libcuda, binds every symbol, calls cuInit and checks that a
// device exists, once per process.
func loadDriver() (*driverAPI, error) {
	driverOnce.Do(func() {
		h, path, err := openFirst("the CUDA driver library", driverCandidates(processEnvironment()))
		if err != nil {
			driverErr = err
			return
		}
		a := &driverAPI{path: path}
		if err := bindAll(h, path, a.bindings()); err != nil {
			driverErr = err
			return
		}
		if err := a.check("cuInit", a.cuInit(0)); err != nil {
			driverErr = err
			return
		}
		var n int32
		if err := a.check("cuDeviceGetCount", a.cuDeviceGetCount(&n)); err != nil {
			driverErr = err
			return
		}
		if n <= 0 {
			driverErr = errors.New("cuDeviceGetCount: the CUDA driver reports 0 devices")
			return
		}
		driverLoaded = a
	})
	return driverLoaded, driverErr
}

// Available reports whether CUDA can be used: nil when libcuda.so.1 loads,
// cuInit succeeds and at least one device exists; otherwise an error that says
// which of those failed. The answer is computed once per process.
func Available() error {
	_, err := loadDriver()
	if err != nil {
		return fmt.Errorf("CUDA unavailable: %w", err)
	}
	return nil
}

// DeviceCount is the number of CUDA devices the driver sees.
func DeviceCount() (int, error) {
	a, err := loadDriver()
	if err != nil {
		return 0, fmt.Errorf("CUDA unavailable: %w", err)
	}
	var n int32
	if err := a.check("cuDeviceGetCount", a.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// DriverVersion is the CUDA version the installed driver supports, encoded
// as 1000*major + 10*minor (13000 for CUDA 13.0).
func DriverVersion() (int, error) {
	a, err := loadDriver()
	if err != nil {
		return 0, fmt.Errorf("CUDA unavailable: %w", err)
	}
	var v int32
	if err := a.check("cuDriverGetVersion", a.cuDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}
