//go:build race

package race

import (
	"runtime"
	"unsafe"
)

// Read tells the race detector that the calling goroutine read every
// element of s, as one range check instead of one per element.
func Read[T any](s []T) {
	if len(s) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(unsafe.SliceData(s)), len(s)*int(unsafe.Sizeof(s[0])))
	}
}

// Write tells the race detector that the calling goroutine wrote every
// element of s, as one range check.
func Write[T any](s []T) {
	if len(s) > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(unsafe.SliceData(s)), len(s)*int(unsafe.Sizeof(s[0])))
	}
}
