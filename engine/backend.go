package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
)

// Options is what a registered backend is opened with.
type Options = mla.OpenOptions

// EventTimer is implemented by backends that can measure the device time of
// the work f issues (CUDA events around f).
type EventTimer interface {
	Time(ctx context.Context, f func() error) (time.Duration, error)
}

// Backend names the engine resolves itself.
const (
	BackendAuto = mla.BackendAuto // the first registered backend that is available, else cpu
	BackendCPU  = mla.BackendCPU  // the pure-Go reference backend, always available
)

// RegisterBackend is mla.Register, for callers that hold functions rather
// than a Registration.
func RegisterBackend(name string, open func(Options) (mla.Backend, error), available func() error) {
	mla.Register(mla.Registration{Name: name, Open: open, Available: available})
}

// Backends lists the selectable backend names: auto, cpu and every
// registered one.
func Backends() []string {
	names := []string{BackendAuto, BackendCPU}
	for _, r := range mla.Registered() {
		names = append(names, r.Name)
	}
	return names
}

// openBackend resolves a backend name. An explicitly named backend that is
// not linked in or cannot run here is an error that says why; auto falls
// back to cpu only when no registered backend is available.
func openBackend(name string, opts Options, cpuWorkers int) (mla.Backend, error) {
	regs := mla.Registered()
	switch name {
	case "", BackendAuto:
		var why []string
		for _, r := range regs {
			if err := r.Available(); err != nil {
				why = append(why, fmt.Sprintf("%s: %v", r.Name, err))
				continue
			}
			b, err := r.Open(opts)
			if err != nil {
				return nil, fmt.Errorf("engine: backend auto: %s is available but failed to open (use backend cpu to run without it): %w", r.Name, err)
			}
			opts.Logger.Info().Str("backend", r.Name).Msg("auto picked an accelerator backend")
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
		if r.Name != name {
			continue
		}
		if err := r.Available(); err != nil {
			return nil, fmt.Errorf("engine: Config.Backend %q is unavailable on this machine: %w", name, err)
		}
		b, err := r.Open(opts)
		if err != nil {
			return nil, fmt.Errorf("engine: Config.Backend %q: %w", name, err)
		}
		return b, nil
	}
	msg := fmt.Sprintf("engine: Config.Backend %q is not registered in this program (selectable: %s)", name, strings.Join(Backends(), ", "))
	if name == "cuda" {
		msg += `; the CUDA backend registers itself when linked in: import _ "github.com/dsv4mla/prologue/attention/mla/cuda"`
	}
	return nil, errors.New(msg)
}
