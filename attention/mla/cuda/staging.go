package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The asynchronous upload (mla.AsyncWriter). Write copies through the
// driver and then waits for the main stream, a round trip of about 10 us
// per call on the H200 machine; the engine uploads its metadata (and the
// compressor plans) once per iteration, so those copies go out without the
// wait, from page-locked staging memory (cuMemAllocHost_v2) with
// cuMemcpyHtoDAsync_v2 on the main stream.
//
// Why that is safe:
//   - Device order. The copy is enqueued on the main stream, so every
//     launch and graph replay issued on it afterwards reads the new bytes;
//     the side stream (ForkKV, Side) waits for an event recorded on the main
//     stream after the copy, so its kernels do too. A copy enqueued while
//     kernels of the previous iteration still run on the main stream starts
//     after them, so it never changes bytes they read.
//   - Host memory. The staging bytes are read by the DMA engine some time
//     after WriteAsync returns, so they may only be rewritten once the copy
//     is done. The backend numbers the copies it enqueues (issued), keeps
//     the number of the last copy from each staging buffer, and the number
//     a completed wait on the main stream covers (drained); WaitWrites of a
//     buffer returns at once when its last copy is covered, else it waits
//     for the main stream. The writers of staging memory
//     (MetadataBuffers.Upload, the engine's compressor plans) call
//     WaitWrites before each rewrite. In a decode loop End (or Abort, or a
//     Read) has waited for the stream since, so the check costs a few
//     atomic loads, and the plans' copy issued just before the metadata's
//     rewrite does not make the metadata wait; a path that skips the wait
//     (End of an iteration whose layer did not run, a refused Begin after
//     the plans' copy) pays one stream synchronize at the next rewrite.
//   - Pointers. Staging memory comes from the driver and lives outside the
//     Go heap, so the collector never moves it; WriteAsync refuses any
//     other source (Go memory would need a pin for as long as the copy
//     runs, which a call cannot promise).
//   - Lifetime. Close waits for the stream, then frees the staging memory;
//     WaitWrites refuses after Close, so a late Upload cannot read freed
//     memory.
type stagingState struct {
	mu     sync.Mutex
	bufs   []*stagingBuffer
	closed atomic.Bool
	// issued numbers the copies WriteAsync enqueued on the main stream;
	// drained is the number of the last one a completed synchronize of the
	// main stream covers. Both are written on the driver thread (inside
	// ctx.Do), so a synchronize covers exactly the copies counted before it.
	issued, drained atomic.Uint64
}

// stagingBuffer is one AllocStaging slice and the number of its last copy.
type stagingBuffer struct {
	h    *driver.HostBuffer
	last atomic.Uint64
}

// drain records that the first n copies have completed.
func (s *stagingState) drain(n uint64) {
	for {
		d := s.drained.Load()
		if d >= n || s.drained.CompareAndSwap(d, n) {
			return
		}
	}
}

// find returns the staging buffer src lies inside, or nil.
func (s *stagingState) find(src []byte) *stagingBuffer {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(src)))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sb := range s.bufs {
		raw := sb.h.Bytes()
		base := uintptr(unsafe.Pointer(unsafe.SliceData(raw)))
		if p >= base && p-base <= uintptr(len(raw)) && uintptr(len(src)) <= uintptr(len(raw))-(p-base) {
			return sb
		}
	}
	return nil
}

// close frees the staging memory; the stream has been synchronized.
func (s *stagingState) close() error {
	s.closed.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, sb := range s.bufs {
		if err := sb.h.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	s.bufs = nil
	if len(errs) > 0 {
		return fmt.Errorf("cuda: freeing staging memory: %w", errs[0])
	}
	return nil
}

// AllocStaging implements mla.AsyncWriter: n bytes of zeroed page-locked
// host memory, freed by Close.
func (b *Backend) AllocStaging(n int) ([]byte, error) {
	if b.staging.closed.Load() {
		return nil, fmt.Errorf("cuda: AllocStaging: %w", driver.ErrClosed)
	}
	h, err := b.ctx.AllocHost(n)
	if err != nil {
		return nil, fmt.Errorf("cuda: AllocStaging(%d): %w", n, err)
	}
	raw := h.Bytes()
	clear(raw)
	b.staging.mu.Lock()
	b.staging.bufs = append(b.staging.bufs, &stagingBuffer{h: h})
	b.staging.mu.Unlock()
	return raw, nil
}

// WriteAsync implements mla.AsyncWriter: it enqueues the copy of src
// (inside staging memory) to dst on the main stream and returns without
// waiting. Not for use inside Side (its launches go to the side stream)
// nor during a graph capture.
func (b *Backend) WriteAsync(dst mla.Buffer, off int, src []byte) error {
	p, err := span(dst, off, len(src))
	if err != nil || len(src) == 0 {
		return err
	}
	sb := b.staging.find(src)
	if sb == nil {
		return fmt.Errorf("cuda: WriteAsync: the %d source bytes are not inside staging memory from AllocStaging", len(src))
	}
	return b.ctx.Do(func() error {
		// Numbered before it is enqueued: a failed call may still have
		// queued the copy, and then a wait must cover it.
		sb.last.Store(b.staging.issued.Add(1))
		return b.ctx.HtoDAsync(p, src, b.main)
	})
}

// WaitWrites implements mla.AsyncWriter: it returns once no copy
// WriteAsync enqueued from staging's buffer may still read it,
// synchronizing the main stream only when nothing has since its last copy.
func (b *Backend) WaitWrites(staging []byte) error {
	s := &b.staging
	if s.closed.Load() {
		return fmt.Errorf("cuda: WaitWrites: %w", driver.ErrClosed)
	}
	sb := s.find(staging)
	if sb == nil {
		return fmt.Errorf("cuda: WaitWrites: the %d bytes are not inside staging memory from AllocStaging", len(staging))
	}
	if sb.last.Load() <= s.drained.Load() {
		return nil
	}
	return b.syncStream(b.main)
}

// syncStream waits for st; a wait on the main stream also marks the
// staged copies enqueued before it done.
func (b *Backend) syncStream(st *driver.Stream) error {
	return b.ctx.Do(func() error {
		n := b.staging.issued.Load()
		if err := st.Synchronize(); err != nil {
			return err
		}
		if st == b.main {
			b.staging.drain(n)
		}
		return nil
	})
}

var _ mla.AsyncWriter = (*Backend)(nil)
