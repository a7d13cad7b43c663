// Plain C++ entry points of the sm90 family's CUDA code (no torch types), called by bindings.cpp.
// Built for sm_90a only (wgmma, setmaxnreg): the kernels run on compute capability 9.0 alone.
#pragma once
#include <cuda_runtime_api.h>

#include "../common/attn_params.h"

namespace sage::sm90 {

cudaError_t quant_int8(const QuantInt8Params& p, int batch, DType dtype, cudaStream_t stream);
// K's token mean [B, H, D] fp32 for smoothing (the shared token-statistics kernel, mean only)
cudaError_t token_mean(const VScaleParams& p, int batch, DType dtype, cudaStream_t stream);
// INT8 QK^T, 16-bit PV with "fp32" accumulation (the only mode): P.V in fp16 for float16 inputs,
// in bf16 on V as given for bfloat16 (pv_in_bf16); the output has the inputs' dtype.
cudaError_t attn_hd64(const AttnParams& p, DType dtype, cudaStream_t stream);
cudaError_t attn_hd128(const AttnParams& p, DType dtype, cudaStream_t stream);

}  // namespace sage::sm90
