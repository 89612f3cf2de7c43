//go:build invariants

package kvcache

// invariantsEnabled makes every mutation check the cache's invariants.
const invariantsEnabled = true
