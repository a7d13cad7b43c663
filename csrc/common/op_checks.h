// The raw ops' argument checks, before any kernel is launched: each names the argument, what it
// got and what is accepted. ATen only (no CUDA headers), so tests/unit/test_native_checks_host.py
// compiles them on a host without a GPU, meta tensors standing in for CUDA ones
// (-DSAGE_OP_DEVICE_TYPE=c10::DeviceType::Meta). sageattention/native/checks.py mirrors every
// check, with the same words, for the ops' fake implementations (torch.compile refuses the same
// calls the ops refuse). Numbers go through sage::num (message.h), never an ostream.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "attn_params.h"
#include "grid_limits.h"
#include "message.h"

#ifndef SAGE_OP_DEVICE_TYPE
#define SAGE_OP_DEVICE_TYPE c10::DeviceType::CUDA
#endif

namespace sage::glue {

struct View {  // a 4-D tensor seen as [B, H, N, D] through its layout
  int64_t B, H, N, D, sb, sh, sn;
};

inline bool parse_layout(const std::string& layout) {
  TORCH_CHECK(layout == "HND" || layout == "NHD", "tensor_layout must be 'HND' or 'NHD', got '",
              layout, "'");
  return layout == "HND";
}

inline QuantGran parse_gran(const std::string& gran) {
  if (gran == "per_warp") return QuantGran::kPerWarp;
  if (gran == "per_thread") return QuantGran::kPerThread;
  if (gran == "per_block") return QuantGran::kPerBlock;
  TORCH_CHECK(false, "qk_quant_gran must be 'per_block', 'per_warp' or 'per_thread', got '", gran,
              "'");
  return QuantGran::kPerWarp;
}

inline View view_of(const at::Tensor& x, bool hnd) {
  if (hnd) return {x.size(0), x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2)};
  return {x.size(0), x.size(2), x.size(1), x.size(3), x.stride(0), x.stride(2), x.stride(1)};
}

// A shape as Python prints a tuple: (1, 3, 64), (64,), ().
inline std::string shape_text(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + num(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

// A dtype as Python prints it: torch.float16.
inline std::string dtype_text(at::ScalarType t) { return "torch." + std::string(c10::getDtypeNames(t).first); }

// A float as Python prints the non-finite ones (std::to_string says "-nan" for some NaNs).
inline std::string float_text(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return std::to_string(x);
}

// A 4-D fp16/bf16 input of an op, on ref's (the op's first tensor's) CUDA device.
inline void check_input(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK(t.dim() == 4, name, " must be 4-D ([B, H, N, D] for HND, [B, N, H, D] for NHD), got shape ",
              shape_text(t));
  TORCH_CHECK(t.device().type() == SAGE_OP_DEVICE_TYPE, name, " must be a CUDA tensor, got one on ",
              t.device().str());
  TORCH_CHECK(t.device() == ref.device(), name, " is on ", t.device().str(), " but ", ref_name, " is on ",
              ref.device().str(), "; pass all of the op's tensors on one device");
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, name,
              " must be float16 or bfloat16, got ", dtype_text(t.scalar_type()));
}

// The kernels keep token indices in 32-bit ints (attn_params.h), padded up to a block.
inline void check_tokens(const View& X, const char* name) {
  TORCH_CHECK(X.N <= kMaxTokens, name, " has ", num(X.N), " tokens; the kernels take at most ", num(kMaxTokens),
              " (split the sequence)");
}

// Batch and heads ride the launch grid's y/z dims (grid_limits.h).
inline void check_grid_limit(const View& X, const char* name) {
  TORCH_CHECK(X.B <= kMaxGridYZ && X.H <= kMaxGridYZ, name, " has batch ", num(X.B), " and ", num(X.H),
              " heads; the kernels take at most ", num(kMaxGridYZ), " of each (split the call, or use "
              "sageattn, which runs such calls on PyTorch SDPA)");
}

inline void check_finite(double x, const char* name) {
  TORCH_CHECK(std::isfinite(x), name, " must be finite, got ", float_text(x));
}

// v_fp16_with_bf16: a float16 v is also accepted beside bfloat16 q and k (the sm80 family's
// fp16-accumulating modes, whose P.V takes V in fp16 either way: smooth_v hands over V minus its
// mean rounded once, to fp16, instead of twice, through bfloat16).
inline void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool hnd,
                      bool v_fp16_with_bf16 = false) {
  check_input(q, "q", q, "q");
  check_input(k, "k", q, "q");
  check_input(v, "v", q, "q");
  const bool v_fp16_ok = v_fp16_with_bf16 && q.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kHalf;
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && (v.scalar_type() == q.scalar_type() || v_fp16_ok),
              v_fp16_with_bf16 ? "q, k and v must have one dtype (or v float16 with bfloat16 q and k)"
                               : "q, k and v must have one dtype",
              ", got ", dtype_text(q.scalar_type()), ", ", dtype_text(k.scalar_type()), ", ",
              dtype_text(v.scalar_type()));
  const View Q = view_of(q, hnd), K = view_of(k, hnd), V = view_of(v, hnd);
  TORCH_CHECK(Q.D == 64 || Q.D == 128, "head dim must be 64 or 128, got ", num(Q.D));
  TORCH_CHECK(K.D == Q.D && V.D == Q.D, "q, k and v must share the head dim, got ", num(Q.D), ", ", num(K.D),
              ", ", num(V.D));
  TORCH_CHECK(K.B == Q.B && V.B == Q.B, "q, k and v must share the batch size, got ", num(Q.B), ", ",
              num(K.B), ", ", num(V.B));
  TORCH_CHECK(K.H == V.H && K.N == V.N, "k and v must have the same heads and tokens, got k ", num(K.H),
              " heads x ", num(K.N), " tokens, v ", num(V.H), " x ", num(V.N));
  TORCH_CHECK(Q.B > 0 && Q.H > 0 && K.H > 0 && Q.N > 0 && K.N > 0,
              "q, k and v need a batch, heads and tokens (at least one of each), got batch ", num(Q.B),
              ", q ", num(Q.H), " heads x ", num(Q.N), " tokens, k and v ", num(K.H), " heads x ", num(K.N),
              " tokens");
  TORCH_CHECK(Q.H % K.H == 0, "q heads (", num(Q.H), ") must be a multiple of kv heads (", num(K.H), ")");
  check_tokens(Q, "q");
  check_tokens(K, "k");
  check_grid_limit(Q, "q");
}

