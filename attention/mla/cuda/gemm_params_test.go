package cuda

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// fieldMismatches compares every field of a packed value of s with want
// (the bits abi.Struct.Raw reads back): a field without an expectation, or
// an expectation for no field, is a mismatch too.
func fieldMismatches(s *abi.Struct, packed []byte, want map[abi.FieldID]uint64) []string {
	var bad []string
	if len(packed) != s.Size() {
		bad = append(bad, fmt.Sprintf("%s: %d bytes, want %d", s.Name, len(packed), s.Size()))
		return bad
	}
	for i, f := range s.Fields {
		w, ok := want[abi.FieldID(i)]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s.%s: no expectation", s.Name, f.Name))
			continue
		}
		if got := s.Raw(packed, abi.FieldID(i)); got != w {
			bad = append(bad, fmt.Sprintf("%s.%s = %#x, want %#x", s.Name, f.Name, got, w))
		}
	}
	for id := range want {
		if int(id) >= len(s.Fields) {
			bad = append(bad, fmt.Sprintf("%s: expectation for field %d of %d", s.Name, id, len(s.Fields)))
		}
	}
	slices.Sort(bad)
	return bad
}

func requireFields(t *testing.T, s *abi.Struct, packed []byte, want map[abi.FieldID]uint64, what string) {
	t.Helper()
	require.Empty(t, fieldMismatches(s, packed, want), what)
}

func f32(v float32) uint64 { return uint64(math.Float32bits(v)) }

// fakeBuffer is a device buffer at a made-up address (nothing is read or
// written: the packing only does address arithmetic).
func fakeBuffer(addr, n int) *Buffer { return &Buffer{ptr: driver.DevicePtr(addr), n: n} }

// TestFieldMismatchesSeesASwap: two fields packed the wrong way round, a
// field left out of the expectations and a wrong size are all reported,
// so the packing tests below can fail.
func TestFieldMismatchesSeesASwap(t *testing.T) {
	p := abi.SplitKParams.Pack()
	p.Ptr(abi.SplitKPart, 0x1000)
	p.Ptr(abi.SplitKY, 0x2000)
	p.I32(abi.SplitKM, 7) // m and n swapped
	p.I32(abi.SplitKN, 3)
	p.I32(abi.SplitKYStride, 9)
	p.I32(abi.SplitKSplits, 2)
	b, err := p.Bytes()
	require.NoError(t, err)
	want := map[abi.FieldID]uint64{abi.SplitKPart: 0x1000, abi.SplitKY: 0x2000, abi.SplitKM: 3, abi.SplitKN: 7, abi.SplitKYStride: 9, abi.SplitKSplits: 2}
	require.Equal(t, []string{"SplitKParams.m = 0x7, want 0x3", "SplitKParams.n = 0x3, want 0x7"}, fieldMismatches(abi.SplitKParams, b, want))
	delete(want, abi.SplitKSplits)
	require.Contains(t, fieldMismatches(abi.SplitKParams, b, want), "SplitKParams.splits: no expectation")
	require.NotEmpty(t, fieldMismatches(abi.SplitKParams, b[:8], want))
}

