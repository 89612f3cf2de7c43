// sm90.cuh: the Hopper (sm_90a) building blocks the warpgroup-MMA GEMMs
// share (gemm_fp8_wgmma.cu, gemm_bf16_wgmma.cu): the tensor map a bulk
// tensor copy reads, mbarriers (a wait that traps instead of hanging),
// bulk tensor copies into shared memory (plain, with an L2 policy, cluster
// multicast), 4-byte cp.async with an mbarrier arrival, cluster barriers
// and distributed shared memory, named barriers, and wgmma's shared-memory
// descriptor, fences and register fence. Each kernel's own MMA shapes,
// tiles and roles stay in its file. The PTX here exists only for sm_90a:
// include it only from programs compiled for that target (NVRTC 11.8 on
// the build machine still parses it, as inline asm is not checked before
// ptxas).
#ifndef DSV4_PROLOGUE_SM90_CUH
#define DSV4_PROLOGUE_SM90_CUH

#include "common.cuh"

namespace sm90 {

// CUtensorMap: 128 opaque bytes, 64-byte aligned, passed by value as a
// __grid_constant__ parameter (the copy engine reads it from there).
struct __align__(64) TensorMap {
    u64 opaque[16];
};

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ bool mbar_try(u32 bar, u32 parity) {
    u32 done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// No wait of these kernels lasts seconds, not even behind a slow kernel
// before one (the consumers wait for the producer, which waits for that
// kernel): past this, a barrier that can never complete fails the launch
// instead of hanging the device.
#ifndef WGMMA_HANG_NS
#define WGMMA_HANG_NS 20000000000ull
#endif
constexpr u64 kHangNs = WGMMA_HANG_NS;

// Waits for the completion of the barrier's phase of parity `parity`.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    if (mbar_try(bar, parity)) return;
    const u64 t0 = global_ns();
    while (!mbar_try(bar, parity))
        if (global_ns() - t0 > kHangNs) __trap();
}

// A 2D box of the tensor map at (inner c0, outer c1) into shared memory,
// completing `bar`'s transaction bytes.
__device__ __forceinline__ void tma_load_2d(u32 dst, const TensorMap* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}


// The same with an L2 eviction policy (createpolicy below: the weights
// are read once, the activations by every block).
__device__ __forceinline__ void tma_load_2d_hint(u32 dst, const TensorMap* map, int c0, int c1, u32 bar, u64 policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
        "%3}], [%4], %5;" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
        : "memory");
}
__device__ __forceinline__ u64 policy_evict_first() {
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ u64 policy_evict_last() {
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}


// 4 bytes global -> shared through the asynchronous copy unit; src_bytes 0
// writes a zero without reading.
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// An arrival on bar once this thread's earlier cp.async copies complete,
// counted in the barrier's expected arrivals (.noinc).
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(bar) : "memory");
}

// The 2D box into the shared memory of every block of the cluster in
// cta_mask, at dst's offset, each block's barrier at bar's offset
// completing the box's bytes.
__device__ __forceinline__ void tma_load_2d_multicast(u32 dst, const TensorMap* map, int c0, int c1, u32 bar,
                                                      u16 cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
        "%3}], [%4], %5;" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
        : "memory");
}

// An arrival on the barrier at a shared::cluster address (another
// block's), with the default release at CTA scope: the arriving warp's
// reads of the stage are complete (the MMA waited, the scales are in
// registers) and the peer's copy into it is ordered by the barrier itself.
// A cluster-scope release here is a fence a K block a peer: with it the
// kernel ran 1.9x (clusters of 2) and 3.4x (of 4) slower (2026-12-02-h200-g).
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Thread-block clusters: a barrier of every thread of the cluster (its
// shared-memory writes visible to the others after it), and loads from a
// peer block's shared memory at the same offset as a local address.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ u32 mapa(u32 local, int rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}
__device__ __forceinline__ float4 ld_cluster_f4(u32 addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// The 2D box of the tensor map at (inner c0, outer c1) brought into L2
// only (no shared memory, no barrier): a stream's later boxes requested
// from HBM early.
__device__ __forceinline__ void tma_prefetch_2d(const TensorMap* map, int c0, int c1) {
    asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global [%0, {%1, %2}];" ::"l"((u64)map), "r"(c0), "r"(c1) : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"((u64)map) : "memory");
}

__device__ __forceinline__ void named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// wgmma shared-memory matrix descriptor of a K-major operand with the
// 128-byte swizzle: start address >> 4 (bits 0-13), leading byte offset 0
// (unused for a swizzled K-major operand whose K fits one swizzle row),
// stride byte offset 1024 >> 4 (8 rows of 128 bytes, bits 32-45), base
// offset 0 (tiles 1024-byte aligned), layout 1 = 128B swizzle (bits 62-63).
// A K step of 32 bytes inside the row adds 2 to the start address.
__device__ __forceinline__ u64 smem_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Keeps the compiler from moving accumulator registers across the
// asynchronous MMA's issue and wait.
template <int R>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace sm90

#endif  // DSV4_PROLOGUE_SM90_CUH
