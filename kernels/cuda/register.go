package cuda

import (
	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/engine"
)

// Linking this package in (import _ ".../kernels/cuda") makes "cuda"
// selectable in engine.Config.Backend, and the first choice of "auto", in the
// way database/sql drivers register themselves.
func init() {
	engine.RegisterBackend("cuda", func(o engine.Options) (mla.Backend, error) {
		b, err := New(Options{Device: o.Device, Logger: o.Logger, PDL: true})
		if err != nil {
			return nil, err // not a typed nil inside the interface
		}
		return b, nil
	}, Available)
}
