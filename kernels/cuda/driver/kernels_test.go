package driver

import _ "embed"

// testKernels is the CUDA source of the GPU tests' kernels.
//
//go:embed testdata/kernels.cu
var testKernels string
