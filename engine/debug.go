package engine

// Debug is the engine's debug view: the inspection methods that replay,
// verification and tests use (host copies of the pools, the compressor's
// states and weights, the page bookkeeping, the invariants, the launch
// census), kept off Engine so that its methods are what a server embeds.
// A server's attention reads the engine's buffers in place, through
// Engine.Handoff. Its methods may be called from any goroutine, like
// Engine's read-only ones, unless a method says otherwise.
type Debug struct{ e *Engine }

// Debug returns the engine's debug view.
func (e *Engine) Debug() Debug { return Debug{e} }

// IterationDebug is an iteration's debug view: host copies of its
// buffers (ReadQ, ReadChain, ...), the chain's steps one at a time
// (RunStage, WriteChain, for a verifier) and what it issued. Like
// Iteration's, its methods are called from the goroutine that called
// Begin.
type IterationDebug struct{ it *Iteration }

// Debug returns the iteration's debug view.
func (it *Iteration) Debug() IterationDebug { return IterationDebug{it} }
