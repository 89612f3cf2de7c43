package driver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The TestGPU tests need a CUDA device (and most need NVRTC); without one
// they skip and say why. PROLOGUE_REQUIRE_GPU=1 turns the skips into
// failures. TestGPUSuiteAgainstFakeDriver also runs them, on any machine with
// a C compiler, against internal/fakecuda.

// loadTestModule compiles testdata/kernels.cu, or under the fake driver
// (which runs host versions of those kernels) loads a stand-in image.
func loadTestModule(t testing.TB, c *Context) *Module {
	t.Helper()
	var m *Module
	var err error
	if underFakeDriver() {
		m, err = c.LoadModule(fakeCubin("host kernels"))
	} else {
		requireNVRTC(t)
		m, err = c.CompileModule(testKernels, "driver_test.cu", CompileOptions{CacheDir: t.TempDir()})
	}
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, m.Unload()) })
	return m
}

func mustFunction(t testing.TB, m *Module, name string) *Function {
	t.Helper()
	f, err := m.Function(name)
	require.NoError(t, err)
	return f
}

func allocT(t testing.TB, c *Context, n int) DevicePtr {
	t.Helper()
	p, err := c.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Free(p)) })
	return p
}

func randomBytes(rng interface{ Uint64() uint64 }, n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], rng.Uint64())
		copy(b[i:], w[:])
	}
	return b
}

func readUint32s(t testing.TB, c *Context, p DevicePtr, n int) []uint32 {
	t.Helper()
	out := make([]uint32, n)
	require.NoError(t, c.DtoH(AsBytes(out), p))
	return out
}

// requireAllEqual reports the first mismatching index instead of dumping
// a million elements.
func requireAllEqual(t testing.TB, want, got []uint32) {
	t.Helper()
	require.Equal(t, len(want), len(got))
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("element %d of %d: got %#x, want %#x", i, len(want), got[i], want[i])
		}
	}
}

// newStreamT creates a stream destroyed at cleanup (after any capture
// cleanup registered later, since cleanups run last-in first-out).
func newStreamT(t testing.TB, c *Context) *Stream {
	t.Helper()
	s, err := c.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Destroy()) })
	return s
}

// beginCaptureT starts a capture that cleanup ends if the test stops midway,
// so one failed test cannot leave the device capturing for the next.
func beginCaptureT(t testing.TB, c *Context, s *Stream) {
	t.Helper()
	require.NoError(t, c.BeginCapture(s))
	t.Cleanup(func() {
		if g, err := c.EndCapture(s); err == nil {
			g.Destroy()
		}
	})
}

func blocksFor(n, block int) uint32 { return uint32((n + block - 1) / block) }

func TestGPUDeviceProps(t *testing.T) {
	c := openTestContext(t)
	p := c.Props()
	t.Logf("device %+v", p)
	require.NotEmpty(t, p.Name)
	require.GreaterOrEqual(t, p.Major, 5)
	require.Positive(t, p.SMCount)
	require.Positive(t, p.L2Bytes)
	require.Equal(t, 32, p.WarpSize)
	require.GreaterOrEqual(t, p.MaxThreadsPerBlock, 512)
	require.GreaterOrEqual(t, p.MaxSharedBytesOptin, 48<<10)
	require.GreaterOrEqual(t, p.SharedBytesPerSM, p.MaxSharedBytesOptin)
	require.GreaterOrEqual(t, p.RegistersPerSM, 32<<10)
	require.Positive(t, p.TotalMemBytes)
	require.GreaterOrEqual(t, p.DriverVersion, 12000)
	require.Regexp(t, `^sm_[0-9]+$`, p.Arch())

	free, total, err := c.MemInfo()
	require.NoError(t, err)
	require.Positive(t, total)
	require.LessOrEqual(t, free, total)

	n, err := DeviceCount()
	require.NoError(t, err)
	_, err = Open(n)
	require.ErrorContains(t, err, fmt.Sprintf("device ordinal %d out of range", n))
	_, err = Open(-1)
	require.ErrorContains(t, err, "device ordinal -1 out of range")
}

func TestGPUMemoryRoundTrip(t *testing.T) {
	c := openTestContext(t)
	rng := newRand(t)
	for _, n := range []int{1, 7, 4096, 1<<20 + rng.IntN(4096)} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			src := randomBytes(rng, n)
			p, q := allocT(t, c, n), allocT(t, c, n)
			require.NoError(t, c.HtoD(p, src))
			got := make([]byte, n)
			require.NoError(t, c.DtoH(got, p))
			require.True(t, bytes.Equal(src, got), "HtoD then DtoH")

			require.NoError(t, c.DtoD(q, p, n))
			clear(got)
			require.NoError(t, c.DtoH(got, q))
			require.True(t, bytes.Equal(src, got), "DtoD")

			off := rng.IntN(n)
			require.NoError(t, c.Memset8(q+DevicePtr(off), 0xa5, n-off))
			require.NoError(t, c.DtoH(got, q))
			require.True(t, bytes.Equal(src[:off], got[:off]), "bytes before the memset are untouched")
			require.Equal(t, bytes.Repeat([]byte{0xa5}, n-off), got[off:])
		})
	}
}

