package cublaslt

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// WorkspaceBytes is each workspace a Handle allocates once and offers
// every algorithm.
const WorkspaceBytes = 32 << 20

// Workspaces is how many workspaces a Handle allocates: one for each
// stream whose matmuls may run at the same time (the CUDA backend's main,
// side and third streams), chosen by the matmul's Workspace field. The split-K
// algorithms keep their partials, and some the counters their blocks wait
// on, in the workspace: two kernels sharing one at once overwrite each
// other's and can wait forever (cmd/bench's three-projection ratio-4 layer
// at V4-Pro decode hung in its graph so, 2026-12-02-h200-indexer-layer).
const Workspaces = 3

// Config is what a Handle's plans are built with.
type Config struct {
	// RestrictReductions sets the heuristic's preference
	// CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK to ReductionMask
	// (cublasLtReductionScheme_t bits: INPLACE 1, COMPUTE_TYPE 2,
	// OUTPUT_TYPE 4; 0 allows only algorithms that do not split K); without
	// it the library's default allows every scheme.
	RestrictReductions bool
	ReductionMask      uint32
	// FP8Heuristic and BF16Heuristic are which of the heuristic's results
	// an FP8 and a bf16 plan run (0 its first, the library's choice; past
	// the last it returns, the last): alternatives to time.
	FP8Heuristic, BF16Heuristic int
}

// prefs sets the Config's preferences on a heuristic preference object.
func (c Config) prefs(a *api, pref uintptr) error {
	if !c.RestrictReductions {
		return nil
	}
	v := c.ReductionMask
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&v)
	return a.check("cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)", a.prefSetAttribute(pref, prefReductionMask, unsafe.Pointer(&v), 4))
}

// Handle is a cuBLASLt handle bound to one driver Context, with its
// workspace and its plans.
type Handle struct {
	ctx        *driver.Context
	api        *api
	h          uintptr
	cfg        Config
	workspaces [Workspaces]driver.DevicePtr

	mu    sync.Mutex
	plans map[planKey]*plan
}

// matmulKind is which matmul a plan is for.
type matmulKind uint8

const (
	kindFP8  matmulKind = iota + 1 // FP8Matmul
	kindBF16                       // BF16Matmul
)

// planKey is what a plan depends on: the kind and the shape (xStride is
// the BF16 matmul's; the FP8 one's X has no stride).
type planKey struct {
	kind                      matmulKind
	m, n, k, xStride, yStride int
}

// New loads cuBLASLt (once per process), creates a handle on ctx's owner
// thread and allocates the workspaces; its plans are built with cfg.
func New(ctx *driver.Context, cfg Config) (*Handle, error) {
	a, err := load()
	if err != nil {
		return nil, fmt.Errorf("cuBLASLt unavailable: %w", err)
	}
	h := &Handle{ctx: ctx, api: a, cfg: cfg, plans: map[planKey]*plan{}}
	if err := ctx.Do(func() error { return a.check("cublasLtCreate", a.create(&h.h)) }); err != nil {
		return nil, err
	}
	for i := range h.workspaces {
		if h.workspaces[i], err = ctx.Alloc(WorkspaceBytes); err != nil {
			for _, w := range h.workspaces[:i] {
				_ = ctx.Free(w)
			}
			_ = ctx.Do(func() error { return a.check("cublasLtDestroy", a.destroy(h.h)) })
			return nil, err
		}
	}
	return h, nil
}

// workspace is the Handle's workspace i (a matmul's Workspace field).
func (h *Handle) workspace(i int) (driver.DevicePtr, error) {
	if i < 0 || i >= len(h.workspaces) {
		return 0, fmt.Errorf("cublaslt: workspace %d, the handle has %d", i, len(h.workspaces))
	}
	return h.workspaces[i], nil
}

// Version is the loaded library's cublasLtGetVersion().
func (h *Handle) Version() int { return h.api.version }

// Path is the library file loaded.
func (h *Handle) Path() string { return h.api.path }

// Shape is what a plan depends on: Y [M][N] (row stride YStride
// elements) = X [M][K] . W [N][K]^T.
type Shape struct {
	M, N, K, YStride int
}

// FP8Matmul is one block-scaled GEMM's operands, all device addresses:
// W [N][K] e4m3 row-major with WScale [N/128][K/128] float32; X [M][K]
// e4m3 with XScale [K/128][M] float32 (M-major, no padding: cuBLASLt's
// VEC128_32F layout has no stride); Y bf16, row m at Y + 2*m*YStride.
// Workspace is which of the Handle's Workspaces it uses: the stream's own.
type FP8Matmul struct {
	Shape
	W, WScale, X, XScale, Y driver.DevicePtr
	Workspace               int
}

