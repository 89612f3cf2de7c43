package main

import (
	"context"
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// copyMax is the size of the copy buffers: 1 GiB each way.
const copyMax = 1 << 30

// measureCopy times a 1 GiB device-to-device copy both ways the device
// offers (cuMemcpyDtoD and a 16-byte streaming copy kernel), counting bytes
// read and written, and returns the faster: the ceiling every kernel is
// compared with.
func (d *device) measureCopy() (float64, error) {
	var err error
	if d.copySrc, err = d.be.Alloc(copyMax); err != nil {
		return 0, err
	}
	if d.copyDst, err = d.be.Alloc(copyMax); err != nil {
		return 0, err
	}
	var memcpy, kernel []float64
	// Ten copies back to back between two events, issued in one hand-over
	// to the driver thread so no host gap lands inside the timed span; the
	// first rounds warm the clocks up.
	const perRound = 10
	timeCopies := func(one func() error) (float64, error) {
		t, err := d.be.Time(context.Background(), func() error {
			return d.ctx.Do(func() error {
				for range perRound {
					if err := one(); err != nil {
						return err
					}
				}
				return nil
			})
		})
		return t.Seconds() / perRound, err
	}
	for i := range 8 {
		m, err := timeCopies(func() error {
			return d.ctx.DtoDAsync(d.copyDst.(*cuda.Buffer).Ptr(), d.copySrc.(*cuda.Buffer).Ptr(), copyMax, d.be.Stream())
		})
		if err != nil {
			return 0, err
		}
		k, err := timeCopies(func() error { return d.launchCopy(copyMax) })
		if err != nil {
			return 0, err
		}
		if i >= 3 {
			memcpy = append(memcpy, m)
			kernel = append(kernel, k)
		}
	}
	m, k := 2*copyMax/median(memcpy)/1e9, 2*copyMax/median(kernel)/1e9
	fmt.Printf("copy 1 GiB: cuMemcpyDtoD %.0f GB/s, copy kernel %.0f GB/s (read+write)\n", m, k)
	d.copyGBps = max(m, k)
	return d.copyGBps, nil
}

func (d *device) launchCopy(n int) error {
	return d.ctx.Launch(d.copy16, driver.Dim3{uint32(d.be.Props().SMCount * 8), 1, 1}, driver.Dim3{512, 1, 1}, 0, d.be.Stream(),
		d.copyDst.(*cuda.Buffer).Ptr(), d.copySrc.(*cuda.Buffer).Ptr(), uint64(n/16))
}

// sameSizeCopyUs times, like the kernels, a copy that moves the same bytes
// (half read, half written): the fixed cost of a launch and its first DRAM
// round trips weighs on small shapes too, and this shows how much.
func (d *device) sameSizeCopyUs(bytes int64) (float64, error) {
	n := int(min(bytes/2, copyMax)) &^ 15
	us, err := d.timeLaunch(func() error { return d.launchCopy(max(n, 16)) })
	if bytes/2 > copyMax { // past the copy buffers: scale the 1 GiB time
		us *= float64(bytes/2) / copyMax
	}
	return us, err
}

// stridedCopy times a copy with the KV kernel's read pattern (1 KiB of
// every fused row), L2-flushed like the kernels: the ceiling for reading
// the latent in place.
func (d *device) stridedCopy(md model) (StridedCopy, error) {
	const rows = 65536
	stride := uint64(md.QLora+512) * 2
	us, err := d.timeLaunch(func() error {
		return d.ctx.Launch(d.copyRows, driver.Dim3{uint32(d.be.Props().SMCount * 8), 1, 1}, driver.Dim3{512, 1, 1}, 0, d.be.Stream(),
			d.copyDst.(*cuda.Buffer).Ptr(), d.copySrc.(*cuda.Buffer).Ptr(), uint64(rows), stride)
	})
	if err != nil {
		return StridedCopy{}, err
	}
	gbps := float64(2*rows*1024) / us / 1e3
	fmt.Printf("strided copy %s: 1 KiB of every %d bytes, %d rows: %.1f us, %.0f GB/s (%.1f%% of copy)\n",
		md.Name, stride, rows, us, gbps, 100*gbps/d.copyGBps)
	return StridedCopy{Model: md.Name, Rows: rows, StrideBytes: int(stride), Us: us, GBps: gbps}, nil
}