func TestGPUAsyncCopiesOnAStream(t *testing.T) {
	c := openTestContext(t)
	rng := newRand(t)
	s, err := c.NewStream()
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Destroy()); assert.NoError(t, s.Destroy(), "second Destroy is a no-op") }()

	n := 3<<20 + rng.IntN(1000)
	in, err := c.AllocHost(n)
	require.NoError(t, err)
	defer func() { assert.NoError(t, in.Free()) }()
	out, err := c.AllocHost(n)
	require.NoError(t, err)
	defer func() { assert.NoError(t, out.Free()) }()
	copy(in.Bytes(), randomBytes(rng, n))

	p, q := allocT(t, c, n), allocT(t, c, n)
	require.NoError(t, c.HtoDAsync(p, in.Bytes(), s))
	require.NoError(t, c.DtoDAsync(q, p, n, s))
	require.NoError(t, c.Memset8Async(q, 0, 64, s))
	require.NoError(t, c.DtoHAsync(out.Bytes(), q, s))
	require.NoError(t, s.Synchronize())
	require.Equal(t, make([]byte, 64), out.Bytes()[:64])
	require.True(t, bytes.Equal(in.Bytes()[64:], out.Bytes()[64:]))

	// Pageable Go memory through the async entry points, on the default stream.
	src := randomBytes(rng, 4096)
	got := make([]byte, 4096)
	require.NoError(t, c.HtoDAsync(p, src, nil))
	require.NoError(t, c.DtoHAsync(got, p, nil))
	require.NoError(t, c.StreamSynchronize(nil))
	require.Equal(t, src, got)
}

func TestGPUAllocErrors(t *testing.T) {
	c := openTestContext(t)
	_, err := c.Alloc(1 << 52) // 4 PiB
	require.ErrorIs(t, err, ResultOutOfMemory)
	require.ErrorContains(t, err, "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (")
	_, err = c.Alloc(-1)
	require.ErrorContains(t, err, "byte count -1 is negative")
	_, err = c.AllocHost(0)
	require.ErrorContains(t, err, "byte count 0 must be positive")
	_, err = c.LoadModule([]byte("not a cubin"))
	require.ErrorContains(t, err, "not a CUBIN")
}

func TestGPULaunchAddOne(t *testing.T) {
	c := openTestContext(t)
	rng := newRand(t)
	addOne := mustFunction(t, loadTestModule(t, c), "add_one")

	n := 1<<20 + rng.IntN(4096)
	host := make([]uint32, n)
	for i := range host {
		host[i] = rng.Uint32()
	}
	host[0] = math.MaxUint32 // wraps to 0
	p := allocT(t, c, 4*n)
	require.NoError(t, c.HtoD(p, AsBytes(host)))
	require.NoError(t, c.Launch(addOne, Dim3{blocksFor(n, 256), 1, 1}, Dim3{256, 1, 1}, 0, nil, p, uint32(n)))
	require.NoError(t, c.Synchronize())

	want := make([]uint32, n)
	for i, v := range host {
		want[i] = v + 1
	}
	requireAllEqual(t, want, readUint32s(t, c, p, n))

	// Only the first n-1 elements: the bound argument really bounds.
	s := newStreamT(t, c)
	require.NoError(t, c.Launch(addOne, Dim3{blocksFor(n, 128), 1, 1}, Dim3{128, 1, 1}, 0, s, p, uint32(n-1)))
	require.NoError(t, s.Synchronize())
	for i := range n - 1 {
		want[i]++
	}
	requireAllEqual(t, want, readUint32s(t, c, p, n))
}

func TestGPULaunchArgumentPacking(t *testing.T) {
	c := openTestContext(t)
	echo := mustFunction(t, loadTestModule(t, c), "echo_args")
	out := allocT(t, c, 11*8)

	blob := binary.LittleEndian.AppendUint32(nil, 0x01020304)
	blob = binary.LittleEndian.AppendUint32(blob, math.Float32bits(2.5))
	blob = binary.LittleEndian.AppendUint64(blob, 0x1122334455667788)
	require.NoError(t, c.Launch(echo, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, nil,
		out, int8(-5), uint16(0xbeef), int32(-123456), uint32(0xfeedface), int64(-1<<40-3),
		float32(-1.25), float64(math.Pi), true, Bytes(blob)))
	require.NoError(t, c.Synchronize())

	got := make([]uint64, 11)
	require.NoError(t, c.DtoH(AsBytes(got), out))
	neg := func(v int64) uint64 { return uint64(v) }
	want := []uint64{neg(-5), 0xbeef, neg(-123456), 0xfeedface, neg(-1<<40 - 3),
		uint64(math.Float32bits(-1.25)), math.Float64bits(math.Pi), 1,
		0x01020304, uint64(math.Float32bits(2.5)), 0x1122334455667788}
	require.Equal(t, want, got)
}

