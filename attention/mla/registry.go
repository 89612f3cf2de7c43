package mla

import (
	"fmt"
	"slices"
	"sync"

	"github.com/rs/zerolog"
)

// OpenOptions is what a registered backend is opened with.
type OpenOptions struct {
	Device int // accelerator ordinal
	Logger zerolog.Logger
}

// Registration is one backend that can be selected by name.
type Registration struct {
	Name string
	// Open opens the backend on OpenOptions.Device.
	Open func(OpenOptions) (Backend, error)
	// Available reports why the backend cannot run on this machine (nil
	// when it can).
	Available func() error
}

// Reserved backend names, resolved by whoever selects a backend (the
// engine): they cannot be registered.
const (
	BackendAuto = "auto" // the first registered backend that is available, else cpu
	BackendCPU  = "cpu"  // the pure-Go reference backend, always available
)

var registry struct {
	mu   sync.Mutex
	regs []Registration // registration order is the order auto tries them in
}

// Register makes a backend selectable by name. Accelerator backends call it
// from an init function (attention/mla/cuda registers "cuda"), so a program
// links one in with a blank import, the way database/sql drivers register;
// the backends need not import the engine that selects them.
//
// It panics on an empty or reserved name ("auto", "cpu"), a duplicate name
// or a nil function: those are programming errors found at init time.
func Register(r Registration) {
	if r.Name == "" || r.Name == BackendAuto || r.Name == BackendCPU {
		panic(fmt.Sprintf("mla: Register(%q): the name is empty or reserved", r.Name))
	}
	if r.Open == nil || r.Available == nil {
		panic(fmt.Sprintf("mla: Register(%q): Open and Available must not be nil", r.Name))
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, x := range registry.regs {
		if x.Name == r.Name {
			panic(fmt.Sprintf("mla: Register(%q) called twice", r.Name))
		}
	}
	registry.regs = append(registry.regs, r)
}

// Registered lists the registered backends in registration order.
func Registered() []Registration {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return slices.Clone(registry.regs)
}
