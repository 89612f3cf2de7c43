package driver

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// binding ties a Go function variable to the first exported symbol of a
// library found among names.
type binding struct {
	fptr     any      // pointer to a func variable, as purego.RegisterFunc takes
	sym      *uintptr // or the raw symbol address, for calls through purego.SyscallN
	names    []string // exported symbols to try, preferred first
	optional bool     // a missing optional symbol leaves the variable nil
	bound    *string  // if non-nil, receives the symbol that was found
}

// bindAll resolves every binding against handle. It fails on the first
// required symbol that the library does not export, naming it.
func bindAll(handle uintptr, library string, bindings []binding) error {
	for _, b := range bindings {
		found := ""
		for _, name := range b.names {
			sym, err := purego.Dlsym(handle, name)
			if err == nil && sym != 0 {
				if b.sym != nil {
					*b.sym = sym
				} else {
					purego.RegisterFunc(b.fptr, sym)
				}
				found = name
				break
			}
		}
		if found == "" && !b.optional {
			return fmt.Errorf("%s does not export %s", library, strings.Join(b.names, " or "))
		}
		if b.bound != nil {
			*b.bound = found
		}
	}
	return nil
}

// openFirst dlopens the first loadable candidate. Its error lists every
// candidate with the loader's reason, which is what a user needs to fix a
// missing or mismatched library.
func openFirst(what string, candidates []string) (handle uintptr, path string, err error) {
	var reasons []string
	for _, c := range candidates {
		// dlerror's message is per OS thread: purego reads it in a second
		// call after dlopen, so the goroutine must not move between them
		// (CI once saw an empty reason). Locks nest, so the owner
		// goroutine stays locked.
		runtime.LockOSThread()
		h, err := purego.Dlopen(c, purego.RTLD_NOW|purego.RTLD_LOCAL)
		runtime.UnlockOSThread()
		if err == nil {
			return h, c, nil
		}
		reason := err.Error()
		if !strings.Contains(reason, c) {
			reason = c + ": " + reason
		}
		reasons = append(reasons, reason)
	}
	if len(candidates) == 0 {
		return 0, "", fmt.Errorf("load %s: no candidate paths", what)
	}
	return 0, "", fmt.Errorf("load %s: none of %d candidates loaded: %s", what, len(candidates), strings.Join(reasons, "; "))
}

// goString copies a NUL-terminated C string that the library owns (static
// error strings) into Go memory.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cStrings makes NUL-terminated copies of ss and the array of pointers to
// them (a C "const char* const*"). The caller pins every element before
// handing the array to C.
func cStrings(ss []string) (bufs [][]byte, ptrs []*byte) {
	bufs = make([][]byte, len(ss))
	ptrs = make([]*byte, len(ss))
	for i, s := range ss {
		bufs[i] = append([]byte(s), 0)
		ptrs[i] = &bufs[i][0]
	}
	return bufs, ptrs
}
