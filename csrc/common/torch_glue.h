// Torch-side helpers shared by the families' bindings.cpp (the only torch-dependent sources):
// quantization wrappers, the attention ops' common halves (argument checks: op_checks.h). Never included by .cu files.
#pragma once
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <tuple>

#include "attn_params.h"
#include "grid_limits.h"
#include "message.h"
#include "op_checks.h"

namespace sage::glue {

constexpr double kLog2e = 1.4426950408889634;

inline DType dtype_of(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16;
}

// The kernels read 16-byte vectors along the head dim: last dim contiguous, other strides a
// multiple of 8 elements and a 16-byte aligned base. Anything else is copied once.
inline at::Tensor vector_friendly(const at::Tensor& x) {
  const bool ok = x.stride(3) == 1 && x.stride(0) % 8 == 0 && x.stride(1) % 8 == 0 &&
                  x.stride(2) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  if (ok) return x;
  at::Tensor c = x.contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

// vector_friendly, and no dimension of extent > 1 with stride 0 (a broadcast, e.g. expand()): the
// bulk tensor copy engine's maps (sm90_tma.cuh) take strides of at least 16 bytes.
inline at::Tensor tma_friendly(const at::Tensor& x) {
  at::Tensor c = vector_friendly(x);
  for (int d = 0; d < 3; ++d)
    if (c.size(d) > 1 && c.stride(d) == 0) return vector_friendly(c.contiguous());
  return c;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

using QuantInt8Launcher = cudaError_t (*)(const QuantInt8Params&, int, DType, cudaStream_t);

// INT8 quantization of Q (is_key=false) or K (is_key=true): returns the padded HND-contiguous
// int8 tensor [B, H, Npad, D] and fp32 scales [B, H, groups] (docs/architecture.md).
inline std::tuple<at::Tensor, at::Tensor> quant_int8(QuantInt8Launcher launch, const at::Tensor& x_in,
                                                     const c10::optional<at::Tensor>& mean,
                                                     bool hnd, QuantGran gran, bool is_key,
                                                     double scale_mult) {
  check_quant_int8_args(x_in, mean, hnd, scale_mult);
  const at::Tensor x = vector_friendly(x_in);
  const View X = view_of(x, hnd);
  const int block = is_key ? 64 : (gran == QuantGran::kPerBlock ? 128 : 32);
  const int groups = gran != QuantGran::kPerThread ? 1 : (is_key ? 4 : 8);
  const int64_t pad = round_up(X.N, is_key ? 64 : 128);
  at::Tensor mean_c;
  if (mean.has_value()) {
    mean_c = mean->to(at::kFloat).contiguous();  // shape and device: checked
    // the kernel loads it by 16-byte vectors (load_mean8): an fp32 slice at an offset is copied
    if (reinterpret_cast<uintptr_t>(mean_c.data_ptr()) % 16 != 0) mean_c = mean_c.clone();
  }
  auto out = at::empty({X.B, X.H, pad, X.D}, x.options().dtype(at::kChar));
  auto scale = at::empty({X.B, X.H, pad / block * groups}, x.options().dtype(at::kFloat));
  QuantInt8Params p{};
  p.x = x.data_ptr();
  p.x_sb = X.sb; p.x_sh = X.sh; p.x_sn = X.sn;
  p.mean = mean.has_value() ? mean_c.data_ptr<float>() : nullptr;
  p.out = out.data_ptr<int8_t>();
  p.scale_out = scale.data_ptr<float>();
  p.heads = X.H; p.tokens = X.N; p.padded_tokens = pad; p.head_dim = X.D;
  p.block_tokens = block; p.groups_per_block = groups;
  p.scale_groups = pad / block * groups;
  p.scale_mult = static_cast<float>(scale_mult);
  if (out.numel() == 0 || scale.numel() == 0) return {out, scale};  // no batch, heads or tokens: no launch
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = launch(p, X.B, dtype_of(x), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "quant_int8 launch failed: ", cudaGetErrorString(err));
  return {out, scale};
}

// Mean over tokens in fp32, [B, H, D] contiguous (ATen's).
inline at::Tensor token_mean(const at::Tensor& x, bool hnd) {
  return at::mean(x, {hnd ? 2 : 1}, false, at::kFloat).contiguous();
}

using TokenMeanLauncher = cudaError_t (*)(const VScaleParams&, int, DType, cudaStream_t);

#ifndef SAGE_TOKEN_MEAN_KERNEL
#define SAGE_TOKEN_MEAN_KERNEL 1  // tuning builds: 0 takes K's mean from ATen, as before 2026-12-06
#endif

// The token-statistics kernel's parameters for x (viewed as X, rows 16-byte aligned) and their
// scratch: `parts` partial results per chunk of tokens (v_scale_partials) and the zeroed arrival
// counters (quant_kernels.cuh, v_scale_kernel). The outputs are the caller's to set.
struct TokenStatsCall {
  VScaleParams p{};
  at::Tensor partial, arrivals;
  TokenStatsCall(const at::Tensor& x, const View& X, int parts) {
    p.v = x.data_ptr();
    p.v_sb = X.sb; p.v_sh = X.sh; p.v_sn = X.sn;
    p.heads = X.H; p.tokens = X.N; p.head_dim = X.D;
    const int64_t chunk_tokens = v_scale_chunk_tokens(static_cast<int>(X.D));
    p.chunks = (X.N + chunk_tokens - 1) / chunk_tokens;
    partial = at::empty({X.B, X.H, p.chunks, parts, X.D}, x.options().dtype(at::kFloat));
    arrivals = at::zeros({X.B, X.H}, x.options().dtype(at::kInt));
    p.partial = partial.data_ptr<float>();
    p.arrivals = arrivals.data_ptr<int>();
  }
};

// Whether the token-statistics kernel takes X: its head dim (D / 8 divides the kernel's thread
// count), some tokens, batch and heads within the launch grid's y/z limits.
inline bool token_stats_kernel_applies(const View& X) {
  return v_scale_kernel_supported(static_cast<int>(X.D)) && X.N > 0 && X.B > 0 && X.H > 0 &&
         X.B <= kMaxGridYZ && X.H <= kMaxGridYZ;
}

// K's mean over tokens for smoothing, fp32 [B, H, D] contiguous: by the family's token-statistics
// kernel (one pass at memory speed, partials summed in a fixed order: the same bits on every
// run), or by ATen where that kernel does not apply (token_stats_kernel_applies).
inline at::Tensor token_mean(TokenMeanLauncher launch, const at::Tensor& x_in, bool hnd) {
  if (!SAGE_TOKEN_MEAN_KERNEL || !token_stats_kernel_applies(view_of(x_in, hnd))) return token_mean(x_in, hnd);
  const at::Tensor x = vector_friendly(x_in);
  const View X = view_of(x, hnd);
  TokenStatsCall call(x, X, 1);  // one partial: the sum
  at::Tensor mean = at::empty({X.B, X.H, X.D}, x.options().dtype(at::kFloat));
  call.p.mean = mean.data_ptr<float>();
  const cudaError_t err = launch(call.p, X.B, dtype_of(x), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "token_mean launch failed: ", cudaGetErrorString(err));
  return mean;
}

// LSE correction for K smoothing: lse += (q . km) * sm_scale, with km broadcast over GQA groups.
inline void add_smoothing_lse(at::Tensor& lse, const at::Tensor& q, const at::Tensor& km, bool hnd,
                              double sm_scale) {
  const at::Tensor qh = hnd ? q : q.transpose(1, 2);  // [B, Hq, N, D]
  const int64_t rep = qh.size(1) / km.size(1);
  const at::Tensor kmq = rep == 1 ? km : km.repeat_interleave(rep, 1);  // [B, Hq, D]
  lse.add_(at::matmul(qh.to(at::kFloat), kmq.unsqueeze(-1)).squeeze(-1), sm_scale);
}

using QuantFp8Launcher = cudaError_t (*)(const QuantFp8Params&, int, DType, cudaStream_t);
using VScaleLauncher = cudaError_t (*)(const VScaleParams&, int, DType, bool, cudaStream_t);

// V's per-channel FP8 scale [B, H, D] fp32 (and its token mean with smoothing, else undefined)
// from the family's v_scale kernel (v vector_friendly); nullopt where the kernel does not apply
// (token_stats_kernel_applies), for ATen to do instead.
inline c10::optional<std::pair<at::Tensor, at::Tensor>> v_scale_by_kernel(
    VScaleLauncher launch, const at::Tensor& v, bool hnd, bool smooth, double v_max) {
  const View V = view_of(v, hnd);
  if (!token_stats_kernel_applies(V)) return c10::nullopt;
  TokenStatsCall call(v, V, v_scale_partials(smooth));
  VScaleParams& p = call.p;
  const auto f32 = v.options().dtype(at::kFloat);
  at::Tensor scale = at::empty({V.B, V.H, V.D}, f32), mean;
  p.scale = scale.data_ptr<float>();
  if (smooth) {
    mean = at::empty({V.B, V.H, V.D}, f32);
    p.mean = mean.data_ptr<float>();
  }
  p.scale_max = static_cast<float>(v_max);
  const cudaError_t err = launch(p, V.B, dtype_of(v), smooth, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "v_scale launch failed: ", cudaGetErrorString(err));
  return std::make_pair(scale, mean);
}

// FP8 P.V's static P scale and the value V's per-channel amax maps to by default (e4m3's max).
constexpr double kFp8Max = 448.0;

// V -> e4m3 [B, H, kFp8VTerms * D, Npad]: the hi rows, then the lo rows (attn_params.h), the token
// order permuted in 16-token groups (quant_kernels.cuh),
// per-channel scale [B, H, D] and, with smooth_v, the token mean [B, H, D] (else empty).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_v_fp8(QuantFp8Launcher launch,
                                                                  VScaleLauncher scale_launch,
                                                                  const at::Tensor& v_in, bool hnd,
                                                                  bool smooth_v, double v_max) {
  check_quant_v_fp8_args(v_in, hnd);
  const c10::cuda::CUDAGuard guard(v_in.device());
  const at::Tensor v = vector_friendly(v_in);
  const View V = view_of(v, hnd);
  if (V.B == 0 || V.H == 0) {  // no batch or no heads: empty outputs, no launch
    const auto f32 = v.options().dtype(at::kFloat);
    at::Tensor v8 = at::empty({V.B, V.H, kFp8VTerms * V.D, round_up(V.N, 64)}, v.options().dtype(at::kFloat8_e4m3fn));
    at::Tensor mean = smooth_v ? at::empty({V.B, V.H, V.D}, f32) : at::empty({0}, f32);
    return {v8, at::empty({V.B, V.H, V.D}, f32), mean};
  }
  // scale = max(amax / v_max, 2^-100), amax = max |v| or, smoothing, max |v - mean| (the floor:
  // attn_params.h kFp8VScaleFloor, not the INT8 scales' 1e-8, which lost a V of 1e-10)
  at::Tensor mean, scale;
  if (auto by_kernel = v_scale_by_kernel(scale_launch, v, hnd, smooth_v, v_max)) {
    std::tie(scale, mean) = *by_kernel;
    if (!smooth_v) mean = at::empty({0}, v.options().dtype(at::kFloat));
  } else {
    const int64_t tok_dim = hnd ? 2 : 1;
    auto [vmin, vmax] = at::aminmax(v, tok_dim, false);  // [B, H, D]
    at::Tensor amax;
    if (smooth_v) {
      mean = token_mean(v, hnd);
      // max |v - mean| = max(vmax - mean, mean - vmin), exact because rounding is monotonic.
      amax = at::maximum(vmax.to(at::kFloat) - mean, mean - vmin.to(at::kFloat));
    } else {
      mean = at::empty({0}, v.options().dtype(at::kFloat));
      amax = at::maximum(vmax.to(at::kFloat).abs(), vmin.to(at::kFloat).abs());
    }
    // A tensor divisor: ATen turns division by a number into a multiplication by its rounded
    // reciprocal on CUDA, one ulp off at times; the documented scale is one IEEE division.
    scale = (amax / at::scalar_tensor(v_max, amax.options()))
                .clamp_min(static_cast<double>(kFp8VScaleFloor))
                .contiguous();
  }
  const int64_t pad = round_up(V.N, 64);
  auto out = at::empty({V.B, V.H, kFp8VTerms * V.D, pad}, v.options().dtype(at::kFloat8_e4m3fn));
  QuantFp8Params p{};
  p.x = v.data_ptr();
  p.x_sb = V.sb; p.x_sh = V.sh; p.x_sn = V.sn;
  p.scale = scale.data_ptr<float>();
  p.mean = smooth_v ? mean.data_ptr<float>() : nullptr;
  p.out = reinterpret_cast<uint8_t*>(out.data_ptr());
  p.heads = V.H; p.tokens = V.N; p.padded_tokens = pad; p.head_dim = V.D;
  const cudaError_t err =
      launch(p, V.B, dtype_of(v), at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "quant_v_fp8 launch failed: ", cudaGetErrorString(err));
  return {out, scale, mean};
}

// The sm_90a families' kernels exist as sm_90a SASS only (wgmma, setmaxnreg exist nowhere else):
// say so instead of failing the launch with "no kernel image is available for execution".
inline void check_sm90a_device(const char* op_namespace, const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), op_namespace, " needs CUDA tensors, got a tensor on ", x.device());
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(x.device().index());
  TORCH_CHECK(prop->major == 9 && prop->minor == 0, op_namespace,
              " kernels are built for sm_90a and run only on compute capability 9.0 GPUs (H100, "
              "H200); ", prop->name, " is ", num(prop->major), ".", num(prop->minor),
              ": use the sm80/sm89 families or sageattention.sageattn()");
}