func (s Shape) validate() error {
	switch {
	case s.M <= 0 || s.N <= 0 || s.K <= 0:
		return fmt.Errorf("cublaslt: shape M = %d, N = %d, K = %d must be positive", s.M, s.N, s.K)
	case s.N%128 != 0 || s.K%128 != 0:
		return fmt.Errorf("cublaslt: N = %d and K = %d must be multiples of 128 (the scale blocks)", s.N, s.K)
	case s.YStride < s.N || s.YStride%8 != 0:
		return fmt.Errorf("cublaslt: YStride = %d must be >= N = %d and a multiple of 8", s.YStride, s.N)
	}
	return nil
}

// plan is one shape's descriptors and algorithm, or the heuristic's
// refusal (cached too: asking again gives the same answer).
type plan struct {
	desc, a, b, d uintptr
	algo          heuristicResult
	err           error
}

// Supported prepares (or finds) the plan for s and reports whether cuBLASLt
// has an algorithm for it: nil, or the heuristic's refusal (M = 1 and 2
// are refused on the H200). Call it before a CUDA graph capture so that
// the capture itself only enqueues.
func (h *Handle) Supported(s Shape) error {
	_, err := h.plan(s)
	return err
}

func (s Shape) key() planKey {
	return planKey{kind: kindFP8, m: s.M, n: s.N, k: s.K, yStride: s.YStride}
}

func (h *Handle) plan(s Shape) (*plan, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	return h.cached(s.key(),
		func(p *plan) error { return h.build(p, s) },
		func() string { return fmt.Sprintf("cublaslt: M = %d, N = %d, K = %d", s.M, s.N, s.K) })
}

// cached finds the plan of key, or builds it on the owner thread and keeps
// it (with the library's refusal, named by what()).
func (h *Handle) cached(key planKey, build func(p *plan) error, what func() string) (*plan, error) {
	// The lock is not held across ctx.Do: a caller already on the owner
	// thread may be waiting for it.
	h.mu.Lock()
	if h.plans == nil {
		h.mu.Unlock()
		return nil, errors.New("cublaslt: handle is closed")
	}
	p, ok := h.plans[key]
	h.mu.Unlock()
	if ok {
		return p, p.err
	}
	p = &plan{}
	if err := h.ctx.Do(func() error { return build(p) }); err != nil {
		h.destroyPlan(p)
		var le *Error
		if !errors.As(err, &le) {
			return nil, err // not the library's answer: do not cache it
		}
		p = &plan{err: fmt.Errorf("%s: %w", what(), err)}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.plans == nil {
		h.destroyPlan(p)
		return nil, errors.New("cublaslt: handle is closed")
	}
	if q, ok := h.plans[key]; ok { // built concurrently: keep the first
		h.destroyPlan(p)
		return q, q.err
	}
	h.plans[key] = p
	return p, p.err
}

// maxHeuristics is the most results an FP8 plan asks the heuristic for
// (Config.FP8Heuristic).
const maxHeuristics = 8

// build runs on the owner thread.
func (h *Handle) build(p *plan, s Shape) error {
	a := h.api
	if err := a.check("cublasLtMatmulDescCreate", a.descCreate(&p.desc, computeF32, typeF32)); err != nil {
		return err
	}
	setI32 := func(attr int32, v int32) error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&v)
		return a.check(fmt.Sprintf("cublasLtMatmulDescSetAttribute(%d)", attr), a.descSetAttribute(p.desc, attr, unsafe.Pointer(&v), 4))
	}
	if err := errors.Join(setI32(descTransA, opT), setI32(descAScaleMode, scaleBlk128x128F32), setI32(descBScaleMode, scaleVec128F32)); err != nil {
		return err
	}
	// The heuristic refuses block-scaled modes whose scale pointers are
	// unset (status 7, seen on the H200): give it placeholders (the
	// first workspace); Matmul sets each call's real scales.
	setPtr := func(attr int32, v uint64) error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&v)
		return a.check(fmt.Sprintf("cublasLtMatmulDescSetAttribute(%d)", attr), a.descSetAttribute(p.desc, attr, unsafe.Pointer(&v), 8))
	}
	if err := errors.Join(setPtr(descAScalePointer, uint64(h.workspaces[0])), setPtr(descBScalePointer, uint64(h.workspaces[0]))); err != nil {
		return err
	}
	for _, l := range []struct {
		dst        *uintptr
		typ        int32
		rows, cols int
		ld         int
	}{
		{&p.a, typeE4M3, s.K, s.N, s.K},       // W as stored: K x N column-major, transposed by TRANSA
		{&p.b, typeE4M3, s.K, s.M, s.K},       // X
		{&p.d, typeBF16, s.N, s.M, s.YStride}, // Y (C and D)
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
	ws := uint64(WorkspaceBytes)
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&ws)
	if err := a.check("cublasLtMatmulPreferenceSetAttribute", a.prefSetAttribute(pref, prefMaxWorkspace, unsafe.Pointer(&ws), 8)); err != nil {
		return err
	}
	if err := h.cfg.prefs(a, pref); err != nil {
		return err
	}
	var err error
	p.algo, err = a.heuristic(h.h, p, pref, h.cfg.FP8Heuristic)
	return err
}

