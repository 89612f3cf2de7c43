//go:build !amd64 && !arm64

package driver

import "syscall"

func goroutineID() uintptr { return uintptr(syscall.Gettid()) }