// The front half both attention ops share, after check_qkv and under the caller's device guard:
// K's token mean when smoothing (kept for the LSE correction), then INT8 Q (scale carrying
// sm_scale * log2(e)) and INT8 K (smoothed).
struct QuantizedQK {
  View Q, K;
  c10::optional<at::Tensor> k_mean;
  at::Tensor q_i8, q_scale, k_i8, k_scale;
};

inline QuantizedQK quantize_qk(QuantInt8Launcher launch, TokenMeanLauncher mean_launch, const at::Tensor& q,
                               const at::Tensor& k, bool hnd, QuantGran gran, double sm_scale, bool smooth_k) {
  QuantizedQK r{view_of(q, hnd), view_of(k, hnd), c10::nullopt, {}, {}, {}, {}};
  if (smooth_k) r.k_mean = token_mean(mean_launch, k, hnd);
  std::tie(r.q_i8, r.q_scale) = quant_int8(launch, q, c10::nullopt, hnd, gran, false, sm_scale * kLog2e);
  std::tie(r.k_i8, r.k_scale) = quant_int8(launch, k, r.k_mean, hnd, gran, true, 1.0);
  return r;
}

inline void fill_attn_common(AttnParams& p, const at::Tensor& q_i8, const at::Tensor& q_scale,
                             const at::Tensor& k_i8, const at::Tensor& k_scale, const View& Q,
                             const View& K, at::Tensor& out, bool hnd, at::Tensor& lse,
                             bool return_lse, QuantGran gran, bool causal) {
  const View O = view_of(out, hnd);
  p.q = q_i8.data_ptr<int8_t>();
  p.k = k_i8.data_ptr<int8_t>();
  p.q_scale = q_scale.data_ptr<float>();
  p.k_scale = k_scale.data_ptr<float>();
  p.out = out.data_ptr();
  p.o_sb = O.sb; p.o_sh = O.sh; p.o_sn = O.sn;
  p.lse = return_lse ? lse.data_ptr<float>() : nullptr;
  p.batch = Q.B; p.q_heads = Q.H; p.kv_heads = K.H;
  p.q_len = Q.N; p.kv_len = K.N;
  p.q_pad = q_i8.size(2); p.k_pad = k_i8.size(2);
  p.head_dim = Q.D;
  p.q_groups = q_scale.size(2); p.k_groups = k_scale.size(2);
  p.gran = gran;
  p.causal = causal;
}

