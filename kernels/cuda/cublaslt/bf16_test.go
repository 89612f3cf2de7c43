package cublaslt

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// fakeLt is a cuBLASLt that records what the binding asks of it: handles
// are small integers, every call succeeds unless told otherwise.
type fakeLt struct {
	next       uintptr
	descAttrs  map[int32][]byte
	compute    [2]int32
	layouts    map[uintptr][4]int64 // type, rows, cols, ld
	prefAttrs  map[int32][]byte
	prefFreed  bool
	heuristic  Status
	noAlgo     bool
	heurArgs   [6]uintptr // desc, a, b, c, d, pref
	matmulArgs []uintptr  // a, adesc, b, bdesc, c, cdesc, d, ddesc, workspace, size, stream
	alpha      float32
	beta       float32
	algo       uint64
}

func (f *fakeLt) api() *api {
	f.next = 100
	f.descAttrs, f.layouts, f.prefAttrs = map[int32][]byte{}, map[uintptr][4]int64{}, map[int32][]byte{}
	handle := func(dst *uintptr) { f.next++; *dst = f.next }
	bytes := func(buf unsafe.Pointer, size uint64) []byte {
		return append([]byte(nil), unsafe.Slice((*byte)(buf), size)...)
	}
	return &api{
		getStatusString: func(s Status) string { return "fake status" },
		descCreate: func(d *uintptr, compute, scale int32) Status {
			handle(d)
			f.compute = [2]int32{compute, scale}
			return 0
		},
		descSetAttribute: func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) Status {
			f.descAttrs[attr] = bytes(buf, size)
			return 0
		},
		layoutCreate: func(l *uintptr, typ int32, rows, cols uint64, ld int64) Status {
			handle(l)
			f.layouts[*l] = [4]int64{int64(typ), int64(rows), int64(cols), ld}
			return 0
		},
		prefCreate: func(p *uintptr) Status { handle(p); return 0 },
		prefSetAttribute: func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) Status {
			f.prefAttrs[attr] = bytes(buf, size)
			return 0
		},
		prefDestroy: func(p uintptr) Status { f.prefFreed = true; return 0 },
		algoGetHeuristic: func(h, desc, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) Status {
			f.heurArgs = [6]uintptr{desc, a, b, c, d, pref}
			if f.heuristic != 0 {
				return f.heuristic
			}
			if f.noAlgo {
				*returned = 0
				return 0
			}
			r := (*heuristicResult)(results)
			r.algo[0] = 0xA160
			*returned = 1
			return 0
		},
		matmul: func(h, desc uintptr, alpha unsafe.Pointer, a, adesc, b, bdesc uintptr, beta unsafe.Pointer, c, cdesc, d, ddesc uintptr, algo unsafe.Pointer, workspace uintptr, workspaceSize uint64, stream uintptr) Status {
			f.alpha, f.beta = *(*float32)(alpha), *(*float32)(beta)
			f.algo = *(*uint64)(algo)
			f.matmulArgs = []uintptr{a, adesc, b, bdesc, c, cdesc, d, ddesc, workspace, uintptr(workspaceSize), stream}
			return 0
		},
	}
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

