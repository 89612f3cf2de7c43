// Glue (not committed): launches SGLang's DSv4 main-path prologue kernels
// (python/sglang/kernels/jit/csrc/deepseek_v4/main_norm_rope.cuh) from raw
// pointers, as their FusedQNormRopeKernel / FusedKNormRopeFlashMLAKernel
// forward() do after the tensor checks: same grid, block, PDL attribute.
#include <csrc/deepseek_v4/main_norm_rope.cuh>

#include <cstdio>
#include <exception>

namespace {
using bf16 = __nv_bfloat16;
constexpr int64_t kHead = 512, kRope = 64;
}  // namespace

extern "C" int sgl_q_norm_rope(const void* q_in, void* q_out, const float* freqs, const int32_t* positions,
                               int64_t in_stride, int64_t out_stride, uint32_t batch, uint32_t heads, float eps,
                               void* stream) {
  try {
    using namespace sglang;
    const auto params = FusedQNormRopeParams{
        .q_input = q_in,
        .q_output = q_out,
        .freqs_cis = freqs,
        .positions = positions,
        .q_input_stride_batch = in_stride,
        .q_output_stride_batch = out_stride,
        .batch_size = batch,
        .num_q_heads = heads,
        .eps = eps,
    };
    const auto blocks = host::div_ceil(batch * heads, kFusedQNumWarps);
    const auto k = fused_q_norm_rope<bf16, kHead, kRope, int32_t, true>;
    host::LaunchKernel(blocks, kFusedQBlockSize, static_cast<cudaStream_t>(stream)).enable_pdl(true)(k, params);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sgl_q_norm_rope: %s\n", e.what());
    return 1;
  }
}

extern "C" int sgl_k_norm_rope_flashmla(const void* kv, const void* kv_weight, const float* freqs,
                                        const int32_t* positions, const int32_t* out_loc, uint8_t* cache,
                                        int64_t kv_stride, uint32_t batch, float eps, void* stream) {
  try {
    using namespace sglang;
    const auto params = FusedKNormRopeFlashMLAParams{
        .kv = kv,
        .kv_weight = kv_weight,
        .freqs_cis = freqs,
        .positions = positions,
        .out_loc = out_loc,
        .kvcache = cache,
        .kv_stride_batch = kv_stride,
        .batch_size = batch,
        .eps = eps,
    };
    // Page size 64 (kPageBits 6), as FusedKNormRopeFlashMLAKernel<..., 64, true>.
    const auto k = fused_k_norm_rope_flashmla<bf16, kHead, kRope, int32_t, 6, true>;
    host::LaunchKernel(batch, kFusedKBlockSize, static_cast<cudaStream_t>(stream)).enable_pdl(true)(k, params);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sgl_k_norm_rope_flashmla: %s\n", e.what());
    return 1;
  }
}
