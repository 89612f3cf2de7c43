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
		return New(Options{Device: o.Device, Logger: o.Logger, PDL: true})
	}, Available)
}
