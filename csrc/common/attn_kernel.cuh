// The SageAttention 2 forward kernel template shared by the sm80 family (INT8 QK^T, FP16 PV) and
// the sm89 family (INT8 QK^T, FP8 e4m3 PV). CUDA headers only.
//
// A CTA owns CTA_Q = NWARPS * MT * 16 query rows of one (batch, head); each warp owns MT m16 tiles.
// K/V blocks of 64 tokens go through a ring of shared-memory buffers (cp.async). Per block:
//   S = Q_i8 K_i8^T (mma m16n8k32 s8, int32)  -> dequantize with the Q scale (which carries
//   sm_scale * log2 e) and K scale -> mask (sequence end, causal) -> online softmax in base 2
//   -> P (fp16, or e4m3 scaled by 448) -> O += P V (mma m16n8k16 f16 / m16n8k32 e4m3).
// Fragment layouts (PTX ISA, mma.m16n8k*): lane = 4 g + t; accumulator c0,c1 = row g, columns
// 2t, 2t+1; c2,c3 = row g + 8. For m16n8k16 f16 the A fragment of P is built straight from the S
// accumulators of two n8 tiles. For m16n8k32 e4m3 each A register holds 4 consecutive k; we feed
// the columns {2t, 2t+1, 8+2t, 9+2t} of two n8 tiles and store V^T with the same token order
// (perm16 in quant_kernels.cuh), so the sum over k is unchanged.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attn_params.h"
#include "ptx.cuh"

// CTAs per SM the register allocation must allow, per head dim (tuning knobs; 1 = no cap).
// d=64: 3 (168 registers, 12 warps per SM instead of 8) measured +2% ("fp32") and +10% ("fp16")
// on the H200 (benchmarks/results/h200-2026-12-03-native-712289d.log, variant e); on an H100, 2
// (213 registers, no spills, against 168 with spills) ran 0.94x "fp32" and 0.90x "fp16"
// (benchmarks/results/h100-2026-12-07-tune-7232cd3-native.log, variant c2).
#ifndef SAGE_MIN_CTAS_HD64
#define SAGE_MIN_CTAS_HD64 3
#endif
#ifndef SAGE_MIN_CTAS_HD128
#define SAGE_MIN_CTAS_HD128 1
#endif
// K/V buffers in the cp.async ring per head dim (tuning knobs, 2 or more): with S buffers, block
// kb + S - 1 is requested while block kb is computed, so a copy has S - 1 blocks' time to land.
// Three were level for the sm80 family on an H100 (0.980-1.010x, "fp32", d=64 and d=128;
// benchmarks/results/h100-2026-12-06-tune-0d2e506-native.log): its several CTAs per SM already
// hide the copies, unlike the one-CTA wgmma kernel, where a third stage gained 3.6%.
#ifndef SAGE_KV_STAGES_HD64
#define SAGE_KV_STAGES_HD64 2
#endif
#ifndef SAGE_KV_STAGES_HD128
#define SAGE_KV_STAGES_HD128 2
#endif
// Skip the O rescale when no row max of the warp moved (tuning knob).
#ifndef SAGE_SKIP_RESCALE
#define SAGE_SKIP_RESCALE 1
#endif
#ifndef SAGE_FAST_I2F
#define SAGE_FAST_I2F 1
#endif
// n8 score tiles out of every 8 whose exp2 runs on the FMA pipe (exp2_fma), 0..8 (tuning knob).
#ifndef SAGE_EXP2_FMA
#define SAGE_EXP2_FMA 0
#endif
// fp16 P (PvKind::kFp16) as ex2.approx.f16x2 of the fp16-rounded exponents, one per pair of
// scores, its row sum in fp16 (ptx.cuh: exp2_f16x2, sum_f16x2) (tuning knob, 0: off; 0.98x
// for "fp32" and 0.94x for "fp16" on an H100, docs/kernels.md 2026-12-06).
#ifndef SAGE_EXP2_F16X2
#define SAGE_EXP2_F16X2 0
#endif
// 16-bit P packed into its A-fragment words as soon as each pair is exponentiated, not in the P.V
// loop: a block's P then holds half the registers (ptxas, sm_90: "fp16+fp32" spills 28/52 bytes
// at d=128 instead of 392/336, "fp32" none instead of 44/80). -1: the measured rule, on for
// "fp16+fp32" and for "fp32" at d=128; 0: off; 1: every 16-bit mode (tuning knob). H100,
// 2026-12-06 (benchmarks/results/h100-2026-12-06-tune-c9366d3-native.log, variant pe; default
// time / variant time): "fp16+fp32" 1.017-1.074x per case (1.048x geomean), "fp32" 1.015-1.065x
// at d=128 but 0.979-1.055x at d=64, "fp16" 0.959x geomean (0.912 at d=128).
#ifndef SAGE_PACK_P_EARLY
#define SAGE_PACK_P_EARLY -1
#endif
// "fp32" accumulation with 16-bit P: a row's exponent offset (its running maximum) moves only when
// a block's maximum passes it by more than this many powers of two (0: whenever it passes it),
// as the wgmma kernels' SAGE_WG_LAZY_RESCALE. P then reaches up to 2^N, which fp16/bf16 P and
// the fp32 row sum and O hold, and O / l comes out the same; most blocks keep every row's
// offset, so the warp vote skips their O rescale. Not for fp16 accumulators ("fp16",
// "fp16+fp32": a block's P.V would grow 2^N times in fp16) nor FP8 P (scaled to 448).
#ifndef SAGE_LAZY_RESCALE
#define SAGE_LAZY_RESCALE 8
#endif
// One vote per block on whether any row of the warp needs O rescaled, after every row's softmax,
// instead of one vote and branch per row (4 at MT = 2): the rows' softmaxes become one straight
// stretch. -1: the measured rule, on where the lazy rescale is (a rescale is then rare); 0: off;
// 1: every mode (tuning knob). H100, 2026-12-06 (docs/kernels.md, 19th session; default time /
// variant time, "fp32", ten cases): the lazy rescale alone 0.995x
// (benchmarks/results/h100-2026-12-06-tune-b25e8cf-native.log), with the one vote 1.017x
// (1.002-1.020 at d=64; h100-2026-12-06-tune-38bba42-native.log).
#ifndef SAGE_RESCALE_ONE_VOTE
#define SAGE_RESCALE_ONE_VOTE -1
#endif
#if SAGE_EXP2_F16X2 && SAGE_EXP2_FMA
#error "SAGE_EXP2_F16X2 and SAGE_EXP2_FMA are two answers to one question: set one"
#endif