// quant_int8's x, scale_mult and optional mean (K's token mean for smoothing, read by the kernel
// as fp32 [B, H, D] on x's device); returns x's view.
inline View check_quant_int8_args(const at::Tensor& x, const c10::optional<at::Tensor>& mean, bool hnd,
                                  double scale_mult) {
  check_input(x, "x", x, "x");
  const View X = view_of(x, hnd);
  TORCH_CHECK(X.D % 8 == 0 && X.D >= 8 && X.D <= 256, "head dim must be a multiple of 8 from 8 to 256, got ",
              num(X.D));
  check_tokens(X, "x");
  check_grid_limit(X, "x");
  check_finite(scale_mult, "scale_mult");
  if (mean.has_value()) {
    const at::Tensor& m = *mean;
    TORCH_CHECK(m.device() == x.device(), "mean is on ", m.device().str(), " but x is on ", x.device().str(),
                "; pass K's mean on x's device");
    TORCH_CHECK(m.dim() == 3 && m.size(0) == X.B && m.size(1) == X.H && m.size(2) == X.D &&
                    at::isFloatingType(m.scalar_type()),
                "mean must be a floating-point [B, H, D] = [", num(X.B), ", ", num(X.H), ", ", num(X.D),
                "] tensor (x's mean over its tokens), got shape ", shape_text(m), " (",
                dtype_text(m.scalar_type()), ")");
  }
  return X;
}

// quant_v_fp8's v; returns its view.
inline View check_quant_v_fp8_args(const at::Tensor& v, bool hnd) {
  check_input(v, "v", v, "v");
  const View V = view_of(v, hnd);
  TORCH_CHECK(V.D % 8 == 0 && V.D >= 8 && V.D <= 128, "head dim must be a multiple of 8 from 8 to 128, got ",
              num(V.D));
  TORCH_CHECK(V.N > 0, "v needs at least one token (its scale is taken over its tokens), got shape ",
              shape_text(v));
  check_tokens(V, "v");
  check_grid_limit(V, "v");
  return V;
}

}  // namespace sage::glue
