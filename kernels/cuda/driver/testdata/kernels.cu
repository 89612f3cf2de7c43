// Kernels for the driver package's GPU tests. No CUDA headers: NVRTC
// compiles this without include paths.

// EchoArgs is passed by value as driver.Bytes; layout (16 bytes):
// a at 0, b at 4, c at 8.
struct EchoArgs {
    unsigned int a;
    float b;
    unsigned long long c;
};

extern "C" __global__ void add_one(unsigned int* data, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1u;
}

// add_one_after_dependency is launched with programmatic dependent launch: it
// may start while the previous kernel on the stream still runs, so it waits
// for that kernel's results before touching data.
extern "C" __global__ void add_one_after_dependency(unsigned int* data, unsigned int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1u;
}

// echo_args writes every parameter back as 64-bit words so the test can
// check the kernelParams packing of each Go type.
extern "C" __global__ void echo_args(unsigned long long* out, signed char i8, unsigned short u16, int i32,
                                     unsigned int u32, long long i64, float f32, double f64, bool flag,
                                     EchoArgs s) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    out[0] = (unsigned long long)(long long)i8;
    out[1] = u16;
    out[2] = (unsigned long long)(long long)i32;
    out[3] = u32;
    out[4] = (unsigned long long)i64;
    out[5] = __float_as_uint(f32);
    out[6] = (unsigned long long)__double_as_longlong(f64);
    out[7] = flag ? 1ull : 0ull;
    out[8] = s.a;
    out[9] = __float_as_uint(s.b);
    out[10] = s.c;
}

// lcg_rounds advances each element through `rounds` steps of a linear
// congruential generator: enough work for event timing to measure.
extern "C" __global__ void lcg_rounds(unsigned int* data, unsigned int n, unsigned int rounds) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int x = data[i];
    for (unsigned int r = 0; r < rounds; ++r) x = x * 1664525u + 1013904223u;
    data[i] = x;
}

// TensorMap128 is a CUtensorMap's shape: 128 bytes, 64-byte aligned.
struct __align__(64) TensorMap128 {
    unsigned long long w[16];
};

// echo_tensormap writes a tensor map passed by value (as a
// __grid_constant__ parameter, as TMA kernels take it) back, then the int
// parameters around it: the 64-byte aligned parameter's offset.
extern "C" __global__ void echo_tensormap(unsigned long long* out, int before, const __grid_constant__ TensorMap128 tm,
                                          int after) {
    if (blockIdx.x != 0 || threadIdx.x >= 16) return;
    out[threadIdx.x] = tm.w[threadIdx.x];
    if (threadIdx.x == 0) {
        out[16] = (unsigned long long)(long long)before;
        out[17] = (unsigned long long)(long long)after;
    }
}

// cluster_echo is launched with a thread-block cluster shape: block b
// (linear index) writes its cluster's shape to out[4b..4b+2] and, through
// distributed shared memory, what its successor in the cluster (rank + 1,
// wrapping) stored in its own shared memory, that block's rank, to
// out[4b+3]. Without a cluster every block is its own one-block cluster.
extern "C" __global__ void cluster_echo(unsigned int* out) {
    unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned int nx = 1, ny = 1, nz = 1, rank = 0, size = 1, peer_word = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ unsigned int word;
    asm volatile("mov.u32 %0, %%cluster_nctaid.x;" : "=r"(nx));
    asm volatile("mov.u32 %0, %%cluster_nctaid.y;" : "=r"(ny));
    asm volatile("mov.u32 %0, %%cluster_nctaid.z;" : "=r"(nz));
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    if (threadIdx.x == 0) word = rank;
    // Every thread arrives: the barrier is .aligned. The first makes each
    // block's word visible to the cluster, the second keeps every block's
    // shared memory alive until its predecessor has read it.
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
    if (threadIdx.x == 0) {
        unsigned int local = (unsigned int)__cvta_generic_to_shared(&word), remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"((rank + 1) % size));
        asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(peer_word) : "r"(remote) : "memory");
    }
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
#endif
    if (threadIdx.x != 0) return;
    out[4 * b] = nx;
    out[4 * b + 1] = ny;
    out[4 * b + 2] = nz;
    out[4 * b + 3] = peer_word;
}
