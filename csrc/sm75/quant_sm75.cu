// Pre-processing for the sm75 attention kernel: K mean (smooth_k), fused INT8
// quantization of Q and K, and V converted to fp16 and transposed.
// Semantics: docs/architecture.md, "Quantization semantics" (per_warp, sm75).
#include <cstdint>

#include "elem_sm75.cuh"
#include "launchers.h"

namespace sageattention_sm75 {
namespace {

constexpr int kLanesPerRow = 8;  // threads that share one token's head dim

// Partial sums of K over chunks of kMeanChunk tokens, per (b, kv head, channel).
// Two passes (partials, then finalize) keep the sum deterministic.
template <typename T, int D>
__global__ void __launch_bounds__(256) k_mean_partial_kernel(TensorRef k, int kv_len,
                                                             float* part, int n_chunks) {
  constexpr int kRowsPerPass = 256 / D;
  __shared__ float red[kRowsPerPass][D];
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int c = threadIdx.x % D, r = threadIdx.x / D;
  const T* base = static_cast<const T*>(k.data) + b * k.stride_b + h * k.stride_h;
  const int n_end = min(kv_len, (chunk + 1) * kMeanChunk);
  float acc = 0.f;
  for (int n = chunk * kMeanChunk + r; n < n_end; n += kRowsPerPass) {
    acc += to_float(base[n * k.stride_n + c]);
  }
  red[r][c] = acc;
  __syncthreads();
  if (r == 0) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) s += red[i][c];
    part[((static_cast<int64_t>(b) * gridDim.y + h) * n_chunks + chunk) * D + c] = s;
  }
}

template <int D>
__global__ void k_mean_finalize_kernel(const float* part, int n_chunks, int kv_len,
                                       float* mean) {
  const int h = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const int64_t bh = static_cast<int64_t>(b) * gridDim.x + h;
  float s = 0.f;
  for (int i = 0; i < n_chunks; ++i) s += part[(bh * n_chunks + i) * D + c];
  mean[bh * D + c] = s / static_cast<float>(kv_len);
}

enum class MeanUse : int { kNone = 0, kSubtract = 1, kDot = 2 };

// One block quantizes ROWS tokens of one (b, head) with a single scale.
// Thread (r, p) holds channels p, p + 8, ... of token r: loads stay coalesced and
// the per-token dot product (LSE correction) reduces over 8 neighbouring lanes.
//   pre_scale: multiplies x before quantization (Q: sm_scale * log2(e); K: 1)
//   mean:      [B, H / heads_per_mean, D]; subtracted (K) or dotted with (Q)
template <typename T, int D, int ROWS, MeanUse USE>
__global__ void __launch_bounds__(ROWS * kLanesPerRow) quantize_kernel(
    TensorRef src, int len, int len_pad, float pre_scale, const float* mean,
    int heads_per_mean, float dot_scale, int8_t* dst, float* dst_scale, float* dot_out) {
  constexpr int kThreads = ROWS * kLanesPerRow;
  constexpr int kPerThread = D / kLanesPerRow;
  __shared__ float warp_max[kThreads / 32];

  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, n_heads = gridDim.y;
  const int r = threadIdx.x / kLanesPerRow, p = threadIdx.x % kLanesPerRow;
  const int n = blk * ROWS + r;
  const bool valid = n < len;
  const T* row = static_cast<const T*>(src.data) + b * src.stride_b + h * src.stride_h +
                 static_cast<int64_t>(valid ? n : 0) * src.stride_n;
  const float* mrow = nullptr;
  if constexpr (USE != MeanUse::kNone) {
    mrow = mean + (static_cast<int64_t>(b) * (n_heads / heads_per_mean) + h / heads_per_mean) * D;
  }

  float x[kPerThread];
  float dot = 0.f, amax = 0.f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int c = p + kLanesPerRow * i;
    float v = valid ? to_float(row[c]) : 0.f;
    if constexpr (USE == MeanUse::kSubtract) v = valid ? v - mrow[c] : 0.f;
    if constexpr (USE == MeanUse::kDot) dot += v * mrow[c];
    v *= pre_scale;
    x[i] = v;
    amax = fmaxf(amax, fabsf(v));
  }

  if constexpr (USE == MeanUse::kDot) {
#pragma unroll
    for (int off = 1; off < kLanesPerRow; off <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (p == 0 && n < len_pad) {
      dot_out[(static_cast<int64_t>(b) * n_heads + h) * len_pad + n] = valid ? dot * dot_scale : 0.f;
    }
  }

#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);

  // Floor keeps an all-zero block (tails, zero input) from dividing by zero.
  const float scale = fmaxf(amax / 127.f, 1e-8f);
  int8_t* out = dst + ((static_cast<int64_t>(b) * n_heads + h) * len_pad + n) * D;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    // Round half to even (cvt.rni), like torch.round; tails are zero already.
    int qv = __float2int_rn(x[i] / scale);
    qv = max(-127, min(127, qv));
    out[p + kLanesPerRow * i] = static_cast<int8_t>(qv);
  }
  if (threadIdx.x == 0) {
    dst_scale[(static_cast<int64_t>(b) * n_heads + h) * (len_pad / ROWS) + blk] = scale;
  }
}

