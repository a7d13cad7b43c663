// The torch op schemas the families share, each written once: a family's bindings.cpp defines
// the ones it implements (TORCH_LIBRARY: m.def(sage::schema::...)); the unit tests register them
// under a test namespace with the Python fakes (tests/unit/bindings_source.py reads this file).
// Plain C++, no torch.
#pragma once

namespace sage::schema {

// Q or K to INT8: (int8 [B, H, Npad, D], fp32 scales [B, H, groups]); families sm80 .. sm90_fp8.
inline constexpr const char kQuantInt8[] =
    "quant_int8(Tensor x, Tensor? mean, str tensor_layout, str qk_quant_gran, bool is_key, "
    "float scale_mult) -> (Tensor, Tensor)";

// V to e4m3 (permuted V^T, scale, mean); the FP8 P.V families sm89 and sm90_fp8.
inline constexpr const char kQuantVFp8[] =
    "quant_v_fp8(Tensor v, str tensor_layout, bool smooth_v) -> (Tensor, Tensor, Tensor)";

// INT8 QK, 16-bit P.V attention: (out, lse); families sm80 and sm90.
inline constexpr const char kQkInt8PvFp16[] =
    "qk_int8_pv_fp16(Tensor q, Tensor k, Tensor v, str tensor_layout, bool is_causal, "
    "float sm_scale, str qk_quant_gran, str pv_accum_dtype, bool smooth_k, bool return_lse) "
    "-> (Tensor, Tensor)";

// INT8 QK, FP8 P.V attention: (out, lse); families sm89 and sm90_fp8.
inline constexpr const char kQkInt8PvFp8[] =
    "qk_int8_pv_fp8(Tensor q, Tensor k, Tensor v, str tensor_layout, bool is_causal, "
    "float sm_scale, str qk_quant_gran, str pv_accum_dtype, bool smooth_k, bool smooth_v, "
    "bool return_lse) -> (Tensor, Tensor)";

}  // namespace sage::schema
