package cublaslt

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Algorithm is what the heuristic chose for a plan: the fields of
// cublasLtMatmulAlgoConfigAttributes_t and of the heuristic's result. A
// SplitK above 1 with Reduction 1 (INPLACE) adds the splits up in the
// output; 2 and 4 reduce them through the workspace.
type Algorithm struct {
	ID, Tile, SplitK, Reduction, Swizzle, Custom, Stages, InnerShape, ClusterShape int
	WorkspaceBytes                                                                 uint64
	Waves                                                                          float32
}

func (a Algorithm) String() string {
	return fmt.Sprintf("algo %d tile %d stages %d splitK %d reduction %d swizzle %d custom %d inner %d cluster %d workspace %d waves %.2f",
		a.ID, a.Tile, a.Stages, a.SplitK, a.Reduction, a.Swizzle, a.Custom, a.InnerShape, a.ClusterShape, a.WorkspaceBytes, a.Waves)
}

// Algorithm config attributes (cublasLt.h cublasLtMatmulAlgoConfigAttributes_t).
const (
	algoConfigID           = 0
	algoConfigTile         = 1
	algoConfigSplitK       = 2
	algoConfigReduction    = 3
	algoConfigSwizzle      = 4
	algoConfigCustom       = 5
	algoConfigStages       = 6
	algoConfigInnerShape   = 7
	algoConfigClusterShape = 8
)

// FP8Algorithm prepares (or finds) the plan of s and describes its algorithm.
func (h *Handle) FP8Algorithm(s Shape) (Algorithm, error) {
	p, err := h.plan(s)
	if err != nil {
		return Algorithm{}, err
	}
	return h.algorithm(p)
}

func (h *Handle) algorithm(p *plan) (Algorithm, error) {
	out := Algorithm{WorkspaceBytes: p.algo.workspaceSize, Waves: p.algo.waves}
	err := h.ctx.Do(func() error { return h.api.readAlgorithm(&p.algo, &out) })
	return out, err
}

// readAlgorithm reads each config attribute of r's algorithm into out,
// each at the size the library reports for it (4 or 2 bytes).
func (a *api) readAlgorithm(r *heuristicResult, out *Algorithm) error {
	var pin runtime.Pinner
	defer pin.Unpin()
	vals := &struct {
		buf     uint64
		written uint64
	}{}
	pin.Pin(vals)
	pin.Pin(r)
	for _, f := range []struct {
		attr int32
		dst  *int
	}{
		{algoConfigID, &out.ID}, {algoConfigTile, &out.Tile}, {algoConfigSplitK, &out.SplitK},
		{algoConfigReduction, &out.Reduction}, {algoConfigSwizzle, &out.Swizzle}, {algoConfigCustom, &out.Custom},
		{algoConfigStages, &out.Stages}, {algoConfigInnerShape, &out.InnerShape}, {algoConfigClusterShape, &out.ClusterShape},
	} {
		vals.buf, vals.written = 0, 0
		call := fmt.Sprintf("cublasLtMatmulAlgoConfigGetAttribute(%d)", f.attr)
		// The size first (sizeInBytes 0 reports it), then the value.
		if err := a.check(call, a.algoConfigGet(unsafe.Pointer(&r.algo[0]), f.attr, nil, 0, &vals.written)); err != nil {
			return err
		}
		size := vals.written
		if size == 0 || size > 8 {
			return fmt.Errorf("cublaslt: %s reports %d bytes", call, size)
		}
		if err := a.check(call, a.algoConfigGet(unsafe.Pointer(&r.algo[0]), f.attr, unsafe.Pointer(&vals.buf), size, &vals.written)); err != nil {
			return err
		}
		v := vals.buf // little-endian: the low bytes hold the value
		switch size {
		case 1:
			*f.dst = int(int8(v))
		case 2:
			*f.dst = int(int16(v))
		case 4:
			*f.dst = int(int32(v))
		default:
			*f.dst = int(v)
		}
	}
	return nil
}
