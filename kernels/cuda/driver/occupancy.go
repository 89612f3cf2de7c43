package driver

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrNoClusterOccupancy: the driver does not export
// cuOccupancyMaxActiveClusters (it needs a CUDA 12.0 driver).
var ErrNoClusterOccupancy = errors.New("cuda driver: cuOccupancyMaxActiveClusters is not exported (needs a CUDA 12 driver)")

// areaOccupancy is where the driver writes cuOccupancyMaxActiveClusters'
// count (an int), after the launch attributes and before kernelParams.
const areaOccupancy = areaAttrs + maxLaunchAttrs*int(unsafe.Sizeof(launchAttribute{}))

// The count fits before kernelParams.
var _ [areaParams - areaOccupancy - 4]struct{}

// MaxActiveClusters is the number of thread-block clusters of shape cluster
// (in blocks; every component at least 1) that can run on the device at
// once when fn is launched with block threads and sharedBytes of dynamic
// shared memory a block (cuOccupancyMaxActiveClusters). A grid of more
// clusters than that runs in more than one wave. The count is the driver's
// estimate from the function's resources; the driver does not promise that
// it is reached. It is 0 where one cluster does not fit at all.
//
// As for a launch, fn must be allowed its shared memory first: above 48 KiB
// a block, set FuncMaxDynamicSharedSizeBytes to at least sharedBytes, and
// for more than 8 blocks a cluster FuncNonPortableClusterSizeAllowed to 1;
// the driver otherwise reports an error (or 0 clusters). A cluster shape
// with a zero component is ErrClusterShape, and a driver without the
// symbol ErrNoClusterOccupancy, both before the hand-over. Called on the
// owner thread (inside Do) it allocates nothing.
func (c *Context) MaxActiveClusters(fn *Function, block Dim3, sharedBytes uint32, cluster Dim3) (int, error) {
	if fn == nil {
		return 0, errors.New("MaxActiveClusters: function is nil")
	}
	if err := validateDims("block", block); err != nil {
		return 0, fmt.Errorf("max active clusters of %s: %w", fn.Name, err)
	}
	for i, v := range cluster {
		if v == 0 {
			return 0, fmt.Errorf("max active clusters of %s: %w: cluster %v: cluster[%d] is 0 (every dimension at least 1)",
				fn.Name, ErrClusterShape, cluster, i)
		}
	}
	if c.api == nil || c.api.cuOccupancyMaxActiveClusters == 0 {
		return 0, ErrNoClusterOccupancy
	}
	if c.onOwner() {
		if c.closed.Load() {
			return 0, ErrClosed
		}
		return c.maxActiveClusters(fn, block, sharedBytes, cluster)
	}
	var n int
	err := c.Do(func() error {
		var err error
		n, err = c.maxActiveClusters(fn, block, sharedBytes, cluster)
		return err
	})
	return n, err
}

// maxActiveClusters runs the query on the owner. The CUlaunchConfig is a
// launch's, laid out in the launch area: its grid is the cluster itself
// (the driver wants a grid that is a multiple of the cluster, and the
// count does not depend on the grid), its stream the legacy one, so the
// driver takes the current context.
func (c *Context) maxActiveClusters(fn *Function, block Dim3, sharedBytes uint32, cluster Dim3) (int, error) {
	a := c.area
	cfg := a.config(cluster, block, sharedBytes, 0, LaunchOptions{Cluster: cluster})
	n := (*int32)(a.at(areaOccupancy))
	*n = -1
	if err := c.api.check("cuOccupancyMaxActiveClusters", c.api.maxActiveClusters(&a.call, n, fn.h, unsafe.Pointer(cfg))); err != nil {
		return 0, fmt.Errorf("max active clusters of %s (block %v, %d shared bytes, cluster %v): %w", fn.Name, block, sharedBytes, cluster, err)
	}
	return int(*n), nil
}