namespace sage {

// P.V operands: fp16 P and V, bf16 P and V (bfloat16 V with fp32 accumulation: no conversion of V,
// no fp16 overflow), or e4m3 P*448 and per-channel scaled e4m3 V^T.
enum class PvKind { kFp16, kBf16, kFp8 };
__host__ __device__ constexpr bool pv_is_16bit(PvKind k) { return k != PvKind::kFp8; }

constexpr int kBlkK = 64;
constexpr float kLn2 = 0.69314718055994530942f;
constexpr float kFp8PScale = 448.f;
constexpr float kLog2Fp8PScale = 8.807354922057604f;  // log2(448)

// KSUB: 64-token K blocks (one K scale block each) handled per loop iteration / barrier.
template <int HEAD_DIM, int MT, int NWARPS, PvKind PV, int KSUB = 1>
struct AttnTraits {
  static constexpr int kIterK = KSUB * kBlkK;  // keys per iteration
  static constexpr int kCtaQ = NWARPS * MT * 16;
  static constexpr int kThreads = NWARPS * 32;
  // Rows padded by 16 bytes: 8 rows read by one ldmatrix land in 8 different bank groups.
  static constexpr int kQKStride = HEAD_DIM + 16;  // int8 Q/K rows
  static constexpr int kVRows = pv_is_16bit(PV) ? kIterK : kFp8VTerms * HEAD_DIM;  // FP8: hi, then lo rows
  static constexpr int kVStride = pv_is_16bit(PV) ? HEAD_DIM * 2 + 16 : kIterK + 16;
  static constexpr int kQBytes = kCtaQ * kQKStride;
  static constexpr int kKBytes = kIterK * kQKStride;
  static constexpr int kVBytes = kVRows * kVStride;
  static constexpr int kStages = HEAD_DIM == 64 ? SAGE_KV_STAGES_HD64 : SAGE_KV_STAGES_HD128;
  static_assert(kStages >= 2, "at least two K/V buffers");
  static constexpr int kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes);
  static constexpr int kDTiles = HEAD_DIM / 8;  // n8 tiles of the output
};

// Two P values as the 16-bit A-fragment word of the P.V mma.
template <PvKind PV>
__device__ __forceinline__ uint32_t pack_p16(float lo, float hi) {
  if constexpr (PV == PvKind::kBf16) return pack_bf16x2(lo, hi);
  return pack_half2(lo, hi);
}

template <typename OutT>
__device__ __forceinline__ uint32_t pack_out2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack_out2<__half>(float a, float b) {
  return pack_half2(a, b);
}
template <>
__device__ __forceinline__ uint32_t pack_out2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Calls f(c) for this thread's chunks c = tid, tid + THREADS, ... < CHUNKS with a trip count known
// at compile time (a `c < CHUNKS; c += THREADS` loop compiles to a generic loop with remainder
// handling). Used for the one-time Q copy; the per-block K/V copies below go further.
template <int CHUNKS, int THREADS, typename F>
__device__ __forceinline__ void for_each_chunk(const int tid, F&& f) {
  #pragma unroll
  for (int i = 0; i < (CHUNKS + THREADS - 1) / THREADS; ++i) {
    const int c = tid + i * THREADS;
    if (CHUNKS % THREADS == 0 || c < CHUNKS) f(c);
  }
}

// S (int32) -> float without I2F (a quarter-rate instruction on sm_80..sm_90) and without any
// instruction at all: the QK accumulators start at kScoreBias instead of 0. |S| <= 127*127*D < 2^22,
// so the int32 0x4B400000 + S is the bit pattern of the float 1.5*2^23 + S, exactly; the
// softmax takes kScoreBiasF off the row maximum once and folds it into the exp2 FMA's constant.
#if SAGE_FAST_I2F
constexpr int32_t kScoreBias = 0x4B400000;
constexpr float kScoreBiasF = 12582912.f;
__device__ __forceinline__ float score_to_f32(int32_t x) { return __int_as_float(x); }
#else
constexpr int32_t kScoreBias = 0;
constexpr float kScoreBiasF = 0.f;
__device__ __forceinline__ float score_to_f32(int32_t x) { return static_cast<float>(x); }
#endif

