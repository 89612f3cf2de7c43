package abi_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kvcache"
)

// TestParamsLayout pins the C layout of Params: ten pointers, the u64 input
// stride, then 4-byte fields, 176 bytes in all (a static_assert in abi.h
// checks the same size on the device).
func TestParamsLayout(t *testing.T) {
	require.Equal(t, 176, abi.Params.Size())
	for f, want := range map[abi.FieldID]int{
		abi.ParamIn: 0, abi.ParamHdr: 72, abi.ParamInStride: 80, abi.ParamRowBegin: 88,
		abi.ParamNumPages: 136, abi.ParamScale: 140, abi.ParamEps: 160, abi.ParamFromHdr: 168,
	} {
		require.Equal(t, want, abi.Params.Offset(f), "field %s", abi.Params.Fields[f].Name)
	}
	names := map[string]bool{}
	for i, f := range abi.Params.Fields {
		require.NotEmpty(t, f.Name, "field %d has no name (a gap in the table)", i)
		require.False(t, names[f.Name], "field %s twice", f.Name)
		names[f.Name] = true
		if f.Kind == abi.Ptr {
			require.NotEmpty(t, f.CType, "pointer %s needs its C type", f.Name)
		} else {
			require.Contains(t, []abi.Kind{abi.U64, abi.I32, abi.F32}, f.Kind, "field %s", f.Name)
			require.Empty(t, f.CType, "field %s", f.Name)
		}
	}
}

// TestStructPadding: members are aligned to their size and the struct to
// its largest member, as the C compiler lays them out.
func TestStructPadding(t *testing.T) {
	s := &abi.Struct{Name: "S", Fields: []abi.Field{{"a", abi.I32, "", ""}, {"p", abi.Ptr, "u8*", ""}, {"b", abi.F32, "", ""}}}
	require.Equal(t, 0, s.Offset(0))
	require.Equal(t, 8, s.Offset(1))
	require.Equal(t, 16, s.Offset(2))
	require.Equal(t, 24, s.Size())
	small := &abi.Struct{Name: "T", Fields: []abi.Field{{"a", abi.I32, "", ""}}}
	require.Equal(t, 4, small.Size())
}

func TestPacker(t *testing.T) {
	s := &abi.Struct{Name: "S", Fields: []abi.Field{
		{"p", abi.Ptr, "u8*", ""}, {"n", abi.I32, "", ""}, {"x", abi.F32, "", ""}, {"u", abi.U64, "", ""}, {"on", abi.I32, "", ""},
	}}
	p := s.Pack()
	p.Ptr(0, 0x1122334455667788)
	p.I32(1, -2)
	_, err := p.Bytes()
	require.EqualError(t, err, "abi: S fields not set: x, u, on")
	p.F32(2, 1.5)
	p.U64(3, 7)
	p.Bool(4, true)
	b, err := p.Bytes()
	require.NoError(t, err)
	require.Len(t, b, 32)
	require.Equal(t, []byte{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11}, b[:8])
	require.Equal(t, uint64(0xFFFFFFFE), s.Raw(b, 1))
	require.Equal(t, uint64(math.Float32bits(1.5)), s.Raw(b, 2))
	require.Equal(t, uint64(7), s.Raw(b, 3))
	require.Equal(t, uint64(1), s.Raw(b, 4))

	require.PanicsWithValue(t, "abi: S.x is a float32, set as a int32", func() { s.Pack().I32(2, 1) })
	require.PanicsWithValue(t, "abi: S has no field 9", func() { s.Pack().I32(9, 1) })
	require.PanicsWithValue(t, "abi: S.n set twice", func() { q := s.Pack(); q.I32(1, 1); q.I32(1, 2) })
}

// TestPackIntoReusesMemory: a value packed into a reused, dirty buffer is
// byte for byte the value Pack builds (padding zeroed), and packing it
// allocates nothing.
func TestPackIntoReusesMemory(t *testing.T) {
	s := &abi.Struct{Name: "S", Fields: []abi.Field{{"a", abi.I32, "", ""}, {"p", abi.Ptr, "u8*", ""}, {"b", abi.F32, "", ""}}}
	fill := func(p *abi.Packer) []byte {
		p.I32(0, -7)
		p.Ptr(1, 0xdeadbeef00)
		p.F32(2, 0.25)
		b, err := p.Bytes()
		require.NoError(t, err)
		return b
	}
	want := fill(s.Pack())
	buf := make([]byte, 40)
	for i := range buf {
		buf[i] = 0xa5
	}
	p := s.PackInto(buf)
	require.Equal(t, want, fill(&p))
	require.Equal(t, byte(0xa5), buf[24], "bytes past the value are left alone")
	allocs := testing.AllocsPerRun(100, func() {
		p := s.PackInto(buf)
		p.I32(0, 1)
		p.Ptr(1, 2)
		p.F32(2, 3)
		if _, err := p.Bytes(); err != nil {
			panic(err)
		}
	})
	require.Zero(t, allocs)
	require.PanicsWithValue(t, "abi: packing S (24 bytes) into 23 bytes", func() { s.PackInto(buf[:23]) })
}

