package cuda

import (
	"context"
	"errors"
	"fmt"

	"github.com/dsv4mla/prologue/internal/cudatune"
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

// auxStream is the third stream (mla.AuxRunner): forked from the main
// stream like the side stream, joined by JoinKV; mark is the side stream's
// event AwaitSide waits for. pending and marked say whether the third
// stream's join event and the mark were recorded since the last JoinKV: a
// capture may wait only for events recorded inside it.
type auxStream struct {
	sideStream
	mark            *driver.Event
	pending, marked bool
}

func (s *auxStream) init(c *driver.Context) error {
	if err := s.sideStream.init(c); err != nil {
		return err
	}
	var err error
	s.mark, err = c.NewEvent(false)
	return err
}

func (s *auxStream) close() error {
	errs := []error{s.sideStream.close()}
	if s.mark != nil {
		errs = append(errs, s.mark.Destroy())
	}
	return errors.Join(errs...)
}

// streamSlot is the index of the stream launches go to now among the
// per-stream resources (the GEMMs' split-K workspaces, cuBLASLt's): 0 for
// the main stream, 1 for the side stream (inside Side), 2 for the third
// stream (inside Aux).
func (b *Backend) streamSlot() int {
	switch {
	case b.fork.stream != nil && b.stream == b.fork.stream:
		return 1
	case b.aux.stream != nil && b.stream == b.aux.stream:
		return 2
	}
	return 0
}

// streamSlots is how many streams have their own GEMM workspaces.
const streamSlots = 3

// syncAll waits for the work of both streams, in one hand-over to the
// driver thread (End waits here on every iteration).
func (b *Backend) syncAll() error {
	return b.ctx.Do(func() error {
		for _, s := range []*driver.Stream{b.fork.stream, b.aux.stream} {
			if s != nil {
				if err := s.Synchronize(); err != nil {
					return err
				}
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
// the side stream's KV kernels, and for the third stream's work issued
// since the last join (Aux).
func (b *Backend) JoinKV(ctx context.Context) error {
	a := &b.aux
	return b.ctx.Do(func() error {
		if err := b.stream.WaitEvent(b.fork.joined); err != nil {
			return fmt.Errorf("cuda: join: %w", err)
		}
		a.marked = false
		if !a.pending {
			return nil
		}
		a.pending = false
		if err := b.stream.WaitEvent(a.joined); err != nil {
			return fmt.Errorf("cuda: join of the third stream: %w", err)
		}
		return nil
	})
}

// AuxQuery implements mla.AuxRunner: cudatune.Knobs.IndexerStream.
func (b *Backend) AuxQuery() bool { return b.knobs.IndexerStream == cudatune.IndexerStreamAux }

// Aux implements mla.AuxRunner: the launches fn issues go to the third
// stream, after the work issued so far on the main stream; JoinKV makes
// later main-stream work wait for them. It has its own GEMM workspaces
// (streamSlot), so its GEMMs may run while the other streams' do.
func (b *Backend) Aux(ctx context.Context, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.stream != b.main {
		return errors.New("cuda: Aux inside Side or Aux: the third stream forks from the main stream")
	}
	a := &b.aux
	if err := b.ctx.Do(func() error {
		if err := a.forked.Record(b.stream); err != nil {
			return fmt.Errorf("cuda: third stream: %w", err)
		}
		if err := a.stream.WaitEvent(a.forked); err != nil {
			return fmt.Errorf("cuda: third stream: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	b.stream = a.stream
	err := fn()
	b.stream = b.main
	// Record the join even after a failure: a capture must end joined.
	if jerr := b.ctx.Do(func() error { return a.joined.Record(a.stream) }); jerr != nil {
		if err == nil {
			err = fmt.Errorf("cuda: third stream: recording the join event: %w", jerr)
		}
	} else {
		a.pending = true
	}
	return err
}

// MarkSide implements mla.AuxRunner: the mark is recorded on the side
// stream, after the work issued there so far.
func (b *Backend) MarkSide(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	a := &b.aux
	return b.ctx.Do(func() error {
		if err := a.mark.Record(b.fork.stream); err != nil {
			return fmt.Errorf("cuda: side-stream mark: %w", err)
		}
		a.marked = true
		return nil
	})
}

// AwaitSide implements mla.AuxRunner.
func (b *Backend) AwaitSide(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	a := &b.aux
	if !a.marked {
		return mla.ErrNoSideMark
	}
	return b.ctx.Do(func() error {
		if err := b.stream.WaitEvent(a.mark); err != nil {
			return fmt.Errorf("cuda: waiting for the side-stream mark: %w", err)
		}
		return nil
	})
}

var (
	_ mla.KVForker  = (*Backend)(nil)
	_ mla.AuxRunner = (*Backend)(nil)
)
