// sm90_fp8 family: fused INT8 quantization of Q and K, FP8 e4m3 quantization of V (the shared
// kernels, built for sm_90a).
#include "../common/quant_kernels.cuh"
#include "launchers.h"

namespace sage::sm90_fp8 {

cudaError_t quant_int8(const QuantInt8Params& p, int batch, DType dtype, cudaStream_t stream) {
  return launch_quant_int8(p, batch, dtype, stream);
}

cudaError_t token_mean(const VScaleParams& p, int batch, DType dtype, cudaStream_t stream) {
  return launch_token_mean(p, batch, dtype, stream);
}

cudaError_t quant_v_fp8(const QuantFp8Params& p, int batch, DType dtype, cudaStream_t stream) {
  return launch_quant_v_fp8(p, batch, dtype, stream);
}

cudaError_t v_scale(const VScaleParams& p, int batch, DType dtype, bool smooth, cudaStream_t stream) {
  return launch_v_scale(p, batch, dtype, smooth, stream);
}

}  // namespace sage::sm90_fp8
