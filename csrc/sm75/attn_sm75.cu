// Attention for Turing: S = Q K^T with INT8 mma.sync m8n8k16, online base-2
// softmax in fp32, O += P V with fp16 mma.sync m16n8k8 and fp32 accumulators.
// One warp owns kWarpQ = 16 query rows; the block walks K/V in blocks of kBlockK = 32 keys,
// double-buffered in shared memory. Each thread reads one Q scale and one K scale per block:
// per_warp, the warp's and the block's; per_thread, those of its rows g, g + 8 and of its key
// columns 2t, 2t + 1 (launchers.h, QuantGran).
#include <cstdint>
#include <type_traits>

#include "elem_sm75.cuh"
#include "launchers.h"
#include "mma_sm75.cuh"

namespace sageattention_sm75 {
namespace {

constexpr int kWarps = kCtaQ / kWarpQ;  // 4
constexpr int kThreads = kWarps * 32;
constexpr float kLn2 = 0.6931471805599453f;

struct AttnArgs {
  const int8_t* q;       // [B, Hq, q_pad, D]
  const float* q_scale;  // [B, Hq, q_pad / 16 * q_groups], includes sm_scale * log2(e)
  const int8_t* k;       // [B, Hkv, kv_pad, D]
  const float* k_scale;  // [B, Hkv, kv_pad / 32 * k_groups]
  const __half* vt;      // [B, Hkv, D, kv_pad], V divided by v_scale
  const float* v_scale;  // [B, Hkv, D] powers of two (bfloat16) or nullptr (float16: scale 1)
  void* out;
  int64_t out_sb, out_sh, out_sn;
  float* lse;             // [B, Hq, q_len] or nullptr
  const float* lse_corr;  // [B, Hq, q_pad] or nullptr
  int q_heads, kv_heads, q_len, kv_len, q_pad, kv_pad;
  int q_groups;  // Q scales per warp's 16 rows: 1 (per_warp) or 8 (per_thread, one per g)
  int k_groups;  // K scales per 32-key block: 1 (per_warp) or 4 (per_thread, one per t)
};

template <int D>
struct Smem {
  // Row paddings make the fragment reads conflict-free: K rows are 4 words
  // apart mod 32 banks (lane (g, t) -> bank 4g + t), V^T rows 20 words.
  static constexpr int kKStride = D + 16;  // bytes
  static constexpr int kVStride = kBlockK + 8;  // halves
  int8_t k[2][kBlockK][kKStride];
  __half v[2][D][kVStride];
};

// Each thread's share of one K block (int8) and one V^T block (fp16), in 16-byte chunks.
template <int D>
struct TileRegs {
  static constexpr int kKChunks = kBlockK * D / 16 / kThreads;
  static constexpr int kVChunks = D * kBlockK * 2 / 16 / kThreads;
  uint4 k[kKChunks];
  uint4 v[kVChunks];

  __device__ __forceinline__ void load(const int8_t* kg, const __half* vg, int kv_pad, int blk) {
    const int8_t* kb = kg + static_cast<int64_t>(blk) * kBlockK * D;
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;  // chunk id; D / 16 chunks per row
      k[i] = *reinterpret_cast<const uint4*>(kb + c * 16);
    }
#pragma unroll
    for (int i = 0; i < kVChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;  // 4 chunks (32 keys) per channel
      const int ch = c / 4, part = c % 4;
      v[i] = *reinterpret_cast<const uint4*>(vg + static_cast<int64_t>(ch) * kv_pad +
                                             blk * kBlockK + part * 8);
    }
  }

  __device__ __forceinline__ void store(Smem<D>& s, int buf) const {
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int row = c / (D / 16), col = (c % (D / 16)) * 16;
      *reinterpret_cast<uint4*>(&s.k[buf][row][col]) = k[i];
    }
#pragma unroll
    for (int i = 0; i < kVChunks; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int ch = c / 4, part = c % 4;
      *reinterpret_cast<uint4*>(&s.v[buf][ch][part * 8]) = v[i];
    }
  }
};