// TestGEMMParamsPacking packs the FP8 and bf16 GEMMs' launches on the CPU
// (fake addresses, every value distinct) and reads each field back through
// the abi table, with one split of K and with several (the reduction's
// parameters then too).
func TestGEMMParamsPacking(t *testing.T) {
	op := fp8GEMMOperands{w: 0x10000, ws: 0x20000, x: 0x30000, xs: 0x40000, y: 0x50000, m: 37, n: 1536, k: 7168, xsStride: 41, yStride: 1600}
	for _, splits := range []int{1, 6} {
		plan := ownGEMMPlan{mt: 64, chunks: 1, splits: splits, kbPerSplit: 56 / splits}
		part := driver.DevicePtr(0)
		if splits > 1 {
			part = 0x60000
		}
		gemm, reduce, err := fp8GEMMParams(op, plan, part)
		require.NoError(t, err)
		requireFields(t, abi.FP8GEMMParams, gemm, map[abi.FieldID]uint64{
			abi.FP8GEMMW: 0x10000, abi.FP8GEMMWScale: 0x20000, abi.FP8GEMMX: 0x30000, abi.FP8GEMMXScale: 0x40000,
			abi.FP8GEMMY: 0x50000, abi.FP8GEMMPart: uint64(part), abi.FP8GEMMM: 37, abi.FP8GEMMN: 1536, abi.FP8GEMMK: 7168,
			abi.FP8GEMMXScaleStride: 41, abi.FP8GEMMYStride: 1600, abi.FP8GEMMKBPerSplit: uint64(56 / splits),
		}, fmt.Sprintf("gemm_fp8, %d splits", splits))
		if splits == 1 {
			require.Nil(t, reduce, "one split: no reduction")
			continue
		}
		requireFields(t, abi.SplitKParams, reduce, map[abi.FieldID]uint64{
			abi.SplitKPart: 0x60000, abi.SplitKY: 0x50000, abi.SplitKM: 37, abi.SplitKN: 1536, abi.SplitKYStride: 1600, abi.SplitKSplits: 6,
		}, "gemm_fp8_reduce")
	}

	a := &mla.BF16GEMMArgs{Rows: 19, N: 1024, K: 4096, XStride: 4104, YStride: 1032}
	bop := bf16Operands{x: 0x70000, w: 0x80000, y: 0x90000}
	params, err := bf16GEMMParams(bop, a)
	require.NoError(t, err)
	requireFields(t, abi.BF16GEMMParams, params, map[abi.FieldID]uint64{
		abi.BF16GEMMW: 0x80000, abi.BF16GEMMX: 0x70000, abi.BF16GEMMY: 0x90000, abi.BF16GEMMM: 19, abi.BF16GEMMN: 1024,
		abi.BF16GEMMK: 4096, abi.BF16GEMMXStride: 4104, abi.BF16GEMMYStride: 1032,
	}, "gemm_bf16_f32")
	for _, splits := range []int{1, 3} {
		plan := bf16MMAPlan{tiles: 16, chunks: 1, splits: splits, kSplit: 1408, kChunk: 704, shared: 3 << 10}
		mma, reduce, err := bf16MMAParams(bop, a, plan, 0xa0000, 0xb0000)
		require.NoError(t, err)
		out, outStride := uint64(0x90000), uint64(1032)
		if splits > 1 {
			out, outStride = 0xa0000, 1024
		}
		requireFields(t, abi.BF16MMAParams, mma, map[abi.FieldID]uint64{
			abi.BF16MMAW: 0x80000, abi.BF16MMAX: 0x70000, abi.BF16MMAOut: out, abi.BF16MMAM: 19, abi.BF16MMAN: 1024,
			abi.BF16MMAK: 4096, abi.BF16MMAXStride: 4104, abi.BF16MMAOutStride: outStride, abi.BF16MMAKSplit: 1408, abi.BF16MMAKChunk: 704,
			abi.BF16MMAY: 0x90000, abi.BF16MMACounters: 0xb0000, abi.BF16MMAYStride: 1032,
		}, fmt.Sprintf("gemm_bf16_mma, %d splits", splits))
		if splits == 1 {
			require.Nil(t, reduce)
			continue
		}
		requireFields(t, abi.SplitKParams, reduce, map[abi.FieldID]uint64{
			abi.SplitKPart: 0xa0000, abi.SplitKY: 0x90000, abi.SplitKM: 19, abi.SplitKN: 1024, abi.SplitKYStride: 1032, abi.SplitKSplits: 3,
		}, "gemm_bf16_mma_reduce")
	}
	require.Equal(t, driver.Dim3{uint32((19*1024/4 + 255) / 256), 1, 1}, splitKGrid(19, 1024))
}

// TestChainParamsPacking: act_quant's and norm_quant's QuantParams from
// their arguments (fake buffers at their offsets).
func TestChainParamsPacking(t *testing.T) {
	out := mla.FP8Activations{Rows: 5, K: 1536, Data: fakeBuffer(0x200000, 5*1536), Scale: fakeBuffer(0x300000, 4*12*8), ScaleStride: 8}
	x := fakeBuffer(0x100000, 1<<20)
	act := &mla.ActQuantArgs{X: x, XOffset: 4096, XStride: 2048 + 8, Out: out}
	params, err := actQuantParams(act)
	require.NoError(t, err)
	want := map[abi.FieldID]uint64{
		abi.QuantX: 0x100000 + 4096, abi.QuantXStride: 2 * (2048 + 8), abi.QuantWeight: 0, abi.QuantOut: 0x200000,
		abi.QuantScale: 0x300000, abi.QuantRows: 5, abi.QuantK: 1536, abi.QuantScaleStride: 8, abi.QuantEps: 0,
	}
	requireFields(t, abi.QuantParams, params, want, "act_quant")
	norm := &mla.NormQuantArgs{X: x, XOffset: 64, XStride: 1536, Weight: fakeBuffer(0x400000, 4*1536), Eps: 1e-6, Out: out}
	params, err = normQuantParams(norm)
	require.NoError(t, err)
	want[abi.QuantX], want[abi.QuantXStride] = 0x100000+64, 2*1536
	want[abi.QuantWeight], want[abi.QuantEps] = 0x400000, f32(1e-6)
	requireFields(t, abi.QuantParams, params, want, "norm_quant")
	norm.Weight = fakeBuffer(0x400000, 4*1536-4)
	_, err = normQuantParams(norm)
	require.Error(t, err, "a weight shorter than K")
}