func TestKernelNames(t *testing.T) {
	n, err := abi.LayerKernel(kvcache.FormatFP8UE8M0, mla.QBF16, abi.Streaming)
	require.NoError(t, err)
	require.Equal(t, "layer_fp8_ue8m0_qbf16", n)
	n, err = abi.LayerKernel(kvcache.FormatFP8UE8M0, mla.QBF16, abi.Direct)
	require.NoError(t, err)
	require.Equal(t, "layer_fp8_ue8m0_qbf16_direct", n)
	n, err = abi.KVKernel(kvcache.FormatBF16, abi.Direct)
	require.NoError(t, err)
	require.Equal(t, "kv_bf16_direct", n)
	n, err = abi.QKernel(mla.QFP8, abi.Streaming)
	require.NoError(t, err)
	require.Equal(t, "q_fp8", n)
	_, err = abi.LayerKernel(kvcache.Format(9), mla.QFP8, abi.Streaming)
	require.EqualError(t, err, "abi: no KV kernel for cache format Format(9)")
	_, err = abi.QKernel(mla.QFormat(5), abi.Direct)
	require.EqualError(t, err, "abi: no Q kernel for Q format QFormat(5)")
	_, err = abi.KVKernel(kvcache.FormatBF16, abi.Path(7))
	require.EqualError(t, err, "abi: no kernel path Path(7)")
	_, err = abi.LayerKernel(kvcache.FormatBF16, mla.QFP8, abi.Path(7))
	require.EqualError(t, err, "abi: no kernel path Path(7)")
	// Every (cache format, Q format) pair has its fused kernel on each
	// path, and every name is distinct.
	pairs := map[abi.Path]int{}
	names := map[string]bool{}
	for _, k := range abi.Kernels() {
		require.False(t, names[k.Name], "kernel %s listed twice", k.Name)
		names[k.Name] = true
		if k.Kind == abi.KindLayer {
			pairs[k.Path]++
		}
	}
	want := len(kvcache.Formats()) * len(mla.QFormats())
	require.Equal(t, map[abi.Path]int{abi.Streaming: want, abi.Direct: want}, pairs)
	require.Equal(t, "streaming", abi.Streaming.String())
	require.Equal(t, "direct", abi.Direct.String())
}

// A launch's parameters are packed field by field; Bytes refuses a value
// with a field left unset.
func ExampleStruct_Pack() {
	p := abi.Params.Pack()
	p.I32(abi.ParamHeads, 64)
	_, err := p.Bytes()
	fmt.Println(abi.Params.Size(), abi.Params.Offset(abi.ParamEps))
	fmt.Println(err != nil)
	// Output:
	// 176 160
	// true
}

// TestStreamingSharedBytes: the default streaming block (8 warps, rings of
// 4) fills the same 40 KiB for KV (4 slots of a latent row and its RoPE
// row) and Q (4 slots of a row and a bf16 stage), so a fused layer block
// takes no more shared memory than either part.
func TestStreamingSharedBytes(t *testing.T) {
	kv, q := abi.StreamingSharedBytes(8, 4, 4)
	require.Equal(t, 8*4*1280, kv)
	require.Equal(t, 8*(4*1024+1024), q)
	require.Equal(t, kv, q)
	kv, q = abi.StreamingSharedBytes(3, 1, 5)
	require.Equal(t, 3*1280, kv)
	require.Equal(t, 3*6*1024, q)
}

