package driver

import (
	"encoding/binary"
	"math"
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
	// One launch with every argument checks offsets between mixed sizes too.
	a := newTestArea(t)
	for i, tc := range tests {
		require.NoError(t, a.putAny(i, tc.arg))
	}
	require.Equal(t, len(tests), a.n)
	ptrs := unsafe.Slice((*uintptr)(a.params()), a.n)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Zero(t, ptrs[i]%8, "each value starts 8-byte aligned")
			got := unsafe.Slice((*byte)(unsafe.Add(a.at(0), ptrs[i]-uintptr(a.at(0)))), len(tc.want))
			require.Equal(t, tc.want, got)
		})
	}
	for i := 1; i < len(ptrs); i++ {
		require.Greater(t, ptrs[i], ptrs[i-1]+uintptr(len(tests[i-1].want))-1, "values do not overlap")
	}
}

// newTestArea maps a launch area that the test unmaps.
func newTestArea(t *testing.T) *launchArea {
	t.Helper()
	a, err := newLaunchArea()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.free()) })
	a.reset()
	return a
}

func TestLaunchAreaParams(t *testing.T) {
	a := newTestArea(t)
	require.Nil(t, a.params(), "a kernel without parameters gets NULL kernelParams")
	require.NoError(t, a.putAny(0, DevicePtr(16)))
	require.NoError(t, a.put([]byte{3, 0, 0, 0}))
	require.Equal(t, a.at(areaParams), a.params(), "kernelParams is the pointer array")
	array := unsafe.Slice((*unsafe.Pointer)(a.params()), 2)
	require.Equal(t, uint64(16), *(*uint64)(array[0]))
	require.Equal(t, uint32(3), *(*uint32)(array[1]))

	a.reset()
	require.Nil(t, a.params(), "reset starts the next launch")
	for i := range maxKernelArgs {
		require.NoError(t, a.putAny(i, uint32(i)))
	}
	require.ErrorContains(t, a.putAny(maxKernelArgs, uint32(0)), "more than 96 kernel arguments")
	a.reset()
	require.ErrorContains(t, a.put(make([]byte, maxArgValueBytes+1)), "kernel arguments exceed 64512 bytes")
	require.NoError(t, a.put(make([]byte, maxArgValueBytes)), "the whole value space is usable")
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
			require.ErrorContains(t, checkArgs(tc.args), tc.want)
			a := newTestArea(t)
			var err error
			for i, x := range tc.args {
				if err = a.putAny(i, x); err != nil {
					break
				}
			}
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

// TestLaunchAttributesLayout: the CUlaunchConfig and attribute array a
// launch lays out in the launch area, per LaunchOptions: the ids, count
// and value bytes as cuda.h's union holds them.
func TestLaunchAttributesLayout(t *testing.T) {
	require.LessOrEqual(t, areaAttrs+maxLaunchAttrs*int(unsafe.Sizeof(launchAttribute{})), areaParams, "the attributes fit before kernelParams")
	require.Zero(t, areaAttrs%8, "the attribute array is 8-aligned")
	rng := newRand(t)
	cluster := Dim3{1 + uint32(rng.IntN(16)), 1 + uint32(rng.IntN(16)), 1 + uint32(rng.IntN(16))}
	le := binary.LittleEndian
	pdl := make([]byte, 64)
	le.PutUint32(pdl, 1)
	shape := make([]byte, 64)
	le.PutUint32(shape, cluster[0])
	le.PutUint32(shape[4:], cluster[1])
	le.PutUint32(shape[8:], cluster[2])
	type attr struct {
		id    uint32
		value []byte
	}
	tests := []struct {
		name string
		opts LaunchOptions
		want []attr // nil: no config, an ordinary cuLaunchKernel
	}{
		{"none", LaunchOptions{}, nil},
		{"pdl", LaunchOptions{PDL: true}, []attr{{6, pdl}}},
		{"cluster", LaunchOptions{Cluster: cluster}, []attr{{4, shape}}},
		{"pdl and cluster", LaunchOptions{PDL: true, Cluster: cluster}, []attr{{6, pdl}, {4, shape}}},
		{"pdl after pdl and cluster", LaunchOptions{PDL: true}, []attr{{6, pdl}}},
	}
	a := newTestArea(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			grid := Dim3{rng.Uint32(), rng.Uint32(), rng.Uint32()}
			block := Dim3{rng.Uint32(), rng.Uint32(), rng.Uint32()}
			shared, stream := rng.Uint32(), handle(rng.Uint64())
			cfg := a.config(grid, block, shared, stream, tc.opts)
			if tc.want == nil {
				require.Nil(t, cfg)
				return
			}
			require.Equal(t, a.at(areaConfig), unsafe.Pointer(cfg))
			require.Equal(t, launchConfig{
				gridDimX: grid[0], gridDimY: grid[1], gridDimZ: grid[2],
				blockDimX: block[0], blockDimY: block[1], blockDimZ: block[2],
				sharedMemBytes: shared, hStream: stream, attrs: uintptr(a.at(areaAttrs)), numAttrs: uint32(len(tc.want)),
			}, *cfg)
			raw := unsafe.Slice((*byte)(a.at(areaAttrs)), len(tc.want)*72)
			for i, w := range tc.want {
				r := raw[72*i : 72*(i+1)]
				require.Equal(t, w.id, le.Uint32(r), "attribute %d id", i)
				require.Equal(t, []byte{0, 0, 0, 0}, r[4:8], "attribute %d padding", i)
				require.Equal(t, w.value, r[8:], "attribute %d value", i)
			}
		})
	}
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

	// Cluster shapes, on a driver with cuLaunchKernelEx (its address is
	// never called: validation fails first) and on one without.
	withEx := &Context{api: &driverAPI{cuLaunchKernelEx: 1}}
	withoutEx := &Context{api: &driverAPI{}}
	clusterTests := []struct {
		name    string
		c       *Context
		grid    Dim3
		cluster Dim3
		want    error
		msg     string
	}{
		{"x not a multiple", withEx, Dim3{6, 1, 1}, Dim3{4, 1, 1}, ErrClusterShape, "launch k: cuda driver: invalid thread-block cluster shape: grid [6 1 1] is not a multiple of cluster [4 1 1] in dimension 0"},
		{"y not a multiple", withEx, Dim3{4, 3, 1}, Dim3{2, 2, 1}, ErrClusterShape, "grid [4 3 1] is not a multiple of cluster [2 2 1] in dimension 1"},
		{"z not a multiple", withEx, Dim3{2, 2, 5}, Dim3{1, 1, 2}, ErrClusterShape, "in dimension 2"},
		{"cluster larger than the grid", withEx, Dim3{1, 1, 1}, Dim3{2, 1, 1}, ErrClusterShape, "grid [1 1 1] is not a multiple of cluster [2 1 1]"},
		{"zero component", withEx, Dim3{4, 4, 4}, Dim3{2, 0, 1}, ErrClusterShape, "cluster [2 0 1]: cluster[1] is 0"},
		{"no cuLaunchKernelEx", withoutEx, Dim3{4, 1, 1}, Dim3{2, 1, 1}, ErrNoClusterLaunch, "launch k: cuda driver: thread-block cluster launches need cuLaunchKernelEx"},
		{"no driver at all", c, Dim3{4, 1, 1}, Dim3{2, 1, 1}, ErrNoClusterLaunch, "need cuLaunchKernelEx"},
	}
	for _, tc := range clusterTests {
		t.Run("cluster/"+tc.name, func(t *testing.T) {
			fn := &Function{c: tc.c, Name: "k"}
			for _, pdl := range []bool{false, true} {
				opts := LaunchOptions{PDL: pdl, Cluster: tc.cluster}
				err := tc.c.LaunchWith(fn, tc.grid, Dim3{32, 1, 1}, 0, nil, opts, DevicePtr(0))
				require.ErrorIs(t, err, tc.want)
				require.ErrorContains(t, err, tc.msg)
				err = tc.c.LaunchValuesWith(fn, tc.grid, Dim3{32, 1, 1}, 0, nil, opts, []byte{1, 2, 3, 4})
				require.ErrorIs(t, err, tc.want)
				require.ErrorContains(t, err, tc.msg)
			}
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
	a, err := newLaunchArea()
	if err != nil {
		b.Fatal(err)
	}
	defer a.free()
	b.ReportAllocs()
	for b.Loop() {
		a.reset()
		for i, x := range args {
			if err := a.putAny(i, x); err != nil {
				b.Fatal(err)
			}
		}
	}
}
