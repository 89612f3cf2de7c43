// n8: what moves bytes fastest on this H200, 50/50 read/write (the bf16 Q's mix) and 2:1 (the fp8 Q's)?
// Is cuMemcpyDtoD a copy engine or an SM kernel? Standalone; nvcc -O3 -arch=sm_90 cmem.cu -o cmem -lcuda
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
typedef unsigned long long u64;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

template <int U, int CS>
__global__ void kcopy(uint4* __restrict__ dst, const uint4* __restrict__ src, u64 n16) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            if (CS) asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(src + i + k * stride));
            else asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(src + i + k * stride));
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            if (CS) asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst + i + k * stride), "r"(v[k].x), "r"(v[k].y), "r"(v[k].z), "r"(v[k].w) : "memory");
            else asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst + i + k * stride), "r"(v[k].x), "r"(v[k].y), "r"(v[k].z), "r"(v[k].w) : "memory");
        }
    }
    for (; i < n16; i += stride) dst[i] = src[i];
}

// Each block copies a contiguous tile of blockDim*U vectors per step (thread t takes t, t+bd, ...), tiles grid-strided.
template <int U>
__global__ void ktile(uint4* __restrict__ dst, const uint4* __restrict__ src, u64 n16) {
    const u64 tile = (u64)blockDim.x * U;
    for (u64 base = blockIdx.x * tile; base < n16; base += (u64)gridDim.x * tile) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            u64 j = base + threadIdx.x + k * blockDim.x;
            if (j < n16) asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(src + j));
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            u64 j = base + threadIdx.x + k * blockDim.x;
            if (j < n16) asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst + j), "r"(v[k].x), "r"(v[k].y), "r"(v[k].z), "r"(v[k].w) : "memory");
        }
    }
}

// 2:1 read:write (the fp8 Q's mix): reads 2 vectors, writes their xor.
template <int U>
__global__ void kread2(uint4* __restrict__ dst, const uint4* __restrict__ src, u64 nout16) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < nout16; i += stride) {
        uint4 a = __ldcs(src + 2 * i), b = __ldcs(src + 2 * i + 1);
        dst[i] = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
    }
}

__global__ void kreadonly(const uint4* __restrict__ src, u64 n16, unsigned* out) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    unsigned acc = 0;
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n16; i += stride) acc ^= src[i].x;
    if (acc == 0x12345678u) *out = acc;
}

__global__ void kwriteonly(uint4* __restrict__ dst, u64 n16) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n16; i += stride) __stcs(dst + i, make_uint4(i, 1, 2, 3));
}

// TMA bulk copy: one elected thread per block runs an S-stage ring of B-byte chunks, global->smem->global.
__device__ __forceinline__ unsigned sm(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int S>
__global__ void kbulk(unsigned char* dst, const unsigned char* src, u64 nbytes, unsigned B) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) u64 bar[S];
    if (threadIdx.x != 0) return;
    for (int s = 0; s < S; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sm(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const u64 nch = nbytes / B;
    auto load = [&](u64 c, int s) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sm(&bar[s])), "r"(B) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sm(smem + (u64)s * B)), "l"(src + c * B), "r"(B), "r"(sm(&bar[s])) : "memory");
    };
    u64 it = 0;
    for (int s = 0; s < S; s++) {
        u64 c = blockIdx.x + (u64)s * gridDim.x;
        if (c < nch) load(c, s);
    }
    for (u64 c = blockIdx.x; c < nch; c += gridDim.x, it++) {
        int s = it % S;
        unsigned par = (it / S) & 1, done = 0;
        while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(sm(&bar[s])), "r"(par) : "memory");
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + c * B), "r"(sm(smem + (u64)s * B)), "r"(B) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        // refill the previous stage once its store has read it
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        if (it >= 1) {
            int ps = (it - 1) % S;
            u64 nc = c - gridDim.x + (u64)S * gridDim.x;
            if (nc < nch) load(nc, ps);
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}

static const u64 N = 1ull << 30;
uint4 *A, *Bf;
cudaStream_t st;
cudaEvent_t e0, e1;

template <class F>
double timeit(F f, int per = 10) {
    std::vector<double> v;
    for (int r = 0; r < 8; r++) {
        CK(cudaEventRecord(e0, st));
        for (int k = 0; k < per; k++) f();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3) v.push_back(ms * 1e3 / per);
    }
    CK(cudaGetLastError());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
double memcpyRate = 0;
void report(const char* name, double us, double bytes) {
    double gbps = bytes / us / 1e3;
    printf("%-48s %9.1f us %6.0f GB/s  %5.1f%% of memcpy\n", name, us, gbps, memcpyRate > 0 ? 100 * gbps / memcpyRate : 0.0);
}