// The back half every attention op shares: the output and LSE tensors, the common kernel
// parameters, then set_v(p) (the family's V fields), launch(p, stream) (the family's kernels on
// the current stream, returning the launch error) and the K-smoothing LSE term.
template <typename SetV, typename Launch>
std::tuple<at::Tensor, at::Tensor> run_attention(const char* op_namespace, const at::Tensor& q,
                                                 const QuantizedQK& qk, bool hnd, QuantGran gran,
                                                 bool is_causal, bool smooth_k, bool return_lse,
                                                 double sm_scale, SetV&& set_v, Launch&& launch) {
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({return_lse ? qk.Q.B : 0, qk.Q.H, qk.Q.N}, q.options().dtype(at::kFloat));
  AttnParams p{};
  fill_attn_common(p, qk.q_i8, qk.q_scale, qk.k_i8, qk.k_scale, qk.Q, qk.K, out, hnd, lse, return_lse,
                   gran, is_causal);
  set_v(p);
  const cudaError_t err = launch(p, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op_namespace, " attention launch failed: ", cudaGetErrorString(err));
  if (return_lse && smooth_k) add_smoothing_lse(lse, q, *qk.k_mean, hnd, sm_scale);
  return {out, lse};
}

// The kernels of an FP8 P.V family (sm89, sm90_fp8).
using AttnFp8Launcher = cudaError_t (*)(const AttnParams&, PvAccum, DType, cudaStream_t);
struct Fp8Kernels {
  QuantInt8Launcher quant_int8;
  TokenMeanLauncher token_mean;
  QuantFp8Launcher quant_v_fp8;
  VScaleLauncher v_scale;
  AttnFp8Launcher attn_hd64, attn_hd128;
};

