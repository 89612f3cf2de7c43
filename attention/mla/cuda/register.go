package cuda

import (
	"github.com/dsv4mla/prologue/attention/mla"
)

// Linking this package in (import _ ".../attention/mla/cuda") makes "cuda"
// selectable by name (engine.Config.Backend) and the first choice of "auto",
// in the way database/sql drivers register themselves.
func init() {
	mla.Register(mla.Registration{
		Name: "cuda",
		Open: func(o mla.OpenOptions) (mla.Backend, error) {
			b, err := New(Options{Device: o.Device, Logger: o.Logger})
			if err != nil {
				return nil, err // not a typed nil inside the interface
			}
			return b, nil
		},
		Available: Available,
	})
}
