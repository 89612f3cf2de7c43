package driver

// currentGoroutine identifies the calling goroutine: the address of its
// runtime descriptor where the architecture has an assembly reader for it
// (goroutine_amd64.s, goroutine_arm64.s; a few instructions), else the id
// of the OS thread it runs on (a system call), which identifies the owner
// just as well because the owner is locked to its thread. Either way the
// value is only compared, never dereferenced. A descriptor (or thread id)
// may be reused once the owner has exited, which is why callers check
// Context.closed after a match.
func currentGoroutine() uintptr { return goroutineID() }