// TestCompressParamsPacking: compress_entries' CompressParams from a layer
// and its job list, every value distinct.
func TestCompressParamsPacking(t *testing.T) {
	const ratio, pageSize, numPages = 4, 64, 9
	l := &CompressLayer{
		Ratio: ratio, NewK: fakeBuffer(0x100000, 1<<20), NewG: fakeBuffer(0x200000, 1<<20), NewRows: 11,
		StateK: fakeBuffer(0x300000, 1<<20), StateG: fakeBuffer(0x400000, 1<<20), StateRows: 13,
		NormWeight: fakeBuffer(0x500000, 4*numerics.HeadDim), Eps: 2.5e-6, Rope: fakeBuffer(0x600000, 1<<20), RopePositions: 333,
		Pool: fakeBuffer(0x700000, 1<<22), PageSize: pageSize, NumPages: numPages,
	}
	list := fakeBuffer(0x800000, 4096)
	params, err := compressParams(l, list, 32, 17, 32+17*jobBytes, 71)
	require.NoError(t, err)
	requireFields(t, abi.CompressParams, params, map[abi.FieldID]uint64{
		abi.CompressNewK: 0x100000, abi.CompressNewG: 0x200000, abi.CompressStateK: 0x300000, abi.CompressStateG: 0x400000,
		abi.CompressCands: uint64(0x800000 + 32 + 17*jobBytes), abi.CompressJobs: 0x800000 + 32, abi.CompressNorm: 0x500000,
		abi.CompressRope: 0x600000, abi.CompressPool: 0x700000, abi.CompressPageBytes: uint64(kvcache.FormatFP8UE8M0.PageBytes(pageSize)),
		abi.CompressNewRows: 11, abi.CompressStateRows: 13, abi.CompressNumCands: 71, abi.CompressNumJobs: 17,
		abi.CompressRatio: ratio, abi.CompressWidth: uint64(l.Width()), abi.CompressRopePositions: 333,
		abi.CompressPageSize: pageSize, abi.CompressNumPages: numPages, abi.CompressEps: f32(2.5e-6),
	}, "compress_entries")
	l.StateRows = 0 // no kept rows: null state pointers
	params, err = compressParams(l, list, 32, 17, 32+17*jobBytes, 71)
	require.NoError(t, err)
	require.Zero(t, abi.CompressParams.Raw(params, abi.CompressStateK))
	require.Zero(t, abi.CompressParams.Raw(params, abi.CompressStateG))
}

// TestCompressStepParamsPacking: compress_step's and its finish kernel's
// parameters from mla.CompressStepArgs, for the main compressor's entries
// (ratio 4 and 128) and the indexer's, with and without the APE, packed KG
// rows and the indexer's columns of the engine's one projection GEMM.
func TestCompressStepParamsPacking(t *testing.T) {
	for _, c := range []struct {
		ratio            int
		entry            mla.CompressEntry
		ape              bool
		kgOffset, stride int
	}{{4, mla.EntryKV, true, 0, 0}, {128, mla.EntryKV, false, 0, 0}, {4, mla.EntryIndexer, true, 0, 0},
		{4, mla.EntryKV, false, 0, 2624}, {4, mla.EntryIndexer, true, 4 * 2048, 2624}} {
		a := &mla.CompressStepArgs{
			Ratio: c.ratio, Entry: c.entry, KG: fakeBuffer(0x1000000, 1<<24), KGRows: 21, KGOffset: c.kgOffset, KGStride: c.stride,
			Ring:     fakeBuffer(0x3000000, 1<<25),
			RingRows: 136, Slots: 3, Plan: fakeBuffer(0x5000000, 1<<16), PlanOffset: 48, MaxSeqs: 5, MaxJobs: 23,
			NormWeight: fakeBuffer(0x6000000, 4096), Eps: 3e-6, Rope: fakeBuffer(0x7000000, 1<<21), RopePositions: 4097,
			Pool: fakeBuffer(0x8000000, 1<<24), PageSize: 32, NumPages: 19, Scratch: fakeBuffer(0x9000000, 1<<20),
		}
		ape := uint64(0)
		if c.ape {
			a.APE = fakeBuffer(0x2000000, 1<<20)
			ape = 0x2000000
		}
		what := fmt.Sprintf("ratio %d, entry %v, ape %v, KG at %d stride %d", c.ratio, c.entry, c.ape, c.kgOffset, c.stride)
		stride := uint64(c.stride)
		if stride == 0 {
			stride = 2 * uint64(a.Width())
		}
		step, finish, err := compressStepParams(a, 77)
		require.NoError(t, err, what)
		requireFields(t, abi.CompressStepParams, step, map[abi.FieldID]uint64{
			abi.CStepKG: 0x1000000 + uint64(c.kgOffset), abi.CStepAPE: ape, abi.CStepRing: 0x3000000, abi.CStepPlan: 0x5000000 + 48,
			abi.CStepScratch: 0x9000000, abi.CStepKGRows: 21, abi.CStepKGStride: stride, abi.CStepRingRows: 136, abi.CStepSlots: 3, abi.CStepMaxSeqs: 5,
			abi.CStepMaxJobs: 23, abi.CStepRatio: uint64(c.ratio), abi.CStepWidth: uint64(a.Width()), abi.CStepDim: uint64(c.entry.Dim()),
			abi.CStepRopePositions: 4097, abi.CStepPageSize: 32, abi.CStepNumPages: 19, abi.CStepJobBlocks: 77,
		}, "compress_step: "+what)
		requireFields(t, abi.CompressFinishParams, finish, map[abi.FieldID]uint64{
			abi.CFinScratch: 0x9000000, abi.CFinPlan: 0x5000000 + 48, abi.CFinNorm: 0x6000000, abi.CFinRope: 0x7000000,
			abi.CFinPool: 0x8000000, abi.CFinPageBytes: uint64(a.PoolPageBytes()), abi.CFinMaxSeqs: 5, abi.CFinMaxJobs: 23,
			abi.CFinKGRows: 21, abi.CFinSlots: 3, abi.CFinRatio: uint64(c.ratio), abi.CFinRopePositions: 4097,
			abi.CFinPageSize: 32, abi.CFinNumPages: 19, abi.CFinEps: f32(3e-6), abi.CFinHScale: f32(numerics.HadamardScale),
		}, "finish: "+what)
	}
}

