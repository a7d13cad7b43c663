// The sm90 family's tile per head dim and the one runtime -> compile-time switch (input dtype ->
// P.V type) of its warp-specialized wgmma kernel (csrc/common/attn_wgmma.cuh). Shipped shapes, as
// measured on the H200 (benchmarks/results/h200-2026-12-03-wgmma-ws2.log, variants `ws2` and `ws1`
// of one call): two consumer warpgroups (128 query rows per CTA) at both head dims (d=64: 351 / 294
// / 408 / 375 TOPS against 313 / 277 / 347 / 334 with one warpgroup and two CTAs per SM); 128-key
// blocks, a ring of K/V buffers (three since 2026-12-06: SAGE_SM90_STAGES_*), no ping-pong
// (slower: ...-wgmma-ws1.log, `ws2pp`).
#pragma once
// The family's kernel levers, on since 2026-12-05: Q, K and V by the bulk tensor copy engine and
// persistent CTAs taking tiles from a per-call counter. Together 1.050x the previous default
// geomean, 1.019-1.098x per case (benchmarks/results/h200-2026-12-05-tune-ba2477b-native.log,
// variant tp16, an H200; the copy engine alone t16 1.030x; with the fused update and early
// preset, all16, 1.050x but 1.009x at 1x32x16384x128). A -D on the command line overrides each.
#ifndef SAGE_WG_TMA
#define SAGE_WG_TMA 1
#endif
#ifndef SAGE_WG_PERSISTENT
#define SAGE_WG_PERSISTENT 2
#endif
#ifndef SAGE_WG_TMA_STORE
// The staged output tile (d=128, two consumer warpgroups) leaves shared memory by the copy engine:
// H100, 2026-12-06 (benchmarks/results/h100-2026-12-06-tune-c61cff5-native.log, variant tm):
// 1.018x geomean over ten cases, 1.002-1.055x at d=128; d=64 (three warpgroups, not staged) level.
#define SAGE_WG_TMA_STORE 1
#endif
#ifndef SAGE_WG_LAZY_RESCALE
// P up to 2^8 in fp16/bf16: most blocks skip O's rescale (H100, 2026-12-05: 0.98-1.05x per case, 1.013x
// geomean; docs/kernels.md, "three consumer warpgroups at d=64")
#define SAGE_WG_LAZY_RESCALE 8
#endif
#include "../common/attn_wgmma.cuh"

namespace sage::sm90 {

template <int HEAD_DIM>
struct Tile;
// Tuning overrides of the tile per head dim (e.g. -DSAGE_SM90_NWG_64=3 -DSAGE_SM90_BLOCK_N_128=64):
// consumer warpgroups 1 to 4 (three or four need the copy engine, SAGE_WG_TMA), 64- or 128-key blocks.
#ifndef SAGE_SM90_NWG_64
#if SAGE_WG_TMA
#define SAGE_SM90_NWG_64 3  // three at d=64, where the softmax is the limit (H100: 0.99-1.22x per case)
#else
#define SAGE_SM90_NWG_64 2  // three need the copy engine: a -DSAGE_WG_TMA=0 tuning build gets two
#endif
#endif
#ifndef SAGE_SM90_BLOCK_N_64
#define SAGE_SM90_BLOCK_N_64 128
#endif
#ifndef SAGE_SM90_NWG_128
#define SAGE_SM90_NWG_128 2
#endif
#ifndef SAGE_SM90_BLOCK_N_128
#define SAGE_SM90_BLOCK_N_128 128
#endif
// K/V buffers in the ring per head dim: three, so a block's K and V start landing a whole block
// earlier than with two (whose refill waited for both warpgroups to release the stage, then for the
// copy, in the faster warpgroup's softmax). H100, 2026-12-06
// (benchmarks/results/h100-2026-12-06-tune-3a5ec42-native.log, variant st3): 1.036x geomean over ten
// cases, 0.993-1.082x. And turns for the d=128 consumers' products (SAGE_WG_PINGPONG's 1: on issue,
// 2: on completion; two warpgroups only): off (pp1 0.996x; pp2 with three stages 1.028x).
#ifndef SAGE_SM90_STAGES_64
#define SAGE_SM90_STAGES_64 3
#endif
#ifndef SAGE_SM90_STAGES_128
#define SAGE_SM90_STAGES_128 3
#endif
#ifndef SAGE_SM90_PINGPONG_128
#define SAGE_SM90_PINGPONG_128 0
#endif
template <>
struct Tile<64> {
  static constexpr int kConsumerWarpgroups = SAGE_SM90_NWG_64, kBlockN = SAGE_SM90_BLOCK_N_64;
  static constexpr int kStages = SAGE_SM90_STAGES_64, kPingPong = 0;
};
template <>
struct Tile<128> {
  static constexpr int kConsumerWarpgroups = SAGE_SM90_NWG_128, kBlockN = SAGE_SM90_BLOCK_N_128;
  static constexpr int kStages = SAGE_SM90_STAGES_128, kPingPong = SAGE_SM90_PINGPONG_128;
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