// BenchmarkPackParams packs one whole Params value (every field, by its
// kind) into reused memory, as each eager launch does twice (KV and Q).
func BenchmarkPackParams(b *testing.B) {
	buf := make([]byte, abi.Params.Size())
	b.ReportAllocs()
	for b.Loop() {
		p := abi.Params.PackInto(buf)
		for i := range abi.Params.Fields {
			id := abi.FieldID(i)
			switch abi.Params.Fields[i].Kind {
			case abi.Ptr:
				p.Ptr(id, uint64(i)<<12)
			case abi.U64:
				p.U64(id, uint64(i))
			case abi.I32:
				p.I32(id, int32(i))
			case abi.F32:
				p.F32(id, float32(i))
			}
		}
		if _, err := p.Bytes(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTopKParamsLayout pins TopKParams: six pointers, then seven ints, 80
// bytes (abi.h's static_assert checks the same on the device).
func TestTopKParamsLayout(t *testing.T) {
	require.Equal(t, 80, abi.TopKParams.Size())
	require.Equal(t, 48, abi.TopKParams.Offset(abi.TopKRows))
	require.Equal(t, 72, abi.TopKParams.Offset(abi.TopKScratchEntries))
	for i, f := range abi.TopKParams.Fields {
		require.NotEmpty(t, f.Name, "field %d has no name (a gap in the table)", i)
	}
}

// TestStructTables: every parameter struct of abi.h has named, distinct
// fields, a C type on each pointer and none elsewhere, and a distinct name;
// the GEMM and compressor structs' sizes are pinned (abi.h's static_asserts
// check the same on the device).
func TestStructTables(t *testing.T) {
	sizes := map[string]int{
		"Params": 176, "TopKParams": 80, "FP8GEMMParams": 72, "SplitKParams": 32, "BF16GEMMParams": 48,
		"BF16MMAParams": 80, "BF16WGMMAParams": 72, "QuantParams": 56, "CompressParams": 120, "CompressStepParams": 96, "CompressFinishParams": 88,
		"IndexerQueryParams": 24,
	}
	structs := map[string]bool{}
	for _, s := range abi.Structs() {
		require.False(t, structs[s.Name], "struct %s twice", s.Name)
		structs[s.Name] = true
		require.Equal(t, sizes[s.Name], s.Size(), "sizeof(%s)", s.Name)
		names := map[string]bool{}
		for i, f := range s.Fields {
			require.NotEmpty(t, f.Name, "%s: field %d has no name (a gap in the table)", s.Name, i)
			require.False(t, names[f.Name], "%s.%s twice", s.Name, f.Name)
			names[f.Name] = true
			if f.Kind == abi.Ptr {
				require.NotEmpty(t, f.CType, "%s.%s needs its C type", s.Name, f.Name)
			} else {
				require.Empty(t, f.CType, "%s.%s", s.Name, f.Name)
			}
			if i > 0 {
				require.Greater(t, s.Offset(abi.FieldID(i)), s.Offset(abi.FieldID(i-1)), "%s.%s in order", s.Name, f.Name)
			}
		}
	}
	require.Len(t, structs, len(sizes))
	require.Equal(t, 64, abi.FP8GEMMParams.Offset(abi.FP8GEMMYStride))
	require.Equal(t, 80, abi.CompressParams.Offset(abi.CompressNewRows))
	require.Equal(t, 84, abi.CompressFinishParams.Offset(abi.CFinHScale))
}

// TestKernelShapes: the GEMM kernels' shape constants and tiles hold the
// relations the kernels' static_asserts and the host's plans rely on.
func TestKernelShapes(t *testing.T) {
	require.Equal(t, 128, abi.FP8GEMMRowTile, "one row of 128x128 weight scale blocks a block")
	require.Equal(t, 16*abi.FP8GEMMWarps, abi.FP8GEMMRowTile)
	require.Equal(t, 16*abi.BF16MMAWarps, abi.BF16MMARows)
	tiles := abi.FP8GEMMTiles()
	require.NotEmpty(t, tiles)
	for i, tile := range tiles {
		require.Zero(t, tile.Tokens%8, "token tiles of whole 8-token MMA columns")
		require.Positive(t, tile.MinBlocks)
		if i > 0 {
			require.Greater(t, tile.Tokens, tiles[i-1].Tokens, "smallest first")
		}
	}
	require.Contains(t, abi.Header(), "#define FP8_GEMM_KERNELS(X) X(gemm_fp8_mt64, 64, 2) X(gemm_fp8_mt128, 128, 1)\n")
	require.Equal(t, 0, abi.BF16WGMMARowTile%64, "64 W rows a consumer warpgroup")
	require.Equal(t, 64, abi.BF16WGMMAStageK, "a stage is one 128-byte swizzle row of bf16")
	bns := abi.BF16WGMMATokenTiles()
	for i, bn := range bns {
		require.True(t, bn%8 == 0 && bn >= 8 && bn <= 256, "wgmma N %d", bn)
		if i > 0 {
			require.Greater(t, bn, bns[i-1], "smallest first")
		}
	}
	require.Contains(t, abi.Header(), "#define BF16_WGMMA_KERNELS(X) X(gemm_bf16_wgmma_bn8, 8) X(gemm_bf16_wgmma_bn16, 16)")
}