// Which (batch, head, query block) a CTA owns, and how many K blocks it visits. Causal launches
// issue the heaviest query blocks first. Shared by attn_kernel and attn_wgmma_kernel.
struct CtaTile {
  int b, h, hkv, q0, n_kblocks;
  int64_t bh, bhkv;  // (batch, q head) and (batch, kv head) row indices
  CtaTile() = default;
  // A tile decoded elsewhere (the persistent kernel's producer hands its fields to the consumers).
  __device__ __forceinline__ static CtaTile of(const AttnParams& p, int b, int h, int hkv, int q0, int n_kblocks) {
    CtaTile c;
    c.b = b; c.h = h; c.hkv = hkv; c.q0 = q0; c.n_kblocks = n_kblocks;
    c.bh = static_cast<int64_t>(b) * p.q_heads + h;
    c.bhkv = static_cast<int64_t>(b) * p.kv_heads + hkv;
    return c;
  }
  // The tile of this CTA's place in the (query blocks, q heads, batch) grid.
  __device__ __forceinline__ CtaTile(const AttnParams& p, int cta_q, int block_k)
      : CtaTile(p, cta_q, block_k, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x) {}
  // Tile `tile` of all n_qblocks * q_heads * batch (a persistent CTA's tiles): query blocks
  // fastest, then heads, then batches; qblock_major: query blocks slowest, then batches, then heads.
  __device__ __forceinline__ CtaTile(const AttnParams& p, int cta_q, int block_k, int64_t tile, int n_qblocks,
                                     bool qblock_major)
      : CtaTile(p, cta_q, block_k,
                static_cast<int>(qblock_major ? tile / (static_cast<int64_t>(p.q_heads) * p.batch) : tile % n_qblocks),
                static_cast<int>(head_batch_of(p, tile, n_qblocks, qblock_major) % p.q_heads),
                static_cast<int>(head_batch_of(p, tile, n_qblocks, qblock_major) / p.q_heads), n_qblocks) {}
  // The (batch, q head) index, batch * q_heads + head, of linear tile `tile` (as above).
  __device__ __forceinline__ static int64_t head_batch_of(const AttnParams& p, int64_t tile, int n_qblocks,
                                                          bool qblock_major) {
    return qblock_major ? tile % (static_cast<int64_t>(p.q_heads) * p.batch) : tile / n_qblocks;
  }
  // Causal: the last query blocks (the most keys) come first.
  __device__ __forceinline__ CtaTile(const AttnParams& p, int cta_q, int block_k, int qblk_in_order, int head,
                                     int batch, int n_qblocks) {
    b = batch;
    h = head;
    const int qblk = p.causal ? n_qblocks - 1 - qblk_in_order : qblk_in_order;
    q0 = qblk * cta_q;
    hkv = h / (p.q_heads / p.kv_heads);
    bh = static_cast<int64_t>(b) * p.q_heads + h;
    bhkv = static_cast<int64_t>(b) * p.kv_heads + hkv;
    n_kblocks = (p.kv_len + block_k - 1) / block_k;
    if (p.causal) n_kblocks = min(n_kblocks, (q0 + cta_q + block_k - 1) / block_k);
  }
};

// Index of the Q scale of the 16 rows starting at row0 (16-aligned) for the thread of row g:
// per_thread groups rows g, g+8 of each 32-token block, per_warp the 32-token block, per_block 128.
__device__ __forceinline__ int q_scale_index(QuantGran gran, int row0, int g) {
  if (gran == QuantGran::kPerThread) return (row0 / 32) * 8 + g;
  if (gran == QuantGran::kPerWarp) return row0 / 32;
  return row0 / 128;
}

// Epilogue pieces both attention kernels share. A row's sum over its quad (the 4 threads that
// hold its columns), and its LSE in natural log from the base-2 running max and sum (a row that
// saw no key keeps m = -inf: 0 is used, so the LSE is log(l) = -inf, not NaN).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ void store_lse(const AttnParams& p, int64_t bh, int row, float l,
                                          float m_run) {
  const float m = m_run == -INFINITY ? 0.f : m_run;
  p.lse[bh * p.q_len + row] = (log2f(l) + m) * kLn2;
}

// QREG: keep the warp's Q fragments in registers for the whole K loop (else reload them from
// shared memory every K block, trading shared-memory bandwidth for registers).
template <int HEAD_DIM, int MT, int NWARPS, bool QREG, int KSUB, PvKind PV, PvAccum ACC,
          typename OutT>
