// Torch bindings of the sm90_fp8 family (INT8 QK^T, FP8 e4m3 PV on Hopper's wgmma). Same op
// schemas and V layout as the sm89 family; "fp32+fp32" and "fp32" accumulation. Fake
// implementations live in sageattention/native/sm90_fp8.py.
#include <Python.h>

#include "../common/op_schemas.h"
#include "../common/torch_glue.h"
#include "launchers.h"

namespace sage::sm90_fp8 {
namespace {

constexpr const char* kNamespace = "sageattention_sm90_fp8";

// What the op says when the bulk tensor copy engine's tensor maps are refused (attn_wgmma.cuh
// prints which map and the driver's CUresult on stderr). Its maps are all of the op's own
// quantized, 16-byte aligned tensors: only a driver without tensor maps refuses them.
constexpr const char* kMapRefused =
    "sageattention_sm90_fp8: the CUDA driver refused a tensor map of the kernel's bulk tensor copies "
    "(cuTensorMapEncodeTiled; stderr names the map and the driver's error), so nothing ran. The "
    "sm_90a kernels need a driver with tensor maps (CUDA 12 or newer); to run the call elsewhere, "
    "choose another backend (sageattention.force_backend('sdpa'), or SAGEATTENTION_BACKEND)";

// The family's attention launchers, with a refused tensor map said in words (kMapRefused) instead
// of "attention launch failed: operation not supported".
template <glue::AttnFp8Launcher LAUNCH>
cudaError_t attn_said(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream) {
  const cudaError_t err = LAUNCH(p, accum, out_dtype, stream);
  TORCH_CHECK(err != cudaErrorNotSupported, kMapRefused);
  return err;
}

PvAccum parse_accum(const std::string& a) {
  if (a == "fp32+fp32") return PvAccum::kF32F32;
  if (a == "fp32") return PvAccum::kF32;
  TORCH_CHECK(false, "pv_accum_dtype for the sm90_fp8 family must be 'fp32+fp32' or 'fp32', got '", a,
              "'; 'fp32+fp16' is the sm89 family's");
  return PvAccum::kF32F32;
}

std::tuple<at::Tensor, at::Tensor> quant_int8_op(const at::Tensor& x,
                                                 const c10::optional<at::Tensor>& mean,
                                                 const std::string& tensor_layout,
                                                 const std::string& qk_quant_gran, bool is_key,
                                                 double scale_mult) {
  glue::check_sm90a_device(kNamespace, x);
  const bool hnd = glue::parse_layout(tensor_layout);
  const QuantGran gran = glue::parse_gran(qk_quant_gran);
  return glue::quant_int8(&sm90_fp8::quant_int8, x, mean, hnd, gran, is_key, scale_mult);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_v_fp8_op(const at::Tensor& v,
                                                              const std::string& tensor_layout,
                                                              bool smooth_v) {
  glue::check_sm90a_device(kNamespace, v);
  return glue::quant_v_fp8(&sm90_fp8::quant_v_fp8, &sm90_fp8::v_scale, v,
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
  glue::check_sm90a_device(kNamespace, q);
  glue::check_finite(sm_scale, "sm_scale");
  const c10::cuda::CUDAGuard guard(q.device());

  const glue::Fp8Kernels kernels{&sm90_fp8::quant_int8, &sm90_fp8::token_mean, &sm90_fp8::quant_v_fp8,
                                  &sm90_fp8::v_scale, &attn_said<&attn_hd64>, &attn_said<&attn_hd128>};
  return glue::run_fp8_attention(kNamespace, kernels, q, k, v, hnd, gran, accum, is_causal, sm_scale,
                                 smooth_k, smooth_v, return_lse, glue::kFp8Max);
}

}  // namespace
}  // namespace sage::sm90_fp8

TORCH_LIBRARY(sageattention_sm90_fp8, m) {
  m.def(sage::schema::kQuantInt8);
  m.def(sage::schema::kQuantVFp8);
  m.def(sage::schema::kQkInt8PvFp8);
}

TORCH_LIBRARY_IMPL(sageattention_sm90_fp8, CUDA, m) {
  m.impl("quant_int8", &sage::sm90_fp8::quant_int8_op);
  m.impl("quant_v_fp8", &sage::sm90_fp8::quant_v_fp8_op);
  m.impl("qk_int8_pv_fp8", &sage::sm90_fp8::qk_int8_pv_fp8_op);
}

// `import sageattention._kernels_sm90_fp8` runs the registrations above; the module itself is empty.
extern "C" PyObject* PyInit__kernels_sm90_fp8(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_kernels_sm90_fp8",
                            "INT8 QK, FP8 PV wgmma kernels for sm_90a (ops in torch.ops.sageattention_sm90_fp8)",
                            -1, nullptr};
  return PyModule_Create(&def);
}