func TestGPUFunctionLookupAndAttributes(t *testing.T) {
	c := openTestContext(t)
	m := loadTestModule(t, c)
	_, err := m.Function("no_such_kernel")
	require.ErrorIs(t, err, ResultNotFound)
	require.ErrorContains(t, err, `kernel "no_such_kernel": cuModuleGetFunction: CUDA_ERROR_NOT_FOUND`)

	f := mustFunction(t, m, "add_one")
	regs, err := f.Attribute(FuncNumRegs)
	require.NoError(t, err)
	require.Positive(t, regs)
	maxThreads, err := f.Attribute(FuncMaxThreadsPerBlock)
	require.NoError(t, err)
	require.GreaterOrEqual(t, maxThreads, 256)
	require.NoError(t, f.SetAttribute(FuncMaxDynamicSharedSizeBytes, 64<<10))
	got, err := f.Attribute(FuncMaxDynamicSharedSizeBytes)
	require.NoError(t, err)
	require.Equal(t, 64<<10, got)
}

func TestGPULaunchErrorTranslation(t *testing.T) {
	c := openTestContext(t)
	addOne := mustFunction(t, loadTestModule(t, c), "add_one")
	p := allocT(t, c, 4*1024)
	require.NoError(t, c.Memset8(p, 0, 4*1024))

	err := c.Launch(addOne, Dim3{1, 1, 1}, Dim3{4096, 1, 1}, 0, nil, p, uint32(1024))
	require.ErrorIs(t, err, ResultInvalidValue)
	require.ErrorContains(t, err, "cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (")
	require.ErrorContains(t, err, "launch add_one grid [1 1 1] block [4096 1 1]")

	err = c.LaunchPDL(addOne, Dim3{1, 1, 1}, Dim3{4096, 1, 1}, 0, nil, p, uint32(1024))
	require.ErrorIs(t, err, ResultInvalidValue)
	if c.Props().ProgrammaticLaunches {
		require.ErrorContains(t, err, "cuLaunchKernelEx: CUDA_ERROR_INVALID_VALUE")
	}

	err = c.Launch(addOne, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 1<<30, nil, p, uint32(1024))
	require.Error(t, err, "1 GiB of dynamic shared memory is refused")
	t.Logf("oversized shared memory: %v", err)

	// Launch configuration errors are not sticky: the context still works.
	require.NoError(t, c.Launch(addOne, Dim3{4, 1, 1}, Dim3{256, 1, 1}, 0, nil, p, uint32(1024)))
	require.NoError(t, c.Synchronize())
	want := make([]uint32, 1024)
	for i := range want {
		want[i] = 1
	}
	requireAllEqual(t, want, readUint32s(t, c, p, 1024))
}

func TestGPUGraphCaptureAndReplay(t *testing.T) {
	c := openTestContext(t)
	addOne := mustFunction(t, loadTestModule(t, c), "add_one")
	s := newStreamT(t, c)
	const n = 100_000
	p := allocT(t, c, 4*n)
	require.NoError(t, c.Memset8(p, 0, 4*n))
	require.NoError(t, c.Synchronize()) // s does not order after the legacy stream

	require.ErrorContains(t, c.BeginCapture(nil), "legacy default stream cannot be captured")
	beginCaptureT(t, c, s)
	for range 3 {
		require.NoError(t, c.Launch(addOne, Dim3{blocksFor(n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s, p, uint32(n)))
	}
	g, err := c.EndCapture(s)
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Destroy()); assert.NoError(t, g.Destroy()) }()
	requireAllEqual(t, make([]uint32, n), readUint32s(t, c, p, n)) // capturing does not run anything

	exec, err := c.Instantiate(g)
	require.NoError(t, err)
	defer func() { assert.NoError(t, exec.Destroy()); assert.NoError(t, exec.Destroy()) }()
	const replays = 5
	for range replays {
		require.NoError(t, c.GraphLaunch(exec, s))
	}
	require.NoError(t, s.Synchronize())
	want := make([]uint32, n)
	for i := range want {
		want[i] = 3 * replays
	}
	requireAllEqual(t, want, readUint32s(t, c, p, n))
}

func TestGPUCaptureMisuseIsReported(t *testing.T) {
	c := openTestContext(t)
	s := newStreamT(t, c)

	_, err := c.EndCapture(s)
	require.ErrorContains(t, err, "cuStreamEndCapture: ", "ending a capture that never began")

	beginCaptureT(t, c, s)
	syncErr := s.Synchronize()
	require.Error(t, syncErr, "synchronizing a capturing stream is illegal")
	t.Logf("synchronize during capture: %v", syncErr)
	_, err = c.EndCapture(s)
	require.ErrorContains(t, err, "cuStreamEndCapture: ", "the capture was invalidated")
	t.Logf("end of invalidated capture: %v", err)
	require.NoError(t, s.Synchronize(), "the stream is usable again")

	// Capture always ends the capture, whatever f does.
	enqueueFailed := errors.New("enqueue failed")
	_, err = c.Capture(s, func() error { return enqueueFailed })
	require.ErrorIs(t, err, enqueueFailed)
	require.NoError(t, s.Synchronize(), "capture ended after f failed")
	require.PanicsWithValue(t, "enqueue panicked", func() {
		_, _ = c.Capture(s, func() error { panic("enqueue panicked") })
	})
	require.NoError(t, s.Synchronize(), "capture ended after f panicked")
	require.NoError(t, c.HtoD(allocT(t, c, 8), make([]byte, 8)), "synchronous calls work again")
}

