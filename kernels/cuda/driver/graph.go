package driver

import (
	"errors"
	"fmt"
)

// Graph is a captured CUDA graph (CUgraph).
type Graph struct {
	c         *Context
	h         handle
	destroyed bool
}

// GraphExec is an instantiated, launchable graph (CUgraphExec).
type GraphExec struct {
	c         *Context
	h         handle
	destroyed bool
}

// captureModeGlobal is CU_STREAM_CAPTURE_MODE_GLOBAL: while any capture is
// active, unsafe calls (cuMemAlloc, synchronous copies) fail instead of
// silently breaking the capture. All calls of a Context come from its owner
// thread, so the stricter global mode costs nothing.
const captureModeGlobal = 0

// BeginCapture starts recording the work enqueued on s into a graph instead
// of running it. s must be a stream from NewStream (the legacy default stream
// cannot be captured).
func (c *Context) BeginCapture(s *Stream) error {
	if s == nil {
		return errors.New("BeginCapture: stream is nil; the legacy default stream cannot be captured")
	}
	return c.Do(func() error {
		return c.api.check("cuStreamBeginCapture_v2", c.api.cuBeginCapture(s.h, captureModeGlobal))
	})
}

// EndCapture stops the capture on s and returns the recorded graph. If an
// operation during capture failed, the capture is invalidated and the error
// says so (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
func (c *Context) EndCapture(s *Stream) (*Graph, error) {
	if s == nil {
		return nil, errors.New("EndCapture: stream is nil")
	}
	g := &Graph{c: c}
	err := c.Do(func() error { return c.api.check("cuStreamEndCapture", c.api.cuEndCapture(s.h, &g.h)) })
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Instantiate turns a graph into an executable graph.
func (c *Context) Instantiate(g *Graph) (*GraphExec, error) {
	if g == nil {
		return nil, errors.New("Instantiate: graph is nil")
	}
	e := &GraphExec{c: c}
	err := c.Do(func() error {
		if g.destroyed {
			return errors.New("Instantiate: graph is destroyed")
		}
		return c.api.check("cuGraphInstantiateWithFlags", c.api.cuGraphInstantiate(&e.h, g.h, 0))
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// GraphLaunch enqueues one replay of e on s.
func (c *Context) GraphLaunch(e *GraphExec, s *Stream) error {
	if e == nil {
		return errors.New("GraphLaunch: graph exec is nil")
	}
	return c.Do(func() error {
		if e.destroyed {
			return errors.New("GraphLaunch: graph exec is destroyed")
		}
		return c.api.check("cuGraphLaunch", c.api.cuGraphLaunch(e.h, s.raw()))
	})
}

// Destroy releases the graph (instantiated copies stay valid); a second
// Destroy is a no-op.
func (g *Graph) Destroy() error {
	return g.c.Do(func() error {
		if g.destroyed {
			return nil
		}
		g.destroyed = true
		return g.c.api.check("cuGraphDestroy", g.c.api.cuGraphDestroy(g.h))
	})
}

// Destroy releases the executable graph; a second Destroy is a no-op.
func (e *GraphExec) Destroy() error {
	return e.c.Do(func() error {
		if e.destroyed {
			return nil
		}
		e.destroyed = true
		return e.c.api.check("cuGraphExecDestroy", e.c.api.cuGraphExecDestroy(e.h))
	})
}

// Capture records the work f enqueues on s into a graph. The capture always
// ends, also when f fails or panics, so a failed capture never leaves s (and,
// in global capture mode, every synchronous call) unusable; on failure the
// partial graph is discarded and f's error returned.
func (c *Context) Capture(s *Stream, f func() error) (*Graph, error) {
	if err := c.BeginCapture(s); err != nil {
		return nil, err
	}
	ended := false
	defer func() {
		if !ended { // f panicked
			if g, err := c.EndCapture(s); err == nil {
				g.Destroy()
			}
		}
	}()
	fErr := f()
	ended = true
	g, err := c.EndCapture(s)
	if fErr != nil {
		if err == nil {
			g.Destroy()
		}
		return nil, fmt.Errorf("capture: %w", fErr)
	}
	return g, err
}
