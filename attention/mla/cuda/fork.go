package cuda

import (
	"context"
	"errors"
	"fmt"

	"github.com/dsv4mla/prologue/kernels/cuda/abi"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The chain's second stream (mla.KVForker): the KV prologue runs on the
// side stream, ordered after the fused A GEMM on the main stream by the
// forked event, and the main stream waits for it through the joined event
// before anything that must follow it (the end of the layer). Recording an
// event on a capturing stream and waiting for it on another is how a CUDA
// graph capture forks and joins, so the same calls build a graph with two
// branches.
type sideStream struct {
	stream         *driver.Stream
	forked, joined *driver.Event
}

func (s *sideStream) init(c *driver.Context) error {
	var err error
	if s.stream, err = c.NewStream(); err != nil {
		return err
	}
	if s.forked, err = c.NewEvent(false); err != nil {
		return err
	}
	s.joined, err = c.NewEvent(false)
	return err
}

func (s *sideStream) close() error {
	var errs []error
	if s.stream != nil {
		errs = append(errs, s.stream.Synchronize(), s.stream.Destroy())
	}
	if s.forked != nil {
		errs = append(errs, s.forked.Destroy())
	}
	if s.joined != nil {
		errs = append(errs, s.joined.Destroy())
	}
	return errors.Join(errs...)
}

// streamSlot is the index of the stream launches go to now among the
// per-stream resources (the GEMMs' split-K workspaces): 0 for the main
// stream, 1 for the side stream (inside Side).
func (b *Backend) streamSlot() int {
	if b.fork.stream != nil && b.stream == b.fork.stream {
		return 1
	}
	return 0
}

// syncAll waits for the work of both streams, in one hand-over to the
// driver thread (End waits here on every iteration).
func (b *Backend) syncAll() error {
	return b.ctx.Do(func() error {
		if b.fork.stream != nil {
			if err := b.fork.stream.Synchronize(); err != nil {
				return err
			}
		}
		return b.syncStream(b.main)
	})
}

// ForkKV implements mla.KVForker: the side stream waits for the work issued
// so far on the main stream, then runs the KV kernel of every launch. The
// kernels go out without programmatic dependent launch: the first kernel on
// the side stream follows an event wait, not a kernel it could overlap.
func (b *Backend) ForkKV(ctx context.Context, launches []mla.Launch, a *mla.LayerArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Refused before anything is recorded on either stream.
	if _, err := abi.KVKernel(a.CacheConfig.Format, abi.Streaming); err != nil {
		return err
	}
	s := &b.fork
	return b.ctx.Do(func() error {
		if err := s.forked.Record(b.stream); err != nil {
			return fmt.Errorf("cuda: fork: %w", err)
		}
		if err := s.stream.WaitEvent(s.forked); err != nil {
			return fmt.Errorf("cuda: fork: %w", err)
		}
		for _, l := range launches {
			fn, grid, block, p, err := b.kvLaunch(l, a)
			if err != nil {
				return err
			}
			if err := b.ctx.Launch(fn, grid, block, 0, s.stream, p); err != nil {
				return fmt.Errorf("cuda: side-stream KV %v launch: %w", l, err)
			}
		}
		if err := s.joined.Record(s.stream); err != nil {
			return fmt.Errorf("cuda: fork: recording the join event: %w", err)
		}
		return nil
	})
}

// JoinKV implements mla.KVForker: later work on the main stream waits for
// the side stream's KV kernels.
func (b *Backend) JoinKV(ctx context.Context) error {
	return b.ctx.Do(func() error {
		if err := b.stream.WaitEvent(b.fork.joined); err != nil {
			return fmt.Errorf("cuda: join: %w", err)
		}
		return nil
	})
}

var _ mla.KVForker = (*Backend)(nil)