func TestGPUPDLLaunch(t *testing.T) {
	c := openTestContext(t)
	if c.Props().Major < 9 {
		skipOrFail(t, "programmatic dependent launch needs compute capability 9.0, device is %d.%d", c.Props().Major, c.Props().Minor)
	}
	t.Logf("cuLaunchKernelEx available: %v", c.Props().ProgrammaticLaunches)
	m := loadTestModule(t, c)
	addOne, dependent := mustFunction(t, m, "add_one"), mustFunction(t, m, "add_one_after_dependency")
	s := newStreamT(t, c)
	const n = 1 << 22
	p := allocT(t, c, 4*n)
	require.NoError(t, c.Memset8(p, 0, 4*n))
	require.NoError(t, c.Synchronize()) // s does not order after the legacy stream

	// Each dependent kernel may start early but must see its predecessor's
	// writes; any lost update shows up in the final count.
	const pairs = 20
	grid, block := Dim3{blocksFor(n, 256), 1, 1}, Dim3{256, 1, 1}
	require.NoError(t, c.Do(func() error {
		for range pairs {
			if err := c.Launch(addOne, grid, block, 0, s, p, uint32(n)); err != nil {
				return err
			}
			if err := c.LaunchPDL(dependent, grid, block, 0, s, p, uint32(n)); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, s.Synchronize())
	want := make([]uint32, n)
	for i := range want {
		want[i] = 2 * pairs
	}
	requireAllEqual(t, want, readUint32s(t, c, p, n))
}

func TestGPUGraphCaptureWithPDL(t *testing.T) {
	c := openTestContext(t)
	if c.Props().Major < 9 || !c.Props().ProgrammaticLaunches {
		skipOrFail(t, "needs compute capability 9.0 and cuLaunchKernelEx (device %d.%d, cuLaunchKernelEx %v)",
			c.Props().Major, c.Props().Minor, c.Props().ProgrammaticLaunches)
	}
	m := loadTestModule(t, c)
	addOne, dependent := mustFunction(t, m, "add_one"), mustFunction(t, m, "add_one_after_dependency")
	s := newStreamT(t, c)
	const n = 1 << 20
	p := allocT(t, c, 4*n)
	require.NoError(t, c.Memset8(p, 0, 4*n))
	require.NoError(t, c.Synchronize()) // s does not order after the legacy stream
	grid, block := Dim3{blocksFor(n, 256), 1, 1}, Dim3{256, 1, 1}

	g, err := c.Capture(s, func() error {
		for range 2 {
			if err := c.Launch(addOne, grid, block, 0, s, p, uint32(n)); err != nil {
				return err
			}
			if err := c.LaunchPDL(dependent, grid, block, 0, s, p, uint32(n)); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	defer g.Destroy()
	exec, err := c.Instantiate(g)
	require.NoError(t, err)
	defer exec.Destroy()
	for range 3 {
		require.NoError(t, c.GraphLaunch(exec, s))
	}
	require.NoError(t, s.Synchronize())
	want := make([]uint32, n)
	for i := range want {
		want[i] = 12
	}
	requireAllEqual(t, want, readUint32s(t, c, p, n))
}

func TestGPUEventTiming(t *testing.T) {
	c := openTestContext(t)
	rng := newRand(t)
	lcg := mustFunction(t, loadTestModule(t, c), "lcg_rounds")
	s := newStreamT(t, c)
	start, err := c.NewEvent(true)
	require.NoError(t, err)
	defer start.Destroy()
	end, err := c.NewEvent(true)
	require.NoError(t, err)
	defer end.Destroy()

	const n, rounds = 1 << 22, 256
	host := make([]uint32, n)
	for i := range host {
		host[i] = rng.Uint32()
	}
	p := allocT(t, c, 4*n)
	require.NoError(t, c.HtoD(p, AsBytes(host)))
	require.NoError(t, c.Synchronize()) // s does not order after the legacy stream
	require.NoError(t, start.Record(s))
	require.NoError(t, c.Launch(lcg, Dim3{blocksFor(n, 256), 1, 1}, Dim3{256, 1, 1}, 0, s, p, uint32(n), uint32(rounds)))
	require.NoError(t, end.Record(s))
	require.NoError(t, end.Synchronize())
	ms, err := c.ElapsedMs(start, end)
	require.NoError(t, err)
	t.Logf("%d x %d LCG steps: %.3f ms", n, rounds, ms)
	require.Greater(t, ms, float32(0))

	got := readUint32s(t, c, p, n)
	for _, i := range []int{0, 1, n / 2, n - 1, rng.IntN(n)} {
		x := host[i]
		for range rounds {
			x = x*1664525 + 1013904223
		}
		require.Equalf(t, x, got[i], "element %d", i)
	}

	untimed, err := c.NewEvent(false)
	require.NoError(t, err)
	defer untimed.Destroy()
	require.NoError(t, untimed.Record(s))
	require.NoError(t, untimed.Synchronize())
	_, err = c.ElapsedMs(start, untimed)
	require.Error(t, err, "an event created without timing cannot be timed")
	_, err = c.ElapsedMs(nil, end)
	require.ErrorContains(t, err, "must both be non-nil")
}

func TestGPUDoIsReentrantAndSafeForConcurrentUse(t *testing.T) {
	c := openTestContext(t)
	rng := newRand(t)

	// Context methods called inside Do run directly instead of deadlocking.
	require.NoError(t, c.Do(func() error {
		p, err := c.Alloc(64)
		if err != nil {
			return err
		}
		if err := c.Memset8(p, 7, 64); err != nil {
			return err
		}
		return c.Do(func() error { return c.Free(p) })
	}))

	// A panic inside Do surfaces in the caller; the owner survives it.
	require.PanicsWithValue(t, "boom", func() { _ = c.Do(func() error { panic("boom") }) })
	sentinel := errors.New("sentinel")
	require.ErrorIs(t, c.Do(func() error { return sentinel }), sentinel)

	const workers, rounds = 16, 20
	seeds := make([]uint64, workers)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := seeds[w]
			for r := range rounds {
				n := 1 + int(local%8192)
				local = local*6364136223846793005 + 1442695040888963407
				src := bytes.Repeat([]byte{byte(w), byte(r)}, n)
				p, err := c.Alloc(len(src))
				if !assert.NoError(t, err) {
					return
				}
				got := make([]byte, len(src))
				assert.NoError(t, c.HtoD(p, src))
				assert.NoError(t, c.DtoH(got, p))
				assert.Equal(t, src, got)
				assert.NoError(t, c.Free(p))
			}
		}()
	}
	wg.Wait()
}

func TestGPUClosedContext(t *testing.T) {
	openTestContext(t) // skips without a device
	c, err := Open(0)
	require.NoError(t, err)
	require.ErrorContains(t, c.Do(func() error { return c.Close() }), "Close called from inside Do")
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close is idempotent")
	_, err = c.Alloc(16)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, c.Do(func() error { return nil }), ErrClosed)
}

// TestGPULaunchValues: arguments given as their bytes launch the same as
// typed ones, from the owner goroutine (inside Do) and from another one
// (the values copied before the hand-over), with and without PDL.
func TestGPULaunchValues(t *testing.T) {
	c := openTestContext(t)
	rng := newRand(t)
	addOne := mustFunction(t, loadTestModule(t, c), "add_one")
	n := 1000 + rng.IntN(1000)
	host := make([]uint32, n)
	for i := range host {
		host[i] = rng.Uint32()
	}
	p := allocT(t, c, 4*n)
	require.NoError(t, c.HtoD(p, AsBytes(host)))
	ptr := binary.LittleEndian.AppendUint64(nil, uint64(p))
	count := binary.LittleEndian.AppendUint32(nil, uint32(n))
	grid, block := Dim3{blocksFor(n, 256), 1, 1}, Dim3{256, 1, 1}
	require.NoError(t, c.LaunchValues(addOne, grid, block, 0, nil, false, ptr, count))
	require.NoError(t, c.Do(func() error { return c.LaunchValues(addOne, grid, block, 0, nil, true, ptr, count) }))
	require.NoError(t, c.Synchronize())
	want := make([]uint32, n)
	for i, v := range host {
		want[i] = v + 2
	}
	requireAllEqual(t, want, readUint32s(t, c, p, n))
	require.ErrorContains(t, c.LaunchValues(addOne, grid, block, 0, nil, false, ptr, nil), "kernel argument 1 is empty")
}

// clusterEchoWant is what cluster_echo writes for grid launched in clusters
// of cluster ({1, 1, 1}: without clusters): per block its cluster's shape
// and its successor's rank in the cluster.
func clusterEchoWant(grid, cluster Dim3) []uint32 {
	var want []uint32
	size := cluster[0] * cluster[1] * cluster[2]
	for z := range grid[2] {
		for y := range grid[1] {
			for x := range grid[0] {
				rank := x%cluster[0] + cluster[0]*(y%cluster[1]+cluster[1]*(z%cluster[2]))
				want = append(want, cluster[0], cluster[1], cluster[2], (rank+1)%size)
			}
		}
	}
	return want
}

// TestGPUClusterLaunch: LaunchWith and LaunchValuesWith launch in the
// cluster shape asked for (the kernel reads it and its cluster's shared
// memory), with and without PDL, eagerly and in a graph; more than 8 blocks
// a cluster only once the function allows it; a grid that is not a multiple
// of the cluster refused before the driver. Against the fake driver it also
// checks the attributes exactly as the driver receives them.
func TestGPUClusterLaunch(t *testing.T) {
	c := openTestContext(t)
	if !c.Props().ClusterLaunches {
		skipOrFail(t, "thread-block clusters need compute capability 9.0 and cuLaunchKernelEx (device %d.%d, cuLaunchKernelEx %v)",
			c.Props().Major, c.Props().Minor, c.Props().ProgrammaticLaunches)
	}
	rng := newRand(t)
	m := loadTestModule(t, c)
	echo := mustFunction(t, m, "cluster_echo")
	s := newStreamT(t, c)
	out := allocT(t, c, 4*4*1024)
	block := Dim3{32 * (1 + uint32(rng.IntN(4))), 1, 1}

	run := func(t *testing.T, grid Dim3, launch func(out DevicePtr) error) []uint32 {
		t.Helper()
		n := 4 * int(grid[0]*grid[1]*grid[2])
		require.NoError(t, c.Memset8(out, 0xa5, 4*n), "poison")
		require.NoError(t, c.Synchronize())
		require.NoError(t, launch(out))
		require.NoError(t, s.Synchronize())
		return readUint32s(t, c, out, n)
	}
	tests := []struct {
		name    string
		grid    Dim3
		opts    LaunchOptions
		nonPort bool // set FuncNonPortableClusterSizeAllowed first
	}{
		{"no cluster", Dim3{3, 2, 1}, LaunchOptions{}, false},
		{"pdl without cluster", Dim3{5, 1, 1}, LaunchOptions{PDL: true}, false},
		{"cluster 2 in x", Dim3{2 * (1 + uint32(rng.IntN(8))), 1, 1}, LaunchOptions{Cluster: Dim3{2, 1, 1}}, false},
		{"cluster 1x2x2", Dim3{3, 4, 2}, LaunchOptions{Cluster: Dim3{1, 2, 2}}, false},
		{"cluster 4x2 with pdl", Dim3{8, 2, 3}, LaunchOptions{PDL: true, Cluster: Dim3{4, 2, 1}}, false},
		{"cluster 8 (portable maximum)", Dim3{16, 1, 1}, LaunchOptions{PDL: true, Cluster: Dim3{8, 1, 1}}, false},
		{"cluster 16 (non-portable)", Dim3{32, 1, 1}, LaunchOptions{PDL: true, Cluster: Dim3{16, 1, 1}}, true},
		{"cluster of one", Dim3{7, 1, 1}, LaunchOptions{Cluster: Dim3{1, 1, 1}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.nonPort {
				require.NoError(t, echo.SetAttribute(FuncNonPortableClusterSizeAllowed, 1))
				t.Cleanup(func() { assert.NoError(t, echo.SetAttribute(FuncNonPortableClusterSizeAllowed, 0)) })
				v, err := echo.Attribute(FuncNonPortableClusterSizeAllowed)
				require.NoError(t, err)
				require.Equal(t, 1, v)
			}
			shape := tc.opts.Cluster
			if shape == (Dim3{}) {
				shape = Dim3{1, 1, 1}
			}
			want := clusterEchoWant(tc.grid, shape)
			got := run(t, tc.grid, func(out DevicePtr) error {
				return c.LaunchWith(echo, tc.grid, block, 0, s, tc.opts, out)
			})
			requireAllEqual(t, want, got)
			ptr := binary.LittleEndian.AppendUint64(nil, uint64(out))
			got = run(t, tc.grid, func(DevicePtr) error {
				return c.Do(func() error { return c.LaunchValuesWith(echo, tc.grid, block, 0, s, tc.opts, ptr) })
			})
			requireAllEqual(t, want, got)
		})
	}

	t.Run("in a graph", func(t *testing.T) {
		grid, opts := Dim3{4, 3, 1}, LaunchOptions{PDL: true, Cluster: Dim3{2, 3, 1}}
		g, err := c.Capture(s, func() error { return c.LaunchWith(echo, grid, block, 0, s, opts, out) })
		require.NoError(t, err)
		defer g.Destroy()
		exec, err := c.Instantiate(g)
		require.NoError(t, err)
		defer exec.Destroy()
		got := run(t, grid, func(DevicePtr) error { return c.GraphLaunch(exec, s) })
		requireAllEqual(t, clusterEchoWant(grid, opts.Cluster), got)
	})

	t.Run("refusals", func(t *testing.T) {
		require.NoError(t, echo.SetAttribute(FuncNonPortableClusterSizeAllowed, 0))
		err := c.LaunchWith(echo, Dim3{16, 1, 1}, block, 0, s, LaunchOptions{Cluster: Dim3{16, 1, 1}}, out)
		require.ErrorIs(t, err, ResultInvalidClusterSize, "16 blocks a cluster without FuncNonPortableClusterSizeAllowed")
		require.ErrorContains(t, err, "cuLaunchKernelEx: CUDA_ERROR_INVALID_CLUSTER_SIZE")
		err = c.LaunchWith(echo, Dim3{6, 1, 1}, block, 0, s, LaunchOptions{PDL: true, Cluster: Dim3{4, 1, 1}}, out)
		require.ErrorIs(t, err, ErrClusterShape)
		require.ErrorContains(t, err, "launch cluster_echo: cuda driver: invalid thread-block cluster shape: grid [6 1 1] is not a multiple of cluster [4 1 1] in dimension 0")
		require.NoError(t, s.Synchronize(), "the stream is still usable")
	})

	if !underFakeDriver() {
		return
	}
	// The fake's echo_launch reports the attributes the driver received.
	record := mustFunction(t, m, "echo_launch")
	rec := allocT(t, c, 8*(1+9*4))
	le := binary.LittleEndian
	pdlValue := make([]byte, 64)
	le.PutUint32(pdlValue, 1)
	// A shape of distinct sizes (a swapped dimension shows), within the
	// portable 8 blocks.
	shape := []uint32{1, 2, 4}
	rng.Shuffle(len(shape), func(i, j int) { shape[i], shape[j] = shape[j], shape[i] })
	cx, cy, cz := shape[0], shape[1], shape[2]
	clusterValue := make([]byte, 64)
	le.PutUint32(clusterValue, cx)
	le.PutUint32(clusterValue[4:], cy)
	le.PutUint32(clusterValue[8:], cz)
	type attr struct {
		id    uint64
		value []byte
	}
	for _, tc := range []struct {
		name string
		opts LaunchOptions
		want []attr
	}{
		{"none", LaunchOptions{}, nil},
		{"pdl", LaunchOptions{PDL: true}, []attr{{6, pdlValue}}},
		{"cluster", LaunchOptions{Cluster: Dim3{cx, cy, cz}}, []attr{{4, clusterValue}}},
		{"pdl and cluster", LaunchOptions{PDL: true, Cluster: Dim3{cx, cy, cz}}, []attr{{6, pdlValue}, {4, clusterValue}}},
		{"pdl after a cluster launch", LaunchOptions{PDL: true}, []attr{{6, pdlValue}}},
	} {
		t.Run("attributes/"+tc.name, func(t *testing.T) {
			grid := Dim3{2 * cx, 3 * cy, cz}
			words := make([]uint64, 1+9*4)
			for i := range words {
				words[i] = rng.Uint64() | 1<<63 // poison, never a count or an id
			}
			require.NoError(t, c.HtoD(rec, AsBytes(words)))
			require.NoError(t, c.LaunchWith(record, grid, Dim3{32, 1, 1}, 0, s, tc.opts, rec))
			require.NoError(t, s.Synchronize())
			require.NoError(t, c.DtoH(AsBytes(words), rec))
			require.Equal(t, uint64(len(tc.want)), words[0], "attribute count")
			for i, a := range tc.want {
				require.Equal(t, a.id, words[1+9*i], "attribute %d id", i)
				require.Equal(t, a.value, AsBytes(words[2+9*i:1+9*(i+1)]), "attribute %d value", i)
			}
		})
	}

	// Issued on the owner, a cluster launch allocates nothing.
	ptr := le.AppendUint64(nil, uint64(rec))
	opts := LaunchOptions{PDL: true, Cluster: Dim3{cx, cy, cz}}
	grid := Dim3{2 * cx, cy, cz}
	var allocs float64
	var launchErr error
	require.NoError(t, c.Do(func() error {
		allocs = testing.AllocsPerRun(100, func() {
			if err := c.LaunchValuesWith(record, grid, Dim3{32, 1, 1}, 0, s, opts, ptr); err != nil {
				launchErr = err
			}
		})
		return launchErr
	}))
	require.Zero(t, allocs, "allocations per cluster launch on the owner")
}

// fakeMaxActiveClusters is the fake libcuda's device model for
// cuOccupancyMaxActiveClusters (internal/fakecuda/testdata/fakecuda.c):
// min(32, 2048/threads, 233472/(shared+1024)) blocks an SM, and clusters
// kept within GPCs of 18, 18, 18, 18, 16, 16, 14 and 14 SMs.
func fakeMaxActiveClusters(threads, shared, size uint32) int {
	perSM := min(32, 2048/threads, 233472/(shared+1024))
	n := 0
	for _, sms := range []uint32{18, 18, 18, 18, 16, 16, 14, 14} {
		n += int(sms * perSM / size)
	}
	return n
}

// TestGPUMaxActiveClusters: MaxActiveClusters of cluster_echo, 384 threads
// a block, without dynamic shared memory and with 200 KB (one block an SM,
// once FuncMaxDynamicSharedSizeBytes allows it), for clusters of 1, 2, 4
// and 8 blocks: positive, non-increasing with the cluster's size, and with
// 200 KB at most one block an SM; 16 blocks only with
// FuncNonPortableClusterSizeAllowed; the same count from the owner (where
// it allocates nothing) as from another goroutine. Against the fake driver
// every count equals the fake's model, which shows block, shared memory and
// cluster shape reach the driver.
func TestGPUMaxActiveClusters(t *testing.T) {
	c := openTestContext(t)
	if !c.Props().ClusterLaunches {
		skipOrFail(t, "thread-block clusters need compute capability 9.0 and cuLaunchKernelEx (device %d.%d, cuLaunchKernelEx %v)",
			c.Props().Major, c.Props().Minor, c.Props().ProgrammaticLaunches)
	}
	rng := newRand(t)
	m := loadTestModule(t, c)
	echo := mustFunction(t, m, "cluster_echo")
	if c.api.cuOccupancyMaxActiveClusters == 0 {
		_, err := c.MaxActiveClusters(echo, Dim3{32, 1, 1}, 0, Dim3{2, 1, 1})
		require.ErrorIs(t, err, ErrNoClusterOccupancy)
		skipOrFail(t, "%v", err)
	}
	smallShared, err := echo.Attribute(FuncMaxDynamicSharedSizeBytes)
	require.NoError(t, err)
	const bigShared = 200 << 10
	require.NoError(t, echo.SetAttribute(FuncMaxDynamicSharedSizeBytes, bigShared))
	t.Cleanup(func() { assert.NoError(t, echo.SetAttribute(FuncMaxDynamicSharedSizeBytes, smallShared)) })
	block := Dim3{384, 1, 1}
	p := c.Props()

	counts := map[uint32][]int{} // per shared size, per cluster size 1, 2, 4, 8
	for _, shared := range []uint32{0, bigShared} {
		t.Run(fmt.Sprintf("%d shared bytes", shared), func(t *testing.T) {
			prev := math.MaxInt
			for _, size := range []uint32{1, 2, 4, 8} {
				n, err := c.MaxActiveClusters(echo, block, shared, Dim3{size, 1, 1})
				require.NoError(t, err, "cluster of %d", size)
				t.Logf("%d clusters of %d blocks (%v threads, %d shared bytes) at once", n, size, block, shared)
				require.Positive(t, n, "cluster of %d", size)
				require.LessOrEqual(t, n, prev, "cluster of %d: more clusters than of half the size", size)
				if shared > 0 {
					require.LessOrEqual(t, n*int(size), p.SMCount*(p.SharedBytesPerSM/int(shared)),
						"cluster of %d: more blocks than the SMs' shared memory holds", size)
				}
				if underFakeDriver() {
					require.Equal(t, fakeMaxActiveClusters(block[0], shared, size), n, "cluster of %d", size)
				}
				counts[shared] = append(counts[shared], n)
				prev = n
			}
		})
	}

	t.Run("on the owner", func(t *testing.T) {
		cluster := Dim3{4, 2, 1}
		want, err := c.MaxActiveClusters(echo, block, bigShared, cluster)
		require.NoError(t, err)
		var got int
		var allocs float64
		require.NoError(t, c.Do(func() error {
			allocs = testing.AllocsPerRun(50, func() {
				got, err = c.MaxActiveClusters(echo, block, bigShared, cluster)
			})
			return err
		}))
		require.Equal(t, want, got)
		require.Zero(t, allocs, "allocations per query on the owner")
	})

	t.Run("non-portable sizes", func(t *testing.T) {
		require.NoError(t, echo.SetAttribute(FuncNonPortableClusterSizeAllowed, 0))
		n, err := c.MaxActiveClusters(echo, block, bigShared, Dim3{16, 1, 1})
		t.Logf("16 blocks a cluster, not allowed: %d clusters, %v", n, err)
		if underFakeDriver() {
			require.ErrorIs(t, err, ResultInvalidClusterSize)
			require.ErrorContains(t, err, "max active clusters of cluster_echo (block [384 1 1], 204800 shared bytes, cluster [16 1 1]): cuOccupancyMaxActiveClusters: CUDA_ERROR_INVALID_CLUSTER_SIZE")
		} else {
			require.True(t, err != nil || n == 0, "16 blocks a cluster without FuncNonPortableClusterSizeAllowed: %d clusters", n)
		}
		require.NoError(t, echo.SetAttribute(FuncNonPortableClusterSizeAllowed, 1))
		t.Cleanup(func() { assert.NoError(t, echo.SetAttribute(FuncNonPortableClusterSizeAllowed, 0)) })
		n, err = c.MaxActiveClusters(echo, block, bigShared, Dim3{16, 1, 1})
		require.NoError(t, err)
		t.Logf("%d clusters of 16 blocks (%d shared bytes) at once", n, bigShared)
		require.Positive(t, n)
		require.Len(t, counts[bigShared], 4, "the counts for 1 to 8 blocks")
		require.LessOrEqual(t, n, counts[bigShared][3], "more clusters of 16 than of 8")
		if underFakeDriver() {
			require.Equal(t, fakeMaxActiveClusters(block[0], bigShared, 16), n)
		}
	})

	t.Run("shared memory above the function's maximum", func(t *testing.T) {
		require.NoError(t, echo.SetAttribute(FuncMaxDynamicSharedSizeBytes, smallShared))
		t.Cleanup(func() { assert.NoError(t, echo.SetAttribute(FuncMaxDynamicSharedSizeBytes, bigShared)) })
		n, err := c.MaxActiveClusters(echo, block, bigShared, Dim3{2, 1, 1})
		t.Logf("%d shared bytes with FuncMaxDynamicSharedSizeBytes %d: %d clusters, %v", bigShared, smallShared, n, err)
		if underFakeDriver() {
			require.ErrorIs(t, err, ResultInvalidValue)
		} else {
			require.True(t, err != nil || n == 0, "%d shared bytes past FuncMaxDynamicSharedSizeBytes %d: %d clusters", bigShared, smallShared, n)
		}
	})

	t.Run("zero cluster component", func(t *testing.T) {
		_, err := c.MaxActiveClusters(echo, block, 0, Dim3{2, 0, 1})
		require.ErrorIs(t, err, ErrClusterShape)
	})

	if !underFakeDriver() {
		return
	}
	// Random blocks, shared sizes and three-dimensional shapes: each
	// reaches the driver (the fake's count depends on all three).
	for i := range 8 {
		y, z := 1+uint32(rng.IntN(2)), 1+uint32(rng.IntN(2))
		shape := Dim3{1 + uint32(rng.IntN(int(8/(y*z)))), y, z} // portable: at most 8 blocks
		blk := Dim3{32 * (1 + uint32(rng.IntN(16))), 1 + uint32(rng.IntN(2)), 1}
		shared := uint32(rng.IntN(bigShared + 1))
		n, err := c.MaxActiveClusters(echo, blk, shared, shape)
		require.NoError(t, err, "case %d: block %v, %d shared bytes, cluster %v", i, blk, shared, shape)
		require.Equal(t, fakeMaxActiveClusters(blk[0]*blk[1]*blk[2], shared, shape[0]*shape[1]*shape[2]), n,
			"case %d: block %v, %d shared bytes, cluster %v", i, blk, shared, shape)
	}
}
