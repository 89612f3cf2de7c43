package driver

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewErrorFormatting(t *testing.T) {
	driverKnows := func(r Result) (string, string, bool) {
		if r == ResultOutOfMemory {
			return "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", true
		}
		return "", "", false
	}
	tests := []struct {
		name     string
		call     string
		result   Result
		describe describeFunc
		want     string
	}{
		{"driver describes", "cuMemAlloc_v2", ResultOutOfMemory, driverKnows,
			"cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"},
		{"driver cannot describe a known code", "cuLaunchKernel", ResultInvalidValue, driverKnows,
			"cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (the driver could not describe this code)"},
		{"no driver at all", "cuInit", ResultNoDevice, nil,
			"cuInit: CUDA_ERROR_NO_DEVICE (the driver could not describe this code)"},
		{"unknown code", "cuGraphLaunch", Result(4242), nil,
			"cuGraphLaunch: CUresult(4242) (unrecognized CUresult 4242)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := newError(tc.call, tc.result, tc.describe)
			require.EqualError(t, err, tc.want)
			require.ErrorIs(t, fmt.Errorf("wrapped: %w", err), tc.result)
			require.NotErrorIs(t, err, tc.result+1)
		})
	}
}

// TestDriverCheckUsesDriverNames drives driverAPI.check through fake
// cuGetErrorName/cuGetErrorString that hand back C strings, as the driver does.
func TestDriverCheckUsesDriverNames(t *testing.T) {
	name := []byte("CUDA_ERROR_INVALID_VALUE\x00")
	desc := []byte("invalid argument\x00")
	a := &driverAPI{
		cuGetErrorName: func(r Result, s **byte) Result {
			if r != ResultInvalidValue {
				return ResultInvalidValue
			}
			*s = &name[0]
			return ResultSuccess
		},
		cuGetErrorString: func(r Result, s **byte) Result { *s = &desc[0]; return ResultSuccess },
	}
	require.NoError(t, a.check("cuLaunchKernel", ResultSuccess))
	require.EqualError(t, a.check("cuLaunchKernel", ResultInvalidValue),
		"cuLaunchKernel: CUDA_ERROR_INVALID_VALUE (invalid argument)")
	require.EqualError(t, a.check("cuMemAlloc_v2", ResultOutOfMemory),
		"cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (the driver could not describe this code)")
}

func TestResultNames(t *testing.T) {
	tests := []struct {
		r    Result
		want string
	}{
		{ResultSuccess, "CUDA_SUCCESS"},
		{ResultInvalidValue, "CUDA_ERROR_INVALID_VALUE"},
		{ResultStreamCaptureInvalidated, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
		{ResultUnknown, "CUDA_ERROR_UNKNOWN"},
		{Result(-3), "CUresult(-3)"},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, tc.r.Name())
		require.Equal(t, tc.want, tc.r.Error())
	}
}

func TestNVRTCErrors(t *testing.T) {
	base := &NVRTCError{Call: "nvrtcCompileProgram", Result: NVRTCErrorCompilation, Name: "NVRTC_ERROR_COMPILATION"}
	require.EqualError(t, base, "nvrtcCompileProgram: NVRTC_ERROR_COMPILATION")
	require.ErrorIs(t, base, NVRTCErrorCompilation)
	require.NotErrorIs(t, base, NVRTCErrorInvalidOpt)
	require.Equal(t, "nvrtcResult(99)", NVRTCResult(99).Name())

	ce := &CompileError{Program: "k.cu", Options: []string{"--gpu-architecture=sm_90"}, Log: "k.cu(3): error: identifier \"x\" is undefined\n", Err: base}
	msg := ce.Error()
	require.Contains(t, msg, `"k.cu"`)
	require.Contains(t, msg, "--gpu-architecture=sm_90")
	require.Contains(t, msg, `identifier "x" is undefined`)
	require.Contains(t, msg, "NVRTC_ERROR_COMPILATION")
	require.ErrorIs(t, ce, NVRTCErrorCompilation)
	var target *NVRTCError
	require.True(t, errors.As(ce, &target))
}