template <typename OutT, int D, bool CAUSAL>
__global__ void __launch_bounds__(kThreads) attn_kernel(const AttnArgs a) {
  __shared__ __align__(16) Smem<D> smem;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (a.q_heads / a.kv_heads);
  const int q0 = blockIdx.x * kCtaQ;
  const int wq0 = q0 + warp * kWarpQ;
  const int64_t bh = static_cast<int64_t>(b) * a.q_heads + h;
  const int64_t bhk = static_cast<int64_t>(b) * a.kv_heads + hk;

  // Q fragments stay in registers: [k16 step][rows g / g + 8].
  uint32_t qf[D / 16][2];
  const int8_t* qw = a.q + (bh * a.q_pad + wq0) * D;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      qf[kk][hh] = *reinterpret_cast<const uint32_t*>(qw + (hh * 8 + g) * D + kk * 16 + 4 * t);
    }
  }
  const float q_scale =
      a.q_scale[(bh * (a.q_pad / kWarpQ) + wq0 / kWarpQ) * a.q_groups + (a.q_groups > 1 ? g : 0)];
  const float* k_scale =
      a.k_scale + bhk * (a.kv_pad / kBlockK) * a.k_groups + (a.k_groups > 1 ? t : 0);
  const int8_t* kg = a.k + bhk * a.kv_pad * D;
  const __half* vg = a.vt + bhk * D * a.kv_pad;

  float o[D / 8][4];
#pragma unroll
  for (int c = 0; c < D / 8; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // per-thread partial row sums, reduced at the end

  // Causal: keys past the block's last query row are never needed.
  const int kv_end = CAUSAL ? min(a.kv_len, q0 + kCtaQ) : a.kv_len;
  const int n_blocks = (kv_end + kBlockK - 1) / kBlockK;

  TileRegs<D> regs;
  regs.load(kg, vg, a.kv_pad, 0);
  regs.store(smem, 0);
  __syncthreads();

  for (int blk = 0; blk < n_blocks; ++blk) {
    const int buf = blk & 1;
    const bool has_next = blk + 1 < n_blocks;
    if (has_next) regs.load(kg, vg, a.kv_pad, blk + 1);  // in flight during the math

    const int k0 = blk * kBlockK;
    if (!CAUSAL || k0 <= wq0 + kWarpQ - 1) {  // warp-uniform: some key visible to this warp
      int32_t sacc[4][2][2];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) sacc[j][hh][0] = sacc[j][hh][1] = 0;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t kb =
              *reinterpret_cast<const uint32_t*>(&smem.k[buf][j * 8 + g][kk * 16 + 4 * t]);
          mma_m8n8k16_s8(sacc[j][0], qf[kk][0], kb);
          mma_m8n8k16_s8(sacc[j][1], qf[kk][1], kb);
        }
      }

      const float sc = q_scale * k_scale[blk * a.k_groups];
      const bool need_mask = (k0 + kBlockK > a.kv_len) || (CAUSAL && k0 + kBlockK - 1 > wq0);
      float s[4][2][2];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float x = static_cast<float>(sacc[j][hh][i]) * sc;
            if (need_mask) {
              const int key = k0 + j * 8 + 2 * t + i;
              const int row = wq0 + hh * 8 + g;
              if (key >= a.kv_len || (CAUSAL && key > row)) x = -INFINITY;
            }
            s[j][hh][i] = x;
          }

      // Online softmax, base 2 (the log2(e) factor is in the Q scale).
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fmaxf(s[j][hh][0], s[j][hh][1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[hh], mx);
        // A row with nothing visible yet keeps m = -inf; use 0 so no inf - inf = NaN.
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m[hh] - m_use);
        m[hh] = m_new;
        l[hh] *= alpha;
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
          o[c][2 * hh] *= alpha;
          o[c][2 * hh + 1] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float pv = exp2f(s[j][hh][i] - m_use);
            s[j][hh][i] = pv;
            l[hh] += pv;
          }
      }

      // O += P V: the S tile of keys 8j..8j+7 is the A fragment of k8 step j.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a0 = pack_half2(s[j][0][0], s[j][0][1]);
        const uint32_t a1 = pack_half2(s[j][1][0], s[j][1][1]);
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
          const uint32_t vb =
              *reinterpret_cast<const uint32_t*>(&smem.v[buf][c * 8 + g][j * 8 + 2 * t]);
          mma_m16n8k8_f16_f32(o[c], a0, a1, vb);
        }
      }
    }

    if (has_next) regs.store(smem, buf ^ 1);  // that buffer was last read before the previous barrier
    __syncthreads();
  }

  // Epilogue: full row sums, normalize, undo V's channel scales, write O (and the natural-log LSE).
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
  }
  OutT* out = static_cast<OutT*>(a.out) + b * a.out_sb + h * a.out_sh;
  // A bfloat16 V's channel scales (launchers.h, scales_v), this thread's columns 2t, 2t + 1. The
  // offset is recomputed from blockIdx rather than from bhk: bhk kept live costs registers.
  const int64_t v_bh = static_cast<int64_t>(blockIdx.z) * a.kv_heads +
                       blockIdx.y / (a.q_heads / a.kv_heads);
  const float* v_scale = a.v_scale + v_bh * D + 2 * t;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = wq0 + hh * 8 + g;
    if (row >= a.q_len) continue;
    const float inv = l[hh] > 0.f ? 1.f / l[hh] : 0.f;
    OutT* orow = out + static_cast<int64_t>(row) * a.out_sn;
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      float o0 = o[c][2 * hh] * inv, o1 = o[c][2 * hh + 1] * inv;
      if (std::is_same_v<OutT, __nv_bfloat16> && a.v_scale != nullptr) {  // exact: powers of two
        const float2 vs = *reinterpret_cast<const float2*>(v_scale + c * 8);
        o0 *= vs.x;
        o1 *= vs.y;
      }
      store_pair(orow + c * 8 + 2 * t, o0, o1);
    }
    if (a.lse != nullptr && t == 0) {
      float lse = (m[hh] + log2f(l[hh])) * kLn2;
      if (a.lse_corr != nullptr) lse += a.lse_corr[bh * a.q_pad + row];
      a.lse[bh * a.q_len + row] = lse;
    }
  }
}

}  // namespace

