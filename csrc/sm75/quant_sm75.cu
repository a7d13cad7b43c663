// Pre-processing for the sm75 attention kernel: K mean (smooth_k), fused INT8
// quantization of Q and K, V's per-channel power-of-two scales (bfloat16 only), and V converted
// to fp16 and transposed.
// Semantics: docs/architecture.md, "Quantization semantics" (per_warp and per_thread, sm75).
#include <cstdint>
#include <type_traits>

#include "elem_sm75.cuh"
#include "launchers.h"

namespace sageattention_sm75 {
namespace {

constexpr int kLanesPerRow = 8;  // threads that share one token's head dim

// Per-channel reductions over the tokens of one (b, kv head): K's sum (for its mean) and V's amax.
struct SumOf {
  static __device__ __forceinline__ float of(float x) { return x; }
  static __device__ __forceinline__ float combine(float a, float b) { return a + b; }
};
struct AbsMaxOf {
  static __device__ __forceinline__ float of(float x) { return fabsf(x); }
  static __device__ __forceinline__ float combine(float a, float b) { return fmaxf(a, b); }
};

// Partials over chunks of kChannelChunk tokens, per (b, kv head, channel). Two passes (partials,
// then a finalize kernel) keep a sum deterministic; both reductions start from 0.
template <typename T, int D, typename Op>
__global__ void __launch_bounds__(256) channel_partial_kernel(TensorRef x, int kv_len,
                                                              float* part, int n_chunks) {
  constexpr int kRowsPerPass = 256 / D;
  __shared__ float red[kRowsPerPass][D];
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int c = threadIdx.x % D, r = threadIdx.x / D;
  const T* base = static_cast<const T*>(x.data) + b * x.stride_b + h * x.stride_h;
  const int n_end = min(kv_len, (chunk + 1) * kChannelChunk);
  float acc = 0.f;
  for (int n = chunk * kChannelChunk + r; n < n_end; n += kRowsPerPass) {
    acc = Op::combine(acc, Op::of(to_float(base[n * x.stride_n + c])));
  }
  red[r][c] = acc;
  __syncthreads();
  if (r == 0) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kRowsPerPass; ++i) s = Op::combine(s, red[i][c]);
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

template <int D>
__global__ void v_scale_finalize_kernel(const float* part, int n_chunks, float* scale) {
  const int h = blockIdx.x, b = blockIdx.y, c = threadIdx.x;
  const int64_t bh = static_cast<int64_t>(b) * gridDim.x + h;
  float amax = 0.f;
  for (int i = 0; i < n_chunks; ++i) amax = fmaxf(amax, part[(bh * n_chunks + i) * D + c]);
  scale[bh * D + c] = v16_scale_for(amax);
}

enum class MeanUse : int { kNone = 0, kSubtract = 1, kDot = 2 };

// Which of a quantization block's ROWS tokens share a scale: token r is in group
// (r % PERIOD) / SPAN, so a block has PERIOD / SPAN scales, stored at blk * kGroups + group
// (the order of sageattention.reference.scale_group_ids).
template <int ROWS, int PERIOD, int SPAN>
struct ScaleGroups {
  static_assert(ROWS % PERIOD == 0 && PERIOD % SPAN == 0, "groups must tile the block");
  static constexpr int kRows = ROWS;
  static constexpr int kGroups = PERIOD / SPAN;

