// Package fakecuda builds testdata/fakecuda.c, a host-only stand-in for
// libcuda.so.1, so that the driver binding and the host paths of the
// backends above it can be tested and benchmarked on a machine without a
// GPU. The fake enforces the driver rules the Go side must respect (calls
// only where the context is current, kernelParams and CUlaunchConfig as
// cuda.h lays them out, argument values copied at launch and capture); its
// kernels run on the host, synchronously.
//
// The driver is loaded once per process, so a test that wants the fake
// either reruns its test binary in a child process with the fake selected
// (RunChild), or, for benchmarks, selects it before the first driver call
// (Use).
package fakecuda