// V -> fp16, transposed to [D, tokens] so that one 32-bit word holds the two
// consecutive keys of a channel that an m16n8k8 B fragment needs.
template <typename T, int D>
__global__ void __launch_bounds__(256) transpose_v_kernel(TensorRef v, int kv_len, int kv_pad,
                                                          __half* vt) {
  constexpr int kStride = D + 2;  // odd word stride: conflict-free column reads
  __shared__ __half tile[kBlockK][kStride];
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, n_heads = gridDim.y;
  const T* base = static_cast<const T*>(v.data) + b * v.stride_b + h * v.stride_h;
  for (int e = threadIdx.x; e < kBlockK * D; e += blockDim.x) {
    const int r = e / D, c = e % D, n = blk * kBlockK + r;
    tile[r][c] = n < kv_len ? __float2half_rn(to_float(base[static_cast<int64_t>(n) * v.stride_n + c]))
                            : __float2half_rn(0.f);
  }
  __syncthreads();
  __half* out = vt + (static_cast<int64_t>(b) * n_heads + h) * D * kv_pad + blk * kBlockK;
  for (int e = threadIdx.x; e < kBlockK * D; e += blockDim.x) {
    const int c = e / kBlockK, r = e % kBlockK;
    out[static_cast<int64_t>(c) * kv_pad + r] = tile[r][c];
  }
}

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace

cudaError_t launch_k_mean(const Problem& p, const TensorRef& k, const Workspace& ws,
                          cudaStream_t stream) {
  const int n_chunks = static_cast<int>(mean_chunks(p.kv_len));
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    k_mean_partial_kernel<T, D><<<dim3(n_chunks, p.kv_heads, p.batch), 256, 0, stream>>>(
        k, p.kv_len, ws.k_mean_part, n_chunks);
    k_mean_finalize_kernel<D><<<dim3(p.kv_heads, p.batch), D, 0, stream>>>(
        ws.k_mean_part, n_chunks, p.kv_len, ws.k_mean);
    return cudaGetLastError();
  });
}

cudaError_t launch_quantize_q(const Problem& p, const TensorRef& q, const Workspace& ws,
                              cudaStream_t stream) {
  const int len_pad = static_cast<int>(padded_q_len(p.q_len));
  const dim3 grid(len_pad / kWarpQ, p.q_heads, p.batch);
  const float pre = p.sm_scale * kLog2e;
  const int group = p.q_heads / p.kv_heads;
  const bool corr = p.smooth_k && p.return_lse;
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    constexpr int kThreads = kWarpQ * kLanesPerRow;
    if (corr) {
      quantize_kernel<T, D, kWarpQ, MeanUse::kDot><<<grid, kThreads, 0, stream>>>(
          q, p.q_len, len_pad, pre, ws.k_mean, group, p.sm_scale, ws.q_int8, ws.q_scale,
          ws.lse_corr);
    } else {
      quantize_kernel<T, D, kWarpQ, MeanUse::kNone><<<grid, kThreads, 0, stream>>>(
          q, p.q_len, len_pad, pre, nullptr, 1, 0.f, ws.q_int8, ws.q_scale, nullptr);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_quantize_k(const Problem& p, const TensorRef& k, const Workspace& ws,
                              cudaStream_t stream) {
  const int len_pad = static_cast<int>(padded_kv_len(p.kv_len));
  const dim3 grid(len_pad / kBlockK, p.kv_heads, p.batch);
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    constexpr int kThreads = kBlockK * kLanesPerRow;
    if (p.smooth_k) {
      quantize_kernel<T, D, kBlockK, MeanUse::kSubtract><<<grid, kThreads, 0, stream>>>(
          k, p.kv_len, len_pad, 1.f, ws.k_mean, 1, 0.f, ws.k_int8, ws.k_scale, nullptr);
    } else {
      quantize_kernel<T, D, kBlockK, MeanUse::kNone><<<grid, kThreads, 0, stream>>>(
          k, p.kv_len, len_pad, 1.f, nullptr, 1, 0.f, ws.k_int8, ws.k_scale, nullptr);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_transpose_v(const Problem& p, const TensorRef& v, const Workspace& ws,
                               cudaStream_t stream) {
  const int len_pad = static_cast<int>(padded_kv_len(p.kv_len));
  const dim3 grid(len_pad / kBlockK, p.kv_heads, p.batch);
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    transpose_v_kernel<T, D><<<grid, 256, 0, stream>>>(v, p.kv_len, len_pad,
                                                       static_cast<__half*>(ws.v_t));
    return cudaGetLastError();
  });
}

}  // namespace sageattention_sm75