  static __device__ __forceinline__ int of(int r) { return (r % PERIOD) / SPAN; }
  // The group's first row (the one that stores its scale).
  static __device__ __forceinline__ bool leads(int r) { return r < PERIOD && r % SPAN == 0; }
  // Max of row_max[] over the rows of group `grp`.
  static __device__ __forceinline__ float max_of(const float* row_max, int grp) {
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < ROWS / PERIOD; ++k)
#pragma unroll
      for (int s = 0; s < SPAN; ++s) m = fmaxf(m, row_max[k * PERIOD + grp * SPAN + s]);
    return m;
  }
};

using QPerWarp = ScaleGroups<kWarpQ, kWarpQ, kWarpQ>;
using QPerThread = ScaleGroups<kWarpQ, 8, 1>;      // rows g and g + 8
using KPerWarp = ScaleGroups<kBlockK, kBlockK, kBlockK>;
using KPerThread = ScaleGroups<kBlockK, 8, 2>;     // keys 8j + 2t and 8j + 2t + 1, j = 0..3
static_assert(QPerWarp::kGroups == q_scales_per_warp(QuantGran::kPerWarp), "Q per_warp");
static_assert(QPerThread::kGroups == q_scales_per_warp(QuantGran::kPerThread), "Q per_thread");
static_assert(KPerWarp::kGroups == k_scales_per_block(QuantGran::kPerWarp), "K per_warp");
static_assert(KPerThread::kGroups == k_scales_per_block(QuantGran::kPerThread), "K per_thread");

// One block quantizes G::kRows tokens of one (b, head) with G::kGroups scales.
// Thread (r, p) holds channels p, p + 8, ... of token r: loads stay coalesced, and the
// per-token reductions (amax, LSE correction dot) run over 8 neighbouring lanes.
//   pre_scale: multiplies x before quantization (Q: sm_scale * log2(e); K: 1)
//   mean:      [B, H / heads_per_mean, D]; subtracted (K) or dotted with (Q)
template <typename T, int D, typename G, MeanUse USE>
__global__ void __launch_bounds__(G::kRows * kLanesPerRow) quantize_kernel(
    TensorRef src, int len, int len_pad, float pre_scale, const float* mean,
    int heads_per_mean, float dot_scale, int8_t* dst, float* dst_scale, float* dot_out) {
  constexpr int kRows = G::kRows;
  constexpr int kPerThread = D / kLanesPerRow;
  __shared__ float row_max[kRows];

  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, n_heads = gridDim.y;
  const int r = threadIdx.x / kLanesPerRow, p = threadIdx.x % kLanesPerRow;
  const int n = blk * kRows + r;
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

  // Token amax, then each thread takes the max over its group's tokens.
#pragma unroll
  for (int off = 1; off < kLanesPerRow; off <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  }
  if (p == 0) row_max[r] = amax;
  __syncthreads();
  const int grp = G::of(r);
  amax = G::max_of(row_max, grp);

  // Floor keeps an all-zero group (tails, zero input) from dividing by zero.
  const float scale = fmaxf(amax / 127.f, 1e-8f);
  int8_t* out = dst + ((static_cast<int64_t>(b) * n_heads + h) * len_pad + n) * D;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    // Round half to even (cvt.rni), like torch.round; tails are zero already.
    int qv = __float2int_rn(x[i] / scale);
    qv = max(-127, min(127, qv));
    out[p + kLanesPerRow * i] = static_cast<int8_t>(qv);
  }
  if (p == 0 && G::leads(r)) {
    const int64_t groups = static_cast<int64_t>(len_pad / kRows) * G::kGroups;
    dst_scale[(static_cast<int64_t>(b) * n_heads + h) * groups + blk * G::kGroups + grp] = scale;
  }
}

// V -> fp16, transposed to [D, tokens] so that one 32-bit word holds the two
// consecutive keys of a channel that an m16n8k8 B fragment needs. scale: [B, H, D] powers of two
// that V is divided by first (bfloat16; exact), or nullptr (float16: V as given).
constexpr int kTransposeThreads = 256;

template <typename T, int D>
__global__ void __launch_bounds__(kTransposeThreads) transpose_v_kernel(
    TensorRef v, int kv_len, int kv_pad, const float* scale, __half* vt) {
  constexpr int kThreads = kTransposeThreads;
  static_assert(kThreads % D == 0, "each thread converts one channel, whatever its rows");
  constexpr int kStride = D + 2;  // odd word stride: conflict-free column reads
  __shared__ __half tile[kBlockK][kStride];
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, n_heads = gridDim.y;
  const T* base = static_cast<const T*>(v.data) + b * v.stride_b + h * v.stride_h;
  const int c = threadIdx.x % D;
  const float inv =
      scale != nullptr ? 1.f / scale[(static_cast<int64_t>(b) * n_heads + h) * D + c] : 1.f;
  for (int r = threadIdx.x / D; r < kBlockK; r += kThreads / D) {
    const int n = blk * kBlockK + r;
    const float x = n < kv_len ? to_float(base[static_cast<int64_t>(n) * v.stride_n + c]) : 0.f;
    tile[r][c] = __float2half_rn(x * inv);
  }
  __syncthreads();
  __half* out = vt + (static_cast<int64_t>(b) * n_heads + h) * D * kv_pad + blk * kBlockK;
  for (int e = threadIdx.x; e < kBlockK * D; e += kThreads) {
    const int c = e / kBlockK, r = e % kBlockK;
    out[static_cast<int64_t>(c) * kv_pad + r] = tile[r][c];
  }
}

constexpr float kLog2e = 1.4426950408889634f;

