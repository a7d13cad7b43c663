// Torch bindings of the sm80 family (INT8 QK^T, FP16 PV). The op schemas are defined here once;
// fake implementations live in sageattention/native/sm80.py.
#include <Python.h>

#include "../common/op_schemas.h"
#include "../common/torch_glue.h"
#include "launchers.h"

namespace sage::sm80 {
namespace {

PvAccum parse_accum(const std::string& a) {
  if (a == "fp32") return PvAccum::kF32;
  if (a == "fp16+fp32") return PvAccum::kF16F32;
  if (a == "fp16") return PvAccum::kF16;
  TORCH_CHECK(false, "pv_accum_dtype for the sm80 family must be 'fp32', 'fp16+fp32' or 'fp16', got '",
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
  return glue::quant_int8(&sm80::quant_int8, x, mean, hnd, gran, is_key, scale_mult);
}

std::tuple<at::Tensor, at::Tensor> qk_int8_pv_fp16_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::string& tensor_layout,
    bool is_causal, double sm_scale, const std::string& qk_quant_gran,
    const std::string& pv_accum_dtype, bool smooth_k, bool return_lse) {
  const bool hnd = glue::parse_layout(tensor_layout);
  const QuantGran gran = glue::parse_gran(qk_quant_gran);
  const PvAccum accum = parse_accum(pv_accum_dtype);
  const DType od = glue::dtype_of(q);
  glue::check_qkv(q, k, v, hnd, /*v_fp16_with_bf16=*/!pv_in_bf16(od, accum));
  glue::check_finite(sm_scale, "sm_scale");
  const c10::cuda::CUDAGuard guard(q.device());

  const glue::QuantizedQK qk =
      glue::quantize_qk(&sm80::quant_int8, &sm80::token_mean, q, k, hnd, gran, sm_scale, smooth_k);
  // 16-bit PV: V as given when fp16, or bf16 with fp32 accumulation (pv_in_bf16); else bf16 V is
  // converted to fp16 for the fp16-accumulating mma (docs/architecture.md).
  const bool v_as_given = v.scalar_type() == at::kHalf || pv_in_bf16(od, accum);
  const at::Tensor v16 = glue::vector_friendly(v_as_given ? v : v.to(at::kHalf));
  const glue::View V = glue::view_of(v16, hnd);

  return glue::run_attention(
      "sageattention_sm80", q, qk, hnd, gran, is_causal, smooth_k, return_lse, sm_scale,
      [&](AttnParams& p) {
        p.v = v16.data_ptr();
        p.v_sb = V.sb; p.v_sh = V.sh; p.v_sn = V.sn;
      },
      [&](const AttnParams& p, cudaStream_t stream) {
        return qk.Q.D == 64 ? attn_hd64(p, accum, od, stream) : attn_hd128(p, accum, od, stream);
      });
}

}  // namespace
}  // namespace sage::sm80

TORCH_LIBRARY(sageattention_sm80, m) {
  m.def(sage::schema::kQuantInt8);
  m.def(sage::schema::kQkInt8PvFp16);
}

TORCH_LIBRARY_IMPL(sageattention_sm80, CUDA, m) {
  m.impl("quant_int8", &sage::sm80::quant_int8_op);
  m.impl("qk_int8_pv_fp16", &sage::sm80::qk_int8_pv_fp16_op);
}

// `import sageattention._kernels_sm80` runs the registrations above; the module itself is empty.
extern "C" PyObject* PyInit__kernels_sm80(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_kernels_sm80",
                            "INT8 QK, FP16 PV kernels (ops in torch.ops.sageattention_sm80)", -1,
                            nullptr};
  return PyModule_Create(&def);
}
