package mlatest

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/dsv4mla/prologue/attention/mla"
)

// AsyncInner is what an Async wraps: a backend that runs the prologue and
// the compressor step on host memory, synchronously (the CPU backend).
type AsyncInner interface {
	mla.Backend
	mla.CompressStepper
}

// Async is a host backend (the CPU backend) with an mla.AsyncWriter whose copies land
// late, as a device's do: WriteAsync only queues the copy, and the queue
// runs, in order, when the backend next touches its memory in stream order
// (Write, Read, Fill, Free, any kernel, Synchronize) or in WaitWrites. A
// copy whose source bytes changed between WriteAsync and the moment it runs
// broke the AsyncWriter contract (the staging memory was rewritten while a
// device could still read it): Violations lists each one. So a test of a
// caller of WriteAsync sees both a stale device buffer, where the caller
// forgot that the copy is ordered with the launches, and a rewrite, where
// it forgot WaitWrites.
type Async struct {
	AsyncInner

	mu         sync.Mutex
	staging    [][]byte
	pending    []pendingCopy
	violations []string
	copies     int
	waits      int // WaitWrites calls that found a copy pending
}

type pendingCopy struct {
	dst      mla.Buffer
	off      int
	src      []byte
	snapshot []byte // src at WriteAsync
}

// NewAsync returns an Async over inner, which must not queue work itself.
func NewAsync(inner AsyncInner) *Async { return &Async{AsyncInner: inner} }

// Name is the inner backend's name with "-async" appended.
func (b *Async) Name() string { return b.AsyncInner.Name() + "-async" }

// AllocStaging implements mla.AsyncWriter.
func (b *Async) AllocStaging(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mlatest: AllocStaging(%d): byte count must be positive", n)
	}
	raw := make([]byte, n)
	b.mu.Lock()
	b.staging = append(b.staging, raw)
	b.mu.Unlock()
	return raw, nil
}

// WriteAsync implements mla.AsyncWriter: it checks the range and the
// source, and queues the copy.
func (b *Async) WriteAsync(dst mla.Buffer, off int, src []byte) error {
	if off < 0 || off+len(src) > dst.Len() {
		return fmt.Errorf("mlatest: WriteAsync: range [%d,%d) outside a buffer of %d bytes", off, off+len(src), dst.Len())
	}
	if len(src) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stagingOf(src) == nil {
		return fmt.Errorf("mlatest: WriteAsync: the %d source bytes are not inside staging memory", len(src))
	}
	b.copies++
	b.pending = append(b.pending, pendingCopy{dst: dst, off: off, src: src, snapshot: append([]byte(nil), src...)})
	return nil
}

// stagingOf returns the staging slice p lies inside, or nil.
func (b *Async) stagingOf(p []byte) []byte {
	at := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	for _, s := range b.staging {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
		if at >= base && at+uintptr(len(p)) <= base+uintptr(len(s)) {
			return s
		}
	}
	return nil
}

// WaitWrites implements mla.AsyncWriter: it runs the queued copies up to
// the last one from staging's slice, as a device would have by the time
// that one is done.
func (b *Async) WaitWrites(staging []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.stagingOf(staging)
	if s == nil {
		return fmt.Errorf("mlatest: WaitWrites: the %d bytes are not inside staging memory", len(staging))
	}
	last := -1
	for i, c := range b.pending {
		if unsafe.SliceData(b.stagingOf(c.src)) == unsafe.SliceData(s) {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	b.waits++
	return b.runLocked(last + 1)
}

// flush runs every queued copy.
func (b *Async) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runLocked(len(b.pending))
}

// runLocked runs the first n queued copies in order, recording the ones
// whose source changed since WriteAsync.
func (b *Async) runLocked(n int) error {
	for _, c := range b.pending[:n] {
		if string(c.src) != string(c.snapshot) {
			b.violations = append(b.violations, fmt.Sprintf("the %d staged bytes for offset %d changed before the copy ran", len(c.src), c.off))
		}
		if err := b.AsyncInner.Write(c.dst, c.off, c.src); err != nil {
			return err
		}
	}
	rest := copy(b.pending, b.pending[n:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
	return nil
}

// Pending is the number of queued copies.
func (b *Async) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

// Copies is the number of WriteAsync calls that queued a copy.
func (b *Async) Copies() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.copies
}

// Waits is the number of WaitWrites calls that found a copy queued.
func (b *Async) Waits() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waits
}

// Violations lists the copies whose source changed before they ran.
func (b *Async) Violations() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.violations...)
}

// The methods below run the queued copies first: they are what follows a
// copy on a device's stream.

func (b *Async) Free(buf mla.Buffer) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.Free(buf)
}

func (b *Async) Write(dst mla.Buffer, off int, src []byte) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.Write(dst, off, src)
}

func (b *Async) Read(dst []byte, src mla.Buffer, off int) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.Read(dst, src, off)
}

func (b *Async) Fill(dst mla.Buffer, off, n int, v byte) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.Fill(dst, off, n, v)
}

func (b *Async) Synchronize(ctx context.Context) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.Synchronize(ctx)
}

func (b *Async) KVNormRopeStore(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.KVNormRopeStore(ctx, l, a)
}

func (b *Async) QNormRopeQuant(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.QNormRopeQuant(ctx, l, a)
}

func (b *Async) CompressStep(ctx context.Context, a *mla.CompressStepArgs) error {
	if err := b.flush(); err != nil {
		return err
	}
	return b.AsyncInner.CompressStep(ctx, a)
}

var _ mla.AsyncWriter = (*Async)(nil)
