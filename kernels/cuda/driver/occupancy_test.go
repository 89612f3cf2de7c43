package driver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMaxActiveClustersValidatesBeforeCallingTheDriver(t *testing.T) {
	// Contexts with no owner: each refusal comes before any hand-over (the
	// symbol's address is never called).
	withSym := &Context{api: &driverAPI{cuOccupancyMaxActiveClusters: 1}}
	withoutSym := &Context{api: &driverAPI{cuLaunchKernelEx: 1}}
	tests := []struct {
		name           string
		c              *Context
		nilFn          bool
		block, cluster Dim3
		want           error // nil: only the message is checked
		msg            string
	}{
		{"nil function", withSym, true, Dim3{32, 1, 1}, Dim3{2, 1, 1}, nil, "MaxActiveClusters: function is nil"},
		{"zero block", withSym, false, Dim3{32, 0, 1}, Dim3{2, 1, 1}, nil, "max active clusters of k: block[1] is 0"},
		{"zero cluster component", withSym, false, Dim3{32, 1, 1}, Dim3{2, 1, 0}, ErrClusterShape,
			"max active clusters of k: cuda driver: invalid thread-block cluster shape: cluster [2 1 0]: cluster[2] is 0"},
		{"no cluster", withSym, false, Dim3{32, 1, 1}, Dim3{}, ErrClusterShape, "cluster [0 0 0]: cluster[0] is 0"},
		{"no cuOccupancyMaxActiveClusters", withoutSym, false, Dim3{32, 1, 1}, Dim3{2, 1, 1}, ErrNoClusterOccupancy,
			"cuda driver: cuOccupancyMaxActiveClusters is not exported (needs a CUDA 12 driver)"},
		{"no driver at all", &Context{}, false, Dim3{32, 1, 1}, Dim3{2, 1, 1}, ErrNoClusterOccupancy, "is not exported"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fn := &Function{c: tc.c, Name: "k"}
			if tc.nilFn {
				fn = nil
			}
			n, err := tc.c.MaxActiveClusters(fn, tc.block, 0, tc.cluster)
			require.Zero(t, n)
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
			}
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// TestOccupancyCountSlot: the count the driver writes sits between the
// launch attributes and kernelParams, 4-byte aligned.
func TestOccupancyCountSlot(t *testing.T) {
	require.GreaterOrEqual(t, areaOccupancy, areaAttrs+maxLaunchAttrs*72)
	require.LessOrEqual(t, areaOccupancy+4, areaParams)
	require.Zero(t, areaOccupancy%4)
}
