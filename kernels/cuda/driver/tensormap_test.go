package driver

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLaunchAreaAlignsTensorMaps: a TensorMap argument is laid out whole
// and 64-byte aligned after smaller ones, and the next argument follows it.
func TestLaunchAreaAlignsTensorMaps(t *testing.T) {
	a, err := newLaunchArea()
	require.NoError(t, err)
	defer func() { require.NoError(t, a.free()) }()
	var m TensorMap
	for i := range m {
		m[i] = byte(i*7 + 1)
	}
	a.reset()
	require.NoError(t, a.putAny(0, DevicePtr(0x1234)))
	require.NoError(t, a.putAny(1, int32(-7)))
	require.NoError(t, a.putAny(2, m))
	require.NoError(t, a.putAny(3, int32(9)))
	base := uintptr(unsafe.Pointer(&a.mem[0]))
	off := func(i int) int { return int(*(*uintptr)(a.at(areaParams + 8*i)) - base) }
	require.Zero(t, (base+uintptr(off(2)))%64, "the tensor map's value is 64-byte aligned")
	require.Equal(t, m[:], a.mem[off(2):off(2)+128])
	require.Equal(t, off(2)+128, off(3), "the next argument follows the map")
	require.Equal(t, uint32(9), binary.LittleEndian.Uint32(a.mem[off(3):]))
}

// TestTiledTensorChecks: what EncodeTiled refuses before the driver sees it.
func TestTiledTensorChecks(t *testing.T) {
	ok := TiledTensor{Addr: 0x1000, Dims: []uint64{256, 8}, Strides: []uint64{256}, Box: []uint32{128, 8}}
	require.NoError(t, ok.check())
	for name, tc := range map[string]struct {
		f    func(*TiledTensor)
		want string
	}{
		"no dims":       {func(x *TiledTensor) { x.Dims, x.Strides, x.Box = nil, nil, nil }, "0 dimensions"},
		"six dims":      {func(x *TiledTensor) { x.Dims = make([]uint64, 6) }, "6 dimensions"},
		"strides":       {func(x *TiledTensor) { x.Strides = nil }, "0 strides for 2 dimensions"},
		"box":           {func(x *TiledTensor) { x.Box = []uint32{128} }, "1 box sizes"},
		"unaligned":     {func(x *TiledTensor) { x.Addr = 0x1008 }, "not 16-byte aligned"},
		"stride":        {func(x *TiledTensor) { x.Strides = []uint64{264} }, "not a multiple of 16"},
		"box too large": {func(x *TiledTensor) { x.Box = []uint32{128, 257} }, "want 1 to 256"},
		"box size zero": {func(x *TiledTensor) { x.Box = []uint32{0, 8} }, "want 1 to 256"},
	} {
		x := ok
		tc.f(&x)
		require.ErrorContains(t, x.check(), tc.want, name)
	}
}

// TestGPUTensorMap encodes a tiled tensor map, refuses a box row wider than
// its swizzle (the driver's check), and passes the map by value to a
// kernel, directly and from a captured graph: the kernel reads the bytes
// the host encoded, and the int parameters around the 64-byte aligned one.
// Against the fake driver the encoding records the arguments, so it also
// checks what EncodeTiled passed.
func TestGPUTensorMap(t *testing.T) {
	c := openTestContext(t)
	if c.api.cuTensorMapEncodeTiled == nil {
		skipOrFail(t, "%v", ErrNoTensorMaps)
	}
	buf := allocT(t, c, 64<<10)
	tt := TiledTensor{DataType: TensorDataUint8, Addr: buf, Dims: []uint64{512, 96}, Strides: []uint64{512},
		Box: []uint32{128, 32}, Swizzle: Swizzle128B, L2Promotion: L2Promotion256B}
	m, err := c.EncodeTiled(tt)
	require.NoError(t, err)
	require.NotEqual(t, TensorMap{}, m)
	if underFakeDriver() {
		w := func(i int) uint64 { return binary.LittleEndian.Uint64(m[8*i:]) }
		require.Equal(t, "TMAPFAKE", string(m[:8]))
		require.Equal(t, uint64(0|2<<8|0<<16|3<<24|3<<32|0<<40), w(1), "dtype, rank, interleave, swizzle, L2, OOB fill")
		require.Equal(t, uint64(buf), w(2))
		require.Equal(t, []uint64{512, 96}, []uint64{w(3), w(4)})
		require.Equal(t, uint64(512), w(8))
		require.Equal(t, []byte{128, 0, 32, 0}, m[96:100], "box")
		require.Equal(t, []byte{1, 1}, m[106:108], "element strides")
	}
	wide := tt
	wide.Box = []uint32{256, 32}
	_, err = c.EncodeTiled(wide)
	require.Error(t, err, "a 256-byte box row under the 128-byte swizzle")
	t.Logf("refused: %v", err)

	echo := mustFunction(t, loadTestModule(t, c), "echo_tensormap")
	out := allocT(t, c, 18*8)
	want := make([]uint64, 18)
	for i := range 16 {
		want[i] = binary.LittleEndian.Uint64(m[8*i:])
	}
	want[16], want[17] = uint64(0xfffffffffffffff9), 12345 // -7 sign-extended
	require.NoError(t, c.Launch(echo, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, nil, out, int32(-7), m, int32(12345)))
	require.NoError(t, c.Synchronize())
	got := make([]uint64, 18)
	require.NoError(t, c.DtoH(AsBytes(got), out))
	require.Equal(t, want, got, "launched directly")

	s := newStreamT(t, c)
	require.NoError(t, c.Memset8(out, 0, 18*8))
	require.NoError(t, c.Synchronize())
	g, err := c.Capture(s, func() error {
		return c.LaunchPDL(echo, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, out, int32(-7), m, int32(12345))
	})
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Destroy()) }()
	exec, err := c.Instantiate(g)
	require.NoError(t, err)
	defer func() { assert.NoError(t, exec.Destroy()) }()
	require.NoError(t, c.GraphLaunch(exec, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, c.DtoH(AsBytes(got), out))
	require.Equal(t, want, got, "replayed from a graph")
}
