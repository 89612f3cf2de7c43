package driver

import (
	"encoding/binary"
	"math"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestPackArgs(t *testing.T) {
	le := binary.LittleEndian
	tests := []struct {
		name string
		arg  any
		want []byte
	}{
		{"device pointer", DevicePtr(0x7f0012345600), le.AppendUint64(nil, 0x7f0012345600)},
		{"uint64", uint64(math.MaxUint64 - 1), le.AppendUint64(nil, math.MaxUint64-1)},
		{"int64", int64(-2), le.AppendUint64(nil, math.MaxUint64-1)},
		{"uint32", uint32(0xdeadbeef), le.AppendUint32(nil, 0xdeadbeef)},
		{"int32", int32(-1), []byte{0xff, 0xff, 0xff, 0xff}},
		{"uint16", uint16(0xbeef), []byte{0xef, 0xbe}},
		{"int16", int16(-2), []byte{0xfe, 0xff}},
		{"uint8", uint8(7), []byte{7}},
		{"int8", int8(-128), []byte{0x80}},
		{"bool true", true, []byte{1}},
		{"bool false", false, []byte{0}},
		{"float32", float32(1.5), le.AppendUint32(nil, math.Float32bits(1.5))},
		{"float32 negative zero", float32(math.Copysign(0, -1)), []byte{0, 0, 0, 0x80}},
		{"float64", math.Pi, le.AppendUint64(nil, math.Float64bits(math.Pi))},
		{"struct by value", Bytes{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
	}
	// One call with every argument checks offsets between mixed sizes too.
	args := make([]any, len(tests))
	for i, tc := range tests {
		args[i] = tc.arg
	}
	k, err := packArgs(args)
	require.NoError(t, err)
	require.Len(t, k.ptrs, len(tests))
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, len(tc.want), k.sizes[i])
			require.Zero(t, uintptr(k.ptrs[i])%8, "each value starts 8-byte aligned")
			got := unsafe.Slice((*byte)(k.ptrs[i]), k.sizes[i])
			require.Equal(t, tc.want, got)
		})
	}
	for i := 1; i < len(k.ptrs); i++ {
		require.Greater(t, uintptr(k.ptrs[i]), uintptr(k.ptrs[i-1])+uintptr(k.sizes[i-1])-1, "values do not overlap")
	}
}

func TestPackArgsPinnedArray(t *testing.T) {
	k, err := packArgs([]any{DevicePtr(16), uint32(3)})
	require.NoError(t, err)
	var pin runtime.Pinner
	params := k.pin(&pin)
	defer pin.Unpin()
	require.Equal(t, unsafe.Pointer(&k.ptrs[0]), params, "kernelParams is the pointer array")
	array := unsafe.Slice((*unsafe.Pointer)(params), 2)
	require.Equal(t, uint64(16), *(*uint64)(array[0]))
	require.Equal(t, uint32(3), *(*uint32)(array[1]))

	empty, err := packArgs(nil)
	require.NoError(t, err)
	require.Nil(t, empty.pin(&pin), "a kernel without parameters gets NULL kernelParams")
}

func TestPackArgsRejects(t *testing.T) {
	tests := []struct {
		name string
		args []any
		want string
	}{
		{"int has no fixed width", []any{DevicePtr(0), 5}, "kernel argument 1 has type int, which has no fixed C width"},
		{"uintptr", []any{uintptr(5)}, "kernel argument 0 has type uintptr"},
		{"string", []any{uint32(1), uint32(2), "x"}, "kernel argument 2 has unsupported type string"},
		{"slice", []any{[]byte{1}}, "kernel argument 0 has unsupported type []uint8"},
		{"empty struct blob", []any{Bytes{}}, "kernel argument 0: Bytes value is empty"},
		{"pointer", []any{new(uint32)}, "kernel argument 0 has unsupported type *uint32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := packArgs(tc.args)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestLaunchConfigLayout pins the Go mirrors of CUlaunchConfig and
// CUlaunchAttribute to the LP64 layout of cuda.h.
func TestLaunchConfigLayout(t *testing.T) {
	var cfg launchConfig
	require.Equal(t, uintptr(56), unsafe.Sizeof(cfg))
	require.Equal(t, uintptr(24), unsafe.Offsetof(cfg.sharedMemBytes))
	require.Equal(t, uintptr(32), unsafe.Offsetof(cfg.hStream))
	require.Equal(t, uintptr(40), unsafe.Offsetof(cfg.attrs))
	require.Equal(t, uintptr(48), unsafe.Offsetof(cfg.numAttrs))

	var attr launchAttribute
	require.Equal(t, uintptr(72), unsafe.Sizeof(attr))
	require.Equal(t, uintptr(8), unsafe.Offsetof(attr.value))
	require.Equal(t, uintptr(8), unsafe.Alignof(attr), "the C union is 8-aligned")

	attr.value[0] = 1
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&attr.value)), 8)
	require.Equal(t, []byte{1, 0, 0, 0, 0, 0, 0, 0}, raw, "int programmaticStreamSerializationAllowed = 1 at offset 0")
}

func TestLaunchValidatesBeforeCallingTheDriver(t *testing.T) {
	// A Context with no owner: validation must fail before any hand-over.
	c := &Context{}
	fn := &Function{c: c, Name: "k"}
	tests := []struct {
		name        string
		fn          *Function
		grid, block Dim3
		args        []any
		want        string
	}{
		{"nil function", nil, Dim3{1, 1, 1}, Dim3{1, 1, 1}, nil, "Launch: function is nil"},
		{"zero grid", fn, Dim3{1, 0, 1}, Dim3{1, 1, 1}, nil, "launch k: grid[1] is 0"},
		{"zero block", fn, Dim3{1, 1, 1}, Dim3{0, 1, 1}, nil, "launch k: block[0] is 0"},
		{"bad argument", fn, Dim3{1, 1, 1}, Dim3{1, 1, 1}, []any{3}, "launch k: kernel argument 0 has type int"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, c.Launch(tc.fn, tc.grid, tc.block, 0, nil, tc.args...), tc.want)
			require.ErrorContains(t, c.LaunchPDL(tc.fn, tc.grid, tc.block, 0, nil, tc.args...), tc.want)
		})
	}
}

func TestAsBytes(t *testing.T) {
	require.Equal(t, []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, AsBytes([]int32{1, -1}))
	require.Equal(t, []byte{0, 0, 0xc0, 0x3f}, AsBytes([]float32{1.5}))
	require.Nil(t, AsBytes([]uint16(nil)))
	type bf16 uint16
	require.Len(t, AsBytes(make([]bf16, 5)), 10)
}

func BenchmarkPackArgs(b *testing.B) {
	args := []any{DevicePtr(1 << 40), DevicePtr(2 << 40), DevicePtr(3 << 40), uint32(512), int32(7), float32(1e-6), Bytes(make([]byte, 24))}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := packArgs(args); err != nil {
			b.Fatal(err)
		}
	}
}