__global__ void __launch_bounds__(NWARPS * 32, HEAD_DIM == 64 ? SAGE_MIN_CTAS_HD64 : SAGE_MIN_CTAS_HD128)
    attn_kernel(const AttnParams p) {
  using Tr = AttnTraits<HEAD_DIM, MT, NWARPS, PV, KSUB>;
  constexpr int kIterK = Tr::kIterK;
  constexpr int kNT = 8 * KSUB;  // n8 tiles of S per iteration
  constexpr int kCtaQ = Tr::kCtaQ;
  constexpr int kThreads = Tr::kThreads;
  constexpr int kDT = Tr::kDTiles;
  // Inner (per K block) accumulators for two-level modes.
  constexpr bool kInnerF16 = ACC == PvAccum::kF16F32 || ACC == PvAccum::kF32F16;
  constexpr bool kInnerF32 = ACC == PvAccum::kF32F32;
  constexpr bool kAllF16 = ACC == PvAccum::kF16;
  constexpr bool kExp2F16x2 = SAGE_EXP2_F16X2 && PV == PvKind::kFp16;  // P from exp2_f16x2
  constexpr bool kPackEarly =
      pv_is_16bit(PV) && (SAGE_PACK_P_EARLY > 0 || (SAGE_PACK_P_EARLY < 0 && (ACC == PvAccum::kF16F32 ||
                                                                            (ACC == PvAccum::kF32 && HEAD_DIM == 128))));
  constexpr bool kLazyRescale = SAGE_LAZY_RESCALE > 0 && pv_is_16bit(PV) && ACC == PvAccum::kF32;
  constexpr bool kOneVote = SAGE_RESCALE_ONE_VOTE > 0 || (SAGE_RESCALE_ONE_VOTE < 0 && kLazyRescale);
  // s[mt][j][2r] holds P's packed word of columns 2t, 2t+1 after the softmax
  constexpr bool kPackedP = kExp2F16x2 || kPackEarly;
  static_assert(PV != PvKind::kBf16 || ACC == PvAccum::kF32,
                "bf16 P.V has fp32 accumulators only (the fp16-accumulating mma takes fp16 operands)");

  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + Tr::kQBytes;
  constexpr int kStages = Tr::kStages;
  const uint32_t sV = sK + kStages * Tr::kKBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const CtaTile cta(p, kCtaQ, kIterK);
  const int b = cta.b, h = cta.h, hkv = cta.hkv, q0 = cta.q0, n_kblocks = cta.n_kblocks;
  const int64_t bh = cta.bh, bhkv = cta.bhkv;

  const int8_t* gQ = p.q + (bh * p.q_pad + q0) * HEAD_DIM;
  const int8_t* gK = p.k + bhkv * p.k_pad * HEAD_DIM;

  // ---- async loads ----
  // Each thread copies 16-byte chunks of one column of chunks, every ROWS_PER_PASS-th row: the
  // addresses are per-thread bases plus compile-time offsets (no per-chunk index arithmetic).
  constexpr int kKRowChunks = HEAD_DIM / 16;  // int8 K rows
  constexpr int kKRowsPerPass = kThreads / kKRowChunks;
  static_assert(kThreads % kKRowChunks == 0 && kIterK % kKRowsPerPass == 0, "K copy tiling");
  const int k_row = tid / kKRowChunks, k_col = (tid % kKRowChunks) * 16;
  const int8_t* const k_src = gK + k_row * HEAD_DIM + k_col;
  const uint32_t k_dst = sK + k_row * Tr::kQKStride + k_col;
  auto load_k = [&](int kb, int buf) {
    const uint32_t dst = k_dst + buf * Tr::kKBytes;
    const int8_t* src = k_src + static_cast<int64_t>(kb) * (kIterK * HEAD_DIM);
    #pragma unroll
    for (int i = 0; i < kIterK / kKRowsPerPass; ++i) {
      // K is padded to 64 tokens only: with KSUB > 1 the last iteration may pass its end.
      const bool ok = KSUB == 1 || kb * kIterK + k_row + i * kKRowsPerPass < p.k_pad;
      cp_async_16(dst + i * kKRowsPerPass * Tr::kQKStride,
                  ok ? src + i * kKRowsPerPass * HEAD_DIM : gK, ok);
    }
  };
  // 16-bit V (fp16 or bf16): rows of HEAD_DIM elements from the caller's strides; FP8 V^T:
  // kFp8VTerms * HEAD_DIM rows of the padded token axis (the hi rows, then the lo rows).
  constexpr int kVRowChunks = pv_is_16bit(PV) ? HEAD_DIM / 8 : kIterK / 16;
  constexpr int kVRowsPerPass = kThreads / kVRowChunks;
  static_assert(kThreads % kVRowChunks == 0 && Tr::kVRows % kVRowsPerPass == 0, "V copy tiling");
  const int v_row = tid / kVRowChunks, v_col = (tid % kVRowChunks) * 16;  // v_col in bytes
  const uint32_t v_dst = sV + v_row * Tr::kVStride + v_col;
  [[maybe_unused]] const __half* v_base = nullptr;  // 16-bit V: this (batch, head); __half only
  [[maybe_unused]] const __half* v_src = nullptr;   // sizes the steps. This thread's first chunk
  if constexpr (pv_is_16bit(PV)) {
    v_base = reinterpret_cast<const __half*>(p.v) + b * p.v_sb + hkv * p.v_sh;
    v_src = v_base + v_row * p.v_sn + v_col / 2;
  }
  auto load_v = [&](int kb, int buf) {
    const uint32_t dst = v_dst + buf * Tr::kVBytes;
    if constexpr (pv_is_16bit(PV)) {
      const int64_t step = kVRowsPerPass * p.v_sn;
      const __half* src = v_src + static_cast<int64_t>(kb) * kIterK * p.v_sn;
      if ((kb + 1) * kIterK <= p.kv_len) {  // the whole block is inside the sequence
        #pragma unroll
        for (int i = 0; i < kIterK / kVRowsPerPass; ++i)
          cp_async_16(dst + i * kVRowsPerPass * Tr::kVStride, src + i * step, true);
      } else {
        const int tok0 = kb * kIterK + v_row;
        #pragma unroll
        for (int i = 0; i < kIterK / kVRowsPerPass; ++i) {
          // zero-fill past the end: P is 0 there, V must not be NaN
          const bool ok = tok0 + i * kVRowsPerPass < p.kv_len;
          cp_async_16(dst + i * kVRowsPerPass * Tr::kVStride, ok ? src + i * step : v_base, ok);
        }
      }
    } else {
      const int col = kb * kIterK + v_col;  // token
      const uint8_t* src = reinterpret_cast<const uint8_t*>(p.v) +
                           (bhkv * Tr::kVRows + v_row) * p.k_pad + col;
      const bool ok = KSUB == 1 || col < p.k_pad;
      #pragma unroll
      for (int i = 0; i < Tr::kVRows / kVRowsPerPass; ++i)
        cp_async_16(dst + i * kVRowsPerPass * Tr::kVStride,
                    ok ? src + static_cast<int64_t>(i) * kVRowsPerPass * p.k_pad : p.v, ok);
    }
  };

  {
    constexpr int kChunks = kCtaQ * HEAD_DIM / 16;
    for_each_chunk<kChunks, kThreads>(tid, [&](const int c) {
      const int r = c / (HEAD_DIM / 16), col = (c % (HEAD_DIM / 16)) * 16;
      cp_async_16(sQ + r * Tr::kQKStride + col, gQ + r * HEAD_DIM + col, true);
    });
  }
  // One commit group per K/V block, empty past the last, so that waiting for all but the newest
  // kStages - 2 groups always means "block kb has landed" (the first group also holds Q).
  load_k(0, 0);
  load_v(0, 0);
  cp_async_commit();
  #pragma unroll
  for (int kb = 1; kb < kStages - 1; ++kb) {
    if (kb < n_kblocks) {
      load_k(kb, kb);
      load_v(kb, kb);
    }
    cp_async_commit();
  }

  // ---- per-thread state ----
  const int warp_row0 = warp * MT * 16;  // inside the CTA
  float qs[MT];
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    qs[mt] = p.q_scale[bh * p.q_groups + q_scale_index(p.gran, q0 + warp_row0 + mt * 16, g)];
  }

  // K scales: one per 64-token block, or 4 per block (per_thread: one per t).
  const bool k_per_thread = p.gran == QuantGran::kPerThread;
  const float* const ks_src = p.k_scale + bhkv * p.k_groups + (k_per_thread ? t : 0);
  const int ks_step = k_per_thread ? 4 : 1;

  float m_run[MT][2], l_run[MT][2];
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    #pragma unroll
    for (int r = 0; r < 2; ++r) { m_run[mt][r] = -INFINITY; l_run[mt][r] = 0.f; }

  float o32[kAllF16 ? 1 : MT][kAllF16 ? 1 : kDT][4];
  uint32_t o16[kAllF16 ? MT : 1][kAllF16 ? kDT : 1][2];
  if constexpr (!kAllF16) {
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      #pragma unroll
      for (int j = 0; j < kDT; ++j)
        #pragma unroll
        for (int e = 0; e < 4; ++e) o32[mt][j][e] = 0.f;
  } else {
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      #pragma unroll
      for (int j = 0; j < kDT; ++j) o16[mt][j][0] = o16[mt][j][1] = 0u;
  }

  cp_async_wait<kStages - 2>();
  __syncthreads();

  // ldmatrix row addresses: a per-thread base plus compile-time offsets (mt, kc, np, dp).
  // Q fragment (m16n8k32 A, row-major): matrices = rows 0-7/8-15 x bytes 0-15/16-31.
  const uint32_t q_ld = sQ + (warp_row0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * Tr::kQKStride +
                        16 * (lane >> 4);
  auto load_qf = [&](uint32_t (&frag)[4], int mt, int kc) {
    ldmatrix_x4(frag, q_ld + mt * 16 * Tr::kQKStride + kc * 32);
  };
  // K (B of m16n8k32, two n8 tiles): matrices = keys 0-7/8-15 x bytes 0-15/16-31.
  const int mi = lane >> 3;
  const uint32_t k_ld = ((mi >> 1) * 8 + (lane & 7)) * Tr::kQKStride + (mi & 1) * 16;
  // V: FP16 (B of m16n8k16 via .trans): matrices = tokens 0-7/8-15 x dims 0-7/8-15;
  // FP8 V^T (B of m16n8k32): dims 0-7/8-15 x token bytes 0-15/16-31.
  const uint32_t v_ld = pv_is_16bit(PV)
      ? ((mi & 1) * 8 + (lane & 7)) * Tr::kVStride + (mi >> 1) * 16
      : ((mi >> 1) * 8 + (lane & 7)) * Tr::kVStride + (mi & 1) * 16;
  uint32_t qf[QREG ? MT : 1][QREG ? HEAD_DIM / 32 : 1][4];
  if constexpr (QREG) {
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      #pragma unroll
      for (int kc = 0; kc < HEAD_DIM / 32; ++kc) load_qf(qf[mt][kc], mt, kc);
  }

  // One K/V block. MASKED: apply the sequence-end and causal masks. Blocks that need no mask for
  // any row of the CTA run the copy without mask code (predicated mask selects in the hot loop
  // were a large share of its instructions, measured with ncu on the H200).
  auto kv_block = [&](auto masked, const int kb) {
    constexpr bool kMasked = decltype(masked)::value;
    if (kb > 0) {  // block kb landed; every warp is done with block kb - 1, whose buffer refills now
      cp_async_wait<kStages - 2>();
      __syncthreads();
    }
    // Two buffers keep the code they had: written in the general form below (with or without a
    // buffer-index helper), the shipped kernels' SASS changed in all four files (tried, nvcc 13.0).
    if constexpr (kStages == 2) {
      if (kb + 1 < n_kblocks) {
        load_k(kb + 1, (kb + 1) & 1);
        load_v(kb + 1, (kb + 1) & 1);
        cp_async_commit();
      }
    } else {
      const int next = kb + kStages - 1;
      if (next < n_kblocks) {
        load_k(next, next % kStages);
        load_v(next, next % kStages);
      }
      cp_async_commit();  // empty past the last block
    }
    const int cur = kStages == 2 ? (kb & 1) : kb % kStages;
    const uint32_t cK = sK + cur * Tr::kKBytes + k_ld;
    const uint32_t cV = sV + cur * Tr::kVBytes + v_ld;

    // ---- S = Q K^T (int32) ----
    int32_t s_i[MT][kNT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      #pragma unroll
      for (int j = 0; j < kNT; ++j)
        #pragma unroll
        for (int e = 0; e < 4; ++e) s_i[mt][j][e] = kScoreBias;
    #pragma unroll
    for (int kc = 0; kc < HEAD_DIM / 32; ++kc) {
      uint32_t qtmp[QREG ? 1 : MT][4];
      if constexpr (!QREG) {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) load_qf(qtmp[mt], mt, kc);
      }
      #pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(bk, cK + np * 16 * Tr::kQKStride + kc * 32);
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t (&a)[4] = QREG ? qf[QREG ? mt : 0][QREG ? kc : 0] : qtmp[QREG ? 0 : mt];
          mma_m16n8k32_s8(s_i[mt][2 * np], a, bk[0], bk[1]);
          mma_m16n8k32_s8(s_i[mt][2 * np + 1], a, bk[2], bk[3]);
        }
      }
    }

    // ---- dequantize, mask, online softmax (base 2) ----
    float ks[KSUB];
    #pragma unroll
    for (int sub = 0; sub < KSUB; ++sub) {
      const int blk = kb * KSUB + sub;  // 64-token scale block
      ks[sub] = (KSUB == 1 || blk < p.k_pad / kBlkK) ? ks_src[blk * ks_step]
                                                     : 1.f;  // past the end: fully masked
    }
    const int k0 = kb * kIterK;
    const bool need_mask = kMasked && ((k0 + kIterK > p.kv_len) ||
                                       (p.causal && k0 + kIterK - 1 > q0 + warp_row0));
    // s holds the integer scores as floats (plus kScoreBiasF); the dequantization factor dq > 0
    // is applied to the row max and inside the exp2 FFMA: p = exp2(s * dq - m).
    float s[MT][kNT][4];
    float dqs[MT][KSUB];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      #pragma unroll
      for (int sub = 0; sub < KSUB; ++sub) dqs[mt][sub] = qs[mt] * ks[sub];
      // Keys this thread's two rows may see, relative to its first column: col < limit.
      int limit[2];
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = q0 + warp_row0 + mt * 16 + g + 8 * r;
        limit[r] = (p.causal ? min(p.kv_len, row + 1) : p.kv_len) - (k0 + 2 * t);
      }
      #pragma unroll
      for (int j = 0; j < kNT; ++j)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = score_to_f32(s_i[mt][j][e]);
          if (need_mask && j * 8 + (e & 1) >= limit[e >> 1]) v = -INFINITY;
          s[mt][j][e] = v;
        }
    }
    // O's rows of m tile mt, half r (row g + 8 r) times alpha.
    auto rescale_o = [&](int mt, int r, float alpha) {
      if constexpr (!kAllF16) {
        #pragma unroll
        for (int j = 0; j < kDT; ++j) {
          o32[mt][j][2 * r] *= alpha;
          o32[mt][j][2 * r + 1] *= alpha;
        }
      } else {
        const __half2 a2 = __float2half2_rn(alpha);
        #pragma unroll
        for (int j = 0; j < kDT; ++j) {
          __half2 v = *reinterpret_cast<__half2*>(&o16[mt][j][r]);
          v = __hmul2(v, a2);
          o16[mt][j][r] = *reinterpret_cast<uint32_t*>(&v);
        }
      }
    };
    [[maybe_unused]] float alphas[MT][2];
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      #pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
        #pragma unroll
        for (int sub = 0; sub < KSUB; ++sub) {
          float mraw = -INFINITY;
          if constexpr (kScoreBias != 0) {
            // Biased scores are positive floats (masked ones -inf): their bit patterns order
            // like the values, and sm_90 has a three-input integer max (half the instructions).
            int max_bits = __float_as_int(-INFINITY);
            #pragma unroll
            for (int j = 8 * sub; j < 8 * sub + 8; ++j)
              max_bits = __vimax3_s32(max_bits, __float_as_int(s[mt][j][2 * r]),
                                      __float_as_int(s[mt][j][2 * r + 1]));
            mraw = __int_as_float(max_bits);
          } else {
            #pragma unroll
            for (int j = 8 * sub; j < 8 * sub + 8; ++j)
              mraw = fmaxf(mraw, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
          }
          // scaled per thread first: per_thread scales differ across the quad (and sub-blocks)
          mraw -= kScoreBiasF;  // exact: an integer below 2^24 (or -inf when all masked)
          mx = sub == 0 ? mraw * dqs[mt][sub] : fmaxf(mx, mraw * dqs[mt][sub]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float m_new = fmaxf(m_run[mt][r], mx);
        if constexpr (kLazyRescale) {  // the offset stays while P <= 2^SAGE_LAZY_RESCALE (-inf: moves)
          if (mx <= m_run[mt][r] + static_cast<float>(SAGE_LAZY_RESCALE)) m_new = m_run[mt][r];
        }
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a fully masked row stays at 0
        const float alpha = fast_exp2(m_run[mt][r] - m_use);
        m_run[mt][r] = m_new;
        // p = exp2((s - bias) * dq - m) = exp2(s * dq - (bias * dq + m)). The constant is rounded
        // once to fp32, shifting the exponents of this row's block by at most 6e-8 * bias * dq:
        // about 1e-4 (log2 units) for Gaussian inputs (largest score ~3.5 at |S| ~ 3e4), 5e-4
        // for a row whose largest score is 20. One factor for the block's P and row sum alike,
        // the size of P's own rounding to fp16 (5e-4); measured against sageattention.reference
        // on the H200: cosine 1.000000, relative L1 1e-4 (docs/kernels.md).
        float neg_c[KSUB];
        #pragma unroll
        for (int sub = 0; sub < KSUB; ++sub) neg_c[sub] = -fmaf(kScoreBiasF, dqs[mt][sub], m_use);
        float rowsum = 0.f;
        if constexpr (kExp2F16x2) {  // s[mt][j][2r] takes the word of P's two columns
          uint32_t words[kNT];
          #pragma unroll
          for (int j = 0; j < kNT; ++j) {
            words[j] = exp2_f16x2(fmaf(s[mt][j][2 * r], dqs[mt][j / 8], neg_c[j / 8]),
                                  fmaf(s[mt][j][2 * r + 1], dqs[mt][j / 8], neg_c[j / 8]));
            s[mt][j][2 * r] = __uint_as_float(words[j]);
          }
          rowsum = sum_f16x2<kNT>(words);
        } else if constexpr (kPackedP) {
          #pragma unroll
          for (int j = 0; j < kNT; ++j) {
            float pv[2];
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
              pv[e] = softmax_exp2<SAGE_EXP2_FMA>(fmaf(s[mt][j][2 * r + e], dqs[mt][j / 8], neg_c[j / 8]), j);
              rowsum += pv[e];
            }
            s[mt][j][2 * r] = __uint_as_float(pack_p16<PV>(pv[0], pv[1]));
          }
        } else {
          #pragma unroll
          for (int j = 0; j < kNT; ++j)
            #pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pv = softmax_exp2<SAGE_EXP2_FMA>(fmaf(s[mt][j][2 * r + e], dqs[mt][j / 8], neg_c[j / 8]), j);
              s[mt][j][2 * r + e] = pv;
              rowsum += pv;
            }
        }
        l_run[mt][r] = l_run[mt][r] * alpha + rowsum;
        if constexpr (kOneVote) {  // rescaled below, after every row
          alphas[mt][r] = alpha;
          continue;
        }
        // Once the row maxima settle, alpha is 1 for the whole warp: skip the O rescale.
        if (SAGE_SKIP_RESCALE && __all_sync(0xffffffffu, alpha == 1.f)) continue;
        rescale_o(mt, r, alpha);
      }
    if constexpr (kOneVote) {
      bool same = true;
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt) same = same && alphas[mt][0] == 1.f && alphas[mt][1] == 1.f;
      if (!__all_sync(0xffffffffu, same)) {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          #pragma unroll
          for (int r = 0; r < 2; ++r) rescale_o(mt, r, alphas[mt][r]);
      }
    }

    // ---- O += P V ----
    if constexpr (pv_is_16bit(PV)) {
      [[maybe_unused]] uint32_t inner[kInnerF16 ? MT : 1][kInnerF16 ? kDT : 1][2];
      if constexpr (kInnerF16) {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          #pragma unroll
          for (int j = 0; j < kDT; ++j) inner[mt][j][0] = inner[mt][j][1] = 0u;
      }
      #pragma unroll
      for (int kc = 0; kc < kIterK / 16; ++kc) {
        uint32_t pa[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kPackedP) {
            pa[mt][0] = __float_as_uint(s[mt][2 * kc][0]);
            pa[mt][1] = __float_as_uint(s[mt][2 * kc][2]);
            pa[mt][2] = __float_as_uint(s[mt][2 * kc + 1][0]);
            pa[mt][3] = __float_as_uint(s[mt][2 * kc + 1][2]);
            continue;
          }
          pa[mt][0] = pack_p16<PV>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
          pa[mt][1] = pack_p16<PV>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
          pa[mt][2] = pack_p16<PV>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
          pa[mt][3] = pack_p16<PV>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
        }
        #pragma unroll
        for (int dp = 0; dp < HEAD_DIM / 16; ++dp) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, cV + kc * 16 * Tr::kVStride + dp * 32);
          #pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if constexpr (kInnerF16) {
              mma_m16n8k16_f16_f16(inner[mt][2 * dp], pa[mt], bv[0], bv[1]);
              mma_m16n8k16_f16_f16(inner[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
            } else if constexpr (kAllF16) {
              mma_m16n8k16_f16_f16(o16[mt][2 * dp], pa[mt], bv[0], bv[1]);
              mma_m16n8k16_f16_f16(o16[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
            } else if constexpr (PV == PvKind::kBf16) {
              mma_m16n8k16_bf16_f32(o32[mt][2 * dp], pa[mt], bv[0], bv[1]);
              mma_m16n8k16_bf16_f32(o32[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
            } else {
              mma_m16n8k16_f16_f32(o32[mt][2 * dp], pa[mt], bv[0], bv[1]);
              mma_m16n8k16_f16_f32(o32[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
            }
          }
        }
      }
      if constexpr (kInnerF16) {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          #pragma unroll
          for (int j = 0; j < kDT; ++j)
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float2 f = __half22float2(*reinterpret_cast<__half2*>(&inner[mt][j][r]));
              o32[mt][j][2 * r] += f.x;
              o32[mt][j][2 * r + 1] += f.y;
            }
      }
    } else {
      [[maybe_unused]] float innerf[kInnerF32 ? MT : 1][kInnerF32 ? kDT : 1][4];
      [[maybe_unused]] uint32_t innerh[kInnerF16 ? MT : 1][kInnerF16 ? kDT : 1][2];
      if constexpr (kInnerF32) {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          #pragma unroll
          for (int j = 0; j < kDT; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) innerf[mt][j][e] = 0.f;
      }
      if constexpr (kInnerF16) {
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          #pragma unroll
          for (int j = 0; j < kDT; ++j) innerh[mt][j][0] = innerh[mt][j][1] = 0u;
      }
      #pragma unroll
      for (int kc = 0; kc < kIterK / 32; ++kc) {
        uint32_t pa[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          #pragma unroll
          for (int r = 0; r < 2; ++r) {
            // a[r]: k 4t..4t+3 = columns 2t,2t+1 of tiles 4kc, 4kc+1; a[r+2]: tiles 4kc+2, 4kc+3.
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int j = 4 * kc + 2 * half;
              const uint32_t lo = f32x2_to_e4m3x2(s[mt][j][2 * r] * kFp8PScale,
                                                  s[mt][j][2 * r + 1] * kFp8PScale);
              const uint32_t hi = f32x2_to_e4m3x2(s[mt][j + 1][2 * r] * kFp8PScale,
                                                  s[mt][j + 1][2 * r + 1] * kFp8PScale);
              pa[mt][r + 2 * half] = lo | (hi << 16);
            }
          }
        }
        // V's terms in turn into the same accumulators: hi, then lo (kFp8VTerms) for each chunk
        #pragma unroll
        for (int dp = 0; dp < HEAD_DIM / 16; ++dp)
          #pragma unroll
          for (int term = 0; term < kFp8VTerms; ++term) {
            uint32_t bv[4];
            ldmatrix_x4(bv, cV + (term * HEAD_DIM + dp * 16) * Tr::kVStride + kc * 32);
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              if constexpr (kInnerF32) {
                mma_m16n8k32_e4m3_f32(innerf[mt][2 * dp], pa[mt], bv[0], bv[1]);
                mma_m16n8k32_e4m3_f32(innerf[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
              } else if constexpr (kInnerF16) {
                mma_m16n8k32_e4m3_f16(innerh[mt][2 * dp], pa[mt], bv[0], bv[1]);
                mma_m16n8k32_e4m3_f16(innerh[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
              } else {
                mma_m16n8k32_e4m3_f32(o32[mt][2 * dp], pa[mt], bv[0], bv[1]);
                mma_m16n8k32_e4m3_f32(o32[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
              }
            }
          }
      }
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int j = 0; j < kDT; ++j) {
          if constexpr (kInnerF32) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) o32[mt][j][e] += innerf[mt][j][e];
          }
          if constexpr (kInnerF16) {
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
              const float2 f = __half22float2(*reinterpret_cast<__half2*>(&innerh[mt][j][r]));
              o32[mt][j][2 * r] += f.x;
              o32[mt][j][2 * r + 1] += f.y;
            }
          }
        }
    }
  };
  // Leading blocks wholly inside the sequence and (causal) left of the CTA's first query row.
  int n_plain = min(p.kv_len / kIterK, n_kblocks);
  if (p.causal) n_plain = min(n_plain, (q0 + 1) / kIterK);
  for (int kb = 0; kb < n_plain; ++kb) kv_block(std::false_type{}, kb);
  for (int kb = n_plain; kb < n_kblocks; ++kb) kv_block(std::true_type{}, kb);

  // ---- epilogue: O / l, LSE ----
  OutT* out = reinterpret_cast<OutT*>(p.out) + b * p.o_sb + h * p.o_sh;
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(l_run[mt][r]);
      const int row = q0 + warp_row0 + mt * 16 + g + 8 * r;
      if (row >= p.q_len) continue;
      float inv = 1.f / l;
      if constexpr (PV == PvKind::kFp8) inv *= 1.f / kFp8PScale;
      OutT* orow = out + row * p.o_sn;
      #pragma unroll
      for (int j = 0; j < kDT; ++j) {
        const int d = j * 8 + 2 * t;
        float a, c;
        if constexpr (kAllF16) {
          const float2 f = __half22float2(*reinterpret_cast<__half2*>(&o16[mt][j][r]));
          a = f.x * inv;
          c = f.y * inv;
        } else {
          a = o32[mt][j][2 * r] * inv;
          c = o32[mt][j][2 * r + 1] * inv;
        }
        if constexpr (PV == PvKind::kFp8) {
          const float* vs = p.v_scale + bhkv * HEAD_DIM;
          a *= vs[d];
          c *= vs[d + 1];
          if (p.v_mean) {
            const float* vm = p.v_mean + bhkv * HEAD_DIM;
            a += vm[d];
            c += vm[d + 1];
          }
        }
        *reinterpret_cast<uint32_t*>(orow + d) = pack_out2<OutT>(a, c);
      }
      if (p.lse && t == 0) store_lse(p, bh, row, l, m_run[mt][r]);
    }
}

