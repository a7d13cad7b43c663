// sm80 family: fused INT8 quantization of Q and K.
#include "../common/quant_kernels.cuh"
#include "launchers.h"

namespace sage::sm80 {

cudaError_t quant_int8(const QuantInt8Params& p, int batch, DType dtype, cudaStream_t stream) {
  return launch_quant_int8(p, batch, dtype, stream);
}

cudaError_t token_mean(const VScaleParams& p, int batch, DType dtype, cudaStream_t stream) {
  return launch_token_mean(p, batch, dtype, stream);
}

}  // namespace sage::sm80
