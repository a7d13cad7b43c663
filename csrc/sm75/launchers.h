// Plain C++ interface of the sm75 kernels: raw pointers, sizes, strides and a
// stream. No torch headers here or in the .cu files, so the compiled kernel
// objects do not depend on the torch version (the factory caches them).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "v16_scale.h"

namespace sageattention_sm75 {

// Block sizes of this family (docs/architecture.md, "Granularity"; sageattention.reference's
// FAMILY_BLOCK_SIZES["sm75"]).
constexpr int kWarpQ = 16;    // query tokens per warp (one m16 tile of S)
constexpr int kBlockK = 32;   // key tokens per K block
constexpr int kCtaQ = 64;     // query tokens per thread block (4 warps)
constexpr int kChannelChunk = 256;  // key tokens per partial of a channel's K sum or V amax

enum class ElemType : int { kFloat16 = 0, kBFloat16 = 1 };

// bfloat16 V is divided per channel by a power of two s with max |V| / s in (kV16Max / 2, kV16Max]
// before its fp16 conversion, and the output channel multiplied by s (v16_scale.h): V past fp16's
// 65504 fits, and a small V keeps its bits instead of falling into fp16's subnormals (before audit
// 30, s >= 1 only: a bfloat16 V of magnitude 1e-7 came out 17% off in relative L1, 1e-8 as zeros).
// Which inputs get those scales (a float16 V fits as given: no scales, no extra pass).
constexpr bool scales_v(ElemType dtype) { return dtype == ElemType::kBFloat16; }

// Which tokens share one INT8 scale. per_warp: the kWarpQ rows of a warp (Q), the kBlockK keys of
// a block (K). per_thread: what one mma thread (lane = 4g + t) holds, so that it still needs only
// one Q scale and one K scale per block: Q rows g and g + 8 of its warp's m8n8k16 A tiles, K
// columns 2t, 2t + 1 of every n8 tile of the block.
enum class QuantGran : int { kPerWarp = 0, kPerThread = 1 };

constexpr int q_scales_per_warp(QuantGran g) { return g == QuantGran::kPerThread ? 8 : 1; }
constexpr int k_scales_per_block(QuantGran g) { return g == QuantGran::kPerThread ? 4 : 1; }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t padded_q_len(int64_t q_len) { return round_up(q_len, kCtaQ); }
inline int64_t padded_kv_len(int64_t kv_len) { return round_up(kv_len, kBlockK); }
inline int64_t channel_chunks(int64_t kv_len) {
  return (kv_len + kChannelChunk - 1) / kChannelChunk;
}
// Scales per (batch, head), counted over the padded lengths.
inline int64_t q_scale_count(int64_t q_len, QuantGran g) {
  return padded_q_len(q_len) / kWarpQ * q_scales_per_warp(g);
}
inline int64_t k_scale_count(int64_t kv_len, QuantGran g) {
  return padded_kv_len(kv_len) / kBlockK * k_scales_per_block(g);
}

// A 4-D input or output seen as [batch, heads, tokens, head_dim]; strides in
// elements for batch, head and token; the head dim must be contiguous.
struct TensorRef {
  void* data;
  int64_t stride_b;
  int64_t stride_h;
  int64_t stride_n;
};

struct Problem {
  int batch;
  int q_heads;
  int kv_heads;
  int q_len;
  int kv_len;
  int head_dim;  // 64 or 128
  ElemType dtype;  // of q, k, v and the output
  float sm_scale;
  QuantGran qk_quant_gran;  // of both Q and K
  bool is_causal;
  bool smooth_k;
  bool return_lse;
};

// Scratch buffers the caller allocates (sizes from the helpers above).
struct Workspace {
  int8_t* q_int8;       // [B, Hq, padded_q_len, D]
  float* q_scale;       // [B, Hq, q_scale_count]
  int8_t* k_int8;       // [B, Hkv, padded_kv_len, D]
  float* k_scale;       // [B, Hkv, k_scale_count]
  void* v_t;            // fp16 [B, Hkv, D, padded_kv_len] (V transposed, divided by v_scale)
  float* k_mean_part;   // [B, Hkv, channel_chunks, D]   (smooth_k only)
  float* k_mean;        // [B, Hkv, D]                   (smooth_k only)
  float* v_amax_part;   // [B, Hkv, channel_chunks, D]   (bfloat16 only)
  float* v_scale;       // [B, Hkv, D] powers of two     (bfloat16 only; nullptr for float16)
  float* lse_corr;      // [B, Hq, padded_q_len]         (smooth_k and return_lse only)
};

// Quantizes Q and K (fused scale, mean subtraction, zero-filled tails), converts
// and transposes V (a bfloat16 V first scaled per channel: kV16Max), then runs
// attention. out: the output in the same element type; lse: fp32 [B, Hq, q_len]
// contiguous, or nullptr when !return_lse.
// Returns the first CUDA error met (launches are asynchronous on `stream`).
cudaError_t qk_int8_pv_fp16(const Problem& p, const TensorRef& q, const TensorRef& k,
                            const TensorRef& v, const TensorRef& out, float* lse,
                            const Workspace& ws, cudaStream_t stream);

// Steps, exposed for the launcher above (each returns cudaGetLastError()).
cudaError_t launch_k_mean(const Problem& p, const TensorRef& k, const Workspace& ws,
                          cudaStream_t stream);
cudaError_t launch_quantize_q(const Problem& p, const TensorRef& q, const Workspace& ws,
                              cudaStream_t stream);
cudaError_t launch_quantize_k(const Problem& p, const TensorRef& k, const Workspace& ws,
                              cudaStream_t stream);
cudaError_t launch_v_scale(const Problem& p, const TensorRef& v, const Workspace& ws,
                           cudaStream_t stream);
cudaError_t launch_transpose_v(const Problem& p, const TensorRef& v, const Workspace& ws,
                               cudaStream_t stream);
cudaError_t launch_attention(const Problem& p, const TensorRef& out, float* lse,
                             const Workspace& ws, cudaStream_t stream);

}  // namespace sageattention_sm75
