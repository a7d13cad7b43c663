// Runtime -> compile-time switch for the attention kernel: the only place that maps
// (accumulation mode, output dtype) to template instantiations, and the per-head-dim tile shape.
#pragma once
#include "attn_kernel.cuh"

namespace sage {

// Tile shape per head dim: MT m16 tiles per warp, NWARPS warps (CTA_Q = 16 * MT * NWARPS, at
// most 128 = the Q padding), QREG: Q fragments kept in registers. The -D overrides exist for
// tuning runs (benchmarks/gpu_dev_native.py --variant); the defaults are the measured best.
// Measured on the H200 (docs/kernels.md): for d=128, 4 warps x 2 m-tiles with Q reloaded from
// shared memory ran 296 TOPS vs 219 for 8 warps x 1 m-tile (2026-12-02, fp16, 4x32x4096); after
// the 2026-12-03 loop rewrite 1 m-tile per warp, 128-key iterations and Q in registers were
// still 3-33% slower than these defaults, and after the address changes (docs/kernels.md)
// d=64 with 2 CTAs per SM, 128-key iterations or 2 warps per CTA were 6-18% slower.
// Each knob can be set alone with -D; unset ones keep these defaults.
#ifndef SAGE_HD64_KSUB  // 64-token K scale blocks per loop iteration (2: timed, slower)
#define SAGE_HD64_KSUB 1
#endif
#ifndef SAGE_HD64_MT
#define SAGE_HD64_MT 2
#endif
#ifndef SAGE_HD64_WARPS
#define SAGE_HD64_WARPS 4
#endif
#ifndef SAGE_HD64_QREG
#define SAGE_HD64_QREG 0
#endif
#ifndef SAGE_HD128_KSUB
#define SAGE_HD128_KSUB 1
#endif
#ifndef SAGE_HD128_MT
#define SAGE_HD128_MT 2
#endif
#ifndef SAGE_HD128_WARPS
#define SAGE_HD128_WARPS 4
#endif
#ifndef SAGE_HD128_QREG
#define SAGE_HD128_QREG 0
#endif
template <int HEAD_DIM>
struct TileShape;
template <>
struct TileShape<64> {
  static constexpr int kMT = SAGE_HD64_MT, kWarps = SAGE_HD64_WARPS, kKSub = SAGE_HD64_KSUB;
  static constexpr bool kQReg = SAGE_HD64_QREG;
};
template <>
struct TileShape<128> {
  static constexpr int kMT = SAGE_HD128_MT, kWarps = SAGE_HD128_WARPS, kKSub = SAGE_HD128_KSUB;
  static constexpr bool kQReg = SAGE_HD128_QREG;
};
static_assert(16 * SAGE_HD64_MT * SAGE_HD64_WARPS <= 128 && 16 * SAGE_HD128_MT * SAGE_HD128_WARPS <= 128,
              "CTA_Q must divide the 128-token Q padding");

#ifdef SAGE_WGMMA
// Tuning build for sm_90a only (benchmarks/gpu_dev_native.py --arch 9.0a --variant
// "wg=-DSAGE_WGMMA=1 ..."): the sm80 family's "fp32" mode runs on a wgmma kernel (attn_wgmma.cuh),
// and with SAGE_WG_WS=1 the sm89 family's "fp32" / "fp32+fp32" FP8 modes too.
#ifndef SAGE_WG_NWG
#define SAGE_WG_NWG 1  // warpgroups (64 query rows each) per CTA
#endif
#ifndef SAGE_WG_N64
#define SAGE_WG_N64 128  // keys per block, head dim 64
#endif
#ifndef SAGE_WG_N128
#define SAGE_WG_N128 128  // keys per block, head dim 128
#endif
#ifndef SAGE_WG_WS
#define SAGE_WG_WS 0  // 1: the warp-specialized kernel (a producer warpgroup, mbarriers)
#endif
#ifndef SAGE_WG_STAGES
#define SAGE_WG_STAGES 2  // WS: K/V buffers in the ring
#endif
#ifndef SAGE_WG_PINGPONG
#define SAGE_WG_PINGPONG 0  // WS with NWG=2: turns for the consumers' wgmmas (1: on issue, 2: on completion)
#endif
}  // namespace sage
#include "attn_wgmma.cuh"
namespace sage {
#endif  // SAGE_WGMMA

template <int HEAD_DIM, PvKind PV, PvAccum ACC>
cudaError_t launch_attn_dtype(const AttnParams& p, DType out_dtype, cudaStream_t stream) {
  using S = TileShape<HEAD_DIM>;
#if defined(SAGE_WGMMA) && SAGE_WG_WS
  // Tuning build (sm89 family, -DSAGE_WGMMA=1 -DSAGE_WG_WS=1): FP8 P.V with "fp32" or "fp32+fp32"
  // accumulation on the warp-specialized wgmma kernel, 128-key blocks.
  if constexpr (PV == PvKind::kFp8 && (ACC == PvAccum::kF32 || ACC == PvAccum::kF32F32)) {
    constexpr bool kTwoLevel = ACC == PvAccum::kF32F32;
    if (out_dtype == DType::kFloat16)
      return launch_attn_wgmma_ws<HEAD_DIM, SAGE_WG_NWG, 128, SAGE_WG_STAGES, SAGE_WG_PINGPONG, PV, __half,
                                  kTwoLevel>(p, stream);
    return launch_attn_wgmma_ws<HEAD_DIM, SAGE_WG_NWG, 128, SAGE_WG_STAGES, SAGE_WG_PINGPONG, PV,
                                __nv_bfloat16, kTwoLevel>(p, stream);
  }
#endif
  if (out_dtype == DType::kFloat16)
    return launch_attn<HEAD_DIM, S::kMT, S::kWarps, S::kQReg, S::kKSub, PV, ACC, __half>(p, stream);
  return launch_attn<HEAD_DIM, S::kMT, S::kWarps, S::kQReg, S::kKSub, PV, ACC, __nv_bfloat16>(p, stream);
}

// FP16-PV families ("fp32" accumulation): fp16 P.V for float16 inputs, bf16 P.V for bfloat16
// (pv_in_bf16); the output has the inputs' dtype.
#ifdef SAGE_WGMMA
template <int HEAD_DIM>
cudaError_t launch_attn_pv16_f32(const AttnParams& p, DType dtype, cudaStream_t stream) {
  constexpr int kN = HEAD_DIM == 64 ? SAGE_WG_N64 : SAGE_WG_N128;
#if SAGE_WG_WS
  if (pv_in_bf16(dtype, PvAccum::kF32))
    return launch_attn_wgmma_ws<HEAD_DIM, SAGE_WG_NWG, kN, SAGE_WG_STAGES, SAGE_WG_PINGPONG, PvKind::kBf16,
                                __nv_bfloat16>(p, stream);
  return launch_attn_wgmma_ws<HEAD_DIM, SAGE_WG_NWG, kN, SAGE_WG_STAGES, SAGE_WG_PINGPONG, PvKind::kFp16,
                              __half>(p, stream);
#else
  if (pv_in_bf16(dtype, PvAccum::kF32))
    return launch_attn_wgmma<HEAD_DIM, SAGE_WG_NWG, kN, PvKind::kBf16, __nv_bfloat16>(p, stream);
  return launch_attn_wgmma<HEAD_DIM, SAGE_WG_NWG, kN, PvKind::kFp16, __half>(p, stream);
#endif
}
#else
template <int HEAD_DIM>
cudaError_t launch_attn_pv16_f32(const AttnParams& p, DType dtype, cudaStream_t stream) {
  using S = TileShape<HEAD_DIM>;
  if (pv_in_bf16(dtype, PvAccum::kF32))
    return launch_attn<HEAD_DIM, S::kMT, S::kWarps, S::kQReg, S::kKSub, PvKind::kBf16, PvAccum::kF32,
                       __nv_bfloat16>(p, stream);
  return launch_attn<HEAD_DIM, S::kMT, S::kWarps, S::kQReg, S::kKSub, PvKind::kFp16, PvAccum::kF32,
                     __half>(p, stream);
}
#endif

}  // namespace sage
