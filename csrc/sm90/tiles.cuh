// The sm90 family's tile per head dim and the one runtime -> compile-time switch (input dtype ->
// P.V type) of its warp-specialized wgmma kernel (csrc/common/attn_wgmma.cuh). Shipped shapes, as
// measured on the H200 (benchmarks/results/h200-2026-12-03-wgmma-ws2.log, variants `ws2` and `ws1`
// of one call): two consumer warpgroups (128 query rows per CTA) at both head dims (d=64: 351 / 294
// / 408 / 375 TOPS against 313 / 277 / 347 / 334 with one warpgroup and two CTAs per SM); 128-key
// blocks, a ring of two K/V buffers, no ping-pong (slower: ...-wgmma-ws1.log, `ws2pp`).
#pragma once
#include "../common/attn_wgmma.cuh"

namespace sage::sm90 {

template <int HEAD_DIM>
struct Tile;
template <>
struct Tile<64> {
  static constexpr int kConsumerWarpgroups = 2, kBlockN = 128, kStages = 2;
  static constexpr bool kPingPong = false;
};
template <>
struct Tile<128> {
  static constexpr int kConsumerWarpgroups = 2, kBlockN = 128, kStages = 2;
  static constexpr bool kPingPong = false;
};

template <int HEAD_DIM>
cudaError_t launch_attention(const AttnParams& p, DType dtype, cudaStream_t stream) {
  using T = Tile<HEAD_DIM>;
  if (pv_in_bf16(dtype, PvAccum::kF32))
    return launch_attn_wgmma_ws<HEAD_DIM, T::kConsumerWarpgroups, T::kBlockN, T::kStages, T::kPingPong,
                                PvKind::kBf16, __nv_bfloat16>(p, stream);
  return launch_attn_wgmma_ws<HEAD_DIM, T::kConsumerWarpgroups, T::kBlockN, T::kStages, T::kPingPong,
                              PvKind::kFp16, __half>(p, stream);
}

}  // namespace sage::sm90
