// sm90_fp8 family: INT8 QK^T + FP8 e4m3 PV attention on wgmma (sm_90a), head dim 128, fp16/bf16 out.
#include "launchers.h"
#include "tiles.cuh"

namespace sage::sm90_fp8 {

cudaError_t attn_hd128(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream) {
  return launch_attention<128>(p, accum, out_dtype, stream);
}

}  // namespace sage::sm90_fp8