// Host side: a per-device value, asked of `query(dev, value)` until it first gives one > 0, then
// read from `cache` (atomics: two host threads may drive two devices or streams at once).
template <typename Query>
cudaError_t once_per_device(std::atomic<int> (&cache)[64], int* value, Query&& query) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 64) {
    const int cached = cache[dev].load(std::memory_order_acquire);
    if (cached > 0) {
      *value = cached;
      return cudaSuccess;
    }
  }
  err = query(dev, value);
  if (err == cudaSuccess && dev < 64 && *value > 0) cache[dev].store(*value, std::memory_order_release);
  return err;
}

// Raises KERNEL's dynamic shared-memory limit once per device (not per call: keeps graph capture
// free of non-stream API calls after the first use). Host side; one flag per kernel and device.
template <auto KERNEL>
cudaError_t raise_smem_limit_once(int smem_bytes) {
  static std::atomic<int> configured[64];  // static storage: zero-initialised
  int done = 0;
  return once_per_device(configured, &done, [smem_bytes](int, int* flag) {
    const cudaError_t err = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    *flag = err == cudaSuccess;
    return err;
  });
}

// Host side: launch KERNEL (traits Tr: kThreads, kSmemBytes) on `grid`, with the kernel's
// parameters after p if it has any. Returns the launch error.
template <auto KERNEL, typename Tr, typename... More>
cudaError_t launch_on_grid(dim3 grid, const AttnParams& p, cudaStream_t stream, const More&... more) {
  const cudaError_t err = raise_smem_limit_once<KERNEL>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  KERNEL<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, more...);
  return cudaGetLastError();
}