cudaError_t launch_attention(const Problem& p, const TensorRef& out, float* lse,
                             const Workspace& ws, cudaStream_t stream) {
  AttnArgs a;
  a.q = ws.q_int8;
  a.q_scale = ws.q_scale;
  a.k = ws.k_int8;
  a.k_scale = ws.k_scale;
  a.vt = static_cast<const __half*>(ws.v_t);
  a.v_scale = scales_v(p.dtype) ? ws.v_scale : nullptr;
  a.out = out.data;
  a.out_sb = out.stride_b;
  a.out_sh = out.stride_h;
  a.out_sn = out.stride_n;
  a.lse = p.return_lse ? lse : nullptr;
  a.lse_corr = (p.return_lse && p.smooth_k) ? ws.lse_corr : nullptr;
  a.q_heads = p.q_heads;
  a.kv_heads = p.kv_heads;
  a.q_len = p.q_len;
  a.kv_len = p.kv_len;
  a.q_pad = static_cast<int>(padded_q_len(p.q_len));
  a.kv_pad = static_cast<int>(padded_kv_len(p.kv_len));
  a.q_groups = q_scales_per_warp(p.qk_quant_gran);
  a.k_groups = k_scales_per_block(p.qk_quant_gran);
  const dim3 grid(a.q_pad / kCtaQ, p.q_heads, p.batch);
  return SA75_DISPATCH_DTYPE_DIM(p.dtype, p.head_dim, {
    if (p.is_causal) {
      attn_kernel<T, D, true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      attn_kernel<T, D, false><<<grid, kThreads, 0, stream>>>(a);
    }
    return cudaGetLastError();
  });
}

cudaError_t qk_int8_pv_fp16(const Problem& p, const TensorRef& q, const TensorRef& k,
                            const TensorRef& v, const TensorRef& out, float* lse,
                            const Workspace& ws, cudaStream_t stream) {
  if (p.head_dim != 64 && p.head_dim != 128) return cudaErrorInvalidValue;
  if (p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0) return cudaErrorInvalidValue;
  if (p.q_len <= 0 || p.kv_len <= 0 || p.batch <= 0) return cudaErrorInvalidValue;
  if (p.qk_quant_gran != QuantGran::kPerWarp && p.qk_quant_gran != QuantGran::kPerThread) {
    return cudaErrorInvalidValue;
  }
  cudaError_t err = cudaSuccess;
  if (p.smooth_k && (err = launch_k_mean(p, k, ws, stream)) != cudaSuccess) return err;
  if ((err = launch_quantize_q(p, q, ws, stream)) != cudaSuccess) return err;
  if ((err = launch_quantize_k(p, k, ws, stream)) != cudaSuccess) return err;
  if (scales_v(p.dtype)) {
    if (ws.v_amax_part == nullptr || ws.v_scale == nullptr) return cudaErrorInvalidValue;
    if ((err = launch_v_scale(p, v, ws, stream)) != cudaSuccess) return err;
  }
  if ((err = launch_transpose_v(p, v, ws, stream)) != cudaSuccess) return err;
  return launch_attention(p, out, lse, ws, stream);
}

}  // namespace sageattention_sm75
