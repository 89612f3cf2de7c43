// fakecuda.c: a host-only stand-in for libcuda.so.1 used by the driver
// package's tests on machines without a GPU. It implements the exported
// symbols the package binds, with the driver's C signatures and the driver's
// rules that matter to the Go side:
//   - a call that needs a context fails with CUDA_ERROR_INVALID_CONTEXT on a
//     thread where no context is current (so the owner-thread model is tested);
//   - kernel arguments are read through kernelParams exactly as the driver
//     reads them, and CUlaunchConfig / CUlaunchAttribute are the cuda.h
//     structs, so the Go mirrors of both are checked by a C compiler; the
//     launch attributes are validated as the driver does (PDL, and cluster
//     shapes that divide the grid, more than 8 blocks only where the
//     function allows non-portable sizes), for cuOccupancyMaxActiveClusters
//     too, which answers from a stated device model;
//   - stream capture records launches (copying argument values, as the
//     driver does) and graphs replay them.
// "Device" memory is host memory and kernels run on the host, synchronously.
// The kernels are host versions of testdata/kernels.cu, looked up by name.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUgraph;
typedef void* CUgraphExec;

enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, CUDA_ERROR_INVALID_CLUSTER_SIZE = 912,
};

// CUlaunchAttributeID and CUfunction_attribute values (cuda.h).
enum { CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6 };
enum { CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14 };

// cuda.h, CUDA 12.0 through 13.0.
typedef struct CUlaunchAttribute_st {
    int id;
    char pad[8 - sizeof(int)];
    union {
        char pad[64];
        struct { unsigned int x, y, z; } clusterDim;
        int programmaticStreamSerializationAllowed;
    } value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute* attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig layout");
_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute layout");

static int initialized;
static int primary_refs;
static int the_context; // its address is the CUcontext
static __thread int context_current;

#define NEED_CONTEXT() do { if (!context_current) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

static const char* names[][2] = {
    {"CUDA_SUCCESS", "no error"}, {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
};

CUresult cuGetErrorName(CUresult r, const char** s) {
    switch (r) {
    case 0: case 1: case 2: *s = names[r][0]; return 0;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; return 0;
    case 401: *s = "CUDA_ERROR_ILLEGAL_STATE"; return 0;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; return 0;
    case 200: *s = "CUDA_ERROR_INVALID_IMAGE"; return 0;
    case 900: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; return 0;
    case 901: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; return 0;
    case 912: *s = "CUDA_ERROR_INVALID_CLUSTER_SIZE"; return 0;
    }
    *s = 0;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char** s) {
    if (r >= 0 && r <= 2) { *s = names[r][1]; return 0; }
    const char* n;
    if (cuGetErrorName(r, &n) != 0) { *s = 0; return CUDA_ERROR_INVALID_VALUE; }
    *s = "fake driver error";
    return 0;
}

CUresult cuInit(unsigned int flags) { if (flags) return CUDA_ERROR_INVALID_VALUE; initialized = 1; return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int* n) { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice* d, int ordinal) { if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return 0; }
CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    if (d != 0 || len < 1) return CUDA_ERROR_INVALID_VALUE;
    strncpy(name, "Fake H200 (host)", len - 1);
    name[len - 1] = 0;
    return 0;
}
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case 1: *v = 1024; return 0;       // max threads per block
    case 10: *v = 32; return 0;        // warp size
    case 16: *v = 132; return 0;       // SMs
    case 38: *v = 52428800; return 0;  // L2 bytes
    case 75: *v = 9; return 0;
    case 76: *v = 0; return 0;
    case 81: *v = 233472; return 0;    // shared per multiprocessor
    case 82: *v = 65536; return 0;     // registers per multiprocessor
    case 97: *v = 232448; return 0;    // shared per block opt-in
    }
    return CUDA_ERROR_INVALID_VALUE;
}
CUresult cuDeviceTotalMem_v2(size_t* b, CUdevice d) { *b = (size_t)141 << 30; return d ? CUDA_ERROR_INVALID_DEVICE : 0; }
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    __atomic_add_fetch(&primary_refs, 1, __ATOMIC_SEQ_CST);
    *c = &the_context;
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    return __atomic_sub_fetch(&primary_refs, 1, __ATOMIC_SEQ_CST) < 0 ? CUDA_ERROR_INVALID_CONTEXT : 0;
}
CUresult cuCtxSetCurrent(CUcontext c) {
    if (c != &the_context && c != 0) return CUDA_ERROR_INVALID_CONTEXT;
    context_current = c != 0;
    return 0;
}
CUresult cuCtxSynchronize(void) { NEED_CONTEXT(); return 0; }
CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    NEED_CONTEXT();
    *total = (size_t)141 << 30;
    *free_bytes = (size_t)140 << 30;
    return 0;
}