// TestBuildBF16 checks the bf16 plan against the layout the GEMM needs:
// W [N][K] row-major as a K x N column-major matrix transposed, X as K x M
// with ld XStride, Y float32 N x M with ld YStride (C and D), compute 32F
// with float32 scalars, no scale modes, 16-byte alignment promised.
func TestBuildBF16(t *testing.T) {
	for _, s := range []BF16Shape{{M: 1, N: 512, K: 4096, XStride: 4096, YStride: 512}, {M: 1000, N: 2048, K: 7168, XStride: 7176, YStride: 2052}} {
		f := &fakeLt{}
		a := f.api()
		p := &plan{}
		require.NoError(t, a.buildBF16(7, p, s, Config{}))
		require.Equal(t, [2]int32{computeF32, typeF32}, f.compute)
		require.Equal(t, map[int32][]byte{descTransA: le32(opT)}, f.descAttrs, "only TRANSA is set: no scale modes or pointers")
		require.Equal(t, [4]int64{typeBF16, int64(s.K), int64(s.N), int64(s.K)}, f.layouts[p.a], "A = W")
		require.Equal(t, [4]int64{typeBF16, int64(s.K), int64(s.M), int64(s.XStride)}, f.layouts[p.b], "B = X")
		require.Equal(t, [4]int64{typeF32, int64(s.N), int64(s.M), int64(s.YStride)}, f.layouts[p.d], "C = D = Y")
		require.Equal(t, [6]uintptr{p.desc, p.a, p.b, p.d, p.d, f.heurArgs[5]}, f.heurArgs)
		require.Equal(t, map[int32][]byte{
			prefMaxWorkspace:  {0, 0, 0, 2, 0, 0, 0, 0}, // 32 MiB
			prefMinAlignmentA: le32(16), prefMinAlignmentB: le32(16), prefMinAlignmentC: le32(16), prefMinAlignmentD: le32(16),
		}, f.prefAttrs)
		require.True(t, f.prefFreed)
		require.Equal(t, uint64(0xA160), p.algo.algo[0])

		m := &BF16Matmul{BF16Shape: s, W: 0x1000, X: 0x2010, Y: 0x3020}
		require.NoError(t, a.matmulBF16(7, p, m, 0x4000, 0x99))
		require.Equal(t, float32(1), f.alpha)
		require.Equal(t, float32(0), f.beta)
		require.Equal(t, uint64(0xA160), f.algo)
		require.Equal(t, []uintptr{0x1000, p.a, 0x2010, p.b, 0x3020, p.d, 0x3020, p.d, 0x4000, WorkspaceBytes, 0x99}, f.matmulArgs)
	}
}

// TestBuildRestrictsReductions: Config's reduction mask reaches the
// heuristic's preference as a uint32, 0 included (only unsplit
// algorithms), and is not set without RestrictReductions.
func TestBuildRestrictsReductions(t *testing.T) {
	s := BF16Shape{M: 16, N: 512, K: 1024, XStride: 1024, YStride: 512}
	for _, c := range []struct {
		cfg  Config
		want []byte
	}{{Config{}, nil}, {Config{RestrictReductions: true, ReductionMask: 6}, le32(6)}, {Config{RestrictReductions: true}, le32(0)}} {
		f := &fakeLt{}
		require.NoError(t, f.api().buildBF16(7, &plan{}, s, c.cfg))
		got, ok := f.prefAttrs[prefReductionMask]
		require.Equal(t, c.want != nil, ok, "%+v", c.cfg)
		require.Equal(t, c.want, got, "%+v", c.cfg)
	}
}

// TestReadAlgorithm reads each config attribute at the size the library
// reports for it.
func TestReadAlgorithm(t *testing.T) {
	vals := map[int32]uint64{algoConfigID: 66, algoConfigTile: 20, algoConfigSplitK: 4, algoConfigReduction: 1, algoConfigSwizzle: 0,
		algoConfigCustom: 3, algoConfigStages: 17, algoConfigInnerShape: 2, algoConfigClusterShape: 0xfffe}
	sizes := map[int32]uint64{algoConfigInnerShape: 2, algoConfigClusterShape: 2}
	a := &api{getStatusString: func(Status) string { return "fake" },
		algoConfigGet: func(algo unsafe.Pointer, attr int32, buf unsafe.Pointer, size uint64, written *uint64) Status {
			n := uint64(4)
			if v, ok := sizes[attr]; ok {
				n = v
			}
			*written = n
			if size == 0 {
				return 0
			}
			if size != n {
				return 7
			}
			copy(unsafe.Slice((*byte)(buf), n), unsafe.Slice((*byte)(unsafe.Pointer(&[]uint64{vals[attr]}[0])), n))
			return 0
		}}
	var got Algorithm
	require.NoError(t, a.readAlgorithm(&heuristicResult{}, &got))
	require.Equal(t, Algorithm{ID: 66, Tile: 20, SplitK: 4, Reduction: 1, Custom: 3, Stages: 17, InnerShape: 2, ClusterShape: -2}, got)
	require.Contains(t, got.String(), "splitK 4 reduction 1")
}

