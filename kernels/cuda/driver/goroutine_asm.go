//go:build amd64 || arm64

package driver

// getg returns the runtime's descriptor of the calling goroutine (the g
// register or TLS slot), as an address.
func getg() uintptr

func goroutineID() uintptr { return getg() }
