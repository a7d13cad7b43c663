// Torch bindings of the sm89 family (INT8 QK^T, FP8 e4m3 PV; runs on sm89 and sm90). The op
// schemas are defined here once; fake implementations live in sageattention/native/sm89.py.
#include <Python.h>

#include "../common/op_schemas.h"
#include "../common/torch_glue.h"
#include "launchers.h"

namespace sage::sm89 {
namespace {

// With an fp16 inner accumulator ("fp32+fp16") V's amax maps to 2.25, not 448: P (up to 448) times V
// summed over a 64-key block stays below 64 * 448 * 2.25 = 64512 < 65504 (fp16's max). Same rule as
// sageattention.reference.fp8_v_max_for.
constexpr double kFp8VMaxFp16Inner = 2.25;

PvAccum parse_accum(const std::string& a) {
  if (a == "fp32") return PvAccum::kF32;
  if (a == "fp32+fp32") return PvAccum::kF32F32;
  if (a == "fp32+fp16") return PvAccum::kF32F16;
  TORCH_CHECK(false,
              "pv_accum_dtype for the sm89 family must be 'fp32', 'fp32+fp32' or 'fp32+fp16', got '",
              a, "'");
  return PvAccum::kF32;
}

std::tuple<at::Tensor, at::Tensor> quant_int8_op(const at::Tensor& x,
                                                 const c10::optional<at::Tensor>& mean,
                                                 const std::string& tensor_layout,
                                                 const std::string& qk_quant_gran, bool is_key,
                                                 double scale_mult) {
  const bool hnd = glue::parse_layout(tensor_layout);
  const QuantGran gran = glue::parse_gran(qk_quant_gran);
  return glue::quant_int8(&sm89::quant_int8, x, mean, hnd, gran, is_key, scale_mult);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_v_fp8_op(const at::Tensor& v,
                                                              const std::string& tensor_layout,
                                                              bool smooth_v) {
  return glue::quant_v_fp8(&sm89::quant_v_fp8, &sm89::v_scale, v,
                           glue::parse_layout(tensor_layout), smooth_v, glue::kFp8Max);
}

std::tuple<at::Tensor, at::Tensor> qk_int8_pv_fp8_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::string& tensor_layout,
    bool is_causal, double sm_scale, const std::string& qk_quant_gran,
    const std::string& pv_accum_dtype, bool smooth_k, bool smooth_v, bool return_lse) {
  const bool hnd = glue::parse_layout(tensor_layout);
  const QuantGran gran = glue::parse_gran(qk_quant_gran);
  const PvAccum accum = parse_accum(pv_accum_dtype);
  glue::check_qkv(q, k, v, hnd);
  glue::check_finite(sm_scale, "sm_scale");
  const c10::cuda::CUDAGuard guard(q.device());

  const glue::Fp8Kernels kernels{&sm89::quant_int8, &sm89::token_mean, &sm89::quant_v_fp8, &sm89::v_scale,
                                  &attn_hd64, &attn_hd128};
  return glue::run_fp8_attention("sageattention_sm89", kernels, q, k, v, hnd, gran, accum, is_causal,
                                 sm_scale, smooth_k, smooth_v, return_lse,
                                 accum == PvAccum::kF32F16 ? kFp8VMaxFp16Inner : glue::kFp8Max);
}

}  // namespace
}  // namespace sage::sm89

TORCH_LIBRARY(sageattention_sm89, m) {
  m.def(sage::schema::kQuantInt8);
  m.def(sage::schema::kQuantVFp8);
  m.def(sage::schema::kQkInt8PvFp8);
}

TORCH_LIBRARY_IMPL(sageattention_sm89, CUDA, m) {
  m.impl("quant_int8", &sage::sm89::quant_int8_op);
  m.impl("quant_v_fp8", &sage::sm89::quant_v_fp8_op);
  m.impl("qk_int8_pv_fp8", &sage::sm89::qk_int8_pv_fp8_op);
}

// `import sageattention._kernels_sm89` runs the registrations above; the module itself is empty.
extern "C" PyObject* PyInit__kernels_sm89(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_kernels_sm89",
                            "INT8 QK, FP8 PV kernels (ops in torch.ops.sageattention_sm89)", -1,
                            nullptr};
  return PyModule_Create(&def);
}
