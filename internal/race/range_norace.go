//go:build !race

package race

// Read tells the race detector that the calling goroutine read every
// element of s, as one range check instead of one per element.
func Read[T any](s []T) {}

// Write tells the race detector that the calling goroutine wrote every
// element of s, as one range check.
func Write[T any](s []T) {}
