// Package driver is prologue's thin layer over the CUDA driver API
// (libcuda.so.1) and NVRTC (libnvrtc), reached without cgo through
// github.com/ebitengine/purego: it builds with CGO_ENABLED=0 and finds the
// libraries at run time, so a machine without a GPU still builds, and
// Available says why CUDA cannot be used there.
//
// # Threading model
//
// A CUDA context is "current" per OS thread, and Go moves goroutines between
// threads. A Context therefore owns one goroutine locked to one OS thread
// (runtime.LockOSThread) on which the device's primary context is made
// current once; every driver call of that Context runs there. Methods of
// Context and of the objects it creates (Stream, Event, Module, Function,
// Graph, HostBuffer) may be called from any goroutine: they hand a closure to
// the owner and wait for its result. Do exposes that mechanism so a caller
// can batch many calls into one hand-over:
//
//	err := ctx.Do(func() error {
//		if err := ctx.Launch(norm, grid, block, 0, stream, in, out); err != nil {
//			return err
//		}
//		return ctx.Launch(rope, grid, block, 0, stream, out)
//	})
//
// Calls made from inside Do (or from any code already running on the owner)
// are recognized by the owner goroutine's identity and run directly, so
// nesting never deadlocks. Close must be called from outside Do. A panic
// inside Do is re-raised in the goroutine that called Do.
//
// Waking a goroutine locked to a thread costs futex round trips (about 100
// microseconds per call on the H200 machine's VM), so both sides poll
// briefly (handoffSpin) before parking: a burst of calls costs about a
// microsecond per hand-over, at the price of that much spinning after each
// burst. A hand-over allocates nothing (its record is pooled), and a launch
// issued on the owner (LaunchValues or LaunchValuesWith inside Do)
// allocates nothing either.
// For the lowest launch overhead, capture a sequence into a CUDA graph
// (Capture, Instantiate, GraphLaunch) and replay it.
//
// # Launches
//
// Launch takes typed Go arguments, LaunchValues their bytes. LaunchPDL
// (programmatic dependent launch) and LaunchWith / LaunchValuesWith set
// launch attributes through cuLaunchKernelEx: PDL and a thread-block
// cluster shape (LaunchOptions). PDL degrades to an ordinary launch on a
// driver without cuLaunchKernelEx; a cluster launch fails on such a driver
// (ErrNoClusterLaunch), and a cluster shape that does not divide the grid
// fails everywhere (ErrClusterShape), both before reaching the driver.
// MaxActiveClusters says how many clusters of a shape fit on the device at
// once (cuOccupancyMaxActiveClusters; ErrNoClusterOccupancy without it),
// so a planner can size a grid to one wave.
//
// # Streams
//
// A nil *Stream means the legacy default stream. Streams from NewStream are
// non-blocking (CU_STREAM_NON_BLOCKING): they do not wait for work on the
// legacy default stream, and the synchronous copies (HtoD, Memset8, ...) run
// there and may return before the device has finished them. Synchronize the
// context, or enqueue the setup on the same stream with the Async variants,
// before a stream's kernels read that data.
//
// # Pinning rule
//
// Every Go pointer handed to the driver or to NVRTC is pinned with
// runtime.Pinner for the duration of the call: host buffers of copies, module
// images, NUL-terminated names and option strings. A launch's argument
// values, its kernelParams pointer array and its CUlaunchConfig are laid out
// by the owner in a mapping outside the Go heap (the launch area), which
// needs no pinning; the driver copies kernel arguments before the launch
// call returns, so the area serves the next launch. An asynchronous copy
// from or to pageable Go memory completes its host side before returning,
// so no Go memory is referenced after a call. Memory that must outlive a
// call, e.g. the host side of a truly asynchronous or
// graph-captured copy, is a HostBuffer (page-locked memory outside the Go
// heap).
//
// # Errors
//
// A failed driver call becomes an *Error naming the call and the driver's
// name and description of the code, e.g.
// "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; errors.Is(err,
// ResultOutOfMemory) matches it. A failed compilation is a *CompileError
// whose message carries NVRTC's complete log.
//
// # Compilation and the cubin cache
//
// Compile runs NVRTC for a real architecture (sm_90 on the H200) with
// -std=c++17 and -default-device. CUBINs are cached under
// os.UserCacheDir()/prologue/cubin ($PROLOGUE_CACHE_DIR overrides), keyed by
// the SHA-256 of the NVRTC version, program name, source and full option
// list. Entries carry a checksum and are written atomically (temporary file
// plus rename); an unreadable or corrupt entry is recompiled, never fatal.
//
// NVRTC is searched as $PROLOGUE_NVRTC (exclusively, when set), then the
// sonames libnvrtc.so.13, .12 and libnvrtc.so through the loader, then the
// lib directories of $CUDA_HOME, $CUDA_PATH, /usr/local/cuda*, the nvidia
// Python wheels (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib) and the system
// library directories.
package driver
