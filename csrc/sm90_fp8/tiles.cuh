// The sm90_fp8 family's tile and its runtime -> compile-time switches (accumulation, output dtype)
// of the warp-specialized wgmma kernel (csrc/common/attn_wgmma.cuh) with FP8 P.V. Shape as
// measured on the H200 (benchmarks/results/h200-2026-12-03-wgmma-fp8-maskbranch.log, variant
// `f8`): two consumer warpgroups (128 query rows per CTA), 128-key blocks (an FP8 V^T row is
// 128 token bytes), a ring of two K/V buffers, no ping-pong; the same at both head dims.
#pragma once
#include "../common/attn_wgmma.cuh"

namespace sage::sm90_fp8 {

struct Tile {
  static constexpr int kConsumerWarpgroups = 2, kBlockN = 128, kStages = 2;
  static constexpr bool kPingPong = false;
};

template <int HEAD_DIM, bool TWO_LEVEL>
cudaError_t launch_dtype(const AttnParams& p, DType out_dtype, cudaStream_t stream) {
  using T = Tile;
  if (out_dtype == DType::kFloat16)
    return launch_attn_wgmma_ws<HEAD_DIM, T::kConsumerWarpgroups, T::kBlockN, T::kStages, T::kPingPong,
                                PvKind::kFp8, __half, TWO_LEVEL>(p, stream);
  return launch_attn_wgmma_ws<HEAD_DIM, T::kConsumerWarpgroups, T::kBlockN, T::kStages, T::kPingPong,
                              PvKind::kFp8, __nv_bfloat16, TWO_LEVEL>(p, stream);
}

template <int HEAD_DIM>
cudaError_t launch_attention(const AttnParams& p, PvAccum accum, DType out_dtype, cudaStream_t stream) {
  switch (accum) {
    case PvAccum::kF32F32: return launch_dtype<HEAD_DIM, true>(p, out_dtype, stream);
    case PvAccum::kF32: return launch_dtype<HEAD_DIM, false>(p, out_dtype, stream);
    default: return cudaErrorInvalidValue;  // the bindings accept only these two
  }
}

}  // namespace sage::sm90_fp8
