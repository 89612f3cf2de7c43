// Package race says whether the binary was built with the race detector, so
// that a test can run its long or big-dimension cases once, in the non-race
// run, and a shorter pass under -race: the detector finds races in the
// goroutines a run starts, not in how many iterations or how wide a shape
// it takes, and it slows the arithmetic of those cases tenfold. .ci/run runs
// the full cases in a step without -race (see the README).
//
// Read and Write let a hot loop (//go:norace) or a clear, which the
// detector does not instrument, stay checked: the caller reports the whole
// slice read or written, one range check instead of one per element.
package race
