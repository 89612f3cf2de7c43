package driver

import (
	"fmt"
	"strconv"
)

// Result is a CUDA driver API status code (CUresult in cuda.h). It implements
// error so that errors.Is(err, ResultOutOfMemory) works on any *Error.
type Result int32

// The CUresult values this package's callers are most likely to test for.
// Values are from cuda.h (CUDA 12.x/13.0); the full name table is resultNames.
const (
	ResultSuccess                  Result = 0
	ResultInvalidValue             Result = 1
	ResultOutOfMemory              Result = 2
	ResultNotInitialized           Result = 3
	ResultDeinitialized            Result = 4
	ResultStubLibrary              Result = 34
	ResultNoDevice                 Result = 100
	ResultInvalidDevice            Result = 101
	ResultInvalidImage             Result = 200
	ResultInvalidContext           Result = 201
	ResultNoBinaryForGPU           Result = 209
	ResultInvalidPTX               Result = 218
	ResultUnsupportedPTXVersion    Result = 222
	ResultInvalidHandle            Result = 400
	ResultNotFound                 Result = 500
	ResultNotReady                 Result = 600
	ResultIllegalAddress           Result = 700
	ResultLaunchOutOfResources     Result = 701
	ResultLaunchFailed             Result = 719
	ResultNotPermitted             Result = 800
	ResultNotSupported             Result = 801
	ResultStreamCaptureUnsupported Result = 900
	ResultStreamCaptureInvalidated Result = 901
	ResultInvalidClusterSize       Result = 912
	ResultUnknown                  Result = 999
)

// resultNames is the CUresult enum of cuda.h. The driver's own cuGetErrorName
// is preferred; this table names codes when the driver cannot be asked (it
// failed to load, or the lookup itself failed).
var resultNames = map[Result]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 5: "CUDA_ERROR_PROFILER_DISABLED",
	6: "CUDA_ERROR_PROFILER_NOT_INITIALIZED", 7: "CUDA_ERROR_PROFILER_ALREADY_STARTED",
	8: "CUDA_ERROR_PROFILER_ALREADY_STOPPED", 34: "CUDA_ERROR_STUB_LIBRARY",
	46: "CUDA_ERROR_DEVICE_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED", 200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
	202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 205: "CUDA_ERROR_MAP_FAILED", 206: "CUDA_ERROR_UNMAP_FAILED",
	207: "CUDA_ERROR_ARRAY_IS_MAPPED", 208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	210: "CUDA_ERROR_ALREADY_ACQUIRED", 211: "CUDA_ERROR_NOT_MAPPED", 212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
	213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER", 214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	215: "CUDA_ERROR_UNSUPPORTED_LIMIT", 216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", 218: "CUDA_ERROR_INVALID_PTX",
	219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", 220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	223: "CUDA_ERROR_JIT_COMPILATION_DISABLED", 224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
	225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", 226: "CUDA_ERROR_CONTAINED",
	300: "CUDA_ERROR_INVALID_SOURCE", 301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", 303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM", 400: "CUDA_ERROR_INVALID_HANDLE", 401: "CUDA_ERROR_ILLEGAL_STATE",
	402: "CUDA_ERROR_LOSSY_QUERY", 500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT", 703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", 709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT", 711: "CUDA_ERROR_TOO_MANY_PEERS",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR", 715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS", 717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC", 719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", 721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
	800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	805: "CUDA_ERROR_MPS_CONNECTION_FAILED", 806: "CUDA_ERROR_MPS_RPC_FAILURE",
	807: "CUDA_ERROR_MPS_SERVER_NOT_READY", 808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
	809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", 810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
	811: "CUDA_ERROR_CDP_NOT_SUPPORTED", 812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 911: "CUDA_ERROR_EXTERNAL_DEVICE",
	912: "CUDA_ERROR_INVALID_CLUSTER_SIZE", 913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
	914: "CUDA_ERROR_INVALID_RESOURCE_TYPE", 915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
	916: "CUDA_ERROR_KEY_ROTATION", 999: "CUDA_ERROR_UNKNOWN",
}

