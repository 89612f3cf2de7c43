package driver

import (
	"fmt"
	"runtime"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr: unsigned long long on LP64).
// Pass it to Launch as a kernel pointer argument.
type DevicePtr uint64

// Scalar is the element types whose slices AsBytes can view as bytes: fixed
// size, no pointers.
type Scalar interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// AsBytes views s as its raw little-endian bytes without copying, for HtoD
// and DtoH of typed host data.
func AsBytes[T Scalar](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(zero)))
}

func checkSize(what string, n int) error {
	if n < 0 {
		return fmt.Errorf("%s: byte count %d is negative", what, n)
	}
	return nil
}

// Alloc allocates n bytes of device memory (cuMemAlloc_v2; 256-byte aligned).
func (c *Context) Alloc(n int) (DevicePtr, error) {
	if err := checkSize("Alloc", n); err != nil {
		return 0, err
	}
	var p DevicePtr
	err := c.Do(func() error { return c.api.check("cuMemAlloc_v2", c.api.cuMemAlloc(&p, uint64(n))) })
	return p, err
}

// Free releases memory from Alloc. Freeing 0 is a no-op.
func (c *Context) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	return c.Do(func() error { return c.api.check("cuMemFree_v2", c.api.cuMemFree(p)) })
}

// HtoD copies src to device address dst on the legacy default stream. It
// returns once src may be reused; the device side may still be in flight (see
// the package doc on streams).
func (c *Context) HtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return c.Do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&src[0])
		return c.api.check("cuMemcpyHtoD_v2", c.api.cuMemcpyHtoD(dst, unsafe.Pointer(&src[0]), uint64(len(src))))
	})
}

// DtoH copies len(dst) bytes from device address src into dst after the
// legacy default stream's earlier work, and returns when dst holds them.
func (c *Context) DtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.Do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&dst[0])
		return c.api.check("cuMemcpyDtoH_v2", c.api.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), src, uint64(len(dst))))
	})
}

// DtoD copies n bytes between device addresses, ordered on the legacy
// default stream; it does not wait for the copy to finish.
func (c *Context) DtoD(dst, src DevicePtr, n int) error {
	if err := checkSize("DtoD", n); err != nil || n == 0 {
		return err
	}
	return c.Do(func() error { return c.api.check("cuMemcpyDtoD_v2", c.api.cuMemcpyDtoD(dst, src, uint64(n))) })
}

// Memset8 sets n bytes at dst to v, ordered on the legacy default stream; it
// does not wait for the device to finish.
func (c *Context) Memset8(dst DevicePtr, v byte, n int) error {
	if err := checkSize("Memset8", n); err != nil || n == 0 {
		return err
	}
	return c.Do(func() error { return c.api.check("cuMemsetD8_v2", c.api.cuMemsetD8(dst, v, uint64(n))) })
}

// HtoDAsync enqueues a host-to-device copy on s (nil: the legacy default
// stream). From Go (pageable) memory the driver stages the bytes before
// returning, so src may be reused at once; from a HostBuffer the copy is
// truly asynchronous and the buffer must stay untouched until s is
// synchronized. Only HostBuffer memory may be copied during graph capture.
func (c *Context) HtoDAsync(dst DevicePtr, src []byte, s *Stream) error {
	if len(src) == 0 {
		return nil
	}
	return c.Do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&src[0])
		return c.api.check("cuMemcpyHtoDAsync_v2",
			c.api.cuMemcpyHtoDAsync(dst, unsafe.Pointer(&src[0]), uint64(len(src)), s.raw()))
	})
}

// DtoHAsync enqueues a device-to-host copy on s. Into Go (pageable) memory the
// driver returns only once the bytes have landed; into a HostBuffer the copy
// is asynchronous and dst is valid after s is synchronized.
func (c *Context) DtoHAsync(dst []byte, src DevicePtr, s *Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return c.Do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&dst[0])
		return c.api.check("cuMemcpyDtoHAsync_v2",
			c.api.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), src, uint64(len(dst)), s.raw()))
	})
}

// DtoDAsync enqueues a device-to-device copy of n bytes on s.
func (c *Context) DtoDAsync(dst, src DevicePtr, n int, s *Stream) error {
	if err := checkSize("DtoDAsync", n); err != nil || n == 0 {
		return err
	}
	return c.Do(func() error {
		return c.api.check("cuMemcpyDtoDAsync_v2", c.api.cuMemcpyDtoDAsync(dst, src, uint64(n), s.raw()))
	})
}

// Memset8Async enqueues setting n bytes at dst to v on s.
func (c *Context) Memset8Async(dst DevicePtr, v byte, n int, s *Stream) error {
	if err := checkSize("Memset8Async", n); err != nil || n == 0 {
		return err
	}
	return c.Do(func() error {
		return c.api.check("cuMemsetD8Async", c.api.cuMemsetD8Async(dst, v, uint64(n), s.raw()))
	})
}

// HostBuffer is page-locked host memory from cuMemAllocHost: copies to and
// from it run asynchronously at full speed and can be captured into graphs.
// It lives outside the Go heap, so the garbage collector never moves or frees
// it; call Free.
type HostBuffer struct {
	c     *Context
	p     unsafe.Pointer
	n     int
	freed bool
}

// AllocHost allocates n bytes of page-locked host memory.
func (c *Context) AllocHost(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("AllocHost: byte count %d must be positive", n)
	}
	h := &HostBuffer{c: c, n: n}
	err := c.Do(func() error { return c.api.check("cuMemAllocHost_v2", c.api.cuMemAllocHost(&h.p, uint64(n))) })
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Bytes is the buffer's memory; nil after Free.
func (h *HostBuffer) Bytes() []byte {
	if h.freed {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.n)
}

// Free releases the buffer; a second Free is a no-op.
func (h *HostBuffer) Free() error {
	return h.c.Do(func() error {
		if h.freed {
			return nil
		}
		h.freed = true
		return h.c.api.check("cuMemFreeHost", h.c.api.cuMemFreeHost(h.p))
	})
}
