package cpu

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
)

// Compress runs a compressed layer's compressor work (package compressor)
// and stores each entry in place in the pool's host memory.
func (*Backend) Compress(ctx context.Context, a *mla.CompressArgs) (int, error) {
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(a.PageSize)
	hb, ok := a.Pool.(*Buffer)
	if !ok {
		return 0, fmt.Errorf("cpu: compress: pool of type %T is not a CPU buffer", a.Pool)
	}
	pool := hb.b
	return a.Run(ctx, func(e *compressor.Entry, page int32, off int) error {
		base := int(page) * pageBytes
		e.Store(pool[base:base+pageBytes], a.PageSize, off)
		return nil
	})
}