// Host side: launch KERNEL (traits Tr: kCtaQ, kThreads, kSmemBytes) over (query blocks, q heads,
// batch).
template <auto KERNEL, typename Tr, typename... More>
cudaError_t launch_over_query_blocks(const AttnParams& p, cudaStream_t stream, const More&... more) {
  return launch_on_grid<KERNEL, Tr>(dim3((p.q_len + Tr::kCtaQ - 1) / Tr::kCtaQ, p.q_heads, p.batch), p, stream,
                                    more...);
}

// Host side: the current device's SM count.
inline cudaError_t sm_count_once(int* count) {
  static std::atomic<int> counts[64];
  return once_per_device(counts, count, [](int dev, int* c) {
    return cudaDeviceGetAttribute(c, cudaDevAttrMultiProcessorCount, dev);
  });
}

// Host side: how many CTAs of KERNEL (traits Tr: kThreads, kSmemBytes) fit on one SM of the current
// device, from the occupancy calculator (the traits' kMinBlocks is what the register allocation
// leaves room for; shared memory can allow fewer).
template <auto KERNEL, typename Tr>
cudaError_t resident_ctas_per_sm_once(int* count) {
  static std::atomic<int> counts[64];
  return once_per_device(counts, count, [](int, int* c) {
    const cudaError_t err = raise_smem_limit_once<KERNEL>(Tr::kSmemBytes);
    return err != cudaSuccess ? err
                              : cudaOccupancyMaxActiveBlocksPerMultiprocessor(c, KERNEL, Tr::kThreads, Tr::kSmemBytes);
  });
}

