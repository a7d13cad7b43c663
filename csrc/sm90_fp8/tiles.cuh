// The sm90_fp8 family's tile and its runtime -> compile-time switches (accumulation, output dtype)
// of the warp-specialized wgmma kernel (csrc/common/attn_wgmma.cuh) with FP8 P.V. Shape as
// measured on the H200 (benchmarks/results/h200-2026-12-03-wgmma-fp8-maskbranch.log, variant
// `f8`): two consumer warpgroups (128 query rows per CTA), 128-key blocks (an FP8 V^T row is
// 128 token bytes), a ring of K/V buffers (three since 2026-12-06, below), no ping-pong; the same
// at both head dims.
#pragma once
// The family's kernel levers, on since 2026-12-05: the bulk tensor copy engine for Q, K and V^T,
// the O update and the next scores' preset inside the softmax's block, and persistent CTAs taking
// tiles from a per-call counter. Together 1.02-1.07x the previous default on every case of
// benchmarks/results/h100-2026-12-05-tune-d73f772-native.log (variant pdfet8, an H100; the
// levers alone: fet8 1.025x, fe8 1.008x, pd8 0.996x geomean). A -D on the command line still
// overrides each.
#ifndef SAGE_WG_TMA
#define SAGE_WG_TMA 1
#endif
#ifndef SAGE_WG_FUSED_UPDATE
#define SAGE_WG_FUSED_UPDATE 1
#endif
#ifndef SAGE_WG_EARLY_PRESET
#define SAGE_WG_EARLY_PRESET 1
#endif
#ifndef SAGE_WG_PERSISTENT
#define SAGE_WG_PERSISTENT 2
#endif
#ifndef SAGE_WG_STAGES
// K/V buffers in the ring: three, as the sm90 family (a block's K and V start landing a block
// earlier). H100, 2026-12-06 (benchmarks/results/h100-2026-12-06-tune-f960dcf-native.log, variant
// f8st3, "fp32+fp32"): 1.051x geomean over eight cases, 0.968-1.132x; two stages before.
#define SAGE_WG_STAGES 3
#endif
#ifndef SAGE_WG_PINGPONG
#define SAGE_WG_PINGPONG 0  // turns for the consumers' wgmmas (1: on issue, 2: on completion)
#endif
#include "../common/attn_wgmma.cuh"

namespace sage::sm90_fp8 {

// Consumer warpgroups at d=64 (tuning knob): three make a 192-row CTA, as the sm90 family's d=64
// default (its softmax bounds the loop there); 2 by default.
#ifndef SAGE_SM90_FP8_NWG_64
#define SAGE_SM90_FP8_NWG_64 2
#endif

template <int HEAD_DIM>
struct Tile {
  static constexpr int kConsumerWarpgroups = HEAD_DIM == 64 ? SAGE_SM90_FP8_NWG_64 : 2, kBlockN = 128;
  static constexpr int kStages = SAGE_WG_STAGES, kPingPong = SAGE_WG_PINGPONG;
};

template <int HEAD_DIM, bool TWO_LEVEL>
cudaError_t launch_dtype(const AttnParams& p, DType out_dtype, cudaStream_t stream) {
  using T = Tile<HEAD_DIM>;
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