// TestBuildBF16Refused: the heuristic's refusal, by status or by returning
// no algorithm, is the library's *Error (cached by the Handle as the
// shape's answer).
func TestBuildBF16Refused(t *testing.T) {
	s := BF16Shape{M: 3, N: 512, K: 1024, XStride: 1024, YStride: 512}
	f := &fakeLt{heuristic: StatusNotSupported}
	err := f.api().buildBF16(7, &plan{}, s, Config{})
	var le *Error
	require.ErrorAs(t, err, &le)
	require.Equal(t, StatusNotSupported, le.Status)
	require.ErrorContains(t, err, "cublasLtMatmulAlgoGetHeuristic")

	f = &fakeLt{noAlgo: true}
	err = f.api().buildBF16(7, &plan{}, s, Config{})
	require.ErrorAs(t, err, &le)
	require.ErrorContains(t, err, "no algorithm")
}

func TestBF16ShapeValidate(t *testing.T) {
	good := BF16Shape{M: 2, N: 512, K: 1024, XStride: 1032, YStride: 516}
	require.NoError(t, good.validate())
	for _, c := range []struct {
		name string
		edit func(s *BF16Shape)
		want string
	}{
		{"no rows", func(s *BF16Shape) { s.M = 0 }, "M = 0"},
		{"negative N", func(s *BF16Shape) { s.N = -8 }, "N = -8"},
		{"K not a multiple of 8", func(s *BF16Shape) { s.K = 1020 }, "K = 1020"},
		{"X stride below K", func(s *BF16Shape) { s.XStride = 1016 }, "XStride = 1016"},
		{"X stride not a multiple of 8", func(s *BF16Shape) { s.XStride = 1028 }, "XStride = 1028"},
		{"Y stride below N", func(s *BF16Shape) { s.YStride = 508 }, "YStride = 508"},
		{"Y stride not a multiple of 4", func(s *BF16Shape) { s.YStride = 514 }, "YStride = 514"},
	} {
		s := good
		c.edit(&s)
		require.ErrorContains(t, s.validate(), c.want, c.name)
	}
}

// TestPlanKeysByKind: an FP8 and a bf16 GEMM of the same M, N, K and
// YStride have different plans, and bf16 plans differ by XStride.
func TestPlanKeysByKind(t *testing.T) {
	fp8 := Shape{M: 4, N: 512, K: 1024, YStride: 512}.key()
	bf16 := BF16Shape{M: 4, N: 512, K: 1024, XStride: 1024, YStride: 512}.key()
	wide := BF16Shape{M: 4, N: 512, K: 1024, XStride: 2048, YStride: 512}.key()
	require.NotEqual(t, fp8, bf16)
	require.NotEqual(t, bf16, wide)
	require.Equal(t, bf16, BF16Shape{M: 4, N: 512, K: 1024, XStride: 1024, YStride: 512}.key())
}

// TestMatmulBF16RefusesMisaligned: pointers below the promised 16-byte
// alignment are refused before any plan (no handle needed).
func TestMatmulBF16RefusesMisaligned(t *testing.T) {
	h := &Handle{}
	s := BF16Shape{M: 1, N: 8, K: 8, XStride: 8, YStride: 8}
	err := h.MatmulBF16(&BF16Matmul{BF16Shape: s, W: 0x100, X: 0x208, Y: 0x300}, nil)
	require.ErrorContains(t, err, "X = 0x208 is not 16-byte aligned")
	err = h.MatmulBF16(&BF16Matmul{BF16Shape: s, W: 0x100, X: 0x200, Y: 0x304}, nil)
	require.ErrorContains(t, err, "Y = 0x304 is not 16-byte aligned")
}

// TestMatmulRefusesWorkspace: a matmul naming a workspace the handle does
// not have is refused before any plan (no handle needed); each stream that
// may run matmuls at once has its own (Workspaces).
func TestMatmulRefusesWorkspace(t *testing.T) {
	h := &Handle{}
	require.Equal(t, 3, Workspaces, "the CUDA backend's main, side and third streams")
	s := BF16Shape{M: 1, N: 8, K: 8, XStride: 8, YStride: 8}
	for _, i := range []int{-1, Workspaces} {
		err := h.MatmulBF16(&BF16Matmul{BF16Shape: s, W: 0x100, X: 0x200, Y: 0x300, Workspace: i}, nil)
		require.ErrorContains(t, err, fmt.Sprintf("workspace %d, the handle has 3", i))
		err = h.Matmul(&FP8Matmul{Shape: Shape{M: 1, N: 128, K: 128, YStride: 128}, Workspace: i}, nil)
		require.ErrorContains(t, err, fmt.Sprintf("workspace %d, the handle has 3", i))
	}
}