// ---- streams and capture ----

typedef struct kernel kernel_t;
// Big enough for the prologue's fused layer kernel: two Params and an int.
#define PARAMS_BYTES 176
// A launch: the kernel, its shape (cluster 1, 1, 1 without one), the
// attributes it was given and its argument values.
#define MAX_ATTRS 4
typedef struct {
    const kernel_t* k;
    unsigned grid[3], block[3], cluster[3];
    unsigned nattrs;
    CUlaunchAttribute attrs[MAX_ATTRS];
    char args[512];
} node_t;
typedef struct { int capturing, invalidated, n; node_t nodes[64]; } stream_t;
typedef struct { int n; node_t nodes[64]; } graph_t;

static stream_t legacy_stream;
static stream_t* stream_of(CUstream s) { return s ? (stream_t*)s : &legacy_stream; }
static int any_capture;

// A synchronous operation while any capture is active: refused, and the
// capture is invalidated (CU_STREAM_CAPTURE_MODE_GLOBAL semantics).
static CUresult refuse_during_capture(stream_t* s) {
    if (s->capturing) { s->invalidated = 1; return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; }
    return 0;
}

CUresult cuStreamCreate(CUstream* s, unsigned int flags) {
    NEED_CONTEXT();
    if (flags > 1) return CUDA_ERROR_INVALID_VALUE;
    *s = calloc(1, sizeof(stream_t));
    return 0;
}
CUresult cuStreamDestroy_v2(CUstream s) { NEED_CONTEXT(); if (!s) return CUDA_ERROR_INVALID_HANDLE; free(s); return 0; }
CUresult cuStreamSynchronize(CUstream s) { NEED_CONTEXT(); return refuse_during_capture(stream_of(s)); }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    NEED_CONTEXT();
    (void)s;
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    return e ? 0 : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    NEED_CONTEXT();
    if (!s || mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
    stream_t* st = s;
    if (st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    st->capturing = 1; st->invalidated = 0; st->n = 0; any_capture++;
    return 0;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
    NEED_CONTEXT();
    stream_t* st = stream_of(s);
    if (!st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
    st->capturing = 0; any_capture--;
    if (st->invalidated) { *g = 0; return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; }
    graph_t* gr = calloc(1, sizeof(graph_t));
    gr->n = st->n;
    memcpy(gr->nodes, st->nodes, sizeof(node_t) * st->n);
    *g = gr;
    return 0;
}

// ---- events ----

typedef struct { int timing; double t; int recorded; } event_t;
static double now_ms(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6; }
CUresult cuEventCreate(CUevent* e, unsigned int flags) {
    NEED_CONTEXT();
    event_t* ev = calloc(1, sizeof(event_t));
    ev->timing = !(flags & 2);
    *e = ev;
    return 0;
}
CUresult cuEventRecord(CUevent e, CUstream s) { NEED_CONTEXT(); (void)s; event_t* ev = e; ev->t = now_ms(); ev->recorded = 1; return 0; }
CUresult cuEventSynchronize(CUevent e) { NEED_CONTEXT(); return e ? 0 : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
    NEED_CONTEXT();
    event_t *x = a, *y = b;
    if (!x->timing || !y->timing || !x->recorded || !y->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)(y->t - x->t);
    return 0;
}
CUresult cuEventDestroy_v2(CUevent e) { NEED_CONTEXT(); free(e); return 0; }

// ---- memory ----

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
    NEED_CONTEXT();
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    if (n > ((size_t)64 << 30)) return CUDA_ERROR_OUT_OF_MEMORY;
    void* m = malloc(n);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)m;
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { NEED_CONTEXT(); free((void*)(uintptr_t)p); return 0; }
CUresult cuMemAllocHost_v2(void** p, size_t n) { NEED_CONTEXT(); *p = malloc(n); return *p ? 0 : CUDA_ERROR_OUT_OF_MEMORY; }
CUresult cuMemFreeHost(void* p) { NEED_CONTEXT(); free(p); return 0; }

#define DEV(p) ((void*)(uintptr_t)(p))
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* h, size_t n) {
    NEED_CONTEXT(); if (any_capture) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; memcpy(DEV(d), h, n); return 0;
}
CUresult cuMemcpyDtoH_v2(void* h, CUdeviceptr d, size_t n) {
    NEED_CONTEXT(); if (any_capture) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; memcpy(h, DEV(d), n); return 0;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { NEED_CONTEXT(); memmove(DEV(d), DEV(s), n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* h, size_t n, CUstream s) { NEED_CONTEXT(); (void)s; memcpy(DEV(d), h, n); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void* h, CUdeviceptr d, size_t n, CUstream s) { NEED_CONTEXT(); (void)s; memcpy(h, DEV(d), n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { NEED_CONTEXT(); (void)s; memmove(DEV(d), DEV(src), n); return 0; }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { NEED_CONTEXT(); memset(DEV(d), v, n); return 0; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { NEED_CONTEXT(); (void)s; memset(DEV(d), v, n); return 0; }

// ---- kernels (host versions of testdata/kernels.cu) ----

struct kernel {
    const char* name;
    int nparams;
    size_t sizes[12];
    void (*run)(char* const* args, unsigned threads);
    int max_dynamic_shared;
    int non_portable_cluster; // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
};

// The launch a kernel's host version runs for (its shape and attributes).
static const node_t* running;

#define ARG(T, i) (*(T*)args[i])

static void add_one(char* const* args, unsigned threads) {
    unsigned* data = ARG(unsigned*, 0);
    unsigned n = ARG(unsigned, 1);
    for (unsigned i = 0; i < threads && i < n; i++) data[i] += 1u;
}
static void lcg_rounds(char* const* args, unsigned threads) {
    unsigned* data = ARG(unsigned*, 0);
    unsigned n = ARG(unsigned, 1), rounds = ARG(unsigned, 2);
    for (unsigned i = 0; i < threads && i < n; i++) {
        unsigned x = data[i];
        for (unsigned r = 0; r < rounds; r++) x = x * 1664525u + 1013904223u;
        data[i] = x;
    }
}
static void echo_args(char* const* args, unsigned threads) {
    (void)threads;
    unsigned long long* out = ARG(unsigned long long*, 0);
    out[0] = (unsigned long long)(long long)ARG(signed char, 1);
    out[1] = ARG(unsigned short, 2);
    out[2] = (unsigned long long)(long long)ARG(int, 3);
    out[3] = ARG(unsigned, 4);
    out[4] = (unsigned long long)ARG(long long, 5);
    float f; memcpy(&f, args[6], 4); unsigned fb; memcpy(&fb, &f, 4); out[5] = fb;
    unsigned long long db; memcpy(&db, args[7], 8); out[6] = db;
    out[7] = ARG(unsigned char, 8) ? 1 : 0;
    const char* s = args[9];
    unsigned a; float b; unsigned long long c;
    memcpy(&a, s, 4); memcpy(&b, s + 4, 4); memcpy(&c, s + 8, 8);
    out[8] = a; memcpy(&fb, &b, 4); out[9] = fb; out[10] = c;
}

// The signature of the prologue's fused layer kernels, and of its KV and Q
// kernels (one Params struct): attention/mla/cuda's host-path tests launch
// them in their place; they run nothing.
static void layer_sink(char* const* args, unsigned threads) { (void)args; (void)threads; }

// echo_tensormap(out, before, tensor map by value, after): the map's 16
// words, then before and after, as testdata/kernels.cu's does.
static void echo_tensormap(char* const* args, unsigned threads) {
    (void)threads;
    unsigned long long* out = ARG(unsigned long long*, 0);
    memcpy(out, args[2], 128);
    out[16] = (unsigned long long)(long long)ARG(int, 1);
    out[17] = (unsigned long long)(long long)ARG(int, 3);
}

// cluster_echo(out), as testdata/kernels.cu's: for the block of linear
// index b, out[4b..4b+2] = its cluster's shape and out[4b+3] = what it read
// from the shared memory of its successor in the cluster (that block's
// rank).
static void cluster_echo(char* const* args, unsigned threads) {
    (void)threads;
    unsigned* out = ARG(unsigned*, 0);
    const unsigned* g = running->grid;
    const unsigned* c = running->cluster;
    unsigned size = c[0] * c[1] * c[2];
    for (unsigned z = 0; z < g[2]; z++)
        for (unsigned y = 0; y < g[1]; y++)
            for (unsigned x = 0; x < g[0]; x++) {
                unsigned b = x + g[0] * (y + g[1] * z);
                unsigned rank = x % c[0] + c[0] * (y % c[1] + c[1] * (z % c[2]));
                out[4 * b] = c[0];
                out[4 * b + 1] = c[1];
                out[4 * b + 2] = c[2];
                out[4 * b + 3] = (rank + 1) % size;
            }
}

// echo_launch(out), the fake's own: the launch attributes it was given,
// out[0] = their count, then 9 words each: the id and the 64-byte value.
static void echo_launch(char* const* args, unsigned threads) {
    (void)threads;
    unsigned long long* out = ARG(unsigned long long*, 0);
    out[0] = running->nattrs;
    for (unsigned i = 0; i < running->nattrs; i++) {
        out[1 + 9 * i] = (unsigned long long)running->attrs[i].id;
        memcpy(&out[2 + 9 * i], running->attrs[i].value.pad, 64);
    }
}

static kernel_t kernels[] = {
    {"cluster_echo", 1, {8}, cluster_echo, 49152},
    {"echo_launch", 1, {8}, echo_launch, 49152},
    {"echo_tensormap", 4, {8, 4, 128, 4}, echo_tensormap, 49152},
    {"add_one", 2, {8, 4}, add_one, 49152},
    {"add_one_after_dependency", 2, {8, 4}, add_one, 49152},
    {"lcg_rounds", 3, {8, 4, 4}, lcg_rounds, 49152},
    {"echo_args", 10, {8, 1, 2, 4, 4, 8, 4, 8, 1, 16}, echo_args, 49152},
    {"prologue_layer_sink", 3, {PARAMS_BYTES, PARAMS_BYTES, 4}, layer_sink, 0},
    {"prologue_params_sink", 1, {PARAMS_BYTES}, layer_sink, 0},
};

static int image_magic_ok(const void* image) { return image && memcmp(image, "\x7f" "ELF", 4) == 0; }
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    NEED_CONTEXT();
    if (!image_magic_ok(image)) return CUDA_ERROR_INVALID_IMAGE;
    *m = kernels;
    return 0;
}
CUresult cuModuleUnload(CUmodule m) { NEED_CONTEXT(); return m == kernels ? 0 : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    NEED_CONTEXT();
    if (m != kernels) return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++)
        if (strcmp(kernels[i].name, name) == 0) { *f = &kernels[i]; return 0; }
    return CUDA_ERROR_NOT_FOUND;
}
CUresult cuFuncGetAttribute(int* v, int attr, CUfunction f) {
    NEED_CONTEXT();
    kernel_t* k = f;
    switch (attr) {
    case 0: *v = 1024; return 0;
    case 4: *v = 16; return 0;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = k->max_dynamic_shared; return 0;
    case 10: case 11: case 12: case 13: *v = 0; return 0; // no compile-time cluster shape
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *v = k->non_portable_cluster; return 0;
    }
    return CUDA_ERROR_INVALID_VALUE;
}
CUresult cuFuncSetAttribute(CUfunction f, int attr, int v) {
    NEED_CONTEXT();
    kernel_t* k = f;
    switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (v < 0 || v > 232448) return CUDA_ERROR_INVALID_VALUE;
        k->max_dynamic_shared = v;
        return 0;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        if (v != 0 && v != 1) return CUDA_ERROR_INVALID_VALUE;
        k->non_portable_cluster = v;
        return 0;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

// check_attrs validates launch attributes as the driver does (for a launch
// or an occupancy query of k over grid) and sets cluster to the cluster
// shape they ask for, leaving it where they ask for none.
static CUresult check_attrs(const kernel_t* k, const unsigned grid[3], const CUlaunchAttribute* attrs, unsigned nattrs,
                            unsigned cluster[3]) {
    if (nattrs > MAX_ATTRS) return CUDA_ERROR_INVALID_VALUE;
    int seen_pdl = 0, seen_cluster = 0;
    for (unsigned i = 0; i < nattrs; i++) {
        const CUlaunchAttribute* a = &attrs[i];
        int from = 0;
        switch (a->id) {
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
            if (seen_pdl++ || a->value.programmaticStreamSerializationAllowed != 1) return CUDA_ERROR_INVALID_VALUE;
            from = 4;
            break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: {
            unsigned cx = a->value.clusterDim.x, cy = a->value.clusterDim.y, cz = a->value.clusterDim.z;
            if (seen_cluster++) return CUDA_ERROR_INVALID_VALUE;
            if (!cx || !cy || !cz || grid[0] % cx || grid[1] % cy || grid[2] % cz) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
            unsigned long long size = (unsigned long long)cx * cy * cz;
            if (size > 16 || (size > 8 && !k->non_portable_cluster)) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
            cluster[0] = cx; cluster[1] = cy; cluster[2] = cz;
            from = 12;
            break;
        }
        default:
            return CUDA_ERROR_INVALID_VALUE;  // only PDL and cluster shapes are expected
        }
        for (int b = from; b < 64; b++)
            if (a->value.pad[b]) return CUDA_ERROR_INVALID_VALUE;
    }
    return 0;
}

static CUresult launch(kernel_t* k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shared, CUstream hs, void** params, void** extra, const CUlaunchAttribute* attrs,
                       unsigned nattrs) {
    if (extra) return CUDA_ERROR_INVALID_VALUE;
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    if ((int)shared > k->max_dynamic_shared) return CUDA_ERROR_INVALID_VALUE;
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    node_t node = {k, {gx, gy, gz}, {bx, by, bz}, {1, 1, 1}, nattrs, {{0}}, {0}};
    CUresult r = check_attrs(k, node.grid, attrs, nattrs, node.cluster);
    if (r) return r;
    for (unsigned i = 0; i < nattrs; i++) node.attrs[i] = attrs[i];
    char* slot[12];
    size_t off = 0;
    for (int i = 0; i < k->nparams; i++) {  // copy argument values now, as the driver does
        memcpy(node.args + off, params[i], k->sizes[i]);
        slot[i] = node.args + off;
        off += (k->sizes[i] + 7) & ~(size_t)7;
    }
    stream_t* st = stream_of(hs);
    if (st->capturing) {
        if (st->n == 64) return CUDA_ERROR_OUT_OF_MEMORY;
        st->nodes[st->n++] = node;
        return 0;
    }
    running = &node;
    k->run(slot, gx * bx);
    running = 0;
    return 0;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void** params, void** extra) {
    NEED_CONTEXT();
    return launch(f, gx, gy, gz, bx, by, bz, shared, s, params, extra, 0, 0);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    NEED_CONTEXT();
    if (c->numAttrs > 0 && !c->attrs) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                  c->sharedMemBytes, c->hStream, params, extra, c->attrs, c->numAttrs);
}

// ---- occupancy ----

// The fake's device model for cuOccupancyMaxActiveClusters: an SM holds
// min(32, 2048 / threads, 233472 / (shared + 1024)) blocks of a kernel (1 KB
// of shared memory is reserved a block, as on sm_90; the host kernels use
// too few registers to limit it), and a cluster's blocks share one GPC: the
// 132 SMs are 8 GPCs of these sizes (a made-up floorsweep, under which 14
// clusters of 8 one-block-an-SM blocks fit, as 12 but not 16 do on the H200).
static const unsigned gpc_sms[] = {18, 18, 18, 18, 16, 16, 14, 14};

CUresult cuOccupancyMaxActiveClusters(int* n, CUfunction f, const CUlaunchConfig* c) {
    NEED_CONTEXT();
    if (!n || !f || !c) return CUDA_ERROR_INVALID_VALUE;
    const kernel_t* k = f;
    unsigned grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ}, cluster[3] = {0, 0, 0};
    unsigned long long threads = (unsigned long long)c->blockDimX * c->blockDimY * c->blockDimZ;
    if (!grid[0] || !grid[1] || !grid[2] || !threads || threads > 1024) return CUDA_ERROR_INVALID_VALUE;
    if ((int)c->sharedMemBytes > k->max_dynamic_shared) return CUDA_ERROR_INVALID_VALUE;
    if (c->numAttrs > 0 && !c->attrs) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_attrs(k, grid, c->attrs, c->numAttrs, cluster);
    if (r) return r;
    // The host kernels have no compile-time cluster shape: the config must give one.
    if (!cluster[0]) return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    unsigned long long per_sm = 32;
    if (2048 / threads < per_sm) per_sm = 2048 / threads;
    if (233472 / (c->sharedMemBytes + 1024ull) < per_sm) per_sm = 233472 / (c->sharedMemBytes + 1024ull);
    unsigned long long size = (unsigned long long)cluster[0] * cluster[1] * cluster[2], total = 0;
    for (unsigned i = 0; i < sizeof gpc_sms / sizeof gpc_sms[0]; i++) total += gpc_sms[i] * per_sm / size;
    *n = (int)total;
    return 0;
}

// ---- tensor maps ----

// cuTensorMapEncodeTiled validates as the driver documents (rank 1-5,
// 16-byte aligned address, strides multiples of 16, boxes 1-256, a swizzled
// box row no wider than the swizzle, byte elements only here) and, in place
// of the opaque encoding, records its arguments: word 0 "TMAPFAKE", word 1
// dtype | rank << 8 | interleave << 16 | swizzle << 24 | l2 << 32 | oob << 40,
// word 2 the address, words 3-7 the dims, 8-11 the strides, then the box
// sizes as 5 uint16 and the element strides as 5 bytes.
typedef struct { _Alignas(64) unsigned long long w[16]; } CUtensorMap;
CUresult cuTensorMapEncodeTiled(CUtensorMap* m, int dtype, unsigned rank, void* addr, const unsigned long long* dims,
                                const unsigned long long* strides, const unsigned* box, const unsigned* elem,
                                int interleave, int swizzle, int l2, int oob) {
    if (!m || rank < 1 || rank > 5 || ((uintptr_t)addr & 15) || dtype != 0) return CUDA_ERROR_INVALID_VALUE;
    if (interleave || swizzle < 0 || swizzle > 3 || l2 < 0 || l2 > 3 || oob < 0 || oob > 1) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i + 1 < rank; i++)
        if (strides[i] % 16) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < rank; i++) {
        if (!box[i] || box[i] > 256 || !elem[i] || elem[i] > 8 || !dims[i]) return CUDA_ERROR_INVALID_VALUE;
    }
    static const unsigned swizzle_bytes[] = {0, 32, 64, 128};
    if (swizzle && box[0] > swizzle_bytes[swizzle]) return CUDA_ERROR_INVALID_VALUE;
    memset(m, 0, sizeof(*m));
    memcpy(&m->w[0], "TMAPFAKE", 8);
    m->w[1] = (unsigned long long)dtype | (unsigned long long)rank << 8 | (unsigned long long)interleave << 16 |
              (unsigned long long)swizzle << 24 | (unsigned long long)l2 << 32 | (unsigned long long)oob << 40;
    m->w[2] = (unsigned long long)(uintptr_t)addr;
    for (unsigned i = 0; i < rank; i++) m->w[3 + i] = dims[i];
    for (unsigned i = 0; i + 1 < rank; i++) m->w[8 + i] = strides[i];
    unsigned char* tail = (unsigned char*)&m->w[12];
    for (unsigned i = 0; i < rank; i++) {
        tail[2 * i] = box[i] & 0xff;
        tail[2 * i + 1] = box[i] >> 8;
        tail[10 + i] = (unsigned char)elem[i];
    }
    return 0;
}

// ---- graphs ----

CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long flags) {
    NEED_CONTEXT();
    if (!g || flags) return CUDA_ERROR_INVALID_VALUE;
    graph_t* copy = malloc(sizeof(graph_t));
    memcpy(copy, g, sizeof(graph_t));
    *e = copy;
    return 0;
}
CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    NEED_CONTEXT();
    (void)s;
    graph_t* g = e;
    for (int i = 0; i < g->n; i++) {
        node_t* nd = &g->nodes[i];
        char* slot[12];
        size_t off = 0;
        for (int j = 0; j < nd->k->nparams; j++) {
            slot[j] = nd->args + off;
            off += (nd->k->sizes[j] + 7) & ~(size_t)7;
        }
        running = nd;
        nd->k->run(slot, nd->grid[0] * nd->block[0]);
        running = 0;
    }
    return 0;
}
CUresult cuGraphExecDestroy(CUgraphExec e) { NEED_CONTEXT(); free(e); return 0; }
CUresult cuGraphDestroy(CUgraph g) { NEED_CONTEXT(); free(g); return 0; }
