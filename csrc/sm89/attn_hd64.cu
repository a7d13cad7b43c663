// sm89 family: INT8 QK^T + FP8 e4m3 PV attention, head dim 64 (all accumulation modes, fp16/bf16 out).
// The sm89 family keeps the tile shape its GPU tests and timings ran with (docs/kernels.md).
#ifndef SAGE_HD64_QREG
#define SAGE_HD64_QREG 1
#endif
#ifndef SAGE_MIN_CTAS_HD64  // the sm80 family's 3-CTA cap spills here (Q in registers)
#define SAGE_MIN_CTAS_HD64 1
#endif
#include "../common/attn_dispatch.cuh"
#include "launchers.h"

namespace sage::sm89 {

cudaError_t attn_hd64(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream) {
  switch (accum) {
    case PvAccum::kF32:
      return launch_attn_dtype<64, PvKind::kFp8, PvAccum::kF32>(p, out_dtype, stream);
    case PvAccum::kF32F32:
      return launch_attn_dtype<64, PvKind::kFp8, PvAccum::kF32F32>(p, out_dtype, stream);
    case PvAccum::kF32F16:
      return launch_attn_dtype<64, PvKind::kFp8, PvAccum::kF32F16>(p, out_dtype, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sage::sm89
