// Glue (not committed): launches vLLM's DSv4 fused Q-norm/RoPE + KV RoPE/UE8M0/insert kernel
// (csrc/libtorch_stable/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu) from raw pointers,
// through its own launch wrapper (launchFusedDeepseekV4QNormRopeKVRopeQuantInsert), as its torch
// op fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert does after the checks.
#include "fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu"

#include <cstdio>
#include <exception>

extern "C" int vllm_dsv4_qnorm_rope_kv_insert(const void* q_in, void* q_out, const void* kv_in, uint8_t* k_cache,
                                              const int64_t* slot_mapping, const int64_t* position_ids,
                                              const float* cos_sin_cache, float eps, int num_tokens_full,
                                              int num_tokens_insert, int num_heads_q, int num_heads_q_padded,
                                              int cache_block_size, int kv_block_stride, void* stream) {
  try {
    using T = c10::BFloat16;
    vllm::deepseek_v4_fused_ops::launchFusedDeepseekV4QNormRopeKVRopeQuantInsert<T>(
        static_cast<const T*>(q_in), static_cast<T*>(q_out), static_cast<const T*>(kv_in), k_cache, slot_mapping,
        position_ids, cos_sin_cache, eps, num_tokens_full, num_tokens_insert, num_heads_q, num_heads_q_padded,
        cache_block_size, kv_block_stride, static_cast<cudaStream_t>(stream));
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      std::fprintf(stderr, "vllm_dsv4_qnorm_rope_kv_insert: %s\n", cudaGetErrorString(err));
      return 2;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vllm_dsv4_qnorm_rope_kv_insert: %s\n", e.what());
    return 1;
  }
}
