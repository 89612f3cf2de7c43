// Package tests holds cross-package tests: the dispatch census (which
// launches each batch shape produces), the proof that a mixed batch writes
// exactly what its two phases write alone, and trace replay through the
// engine.
package tests