// An FP8 P.V family's attention op after its own argument checks and under its device guard:
// INT8 Q/K, V to e4m3 (V's per-channel amax maps to v_max), then the family's kernels.
inline std::tuple<at::Tensor, at::Tensor> run_fp8_attention(
    const char* op_namespace, const Fp8Kernels& kernels, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, bool hnd, QuantGran gran, PvAccum accum, bool is_causal, double sm_scale,
    bool smooth_k, bool smooth_v, bool return_lse, double v_max) {
  const QuantizedQK qk = quantize_qk(kernels.quant_int8, kernels.token_mean, q, k, hnd, gran, sm_scale, smooth_k);
  at::Tensor v8, v_scale, v_mean;  // not a structured binding: C++17 lambdas cannot capture one
  std::tie(v8, v_scale, v_mean) =
      quant_v_fp8(kernels.quant_v_fp8, kernels.v_scale, v, hnd, smooth_v, v_max);
  const DType od = dtype_of(q);
  return run_attention(
      op_namespace, q, qk, hnd, gran, is_causal, smooth_k, return_lse, sm_scale,
      [&](AttnParams& p) {
        TORCH_CHECK(v8.size(3) == p.k_pad, "internal: V and K padding differ");
        p.v = v8.data_ptr();
        p.v_scale = v_scale.data_ptr<float>();
        p.v_mean = smooth_v ? v_mean.data_ptr<float>() : nullptr;
      },
      [&](const AttnParams& p, cudaStream_t stream) {
        return (qk.Q.D == 64 ? kernels.attn_hd64 : kernels.attn_hd128)(p, accum, od, stream);
      });
}

}  // namespace sage::glue