// heuristic asks for the heuristic's results for plan p's descriptors and
// returns the one of index (0 the first; past the last it returns, the
// last usable).
func (a *api) heuristic(handle uintptr, p *plan, pref uintptr, index int) (heuristicResult, error) {
	var results [maxHeuristics]heuristicResult
	var n int32
	want := min(max(index, 0), maxHeuristics-1) + 1
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&results[0])
	pin.Pin(&n)
	if err := a.check("cublasLtMatmulAlgoGetHeuristic", a.algoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, int32(want), unsafe.Pointer(&results[0]), &n)); err != nil {
		return heuristicResult{}, err
	}
	if n < 1 || results[0].state != 0 {
		return heuristicResult{}, &Error{Call: "cublasLtMatmulAlgoGetHeuristic", Status: Status(results[0].state), Text: "no algorithm"}
	}
	i := min(int(n), want) - 1
	for i > 0 && results[i].state != 0 {
		i--
	}
	return results[i], nil
}

func (h *Handle) destroyPlan(p *plan) {
	_ = h.ctx.Do(func() error {
		a := h.api
		for _, l := range []uintptr{p.a, p.b, p.d} {
			if l != 0 {
				a.layoutDestroy(l)
			}
		}
		if p.desc != 0 {
			a.descDestroy(p.desc)
		}
		return nil
	})
}

// Matmul enqueues Y = X . W^T on s. It allocates nothing (the plan is
// cached, the workspace the Handle's), so it may run while s is being
// captured into a graph once Supported(shape) has been called outside the
// capture. Matmuls that may run at the same time (on different streams)
// must name different workspaces.
func (h *Handle) Matmul(m *FP8Matmul, s *driver.Stream) error {
	ws, err := h.workspace(m.Workspace)
	if err != nil {
		return err
	}
	p, err := h.plan(m.Shape)
	if err != nil {
		return err
	}
	a := h.api
	return h.ctx.Do(func() error {
		// The scale pointers are attributes of the descriptor: set them for
		// this call (read when cublasLtMatmul enqueues).
		vals := struct {
			ws, xs      uint64
			alpha, beta float32
		}{uint64(m.WScale), uint64(m.XScale), 1, 0}
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&vals)
		pin.Pin(&p.algo)
		if err := a.check("cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)", a.descSetAttribute(p.desc, descAScalePointer, unsafe.Pointer(&vals.ws), 8)); err != nil {
			return err
		}
		if err := a.check("cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)", a.descSetAttribute(p.desc, descBScalePointer, unsafe.Pointer(&vals.xs), 8)); err != nil {
			return err
		}
		return a.check("cublasLtMatmul", a.matmul(h.h, p.desc, unsafe.Pointer(&vals.alpha),
			uintptr(m.W), p.a, uintptr(m.X), p.b, unsafe.Pointer(&vals.beta),
			uintptr(m.Y), p.d, uintptr(m.Y), p.d, unsafe.Pointer(&p.algo.algo[0]),
			uintptr(ws), WorkspaceBytes, s.Handle()))
	})
}

// Close destroys the plans and the handle and frees the workspaces (after
// the work enqueued so far: the caller synchronizes first).
func (h *Handle) Close() error {
	h.mu.Lock()
	plans := h.plans
	h.plans = nil
	h.mu.Unlock()
	if plans == nil {
		return nil
	}
	for _, p := range plans {
		h.destroyPlan(p)
	}
	var errs []error
	for _, w := range h.workspaces {
		errs = append(errs, h.ctx.Free(w))
	}
	return errors.Join(append(errs,
		h.ctx.Do(func() error { return h.api.check("cublasLtDestroy", h.api.destroy(h.h)) }))...)
}
