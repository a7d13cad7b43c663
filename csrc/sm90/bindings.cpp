// Torch bindings of the sm90 family (INT8 QK^T, 16-bit PV on Hopper's wgmma, "fp32" accumulation).
// The op schemas are defined here once; fake implementations live in sageattention/native/sm90.py.
#include <Python.h>

#include "../common/op_schemas.h"
#include "../common/torch_glue.h"
#include "launchers.h"

namespace sage::sm90 {
namespace {

void check_device(const at::Tensor& x) { glue::check_sm90a_device("sageattention_sm90", x); }

// What the op says when the bulk tensor copy engine's tensor maps are refused (the kernel needs
// them; attn_wgmma.cuh prints which map and the driver's CUresult on stderr), V copied included.
constexpr const char* kMapRefused =
    "sageattention_sm90: the CUDA driver refused a tensor map of the kernel's bulk tensor copies "
    "(cuTensorMapEncodeTiled; stderr names the map and the driver's error), with V contiguous too, "
    "so nothing ran. The sm_90a kernels need a driver with tensor maps (CUDA 12 or newer); to run "
    "the call elsewhere, choose another backend (sageattention.force_backend('sdpa'), or "
    "SAGEATTENTION_BACKEND)";

void check_accum(const std::string& a) {
  TORCH_CHECK(a == "fp32",
              "pv_accum_dtype for the sm90 family must be 'fp32' (its only accumulation mode), "
              "got '", a, "'; 'fp16+fp32' and 'fp16' are the sm80 family's");
}

std::tuple<at::Tensor, at::Tensor> quant_int8_op(const at::Tensor& x,
                                                 const c10::optional<at::Tensor>& mean,
                                                 const std::string& tensor_layout,
                                                 const std::string& qk_quant_gran, bool is_key,
                                                 double scale_mult) {
  check_device(x);
  const bool hnd = glue::parse_layout(tensor_layout);
  const QuantGran gran = glue::parse_gran(qk_quant_gran);
  return glue::quant_int8(&sm90::quant_int8, x, mean, hnd, gran, is_key, scale_mult);
}

std::tuple<at::Tensor, at::Tensor> qk_int8_pv_fp16_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::string& tensor_layout,
    bool is_causal, double sm_scale, const std::string& qk_quant_gran,
    const std::string& pv_accum_dtype, bool smooth_k, bool return_lse) {
  const bool hnd = glue::parse_layout(tensor_layout);
  const QuantGran gran = glue::parse_gran(qk_quant_gran);
  check_accum(pv_accum_dtype);
  glue::check_qkv(q, k, v, hnd);
  check_device(q);
  glue::check_finite(sm_scale, "sm_scale");
  const c10::cuda::CUDAGuard guard(q.device());

  const glue::QuantizedQK qk =
      glue::quantize_qk(&sm90::quant_int8, &sm90::token_mean, q, k, hnd, gran, sm_scale, smooth_k);
  // "fp32" accumulation: V as given, fp16 or bf16 (check_qkv: q's dtype), P.V in that type.
  const DType dtype = glue::dtype_of(q);
  const at::Tensor v16 = glue::tma_friendly(v);  // the kernel may read V by tensor map (SAGE_WG_TMA)
  const glue::View V = glue::view_of(v16, hnd);

  return glue::run_attention(
      "sageattention_sm90", q, qk, hnd, gran, is_causal, smooth_k, return_lse, sm_scale,
      [&](AttnParams& p) {
        p.v = v16.data_ptr();
        p.v_sb = V.sb; p.v_sh = V.sh; p.v_sn = V.sn;
      },
      [&](const AttnParams& p, cudaStream_t stream) {
        const auto attn = [&](const AttnParams& a) {
          return qk.Q.D == 64 ? attn_hd64(a, dtype, stream) : attn_hd128(a, dtype, stream);
        };
        cudaError_t err = attn(p);
        // cudaErrorNotSupported: the driver refused a tensor map (attn_wgmma.cuh; nothing ran, the
        // line on stderr names the map). V's is the one map built on the caller's strides: run
        // again on a contiguous copy, whose strides every driver takes, instead of failing a valid
        // call with "launch failed: operation not supported".
        if (err == cudaErrorNotSupported && !v16.is_contiguous()) {
          const at::Tensor vc = v16.contiguous();
          const glue::View C = glue::view_of(vc, hnd);
          AttnParams retry = p;
          retry.v = vc.data_ptr();
          retry.v_sb = C.sb; retry.v_sh = C.sh; retry.v_sn = C.sn;
          err = attn(retry);
        }
        TORCH_CHECK(err != cudaErrorNotSupported, kMapRefused);
        return err;
      });
}

}  // namespace
}  // namespace sage::sm90

TORCH_LIBRARY(sageattention_sm90, m) {
  m.def(sage::schema::kQuantInt8);
  m.def(sage::schema::kQkInt8PvFp16);
}

TORCH_LIBRARY_IMPL(sageattention_sm90, CUDA, m) {
  m.impl("quant_int8", &sage::sm90::quant_int8_op);
  m.impl("qk_int8_pv_fp16", &sage::sm90::qk_int8_pv_fp16_op);
}

// `import sageattention._kernels_sm90` runs the registrations above; the module itself is empty.
extern "C" PyObject* PyInit__kernels_sm90(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_kernels_sm90",
                            "INT8 QK, FP16 PV wgmma kernels for sm_90a (ops in torch.ops.sageattention_sm90)",
                            -1, nullptr};
  return PyModule_Create(&def);
}
