package driver

import "errors"

// Stream is a CUDA stream. A nil *Stream means the legacy default stream
// (handle 0) wherever a stream is accepted.
type Stream struct {
	c         *Context
	h         handle
	destroyed bool
}

// raw is the CUstream handle; 0 (the legacy default stream) for nil.
func (s *Stream) raw() handle {
	if s == nil {
		return 0
	}
	return s.h
}

// streamNonBlocking is CU_STREAM_NON_BLOCKING: no implicit ordering with the
// legacy default stream, which is also what graph capture requires.
const streamNonBlocking = 0x1

// NewStream creates a non-blocking stream.
func (c *Context) NewStream() (*Stream, error) {
	s := &Stream{c: c}
	err := c.Do(func() error { return c.api.check("cuStreamCreate", c.api.cuStreamCreate(&s.h, streamNonBlocking)) })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// StreamSynchronize waits until all work queued on s (nil: the legacy
// default stream) has finished.
func (c *Context) StreamSynchronize(s *Stream) error {
	return c.Do(func() error { return c.api.check("cuStreamSynchronize", c.api.cuStreamSync(s.raw())) })
}

// Synchronize waits until all work queued on s has finished.
func (s *Stream) Synchronize() error { return s.c.StreamSynchronize(s) }

// WaitEvent makes future work on s wait for the work recorded in e.
func (s *Stream) WaitEvent(e *Event) error {
	if e == nil {
		return errors.New("Stream.WaitEvent: event is nil")
	}
	return s.c.Do(func() error {
		return s.c.api.check("cuStreamWaitEvent", s.c.api.cuStreamWaitEvent(s.h, e.h, 0))
	})
}

// Destroy releases the stream once its queued work completes; a second
// Destroy is a no-op.
func (s *Stream) Destroy() error {
	return s.c.Do(func() error {
		if s.destroyed {
			return nil
		}
		s.destroyed = true
		return s.c.api.check("cuStreamDestroy_v2", s.c.api.cuStreamDestroy(s.h))
	})
}

// Event is a CUDA event, used for timing and cross-stream ordering.
type Event struct {
	c         *Context
	h         handle
	destroyed bool
}

// eventDisableTiming is CU_EVENT_DISABLE_TIMING.
const eventDisableTiming = 0x2

// NewEvent creates an event; with timing false it is cheaper but ElapsedMs
// refuses it.
func (c *Context) NewEvent(timing bool) (*Event, error) {
	flags := uint32(0)
	if !timing {
		flags = eventDisableTiming
	}
	e := &Event{c: c}
	err := c.Do(func() error { return c.api.check("cuEventCreate", c.api.cuEventCreate(&e.h, flags)) })
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Record captures the work queued so far on s (nil: legacy default stream).
func (e *Event) Record(s *Stream) error {
	return e.c.Do(func() error { return e.c.api.check("cuEventRecord", e.c.api.cuEventRecord(e.h, s.raw())) })
}

// Synchronize waits until the recorded work has finished.
func (e *Event) Synchronize() error {
	return e.c.Do(func() error { return e.c.api.check("cuEventSynchronize", e.c.api.cuEventSync(e.h)) })
}

// Destroy releases the event; a second Destroy is a no-op.
func (e *Event) Destroy() error {
	return e.c.Do(func() error {
		if e.destroyed {
			return nil
		}
		e.destroyed = true
		return e.c.api.check("cuEventDestroy_v2", e.c.api.cuEventDestroy(e.h))
	})
}

// ElapsedMs is the time in milliseconds between two recorded, completed
// timing events (resolution about 0.5 microseconds).
func (c *Context) ElapsedMs(start, end *Event) (float32, error) {
	if start == nil || end == nil {
		return 0, errors.New("ElapsedMs: start and end events must both be non-nil")
	}
	var ms float32
	err := c.Do(func() error {
		return c.api.check(c.api.elapsedName, c.api.cuEventElapsed(&ms, start.h, end.h))
	})
	return ms, err
}