int main() {
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&A, N)); CK(cudaMalloc(&Bf, N));
    CK(cudaMemset(A, 1, N)); CK(cudaMemset(Bf, 2, N));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    unsigned* dout; CK(cudaMalloc(&dout, 4));
    const u64 n16 = N / 16;
    for (int round = 0; round < 2; round++) {
        printf("--- round %d\n", round);
        double us = timeit([&] { CK(cudaMemcpyAsync(Bf, A, N, cudaMemcpyDeviceToDevice, st)); });
        memcpyRate = 2.0 * N / us / 1e3;
        report("cudaMemcpyAsync D2D 1 GiB", us, 2.0 * N);
        report("copy16 (bench: SMx8 x512, U4 cs)", timeit([&] { kcopy<4, 1><<<sms * 8, 512, 0, st>>>(Bf, A, n16); }), 2.0 * N);
#define KC(U, CS, G, BL) report("kcopy U" #U " cs" #CS " grid SMx" #G " block " #BL, timeit([&] { kcopy<U, CS><<<sms * G, BL, 0, st>>>(Bf, A, n16); }), 2.0 * N)
        KC(1, 0, 8, 512); KC(2, 0, 8, 512); KC(4, 0, 8, 512); KC(8, 0, 8, 512);
        KC(4, 0, 4, 512); KC(4, 0, 16, 256); KC(8, 0, 4, 256); KC(8, 0, 2, 1024); KC(4, 0, 1, 1024); KC(16, 0, 4, 256);
        KC(4, 1, 4, 1024); KC(8, 1, 8, 256);
        {
            // one big wave: as many blocks as fit, each one tile
            report("kcopy U1 one thread per vector (n16/512 blocks)", timeit([&] { kcopy<1, 0><<<(unsigned)(n16 / 512), 512, 0, st>>>(Bf, A, n16); }), 2.0 * N);
            report("kcopy U4 one pass (n16/2048 blocks x512)", timeit([&] { kcopy<4, 0><<<(unsigned)(n16 / 2048), 512, 0, st>>>(Bf, A, n16); }), 2.0 * N);
        }
#define KT(U, G, BL) report("ktile U" #U " grid SMx" #G " block " #BL, timeit([&] { ktile<U><<<sms * G, BL, 0, st>>>(Bf, A, n16); }), 2.0 * N)
        KT(4, 8, 512); KT(8, 4, 512); KT(8, 8, 256); KT(16, 4, 256); KT(4, 16, 256);
        for (unsigned B : {4096u, 8192u, 16384u, 32768u}) {
            for (int per : {1, 2, 3}) {
                const int S = 4;
                size_t shm = (size_t)S * B;
                if (shm > 200 * 1024) continue;
                CK(cudaFuncSetAttribute(kbulk<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
                char name[96]; snprintf(name, sizeof name, "kbulk S4 B%u blocks/SM %d", B, per);
                report(name, timeit([&] { kbulk<S><<<sms * per, 32, shm, st>>>((unsigned char*)Bf, (const unsigned char*)A, N, B); }), 2.0 * N);
            }
        }
        {
            const int S = 8; unsigned B = 16384; size_t shm = S * B;
            CK(cudaFuncSetAttribute(kbulk<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
            report("kbulk S8 B16384 blocks/SM 1", timeit([&] { kbulk<S><<<sms, 32, shm, st>>>((unsigned char*)Bf, (const unsigned char*)A, N, B); }), 2.0 * N);
        }
        report("read 2 : write 1 (fp8 Q mix) 1 GiB read", timeit([&] { kread2<1><<<sms * 8, 512, 0, st>>>(Bf, A, n16 / 2); }), 1.5 * N);
        report("read only 1 GiB", timeit([&] { kreadonly<<<sms * 8, 512, 0, st>>>(A, n16, dout); }), 1.0 * N);
        report("write only 1 GiB (st.cs)", timeit([&] { kwriteonly<<<sms * 8, 512, 0, st>>>(Bf, n16); }), 1.0 * N);
        report("cudaMemsetAsync 1 GiB", timeit([&] { CK(cudaMemsetAsync(Bf, 3, N, st)); }), 1.0 * N);
    }
    // Copy engine or SM kernel? A spin kernel fills every SM slot on stream s1; the memcpy on s2.
    {
        cudaStream_t s1, s2; CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        cudaEvent_t a0, a1, b0, b1; CK(cudaEventCreate(&a0)); CK(cudaEventCreate(&a1)); CK(cudaEventCreate(&b0)); CK(cudaEventCreate(&b1));
        long long cyc = 20000000; // about 10 ms at 2 GHz
        for (int r = 0; r < 2; r++) {
            CK(cudaEventRecord(a0, s1)); spin<<<sms * 64, 32, 0, s1>>>(cyc); CK(cudaEventRecord(a1, s1));
            CK(cudaEventRecord(b0, s2)); for (int k = 0; k < 4; k++) CK(cudaMemcpyAsync(Bf, A, N, cudaMemcpyDeviceToDevice, s2)); CK(cudaEventRecord(b1, s2));
            CK(cudaDeviceSynchronize());
            float ta, tb, tab; CK(cudaEventElapsedTime(&ta, a0, a1)); CK(cudaEventElapsedTime(&tb, b0, b1)); CK(cudaEventElapsedTime(&tab, a0, b1));
            printf("CE test: spin (all SMs, 64 warps/SM) %.2f ms; 4 x 1 GiB memcpy on another stream %.2f ms (%.0f GB/s), ends %.2f ms after the spin began\n", ta, tb, 2.0 * 4 * N / (tb * 1e6), tab);
        }
        float t; CK(cudaEventRecord(b0, s2)); for (int k = 0; k < 4; k++) CK(cudaMemcpyAsync(Bf, A, N, cudaMemcpyDeviceToDevice, s2)); CK(cudaEventRecord(b1, s2)); CK(cudaEventSynchronize(b1)); CK(cudaEventElapsedTime(&t, b0, b1));
        printf("CE test: 4 x 1 GiB memcpy alone %.2f ms\n", t);
        CK(cudaEventRecord(b0, s2)); kcopy<4, 1><<<sms * 8, 512, 0, s2>>>(Bf, A, n16); kcopy<4, 1><<<sms * 8, 512, 0, s2>>>(Bf, A, n16); CK(cudaEventRecord(b1, s2));
        CK(cudaEventRecord(a0, s1)); spin<<<sms * 64, 32, 0, s1>>>(cyc); CK(cudaEventRecord(a1, s1));
        CK(cudaDeviceSynchronize()); CK(cudaEventElapsedTime(&t, b0, b1));
        printf("CE test control: 2 x copy16 kernel launched just before the spin: %.2f ms\n", t);
    }
    printf("done\n");
    return 0;
}