// Host side: launch a persistent KERNEL (traits Tr: kCtaQ, kThreads, kSmemBytes): as many CTAs as
// are resident on the device at once, at most one per tile; each walks the (query blocks, q heads,
// batch) tiles with stride gridDim.x (CtaTile's linear constructor).
template <auto KERNEL, typename Tr, typename... More>
cudaError_t launch_persistent(const AttnParams& p, cudaStream_t stream, const More&... more) {
  int sms = 0, per_sm = 0;
  cudaError_t err = sm_count_once(&sms);
  if (err == cudaSuccess) err = resident_ctas_per_sm_once<KERNEL, Tr>(&per_sm);
  if (err != cudaSuccess) return err;
  const int64_t tiles = static_cast<int64_t>((p.q_len + Tr::kCtaQ - 1) / Tr::kCtaQ) * p.q_heads * p.batch;
  // per_sm 0 (does not fit at all): one CTA per SM, and the launch reports why
  const int64_t ctas = std::min<int64_t>(tiles, static_cast<int64_t>(sms) * std::max(per_sm, 1));
  if (ctas == 0) return cudaSuccess;
  return launch_on_grid<KERNEL, Tr>(dim3(static_cast<unsigned>(ctas)), p, stream, more...);
}

// Host side: pick the instantiation and launch on `stream`. Returns the launch error.
template <int HEAD_DIM, int MT, int NWARPS, bool QREG, int KSUB, PvKind PV, PvAccum ACC,
          typename OutT>
cudaError_t launch_attn(const AttnParams& p, cudaStream_t stream) {
  return launch_over_query_blocks<attn_kernel<HEAD_DIM, MT, NWARPS, QREG, KSUB, PV, ACC, OutT>,
                                  AttnTraits<HEAD_DIM, MT, NWARPS, PV, KSUB>>(p, stream);
}

}  // namespace sage
