// sm90 family: INT8 QK^T + 16-bit PV attention on wgmma (sm_90a), head dim 128, fp16/bf16.
#include "launchers.h"
#include "tiles.cuh"

namespace sage::sm90 {

cudaError_t attn_hd128(const AttnParams& p, DType dtype, cudaStream_t stream) {
  return launch_attention<128>(p, dtype, stream);
}

}  // namespace sage::sm90
