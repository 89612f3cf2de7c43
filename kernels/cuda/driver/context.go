package driver

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is returned by every Context method after Close.
var ErrClosed = errors.New("cuda driver: context is closed")

// Device attribute ids (CUdevice_attribute in cuda.h).
const (
	attrMaxThreadsPerBlock     = 1
	attrWarpSize               = 10
	attrMultiprocessorCount    = 16
	attrL2CacheSize            = 38
	attrComputeCapabilityMajor = 75
	attrComputeCapabilityMinor = 76
	attrMaxSharedPerSM         = 81
	attrMaxRegistersPerSM      = 82
	attrMaxSharedPerBlockOptin = 97
)

// DeviceProps describes the device a Context runs on.
type DeviceProps struct {
	Ordinal              int
	Name                 string
	Major, Minor         int    // compute capability, e.g. 9.0 on the H200
	SMCount              int    // streaming multiprocessors
	L2Bytes              int    // L2 cache size
	MaxThreadsPerBlock   int    //
	WarpSize             int    //
	MaxSharedBytesOptin  int    // per-block shared memory reachable with cuFuncSetAttribute
	SharedBytesPerSM     int    // shared memory a multiprocessor
	RegistersPerSM       int    // 32-bit registers a multiprocessor
	TotalMemBytes        uint64 // device memory
	DriverVersion        int    // 1000*major + 10*minor of the CUDA version the driver supports
	DriverLibrary        string // the libcuda path that was loaded
	ProgrammaticLaunches bool   // cuLaunchKernelEx exists, so LaunchPDL really uses PDL
	ClusterLaunches      bool   // cuLaunchKernelEx exists and compute capability >= 9.0: LaunchWith takes a cluster shape
}

// Arch is the NVRTC real architecture for the device, e.g. "sm_90".
func (p DeviceProps) Arch() string { return fmt.Sprintf("sm_%d%d", p.Major, p.Minor) }

// Context is one device's primary CUDA context, owned by one goroutine locked
// to one OS thread. Every driver call runs on that goroutine; the methods of
// Context may be called from any goroutine (they hand the work over and wait)
// and also from inside Do (they then run directly). See the package doc.
type Context struct {
	api    *driverAPI
	device int32
	ctx    handle
	props  DeviceProps
	owner  uintptr // currentGoroutine() of the owner goroutine

	area     *launchArea // the owner's launch layout (launch.go)
	spin     atomic.Bool // GOMAXPROCS >= 2: hand-overs poll before parking (see handoffSpin)
	requests chan *call
	done     chan struct{}
	mu       sync.RWMutex // guards sending on requests against Close
	closed   atomic.Bool
	closeErr error
}

// call is one hand-over to the owner: the function, its outcome, and the
// state through which the caller learns that it ran. Calls are pooled, so
// a hand-over allocates nothing.
type call struct {
	f        func() error
	err      error
	panicked bool
	panicVal any
	state    atomic.Uint32 // callPending, then callDone (set by the owner) or callParked (by the caller)
	wake     chan struct{} // buffered: the owner's signal to a caller that parked
}

const (
	callPending = iota
	callDone
	callParked
)

var callPool = sync.Pool{New: func() any { return &call{wake: make(chan struct{}, 1)} }}

// finish publishes the outcome (owner side): a caller that has not parked
// sees the state change; one that parked is woken. The owner does not
// touch the call afterwards.
func (r *call) finish() {
	if !r.state.CompareAndSwap(callPending, callDone) {
		r.wake <- struct{}{}
	}
}

// await waits for the owner to finish the call (caller side), polling for
// up to handoffSpin before parking.
func (r *call) await(spin bool) {
	if spin {
		var deadline time.Time
		for i := 1; ; i++ {
			if r.state.Load() == callDone {
				return
			}
			if i%64 == 0 {
				if deadline.IsZero() {
					deadline = time.Now().Add(handoffSpin) // a short call is over before the clock is read
				} else if time.Now().After(deadline) {
					break
				}
			}
		}
	}
	if r.state.CompareAndSwap(callPending, callParked) {
		<-r.wake
	}
}

