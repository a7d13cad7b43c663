// Torch binding of the sm75 kernel family: the op schema (defined once here),
// input checks, scratch allocation, and the launch on the current stream under
// a device guard. Python wrapper and fake implementation: sageattention/native/sm75.py.
// No torch/extension.h (pybind11): the ops need only ATen and the op registry, and skipping those
// headers roughly halves this file's compile time.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "../common/op_checks.h"
#include "launchers.h"

namespace sageattention_sm75 {
namespace {

using sage::num;

// Sizes and strides of a 4-D tensor seen in the HND order [B, H, N, D].
struct Hnd {
  int64_t b, h, n, d;
  int64_t sb, sh, sn;
};

Hnd as_hnd(const at::Tensor& t, bool nhd) {
  if (nhd) return {t.size(0), t.size(2), t.size(1), t.size(3), t.stride(0), t.stride(2), t.stride(1)};
  return {t.size(0), t.size(1), t.size(2), t.size(3), t.stride(0), t.stride(1), t.stride(2)};
}

TensorRef ref(const at::Tensor& t, const Hnd& s) {
  return TensorRef{const_cast<void*>(t.data_ptr()), s.sb, s.sh, s.sn};
}

// The head dim read contiguously (the kernels take any other strides, element by element).
void check_head_dim_stride(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.stride(3) == 1, "sageattention_sm75: the head dim of ", name,
              " must be contiguous (stride 1), got stride ", num(t.stride(3)));
}

QuantGran parse_gran(const std::string& g) {
  if (g == "per_thread") return QuantGran::kPerThread;
  if (g == "per_warp") return QuantGran::kPerWarp;
  TORCH_CHECK(false, "sageattention_sm75: qk_quant_gran must be 'per_thread' or 'per_warp', got '", g,
              "'");
  return QuantGran::kPerThread;
}

std::tuple<at::Tensor, at::Tensor> qk_int8_pv_fp16_cuda(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v,
                                                        const std::string& tensor_layout,
                                                        bool is_causal, double sm_scale,
                                                        const std::string& qk_quant_gran,
                                                        bool smooth_k, bool return_lse) {
  const bool nhd = !sage::glue::parse_layout(tensor_layout);
  const QuantGran gran = parse_gran(qk_quant_gran);
  sage::glue::check_qkv(q, k, v, !nhd);
  check_head_dim_stride(q, "q");
  check_head_dim_stride(k, "k");
  check_head_dim_stride(v, "v");
  sage::glue::check_finite(sm_scale, "sm_scale");
  const Hnd sq = as_hnd(q, nhd), sk = as_hnd(k, nhd), sv = as_hnd(v, nhd);

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  Problem p;
  p.batch = static_cast<int>(sq.b);
  p.q_heads = static_cast<int>(sq.h);
  p.kv_heads = static_cast<int>(sk.h);
  p.q_len = static_cast<int>(sq.n);
  p.kv_len = static_cast<int>(sk.n);
  p.head_dim = static_cast<int>(sq.d);
  p.dtype = q.scalar_type() == at::kHalf ? ElemType::kFloat16 : ElemType::kBFloat16;
  p.sm_scale = static_cast<float>(sm_scale);
  p.qk_quant_gran = gran;
  p.is_causal = is_causal;
  p.smooth_k = smooth_k;
  p.return_lse = return_lse;

  const auto f32 = q.options().dtype(at::kFloat);
  const auto i8 = q.options().dtype(at::kChar);
  const int64_t q_pad = padded_q_len(sq.n), kv_pad = padded_kv_len(sk.n);
  at::Tensor q_int8 = at::empty({sq.b, sq.h, q_pad, sq.d}, i8);
  at::Tensor q_scale = at::empty({sq.b, sq.h, q_scale_count(sq.n, gran)}, f32);
  at::Tensor k_int8 = at::empty({sk.b, sk.h, kv_pad, sk.d}, i8);
  at::Tensor k_scale = at::empty({sk.b, sk.h, k_scale_count(sk.n, gran)}, f32);
  at::Tensor v_t = at::empty({sv.b, sv.h, sv.d, kv_pad}, q.options().dtype(at::kHalf));
  at::Tensor k_mean_part, k_mean, lse_corr, v_amax_part, v_scale;
  if (smooth_k) {
    k_mean_part = at::empty({sk.b, sk.h, channel_chunks(sk.n), sk.d}, f32);
    k_mean = at::empty({sk.b, sk.h, sk.d}, f32);
    if (return_lse) lse_corr = at::empty({sq.b, sq.h, q_pad}, f32);
  }
  if (scales_v(p.dtype)) {
    v_amax_part = at::empty({sv.b, sv.h, channel_chunks(sv.n), sv.d}, f32);
    v_scale = at::empty({sv.b, sv.h, sv.d}, f32);
  }
  Workspace ws;
  ws.q_int8 = q_int8.data_ptr<int8_t>();
  ws.q_scale = q_scale.data_ptr<float>();
  ws.k_int8 = k_int8.data_ptr<int8_t>();
  ws.k_scale = k_scale.data_ptr<float>();
  ws.v_t = v_t.data_ptr();
  ws.k_mean_part = smooth_k ? k_mean_part.data_ptr<float>() : nullptr;
  ws.k_mean = smooth_k ? k_mean.data_ptr<float>() : nullptr;
  ws.lse_corr = lse_corr.defined() ? lse_corr.data_ptr<float>() : nullptr;
  ws.v_amax_part = v_amax_part.defined() ? v_amax_part.data_ptr<float>() : nullptr;
  ws.v_scale = v_scale.defined() ? v_scale.data_ptr<float>() : nullptr;

  at::Tensor out = at::empty(q.sizes(), q.options());  // contiguous, q's layout
  at::Tensor lse = return_lse ? at::empty({sq.b, sq.h, sq.n}, f32) : at::empty({0}, f32);
  const Hnd so = as_hnd(out, nhd);

  const cudaError_t err = qk_int8_pv_fp16(p, ref(q, sq), ref(k, sk), ref(v, sv), ref(out, so),
                                          return_lse ? lse.data_ptr<float>() : nullptr, ws, stream);
  TORCH_CHECK(err == cudaSuccess, "sageattention_sm75: kernel launch failed: ",
              cudaGetErrorString(err));
  return {out, lse};
}

}  // namespace
}  // namespace sageattention_sm75

TORCH_LIBRARY(sageattention_sm75, m) {
  m.def(
      "qk_int8_pv_fp16(Tensor q, Tensor k, Tensor v, str tensor_layout, bool is_causal, "
      "float sm_scale, str qk_quant_gran, bool smooth_k, bool return_lse) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sageattention_sm75, CUDA, m) {
  m.impl("qk_int8_pv_fp16", &sageattention_sm75::qk_int8_pv_fp16_cuda);
}

// `import sageattention._kernels_sm75` runs the registrations above; the module itself is empty.
extern "C" PyObject* PyInit__kernels_sm75(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_kernels_sm75",
                            "SageAttention sm75 (Turing) kernels; ops in torch.ops.sageattention_sm75",
                            -1, nullptr};
  return PyModule_Create(&def);
}
