package driver

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// Module is a loaded CUBIN (cuModuleLoadData).
type Module struct {
	c        *Context
	h        handle
	unloaded bool
}

// elfMagic starts every CUBIN; checking it turns "not a cubin" into a clear
// error instead of CUDA_ERROR_INVALID_IMAGE.
var elfMagic = []byte("\x7fELF")

// LoadModule loads a CUBIN image into the context.
func (c *Context) LoadModule(cubin []byte) (*Module, error) {
	if !bytes.HasPrefix(cubin, elfMagic) {
		return nil, fmt.Errorf("LoadModule: image of %d bytes is not a CUBIN (no ELF header)", len(cubin))
	}
	m := &Module{c: c}
	err := c.Do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&cubin[0])
		return c.api.check("cuModuleLoadData", c.api.cuModuleLoadData(&m.h, unsafe.Pointer(&cubin[0])))
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Function looks up a kernel by its exported name; declare kernels
// `extern "C" __global__` so the name is not mangled.
func (m *Module) Function(name string) (*Function, error) {
	if name == "" {
		return nil, errors.New("Module.Function: kernel name is empty")
	}
	f := &Function{c: m.c, Name: name}
	cname := append([]byte(name), 0)
	err := m.c.Do(func() error {
		if m.unloaded {
			return fmt.Errorf("Module.Function(%q): module is unloaded", name)
		}
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&cname[0])
		if err := m.c.api.check("cuModuleGetFunction", m.c.api.cuModuleGetFunc(&f.h, m.h, &cname[0])); err != nil {
			return fmt.Errorf("kernel %q: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Unload releases the module; its Functions become invalid. A second Unload
// is a no-op.
func (m *Module) Unload() error {
	return m.c.Do(func() error {
		if m.unloaded {
			return nil
		}
		m.unloaded = true
		return m.c.api.check("cuModuleUnload", m.c.api.cuModuleUnload(m.h))
	})
}

// Function is a kernel in a loaded Module.
type Function struct {
	c    *Context
	h    handle
	Name string
}

// FuncAttribute is a CUfunction_attribute id (cuda.h).
type FuncAttribute int32

// Kernel attributes from cuda.h.
const (
	FuncMaxThreadsPerBlock        FuncAttribute = 0
	FuncSharedSizeBytes           FuncAttribute = 1 // static shared memory
	FuncConstSizeBytes            FuncAttribute = 2
	FuncLocalSizeBytes            FuncAttribute = 3 // per-thread local memory (spills)
	FuncNumRegs                   FuncAttribute = 4
	FuncPTXVersion                FuncAttribute = 5
	FuncBinaryVersion             FuncAttribute = 6
	FuncMaxDynamicSharedSizeBytes FuncAttribute = 8
	FuncPreferredSharedCarveout   FuncAttribute = 9 // percent of the unified L1/shared memory preferred as shared
	// The cluster attributes (compute capability 9.0).
	FuncClusterSizeMustBeSet  FuncAttribute = 10 // 1: the kernel must be launched with a cluster shape
	FuncRequiredClusterWidth  FuncAttribute = 11 // the required cluster shape, or 0 (not settable where __cluster_dims__ fixed it)
	FuncRequiredClusterHeight FuncAttribute = 12
	FuncRequiredClusterDepth  FuncAttribute = 13
	// FuncNonPortableClusterSizeAllowed set to 1 lets the function launch
	// with more than 8 blocks a cluster (LaunchOptions.Cluster).
	FuncNonPortableClusterSizeAllowed FuncAttribute = 14
)

// Attribute reads a kernel attribute.
func (f *Function) Attribute(attr FuncAttribute) (int, error) {
	var v int32
	err := f.c.Do(func() error {
		return f.c.api.check("cuFuncGetAttribute", f.c.api.cuFuncGetAttr(&v, int32(attr), f.h))
	})
	return int(v), err
}

// SetAttribute sets a kernel attribute, e.g. FuncMaxDynamicSharedSizeBytes
// before launching with more than 48 KiB of dynamic shared memory.
func (f *Function) SetAttribute(attr FuncAttribute, value int) error {
	return f.c.Do(func() error {
		return f.c.api.check("cuFuncSetAttribute", f.c.api.cuFuncSetAttr(f.h, int32(attr), int32(value)))
	})
}
