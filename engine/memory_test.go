package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
)

// memCPU is the cpu backend saying it has free bytes.
type memCPU struct {
	*cpu.Backend
	free int64
}

func (b *memCPU) Name() string               { return "test-memory" }
func (b *memCPU) FreeMemory() (int64, error) { return b.free, nil }

// silentCPU is a backend that cannot say how much memory it has.
type silentCPU struct{ mla.Backend }

var (
	testMemFree atomic.Int64
	testMemOn   atomic.Bool // available only inside the test that uses it, so "auto" never picks it
)

func init() {
	gate := func() error {
		if testMemOn.Load() {
			return nil
		}
		return errors.New("test backend: switched off")
	}
	engine.RegisterBackend("test-memory", func(engine.Options) (mla.Backend, error) {
		return &memCPU{Backend: cpu.New(1), free: testMemFree.Load()}, nil
	}, gate)
	engine.RegisterBackend("test-silent", func(engine.Options) (mla.Backend, error) { return silentCPU{cpu.New(1)}, nil }, gate)
}

// TestMemoryLimitDefault: MemoryLimit 0 is what the backend says it has
// free (not a fixed 32 GiB): a configuration past it is refused naming
// where the limit came from, one within it gets it as its limit, and a
// backend that cannot say gets FallbackMemoryLimit. The cpu backend's is
// the host's available memory, known to Resolve already.
func TestMemoryLimitDefault(t *testing.T) {
	testMemOn.Store(true)
	defer testMemOn.Store(false)
	ctx := context.Background()
	cfg := smallConfig() // about 3.5 MiB
	fp, err := cfg.Footprint()
	require.NoError(t, err)

	cfg.Backend = "test-memory"
	testMemFree.Store(fp.Total() - 1)
	_, err = engine.New(ctx, cfg)
	require.ErrorIs(t, err, engine.ErrMemoryLimit)
	require.ErrorContains(t, err, "(0: the test-memory backend's free memory)")
	var ce *engine.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "MaxTokens", ce.Field)

	testMemFree.Store(fp.Total())
	e := newEngine(t, cfg)
	require.Equal(t, fp.Total(), e.Config().MemoryLimit)
	r, err := cfg.Resolve()
	require.NoError(t, err)
	require.Zero(t, r.MemoryLimit, "unknown before New opens the backend")

	cfg.Backend = "test-silent"
	e = newEngine(t, cfg)
	require.Equal(t, int64(engine.FallbackMemoryLimit), e.Config().MemoryLimit)

	cfg.Backend = engine.BackendCPU
	r, err = cfg.Resolve()
	require.NoError(t, err)
	host, err := cpu.AvailableMemory()
	if err != nil {
		require.Equal(t, int64(engine.FallbackMemoryLimit), r.MemoryLimit)
		return
	}
	require.Positive(t, r.MemoryLimit)
	require.InDelta(t, float64(host), float64(r.MemoryLimit), 1<<30, "the host's available memory")
	cfg.MemoryLimit = 5 << 20
	r, err = cfg.Resolve()
	require.NoError(t, err)
	require.Equal(t, int64(5<<20), r.MemoryLimit, "an explicit limit stays")
}