// TestIndexerQueryParamsPacking: indexer_query's own fields, in both
// query formats (its Params are TestLaunchParamsPacking's).
func TestIndexerQueryParamsPacking(t *testing.T) {
	for _, format := range []mla.IndexerQueryFormat{mla.IndexerQueryMXFP4, mla.IndexerQueryFP8} {
		a := &mla.IndexerQueryArgs{WOut: fakeBuffer(0xb00000, 1<<16), WStride: 72, Format: format}
		packed, err := indexerQueryParams(a)
		require.NoError(t, err)
		fp8 := uint64(0)
		if format == mla.IndexerQueryFP8 {
			fp8 = 1
		}
		requireFields(t, abi.IndexerQueryParams, packed, map[abi.FieldID]uint64{
			abi.IQWOut: 0xb00000, abi.IQWStride: 72, abi.IQHScale: f32(numerics.HadamardScale),
			abi.IQWScale: f32(mla.IndexerWeightScale), abi.IQFP8: fp8,
		}, fmt.Sprint(format))
	}
}

// TestGEMMTilesFromTheABI: the architecture's FP8 GEMM tiles are kernels
// gemm_fp8.cu instantiates (abi.FP8GEMMTiles, FP8_GEMM_KERNELS in abi.h)
// and its row tile is theirs, so a tile the table names always loads.
func TestGEMMTilesFromTheABI(t *testing.T) {
	var tokens []int
	for _, tile := range abi.FP8GEMMTiles() {
		tokens = append(tokens, tile.Tokens)
	}
	for _, a := range []cudatune.Arch{cudatune.SM90} {
		require.Equal(t, abi.FP8GEMMRowTile, a.FP8.RowTile, "%s: row tile", a.Name)
		require.NotEmpty(t, a.FP8.TokenTiles, a.Name)
		for _, mt := range a.FP8.TokenTiles {
			require.Contains(t, tokens, mt, "%s: token tile %d has no kernel in gemm_fp8.cu", a.Name, mt)
		}
	}
	require.Equal(t, "gemm_fp8_mt64", abi.FP8GEMMKernel(64))
}

// TestGEMMKernelsCompiled: gemm_fp8.cu, compiled as the backend compiles
// it, defines a kernel for every tile of abi.FP8GEMMTiles (expanded from
// abi.h's FP8_GEMM_KERNELS) and the reduction, each taking its struct.
func TestGEMMKernelsCompiled(t *testing.T) {
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("NVRTC not found: %v", err)
	}
	ptx, err := driver.CompilePTX(fp8GEMMProgram.src(), fp8GEMMProgram.file, fp8GEMMProgram.options("sm_90", cudatune.Knobs{}.Defaults()))
	require.NoError(t, err)
	for _, tile := range abi.FP8GEMMTiles() {
		name := abi.FP8GEMMKernel(tile.Tokens)
		require.Contains(t, ptx, fmt.Sprintf(".entry %s(\n\t.param .align 8 .b8 %s_param_0[%d]\n)", name, name, abi.FP8GEMMParams.Size()))
	}
	require.Contains(t, ptx, fmt.Sprintf(".entry gemm_fp8_reduce(\n\t.param .align 8 .b8 gemm_fp8_reduce_param_0[%d]\n)", abi.SplitKParams.Size()))
}