// Name is the cuda.h spelling of r, or "CUresult(N)" for a code the table
// does not know (a driver newer than this package).
func (r Result) Name() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return "CUresult(" + strconv.Itoa(int(r)) + ")"
}

// Error makes a bare Result usable as an errors.Is target.
func (r Result) Error() string { return r.Name() }

// Error is a failed driver API call: which call, the CUresult, and the
// driver's own name and description of it.
type Error struct {
	Call        string // the exported symbol, e.g. "cuMemAlloc_v2"
	Result      Result
	Name        string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Description string // e.g. "out of memory"
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%s)", e.Call, e.Name, e.Description)
}

// Is reports whether target is the same Result, so callers can write
// errors.Is(err, driver.ResultInvalidValue).
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Result
}

// describeFunc asks the driver for a code's name and description; ok is false
// when the driver cannot answer.
type describeFunc func(r Result) (name, description string, ok bool)

// newError builds the *Error for a failed call, falling back to the static
// name table when the driver cannot describe the code. r must not be success.
func newError(call string, r Result, describe describeFunc) *Error {
	e := &Error{Call: call, Result: r}
	if describe != nil {
		if name, desc, ok := describe(r); ok {
			e.Name, e.Description = name, desc
			return e
		}
	}
	e.Name = r.Name()
	if _, known := resultNames[r]; known {
		e.Description = "the driver could not describe this code"
	} else {
		e.Description = "unrecognized CUresult " + strconv.Itoa(int(r))
	}
	return e
}

// NVRTCResult is an NVRTC status code (nvrtcResult in nvrtc.h).
type NVRTCResult int32

// NVRTC status codes from nvrtc.h.
const (
	NVRTCSuccess          NVRTCResult = 0
	NVRTCErrorInvalidOpt  NVRTCResult = 5
	NVRTCErrorCompilation NVRTCResult = 6
)

var nvrtcResultNames = map[NVRTCResult]string{
	0: "NVRTC_SUCCESS", 1: "NVRTC_ERROR_OUT_OF_MEMORY", 2: "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
	3: "NVRTC_ERROR_INVALID_INPUT", 4: "NVRTC_ERROR_INVALID_PROGRAM", 5: "NVRTC_ERROR_INVALID_OPTION",
	6: "NVRTC_ERROR_COMPILATION", 7: "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
	8: "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
	9: "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION", 10: "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
	11: "NVRTC_ERROR_INTERNAL_ERROR", 12: "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
	13: "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED", 14: "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
	15: "NVRTC_ERROR_PCH_CREATE", 16: "NVRTC_ERROR_CANCELLED", 17: "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
}

// Name is the nvrtc.h spelling of r, or "nvrtcResult(N)" when unknown.
func (r NVRTCResult) Name() string {
	if n, ok := nvrtcResultNames[r]; ok {
		return n
	}
	return "nvrtcResult(" + strconv.Itoa(int(r)) + ")"
}

// Error makes a bare NVRTCResult usable as an errors.Is target.
func (r NVRTCResult) Error() string { return r.Name() }

// NVRTCError is a failed NVRTC call.
type NVRTCError struct {
	Call   string // e.g. "nvrtcCompileProgram"
	Result NVRTCResult
	Name   string // nvrtcGetErrorString's answer, e.g. "NVRTC_ERROR_COMPILATION"
}

func (e *NVRTCError) Error() string { return e.Call + ": " + e.Name }

// Is matches a bare NVRTCResult target.
func (e *NVRTCError) Is(target error) bool {
	r, ok := target.(NVRTCResult)
	return ok && r == e.Result
}

// CompileError is a failed NVRTC compilation; its message carries the whole
// compiler log, because the log is the only place the reason is written.
type CompileError struct {
	Program string   // the program name given to Compile
	Options []string // the NVRTC options used
	Log     string   // NVRTC's program log
	Err     error    // the failing NVRTC call
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("compile %q with NVRTC options %q: %v; compiler log:\n%s", e.Program, e.Options, e.Err, e.Log)
}

func (e *CompileError) Unwrap() error { return e.Err }
