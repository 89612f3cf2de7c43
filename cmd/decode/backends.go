package main

// The CUDA backend registers itself (mla.Register)
// when linked in, so --backend auto picks it where libcuda.so.1, a device
// and NVRTC are found, and --backend cuda can name it.
import _ "github.com/dsv4mla/prologue/attention/mla/cuda"
