// Package bytediff finds where two byte slices first differ: the one
// comparison the engine's kept-row check, cmd/bench's device checks and
// the tests that compare device bytes with a reference share.
package bytediff
