// sm80 family: INT8 QK^T + FP16 PV attention, head dim 64 (all accumulation modes, fp16/bf16 out).
#include "../common/attn_dispatch.cuh"
#include "launchers.h"

namespace sage::sm80 {

cudaError_t attn_hd64(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream) {
  switch (accum) {
    case PvAccum::kF32:
      return launch_attn_pv16_f32<64>(p, out_dtype, stream);
    case PvAccum::kF16F32:
      return launch_attn_dtype<64, PvKind::kFp16, PvAccum::kF16F32>(p, out_dtype, stream);
    case PvAccum::kF16:
      return launch_attn_dtype<64, PvKind::kFp16, PvAccum::kF16>(p, out_dtype, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sage::sm80
