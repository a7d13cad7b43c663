// Plain C++ entry points of the sm89 family's CUDA code (no torch types), called by bindings.cpp.
#pragma once
#include <cuda_runtime_api.h>

#include "../common/attn_params.h"

namespace sage::sm89 {

cudaError_t quant_int8(const QuantInt8Params& p, int batch, DType dtype, cudaStream_t stream);
// K's token mean [B, H, D] fp32 for smoothing (the shared token-statistics kernel, mean only)
cudaError_t token_mean(const VScaleParams& p, int batch, DType dtype, cudaStream_t stream);
// V's per-channel FP8 scale max(amax / scale_max, 2^-100) (and its token mean when smoothing).
cudaError_t v_scale(const VScaleParams& p, int batch, DType dtype, bool smooth, cudaStream_t stream);
cudaError_t quant_v_fp8(const QuantFp8Params& p, int batch, DType dtype, cudaStream_t stream);
// INT8 QK^T, FP8 e4m3 PV. accum: kF32, kF32F32 or kF32F16.
cudaError_t attn_hd64(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream);
cudaError_t attn_hd128(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream);

}  // namespace sage::sm89
