package cublaslt

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// EnvLibrary is the variable naming the exact libcublasLt to load.
const EnvLibrary = "PROLOGUE_CUBLASLT"

// Status is a cublasStatus_t.
type Status int32

// StatusNotSupported is CUBLAS_STATUS_NOT_SUPPORTED (what the heuristic
// answers for M = 1 and 2).
const StatusNotSupported Status = 15

// Error is a failed cuBLASLt call.
type Error struct {
	Call   string
	Status Status
	Text   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuBLASLt %s: status %d (%s)", e.Call, e.Status, e.Text)
}

// Enum values of cublasLt.h, cublas_api.h and library_types.h (CUDA 12.x
// and 13.0; the reference page lists where they were read).
const (
	descTransA        = 3  // CUBLASLT_MATMUL_DESC_TRANSA, int32 cublasOperation_t
	descAScalePointer = 17 // CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, void*
	descBScalePointer = 18 // CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, void*
	descAScaleMode    = 31 // CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32
	descBScaleMode    = 32 // CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32

	scaleVec128F32      = 4 // CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
	scaleBlk128x128F32  = 5 // CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
	prefMaxWorkspace    = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64
	prefReductionMask   = 3 // CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, uint32
	typeE4M3            = 28
	typeBF16            = 14
	typeF32             = 0
	computeF32          = 68 // CUBLAS_COMPUTE_32F
	opT                 = 1  // CUBLAS_OP_T
	heuristicResultSize = 96
)

// heuristicResult mirrors cublasLtMatmulHeuristicResult_t (96 bytes).
type heuristicResult struct {
	algo          [8]uint64 // cublasLtMatmulAlgo_t
	workspaceSize uint64
	state         int32
	waves         float32
	reserved      [4]int32
}

type api struct {
	path    string
	version int

	create           func(h *uintptr) Status
	destroy          func(h uintptr) Status
	getVersion       func() uint64
	getStatusString  func(s Status) string
	descCreate       func(d *uintptr, compute int32, scaleType int32) Status
	descSetAttribute func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) Status
	descDestroy      func(d uintptr) Status
	layoutCreate     func(l *uintptr, typ int32, rows, cols uint64, ld int64) Status
	layoutDestroy    func(l uintptr) Status
	prefCreate       func(p *uintptr) Status
	prefSetAttribute func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) Status
	prefDestroy      func(p uintptr) Status
	algoGetHeuristic func(h, desc, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) Status
	algoConfigGet    func(algo unsafe.Pointer, attr int32, buf unsafe.Pointer, size uint64, written *uint64) Status
	matmul           func(h, desc uintptr, alpha unsafe.Pointer, a uintptr, adesc uintptr, b uintptr, bdesc uintptr, beta unsafe.Pointer, c uintptr, cdesc uintptr, d uintptr, ddesc uintptr, algo unsafe.Pointer, workspace uintptr, workspaceSize uint64, stream uintptr) Status
}

func (a *api) check(call string, s Status) error {
	if s == 0 {
		return nil
	}
	return &Error{Call: call, Status: s, Text: a.getStatusString(s)}
}

// librarySpec is where cuBLASLt is looked for.
var librarySpec = driver.LibrarySpec{
	Env:     EnvLibrary,
	Sonames: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
	Glob:    "libcublasLt.so*",
	Wheels:  []string{"cublas"},
}

// Candidates lists the paths tried, in order.
func Candidates() []string { return driver.LibraryCandidates(librarySpec) }

var (
	loadOnce sync.Once
	loaded   *api
	loadErr  error
)

func load() (*api, error) {
	loadOnce.Do(func() { loaded, loadErr = open(Candidates()) })
	return loaded, loadErr
}

func open(candidates []string) (*api, error) {
	h, path, err := driver.OpenLibrary("cuBLASLt (set "+EnvLibrary+" to its path)", candidates)
	if err != nil {
		return nil, err
	}
	a := &api{path: path}
	for _, b := range []struct {
		fptr any
		name string
	}{
		{&a.create, "cublasLtCreate"}, {&a.destroy, "cublasLtDestroy"},
		{&a.getVersion, "cublasLtGetVersion"}, {&a.getStatusString, "cublasLtGetStatusString"},
		{&a.descCreate, "cublasLtMatmulDescCreate"}, {&a.descSetAttribute, "cublasLtMatmulDescSetAttribute"},
		{&a.descDestroy, "cublasLtMatmulDescDestroy"},
		{&a.layoutCreate, "cublasLtMatrixLayoutCreate"}, {&a.layoutDestroy, "cublasLtMatrixLayoutDestroy"},
		{&a.prefCreate, "cublasLtMatmulPreferenceCreate"}, {&a.prefSetAttribute, "cublasLtMatmulPreferenceSetAttribute"},
		{&a.prefDestroy, "cublasLtMatmulPreferenceDestroy"},
		{&a.algoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"}, {&a.matmul, "cublasLtMatmul"},
		{&a.algoConfigGet, "cublasLtMatmulAlgoConfigGetAttribute"},
	} {
		sym, err := purego.Dlsym(h, b.name)
		if err != nil || sym == 0 {
			return nil, fmt.Errorf("%s does not export %s", path, b.name)
		}
		purego.RegisterFunc(b.fptr, sym)
	}
	a.version = int(a.getVersion())
	return a, nil
}

// Available reports why cuBLASLt cannot be loaded here, or nil. The error
// lists every path tried.
func Available() error {
	_, err := load()
	if err != nil {
		return fmt.Errorf("cuBLASLt unavailable: %w", err)
	}
	return nil
}

// Version is cublasLtGetVersion() (e.g. 130100) and the path loaded.
func Version() (int, string, error) {
	a, err := load()
	if err != nil {
		return 0, "", err
	}
	return a.version, a.path, nil
}
