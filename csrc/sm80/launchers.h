// Plain C++ entry points of the sm80 family's CUDA code (no torch types), called by bindings.cpp.
#pragma once
#include <cuda_runtime_api.h>

#include "../common/attn_params.h"

namespace sage::sm80 {

cudaError_t quant_int8(const QuantInt8Params& p, int batch, DType dtype, cudaStream_t stream);
// K's token mean [B, H, D] fp32 for smoothing (the shared token-statistics kernel, mean only)
cudaError_t token_mean(const VScaleParams& p, int batch, DType dtype, cudaStream_t stream);
// INT8 QK^T, FP16 PV. accum: kF32, kF16F32 or kF16; out_dtype is q's, and with kF32 also V's
// (pv_in_bf16: bfloat16 V runs P.V in bf16); the fp16-accumulating modes take fp16 V.
cudaError_t attn_hd64(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream);
cudaError_t attn_hd128(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream);

}  // namespace sage::sm80
