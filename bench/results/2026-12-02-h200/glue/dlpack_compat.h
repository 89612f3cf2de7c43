// Force-included into the SGLang build (not committed): tvm-ffi 0.1.11's c_env_api.h names
// DLPackManagedTensorAllocator, which DLPack declares from 1.2 on; the dlpack snapshot here is 1.1.
#pragma once
#include <dlpack/dlpack.h>
#if DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION < 2
typedef int (*DLPackManagedTensorAllocator)(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
                                            void (*SetError)(void* error_ctx, const char* kind, const char* message));
#endif
