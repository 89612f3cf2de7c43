//go:build !invariants

package kvcache

// invariantsEnabled is off in ordinary builds: the check is O(pages).
const invariantsEnabled = false