// Launch the Q / K quantization with scale groups G (the caller checks the launch).
template <typename T, int D, typename G>
void quantize_q(const Problem& p, const TensorRef& q, const Workspace& ws, cudaStream_t stream) {
  const int len_pad = static_cast<int>(padded_q_len(p.q_len));
  const dim3 grid(len_pad / G::kRows, p.q_heads, p.batch);
  constexpr int kThreads = G::kRows * kLanesPerRow;
  const float pre = p.sm_scale * kLog2e;
  if (p.smooth_k && p.return_lse) {
    quantize_kernel<T, D, G, MeanUse::kDot><<<grid, kThreads, 0, stream>>>(
        q, p.q_len, len_pad, pre, ws.k_mean, p.q_heads / p.kv_heads, p.sm_scale, ws.q_int8,
        ws.q_scale, ws.lse_corr);
  } else {
    quantize_kernel<T, D, G, MeanUse::kNone><<<grid, kThreads, 0, stream>>>(
        q, p.q_len, len_pad, pre, nullptr, 1, 0.f, ws.q_int8, ws.q_scale, nullptr);
  }
}

template <typename T, int D, typename G>
void quantize_k(const Problem& p, const TensorRef& k, const Workspace& ws, cudaStream_t stream) {
  const int len_pad = static_cast<int>(padded_kv_len(p.kv_len));
  const dim3 grid(len_pad / G::kRows, p.kv_heads, p.batch);
  constexpr int kThreads = G::kRows * kLanesPerRow;
  if (p.smooth_k) {
    quantize_kernel<T, D, G, MeanUse::kSubtract><<<grid, kThreads, 0, stream>>>(
        k, p.kv_len, len_pad, 1.f, ws.k_mean, 1, 0.f, ws.k_int8, ws.k_scale, nullptr);
  } else {
    quantize_kernel<T, D, G, MeanUse::kNone><<<grid, kThreads, 0, stream>>>(
        k, p.kv_len, len_pad, 1.f, nullptr, 1, 0.f, ws.k_int8, ws.k_scale, nullptr);
  }
}

// V's channel scales: bfloat16 only (scales_v); no float16 kernels, and a call for one is an error.
template <typename T, int D>
cudaError_t v_scale(const Problem& p, const TensorRef& v, const Workspace& ws, int n_chunks,
                    cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
    return cudaErrorInvalidValue;
  } else {
    channel_partial_kernel<T, D, AbsMaxOf><<<dim3(n_chunks, p.kv_heads, p.batch), 256, 0, stream>>>(
        v, p.kv_len, ws.v_amax_part, n_chunks);
    v_scale_finalize_kernel<D><<<dim3(p.kv_heads, p.batch), D, 0, stream>>>(
        ws.v_amax_part, n_chunks, ws.v_scale);
    return cudaGetLastError();
  }
}

}  // namespace

cudaError_t launch_k_mean(const Problem& p, const TensorRef& k, const Workspace& ws,
                          cudaStream_t stream) {
  const int n_chunks = static_cast<int>(channel_chunks(p.kv_len));
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    channel_partial_kernel<T, D, SumOf><<<dim3(n_chunks, p.kv_heads, p.batch), 256, 0, stream>>>(
        k, p.kv_len, ws.k_mean_part, n_chunks);
    k_mean_finalize_kernel<D><<<dim3(p.kv_heads, p.batch), D, 0, stream>>>(
        ws.k_mean_part, n_chunks, p.kv_len, ws.k_mean);
    return cudaGetLastError();
  });
}

cudaError_t launch_v_scale(const Problem& p, const TensorRef& v, const Workspace& ws,
                           cudaStream_t stream) {
  const int n_chunks = static_cast<int>(channel_chunks(p.kv_len));
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    return v_scale<T, D>(p, v, ws, n_chunks, stream);
  });
}

cudaError_t launch_quantize_q(const Problem& p, const TensorRef& q, const Workspace& ws,
                              cudaStream_t stream) {
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    if (p.qk_quant_gran == QuantGran::kPerThread) {
      quantize_q<T, D, QPerThread>(p, q, ws, stream);
    } else {
      quantize_q<T, D, QPerWarp>(p, q, ws, stream);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_quantize_k(const Problem& p, const TensorRef& k, const Workspace& ws,
                              cudaStream_t stream) {
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    if (p.qk_quant_gran == QuantGran::kPerThread) {
      quantize_k<T, D, KPerThread>(p, k, ws, stream);
    } else {
      quantize_k<T, D, KPerWarp>(p, k, ws, stream);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_transpose_v(const Problem& p, const TensorRef& v, const Workspace& ws,
                               cudaStream_t stream) {
  const int len_pad = static_cast<int>(padded_kv_len(p.kv_len));
  const dim3 grid(len_pad / kBlockK, p.kv_heads, p.batch);
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    transpose_v_kernel<T, D><<<grid, kTransposeThreads, 0, stream>>>(
        v, p.kv_len, len_pad, scales_v(p.dtype) ? ws.v_scale : nullptr,
        static_cast<__half*>(ws.v_t));
    return cudaGetLastError();
  });
}

}  // namespace sageattention_sm75