// Open retains the primary context of device ordinal on a new owner
// goroutine and reads the device's properties.
func Open(ordinal int) (*Context, error) {
	a, err := loadDriver()
	if err != nil {
		return nil, fmt.Errorf("CUDA unavailable: %w", err)
	}
	var count int32
	if err := a.check("cuDeviceGetCount", a.cuDeviceGetCount(&count)); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(count) {
		return nil, fmt.Errorf("device ordinal %d out of range: the driver sees %d device(s)", ordinal, count)
	}
	area, err := newLaunchArea()
	if err != nil {
		return nil, err
	}
	c := &Context{api: a, area: area, requests: make(chan *call, 64), done: make(chan struct{})}
	c.spin.Store(spinning())
	started := make(chan error, 1)
	go c.own(ordinal, started)
	if err := <-started; err != nil {
		<-c.done
		return nil, errors.Join(err, area.free())
	}
	return c, nil
}

// own is the owner goroutine: it binds the context to its locked thread,
// reports start-up, serves requests until Close, then releases the context.
// It never unlocks the thread, so the thread exits with it and no other
// goroutine ever runs on a thread where this context is current.
func (c *Context) own(ordinal int, started chan<- error) {
	runtime.LockOSThread()
	defer close(c.done)
	c.owner = currentGoroutine()
	if err := c.start(ordinal); err != nil {
		started <- err
		return
	}
	started <- nil
	for {
		r, ok := c.nextRequest()
		if !ok {
			break
		}
		c.serve(r)
		r.finish()
	}
	c.closeErr = errors.Join(
		c.api.check("cuCtxSynchronize", c.api.cuCtxSynchronize()),
		c.api.check("cuDevicePrimaryCtxRelease_v2", c.api.cuPrimaryRelease(c.device)))
}

func (c *Context) start(ordinal int) error {
	a := c.api
	if err := a.check("cuDeviceGet", a.cuDeviceGet(&c.device, int32(ordinal))); err != nil {
		return err
	}
	if err := a.check("cuDevicePrimaryCtxRetain", a.cuPrimaryRetain(&c.ctx, c.device)); err != nil {
		return err
	}
	if err := a.check("cuCtxSetCurrent", a.cuCtxSetCurrent(c.ctx)); err != nil {
		a.cuPrimaryRelease(c.device)
		return err
	}
	props, err := c.queryProps(ordinal)
	if err != nil {
		a.cuPrimaryRelease(c.device)
		return err
	}
	c.props = props
	return nil
}

func (c *Context) queryProps(ordinal int) (DeviceProps, error) {
	a := c.api
	p := DeviceProps{Ordinal: ordinal, DriverLibrary: a.path, ProgrammaticLaunches: a.cuLaunchKernelEx != 0}
	name := make([]byte, 256)
	if err := a.check("cuDeviceGetName", a.cuDeviceGetName(&name[0], int32(len(name)), c.device)); err != nil {
		return p, err
	}
	p.Name = goString(&name[0])
	for _, q := range []struct {
		attr int32
		dst  *int
	}{
		{attrComputeCapabilityMajor, &p.Major}, {attrComputeCapabilityMinor, &p.Minor},
		{attrMultiprocessorCount, &p.SMCount}, {attrL2CacheSize, &p.L2Bytes},
		{attrMaxThreadsPerBlock, &p.MaxThreadsPerBlock}, {attrWarpSize, &p.WarpSize},
		{attrMaxSharedPerBlockOptin, &p.MaxSharedBytesOptin}, {attrMaxSharedPerSM, &p.SharedBytesPerSM},
		{attrMaxRegistersPerSM, &p.RegistersPerSM},
	} {
		var v int32
		if err := a.check(fmt.Sprintf("cuDeviceGetAttribute(%d)", q.attr), a.cuDeviceGetAttr(&v, q.attr, c.device)); err != nil {
			return p, err
		}
		*q.dst = int(v)
	}
	if err := a.check("cuDeviceTotalMem_v2", a.cuDeviceTotalMem(&p.TotalMemBytes, c.device)); err != nil {
		return p, err
	}
	var v int32
	if err := a.check("cuDriverGetVersion", a.cuDriverGetVersion(&v)); err != nil {
		return p, err
	}
	p.DriverVersion = int(v)
	p.ClusterLaunches = p.ProgrammaticLaunches && p.Major >= 9
	return p, nil
}

