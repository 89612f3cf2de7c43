package main

import (
	_ "embed"
	"errors"
	"fmt"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"math"
	"slices"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

//go:embed fill.cu
var fillSource string

// device is one CUDA backend with the benchmark's own kernels (random
// fills, copies) and the buffers every measurement shares.
type device struct {
	be       *cuda.Backend
	ctx      *driver.Context
	fillBF16 *driver.Function
	fillF32  *driver.Function
	fillE4M3 *driver.Function
	copy16   *driver.Function
	copyRows *driver.Function
	chainRow *driver.Function
	flush    mla.Buffer // written before each timed launch to evict the L2
	copySrc  mla.Buffer
	copyDst  mla.Buffer
	reps     int
	seed     uint32 // advanced by every random fill
	copyGBps float64
	// contiguousLatent: see config.ContiguousLatent.
	contiguousLatent bool
}

// flushBytes is the memset that evicts the device's L2 (l2 bytes, as the
// driver reports it) before a cold launch: five times over, and 256 MiB at
// least (the H200's 50 MB L2 gets the 256 MiB every result was measured
// with).
func flushBytes(l2 int) int { return max(256<<20, 5*l2) }

func newDevice(opts cuda.Options, knobs cudatune.Knobs, reps int, contiguousLatent bool) (*device, error) {
	be, err := cuda.NewTuned(opts, knobs)
	if err != nil {
		return nil, err
	}
	d := &device{be: be, ctx: be.Context(), reps: reps, seed: 1, contiguousLatent: contiguousLatent}
	mod, err := d.ctx.CompileModule(fillSource, "fill.cu", driver.CompileOptions{})
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		fn   **driver.Function
		name string
	}{{&d.fillBF16, "fill_bf16"}, {&d.fillF32, "fill_f32"}, {&d.fillE4M3, "fill_e4m3"}, {&d.copy16, "copy16"}, {&d.copyRows, "copy_rows"}, {&d.chainRow, "chain_rows"}} {
		if *f.fn, err = mod.Function(f.name); err != nil {
			return nil, err
		}
	}
	if d.flush, err = be.Alloc(flushBytes(be.Props().L2Bytes)); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *device) grid() driver.Dim3 { return driver.Dim3{uint32(d.be.Props().SMCount * 16), 1, 1} }

// randBF16 allocates n random bf16 values whose magnitude varies per row
// of rowElems values.
func (d *device) randBF16(n int, rowElems int) (mla.Buffer, error) {
	buf, err := d.be.Alloc(2 * n)
	if err != nil {
		return nil, err
	}
	d.seed++
	return buf, d.ctx.Launch(d.fillBF16, d.grid(), driver.Dim3{256, 1, 1}, 0, d.be.Stream(),
		buf.(*cuda.Buffer).Ptr(), uint64(n), d.seed, uint32(rowElems))
}

// randF32 allocates n random float32 values in [lo, hi).
func (d *device) randF32(n int, lo, hi float32) (mla.Buffer, error) {
	buf, err := d.be.Alloc(4 * n)
	if err != nil {
		return nil, err
	}
	d.seed++
	return buf, d.ctx.Launch(d.fillF32, d.grid(), driver.Dim3{256, 1, 1}, 0, d.be.Stream(),
		buf.(*cuda.Buffer).Ptr(), uint64(n), d.seed, lo, hi)
}

// randE4M3 allocates n random e4m3 bytes of moderate magnitude (never NaN).
func (d *device) randE4M3(n int) (mla.Buffer, error) {
	buf, err := d.be.Alloc(n)
	if err != nil {
		return nil, err
	}
	d.seed++
	return buf, d.ctx.Launch(d.fillE4M3, d.grid(), driver.Dim3{256, 1, 1}, 0, d.be.Stream(),
		buf.(*cuda.Buffer).Ptr(), uint64(n), d.seed)
}

// safeDiv is a / b, or 0 when b is not positive: a ratio JSON can hold.
func safeDiv(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	return s[len(s)/2]
}

// timeGraph captures capture's launches in one CUDA graph and returns the
// median replay over reps (timeLaunchN), the graph closed after.
func (d *device) timeGraph(reps int, capture func() error) (float64, error) {
	g, err := d.be.Capture(capture)
	if err != nil {
		return 0, fmt.Errorf("capture: %w", err)
	}
	us, err := d.timeLaunchN(reps, g.Launch)
	return us, errors.Join(err, g.Close())
}

// timeLaunch returns the median device time in microseconds of launch
// over the device's repetitions (after three warm-up ones), each preceded
// by a memset that evicts the L2.
func (d *device) timeLaunch(launch func() error) (float64, error) {
	return d.timeLaunchN(d.reps, launch)
}

// timeLaunchN is timeLaunch with reps repetitions.
func (d *device) timeLaunchN(reps int, launch func() error) (float64, error) {
	n := reps + 3
	events := make([]*driver.Event, 2*n)
	for i := range events {
		e, err := d.ctx.NewEvent(true)
		if err != nil {
			return 0, err
		}
		defer e.Destroy()
		events[i] = e
	}
	s := d.be.Stream()
	flush := d.flush.(*cuda.Buffer)
	// One hand-over to the driver thread for every repetition, so no host
	// gap lands inside a timed span.
	err := d.ctx.Do(func() error {
		for i := range n {
			if err := d.ctx.Memset8Async(flush.Ptr(), byte(i), flush.Len(), s); err != nil {
				return err
			}
			if err := events[2*i].Record(s); err != nil {
				return err
			}
			if err := launch(); err != nil {
				return err
			}
			if err := events[2*i+1].Record(s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := s.Synchronize(); err != nil {
		return 0, err
	}
	var us []float64
	for i := 3; i < n; i++ {
		ms, err := d.ctx.ElapsedMs(events[2*i], events[2*i+1])
		if err != nil {
			return 0, err
		}
		us = append(us, float64(ms)*1000)
	}
	return median(us), nil
}
