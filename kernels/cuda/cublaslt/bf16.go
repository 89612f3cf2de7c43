package cublaslt

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The bf16 matmul with float32 output (the compressor's projections,
// mla.BF16GEMMArgs): Y = X . W^T, bf16 operands, CUBLAS_COMPUTE_32F, alpha
// 1 and beta 0, no scales. Its pointers are only 16-byte aligned (rows at
// an offset inside a buffer), so the heuristic is told so.

// bf16Alignment is the least alignment in bytes of every BF16Matmul
// pointer: what the preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*
// attributes promise the heuristic (their default is 256).
const bf16Alignment = 16

const (
	prefMinAlignmentA = 5 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32
	prefMinAlignmentB = 6 // ..._B_BYTES
	prefMinAlignmentC = 7 // ..._C_BYTES
	prefMinAlignmentD = 8 // ..._D_BYTES
)

// BF16Shape is what a bf16 plan depends on: Y [M][N] float32 (row stride
// YStride elements) = X [M][K] bf16 (row stride XStride elements) . W
// [N][K]^T bf16.
type BF16Shape struct {
	M, N, K, XStride, YStride int
}

// BF16Matmul is one bf16 GEMM's operands, device addresses aligned to 16
// bytes: W [N][K] bf16 row-major, X row m at X + 2*m*XStride, Y (float32)
// row m at Y + 4*m*YStride. Workspace is which of the Handle's Workspaces
// it uses: the stream's own.
type BF16Matmul struct {
	BF16Shape
	W, X, Y   driver.DevicePtr
	Workspace int
}

func (s BF16Shape) validate() error {
	switch {
	case s.M <= 0 || s.N <= 0 || s.K <= 0:
		return fmt.Errorf("cublaslt: bf16 shape M = %d, N = %d, K = %d must be positive", s.M, s.N, s.K)
	case s.K%8 != 0:
		return fmt.Errorf("cublaslt: bf16 K = %d must be a multiple of 8 (16-byte weight rows)", s.K)
	case s.XStride < s.K || s.XStride%8 != 0:
		return fmt.Errorf("cublaslt: bf16 XStride = %d must be >= K = %d and a multiple of 8", s.XStride, s.K)
	case s.YStride < s.N || s.YStride%4 != 0:
		return fmt.Errorf("cublaslt: bf16 YStride = %d must be >= N = %d and a multiple of 4", s.YStride, s.N)
	}
	return nil
}

func (s BF16Shape) key() planKey {
	return planKey{kind: kindBF16, m: s.M, n: s.N, k: s.K, xStride: s.XStride, yStride: s.YStride}
}

func (h *Handle) planBF16(s BF16Shape) (*plan, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	return h.cached(s.key(),
		func(p *plan) error { return h.api.buildBF16(h.h, p, s, h.cfg) },
		func() string {
			return fmt.Sprintf("cublaslt: bf16 M = %d, N = %d, K = %d, XStride = %d, YStride = %d", s.M, s.N, s.K, s.XStride, s.YStride)
		})
}

// SupportedBF16 prepares (or finds) the bf16 plan for s and reports
// whether cuBLASLt has an algorithm for it: nil, or the heuristic's
// refusal. Call it before a CUDA graph capture so that the capture itself
// only enqueues.
func (h *Handle) SupportedBF16(s BF16Shape) error {
	_, err := h.planBF16(s)
	return err
}

// MatmulBF16 enqueues Y = X . W^T on s. Like Matmul it allocates nothing
// and may be captured into a graph once SupportedBF16(shape) has been
// called outside the capture. The plan's descriptor is not modified, so
// calls may run concurrently, each stream with its own Workspace.
func (h *Handle) MatmulBF16(m *BF16Matmul, s *driver.Stream) error {
	ws, err := h.workspace(m.Workspace)
	if err != nil {
		return err
	}
	for _, ptr := range []struct {
		name string
		p    driver.DevicePtr
	}{{"W", m.W}, {"X", m.X}, {"Y", m.Y}} {
		if ptr.p%bf16Alignment != 0 {
			return fmt.Errorf("cublaslt: bf16 %s = %#x is not %d-byte aligned", ptr.name, uint64(ptr.p), bf16Alignment)
		}
	}
	p, err := h.planBF16(m.BF16Shape)
	if err != nil {
		return err
	}
	return h.ctx.Do(func() error { return h.api.matmulBF16(h.h, p, m, uintptr(ws), s.Handle()) })
}

// buildBF16 makes the bf16 plan's descriptors and asks the heuristic for an
// algorithm (on the owner thread). Column-major, as cuBLASLt sees them: A =
// W is K x N (ld K) transposed by TRANSA, B = X is K x M (ld XStride), C =
// D = Y is N x M (ld YStride).
func (a *api) buildBF16(handle uintptr, p *plan, s BF16Shape, cfg Config) error {
	if err := a.check("cublasLtMatmulDescCreate", a.descCreate(&p.desc, computeF32, typeF32)); err != nil {
		return err
	}
	transA := int32(opT)
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&transA)
	if err := a.check("cublasLtMatmulDescSetAttribute(TRANSA)", a.descSetAttribute(p.desc, descTransA, unsafe.Pointer(&transA), 4)); err != nil {
		return err
	}
	for _, l := range []struct {
		dst        *uintptr
		typ        int32
		rows, cols int
		ld         int
	}{
		{&p.a, typeBF16, s.K, s.N, s.K},
		{&p.b, typeBF16, s.K, s.M, s.XStride},
		{&p.d, typeF32, s.N, s.M, s.YStride},
	} {
		if err := a.check("cublasLtMatrixLayoutCreate", a.layoutCreate(l.dst, l.typ, uint64(l.rows), uint64(l.cols), int64(l.ld))); err != nil {
			return err
		}
	}
	var pref uintptr
	if err := a.check("cublasLtMatmulPreferenceCreate", a.prefCreate(&pref)); err != nil {
		return err
	}
	defer a.prefDestroy(pref)
	vals := struct {
		ws    uint64
		align uint32
	}{WorkspaceBytes, bf16Alignment}
	pin.Pin(&vals)
	errs := []error{a.check("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", a.prefSetAttribute(pref, prefMaxWorkspace, unsafe.Pointer(&vals.ws), 8))}
	for _, attr := range []int32{prefMinAlignmentA, prefMinAlignmentB, prefMinAlignmentC, prefMinAlignmentD} {
		errs = append(errs, a.check(fmt.Sprintf("cublasLtMatmulPreferenceSetAttribute(%d)", attr), a.prefSetAttribute(pref, attr, unsafe.Pointer(&vals.align), 4)))
	}
	errs = append(errs, cfg.prefs(a, pref))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var err error
	p.algo, err = a.heuristic(handle, p, pref, cfg.BF16Heuristic)
	return err
}

// matmulBF16 enqueues one bf16 matmul of plan p (on the owner thread).
func (a *api) matmulBF16(handle uintptr, p *plan, m *BF16Matmul, workspace uintptr, stream uintptr) error {
	scalars := struct{ alpha, beta float32 }{1, 0}
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&scalars)
	pin.Pin(&p.algo)
	return a.check("cublasLtMatmul", a.matmul(handle, p.desc, unsafe.Pointer(&scalars.alpha),
		uintptr(m.W), p.a, uintptr(m.X), p.b, unsafe.Pointer(&scalars.beta),
		uintptr(m.Y), p.d, uintptr(m.Y), p.d, unsafe.Pointer(&p.algo.algo[0]),
		workspace, WorkspaceBytes, stream))
}