// handoffSpin bounds how long the owner polls for the next request, and a
// caller for its reply, before parking. Waking a goroutine locked to its
// thread costs a futex round trip per direction, about 100 us on the H200
// machine's VM (TestHandoffLatency measures it); the bound is long enough
// that the calls of an eager iteration, and the host work between them,
// never park, at the price of a core polling that long after each call.
// Only worth it with a second P to run the other side. The request channel
// is buffered so that a caller never parks on the send.
const handoffSpin = 300 * time.Microsecond

func spinning() bool { return runtime.GOMAXPROCS(0) >= 2 }

// nextRequest receives the next request, polling for handoffSpin first.
// GOMAXPROCS is read (it takes the scheduler's lock) only when the owner
// is about to park, not on every hand-over.
func (c *Context) nextRequest() (*call, bool) {
	if c.spin.Load() {
		var deadline time.Time
		for i := 1; ; i++ {
			select {
			case r, ok := <-c.requests:
				return r, ok
			default:
			}
			if i%64 == 0 {
				if deadline.IsZero() {
					deadline = time.Now().Add(handoffSpin)
				} else if time.Now().After(deadline) {
					break
				}
			}
		}
	}
	c.spin.Store(spinning())
	r, ok := <-c.requests
	return r, ok
}

// serve runs the call's function on the owner goroutine, turning a panic
// into its outcome so the caller's goroutine re-panics with it instead of
// the owner dying.
func (c *Context) serve(r *call) {
	defer func() {
		if v := recover(); v != nil {
			r.panicked, r.panicVal = true, v
		}
	}()
	r.err = r.f()
}

// onOwner reports whether the calling goroutine is the owner goroutine
// (currentGoroutine). The identity is read before the closed flag, so a
// reused identity (after the owner exited) is always seen together with
// closed.
func (c *Context) onOwner() bool {
	return currentGoroutine() == c.owner
}

// Do runs f on the owner goroutine, where the context is current, and returns
// its error. Called from inside another Do (or any Context method), it runs f
// directly. Keep f short: it blocks every other caller of this Context. A
// panic in f is re-raised in the calling goroutine.
func (c *Context) Do(f func() error) error {
	if c.onOwner() {
		if c.closed.Load() {
			return ErrClosed
		}
		return f()
	}
	c.mu.RLock()
	if c.closed.Load() {
		c.mu.RUnlock()
		return ErrClosed
	}
	r := callPool.Get().(*call)
	r.f = f
	c.requests <- r
	c.mu.RUnlock()
	r.await(c.spin.Load())
	err, panicked, panicVal := r.err, r.panicked, r.panicVal
	r.f, r.err, r.panicked, r.panicVal = nil, nil, false, nil
	r.state.Store(callPending)
	callPool.Put(r)
	if panicked {
		panic(panicVal)
	}
	return err
}

// Close synchronizes the device, releases the primary context and stops the
// owner goroutine. Objects created from the Context (memory, streams,
// modules, graphs) are freed with the context when this was its last user.
// Close is idempotent; it must not be called from inside Do.
func (c *Context) Close() error {
	if c.onOwner() && !c.closed.Load() {
		return errors.New("cuda driver: Close called from inside Do; call it after Do returns")
	}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	c.closed.Store(true)
	close(c.requests)
	c.mu.Unlock()
	<-c.done
	return errors.Join(c.closeErr, c.area.free())
}

// Props returns the device properties read at Open.
func (c *Context) Props() DeviceProps { return c.props }

// Synchronize waits for all work on the context to finish (cuCtxSynchronize);
// asynchronous kernel faults surface here.
func (c *Context) Synchronize() error {
	return c.Do(func() error { return c.api.check("cuCtxSynchronize", c.api.cuCtxSynchronize()) })
}

// MemInfo returns the free and total device memory in bytes.
func (c *Context) MemInfo() (free, total uint64, err error) {
	err = c.Do(func() error { return c.api.check("cuMemGetInfo_v2", c.api.cuMemGetInfo(&free, &total)) })
	return free, total, err
}
