// Runtime -> compile-time switch for the attention kernel: the only place that maps
// (accumulation mode, output dtype) to template instantiations, and the per-head-dim tile shape.
#pragma once
#include "attn_kernel.cuh"

namespace sage {

// Tile shape per head dim: MT m16 tiles per warp, NWARPS warps (CTA_Q = 16 * MT * NWARPS, at
// most 128 = the Q padding), QREG: Q fragments kept in registers. The -D overrides exist for
// tuning runs (benchmarks/gpu_dev_native.py --variant); the defaults are the measured best.
#ifndef SAGE_HD64_MT
#define SAGE_HD64_MT 2
#define SAGE_HD64_WARPS 4
#define SAGE_HD64_QREG 1
#endif
#ifndef SAGE_HD128_MT
#define SAGE_HD128_MT 1
#define SAGE_HD128_WARPS 8
#define SAGE_HD128_QREG 1
#endif
template <int HEAD_DIM>
struct TileShape;
template <>
struct TileShape<64> {
  static constexpr int kMT = SAGE_HD64_MT, kWarps = SAGE_HD64_WARPS;
  static constexpr bool kQReg = SAGE_HD64_QREG;
};
template <>
struct TileShape<128> {
  static constexpr int kMT = SAGE_HD128_MT, kWarps = SAGE_HD128_WARPS;
  static constexpr bool kQReg = SAGE_HD128_QREG;
};
static_assert(16 * SAGE_HD64_MT * SAGE_HD64_WARPS <= 128 && 16 * SAGE_HD128_MT * SAGE_HD128_WARPS <= 128,
              "CTA_Q must divide the 128-token Q padding");

template <int HEAD_DIM, PvKind PV, PvAccum ACC>
cudaError_t launch_attn_dtype(const AttnParams& p, DType out_dtype, cudaStream_t stream) {
  using S = TileShape<HEAD_DIM>;
  if (out_dtype == DType::kFloat16)
    return launch_attn<HEAD_DIM, S::kMT, S::kWarps, S::kQReg, PV, ACC, __half>(p, stream);
  return launch_attn<HEAD_DIM, S::kMT, S::kWarps, S::kQReg, PV, ACC, __nv_bfloat16>(p, stream);
}

}  // namespace sage
