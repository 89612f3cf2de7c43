package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
)

// Options is what a registered backend is opened with.
type Options struct {
	Device int // accelerator ordinal
	Logger zerolog.Logger
}

// EventTimer is implemented by backends that can measure the device time of
// the work f issues (CUDA events around f).
type EventTimer interface {
	Time(ctx context.Context, f func() error) (time.Duration, error)
}

// Backend names the engine resolves itself.
const (
	BackendAuto = "auto" // the first registered backend that is available, else cpu
	BackendCPU  = "cpu"  // the pure-Go reference backend, always available
)

type registration struct {
	name      string
	open      func(Options) (mla.Backend, error)
	available func() error
}

var registry struct {
	mu   sync.Mutex
	regs []registration // registration order is the order auto tries them in
}

// RegisterBackend makes a backend selectable by name. Accelerator backends
// call it from an init function (kernels/cuda registers "cuda"), so a
// program links one in with a blank import. available reports why the
// backend cannot run on this machine (nil when it can); auto tries the
// registered backends in registration order and falls back to cpu.
//
// It panics on an empty or reserved name ("auto", "cpu"), a duplicate name
// or a nil function: those are programming errors found at init time.
func RegisterBackend(name string, open func(Options) (mla.Backend, error), available func() error) {
	if name == "" || name == BackendAuto || name == BackendCPU {
		panic(fmt.Sprintf("engine: RegisterBackend(%q): the name is empty or reserved", name))
	}
	if open == nil || available == nil {
		panic(fmt.Sprintf("engine: RegisterBackend(%q): open and available must not be nil", name))
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for _, r := range registry.regs {
		if r.name == name {
			panic(fmt.Sprintf("engine: RegisterBackend(%q) called twice", name))
		}
	}
	registry.regs = append(registry.regs, registration{name: name, open: open, available: available})
}

// Backends lists the selectable backend names: auto, cpu and every
// registered one.
func Backends() []string {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	names := []string{BackendAuto, BackendCPU}
	for _, r := range registry.regs {
		names = append(names, r.name)
	}
	return names
}

func registered() []registration {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return slices.Clone(registry.regs)
}

// openBackend resolves a backend name. An explicitly named backend that is
// not linked in or cannot run here is an error that says why; auto falls
// back to cpu only when no registered backend is available.
func openBackend(name string, opts Options, cpuWorkers int) (mla.Backend, error) {
	regs := registered()
	switch name {
	case "", BackendAuto:
		var why []string
		for _, r := range regs {
			if err := r.available(); err != nil {
				why = append(why, fmt.Sprintf("%s: %v", r.name, err))
				continue
			}
			b, err := r.open(opts)
			if err != nil {
				return nil, fmt.Errorf("engine: backend auto: %s is available but failed to open (use backend cpu to run without it): %w", r.name, err)
			}
			opts.Logger.Info().Str("backend", r.name).Msg("auto picked an accelerator backend")
			return b, nil
		}
		ev := opts.Logger.Info().Str("backend", BackendCPU)
		if len(why) == 0 {
			ev.Msg("auto: no accelerator backend is registered in this program; using cpu")
		} else {
			ev.Strs("unavailable", why).Msg("auto: no accelerator backend is available; using cpu")
		}
		return cpu.New(cpuWorkers), nil
	case BackendCPU:
		return cpu.New(cpuWorkers), nil
	}
	for _, r := range regs {
		if r.name != name {
			continue
		}
		if err := r.available(); err != nil {
			return nil, fmt.Errorf("engine: Config.Backend %q is unavailable on this machine: %w", name, err)
		}
		b, err := r.open(opts)
		if err != nil {
			return nil, fmt.Errorf("engine: Config.Backend %q: %w", name, err)
		}
		return b, nil
	}
	msg := fmt.Sprintf("engine: Config.Backend %q is not registered in this program (selectable: %s)", name, strings.Join(Backends(), ", "))
	if name == "cuda" {
		msg += `; the CUDA backend registers itself when linked in: import _ "github.com/dsv4mla/prologue/kernels/cuda"`
	}
	return nil, errors.New(msg)
}
