// INT8 QK^T + 16-bit PV attention on Hopper's warpgroup MMA (wgmma, sm_90a only).
//
// Same contract, inputs and quantization as attn_kernel.cuh (the sm80 family's INT8 Q/K with
// per_block / per_warp / per_thread scales, K smoothing done by the caller, 16-bit V as given,
// "fp32" accumulation): only the matrix products move from mma.sync to wgmma.
//   - A CTA is NWG warpgroups; warpgroup w owns 64 query rows (warp i of it: rows 16i..16i+15,
//     the same rows and register layout as one mma.sync m-tile, so per_thread/per_warp Q scales
//     index exactly as in attn_kernel.cuh).
//   - K/V walk in BLOCK_N-key blocks, double-buffered with cp.async into 1024-byte-aligned,
//     XOR-swizzled shared memory in the canonical layouts wgmma reads through descriptors:
//     Q and K K-major (rows of HEAD_DIM bytes, 128B swizzle for 128, 64B for 64); V MN-major
//     (64-column atoms of 128 bytes, each its own block of BLOCK_N key rows, 128B swizzle).
//   - S = Q K^T: wgmma m64nBLOCK_Nk32 s8 from shared memory. P (fp32 -> fp16/bf16) stays in
//     registers: the S accumulator fragments of two n8 tiles are the A fragment of
//     wgmma m64nHEAD_DIMk16 (A from registers), B = V tile (imm-trans-b: N contiguous).
//   - Each warpgroup waits for its own wgmma groups; a CTA barrier per K block guards the buffers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attn_kernel.cuh"
#include "wgmma_ops.cuh"

namespace sage {

// 1: P goes through shared memory (SS wgmma) instead of registers, so an in-flight P.V holds no
// register but its accumulators (the register-A form's operands were overwritten, see below).
#ifndef SAGE_WG_P_SMEM
#define SAGE_WG_P_SMEM 0
#endif
// 1: the softmax of S_{j+1} runs while P_j V_j is in flight. Measured wrong (NaN at n=4096,
// docs/kernels.md): in the SASS, the softmax's temporaries reuse the physical registers of P_j,
// the A operand of the in-flight wgmma. 0 (default): wait for P_j V_j before the softmax.
#ifndef SAGE_WG_PV_OVERLAP
#define SAGE_WG_PV_OVERLAP 0
#endif
#ifndef SAGE_WG_MINB
#define SAGE_WG_MINB 1  // CTAs per SM the register allocation must leave room for
#endif
namespace wg {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile whose rows are ROW_BYTES
// (64 or 128) long: the hardware XORs address bits [4, 7) with bits [7, 10) (128B swizzle) or
// bits [4, 6) with [7, 9) (64B swizzle); tiles start 1024-byte aligned.
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  static_assert(ROW_BYTES == 64 || ROW_BYTES == 128, "64B or 128B rows");
  const uint32_t off = static_cast<uint32_t>(row * ROW_BYTES + chunk * 16);
  constexpr uint32_t kMask = ROW_BYTES / 16 - 1;
  return off ^ (((off >> 7) & kMask) << 4);
}

// wgmma shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte
// units), swizzle mode (1: 128B, 2: 64B).
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo,
                                              uint32_t swizzle) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
         (static_cast<uint64_t>(swizzle) << 62);
}

template <int N>
__device__ __forceinline__ void qk_wgmma(int32_t (&s)[N / 2], uint64_t da, uint64_t db, int acc) {
  if constexpr (N == 64) wgmma_m64n64k32_s8(s, da, db, acc);
  else wgmma_m64n128k32_s8(s, da, db, acc);
}

template <int N, PvKind PV>
__device__ __forceinline__ void pv_wgmma_ss(float (&o)[N / 2], uint64_t da, uint64_t db) {
  if constexpr (N == 64) {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n64k16_bf16_ss(o, da, db);
    else wgmma_m64n64k16_f16_ss(o, da, db);
  } else {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n128k16_bf16_ss(o, da, db);
    else wgmma_m64n128k16_f16_ss(o, da, db);
  }
}

template <int N, PvKind PV>
__device__ __forceinline__ void pv_wgmma(float (&o)[N / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (N == 64) {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n64k16_bf16_rs(o, a, db);
    else wgmma_m64n64k16_f16_rs(o, a, db);
  } else {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n128k16_bf16_rs(o, a, db);
    else wgmma_m64n128k16_f16_rs(o, a, db);
  }
}

}  // namespace wg

template <int HEAD_DIM, int NWG, int BLOCK_N>
struct WgmmaTraits {
  static constexpr int kThreads = NWG * 128;
  static constexpr int kCtaQ = NWG * 64;
  static constexpr int kQBytes = kCtaQ * HEAD_DIM;
  static constexpr int kKBytes = BLOCK_N * HEAD_DIM;
  static constexpr int kVBytes = BLOCK_N * HEAD_DIM * 2;  // HEAD_DIM / 64 atoms x BLOCK_N x 128 B
  // P_SMEM: P of each warpgroup, K-major (64 rows x BLOCK_N keys of 16 bits), as 64-key atoms of
  // 64 rows x 128 bytes (128B swizzle), for a P.V whose A comes from shared memory.
  static constexpr int kPBytes = SAGE_WG_P_SMEM ? 64 * BLOCK_N * 2 : 0;  // per warpgroup
  static constexpr int kSmemBytes = kQBytes + 2 * kKBytes + 2 * kVBytes + NWG * kPBytes + 1024;
  static constexpr uint32_t kQKSwizzle = HEAD_DIM == 128 ? 1 : 2;  // 128B or 64B
  static constexpr uint32_t kQKSbo = 8 * HEAD_DIM;                // 8 rows of HEAD_DIM bytes
  static_assert(kCtaQ <= 128 && 128 % kCtaQ == 0, "CTA rows must divide the 128-token Q padding");
  static_assert(BLOCK_N == 64 || BLOCK_N == 128, "64- or 128-key blocks");
  static_assert((BLOCK_N * HEAD_DIM / 16) % kThreads == 0 && (BLOCK_N * HEAD_DIM / 8) % kThreads == 0 &&
                (kCtaQ * HEAD_DIM / 16) % kThreads == 0, "copy tiling");
};

template <int HEAD_DIM, int NWG, int BLOCK_N, PvKind PV, typename OutT>
__global__ void __launch_bounds__(NWG * 128, SAGE_WG_MINB) attn_wgmma_kernel(const AttnParams p) {
#if defined(SAGE_HAS_WGMMA)
  using Tr = WgmmaTraits<HEAD_DIM, NWG, BLOCK_N>;
  constexpr int kThreads = Tr::kThreads;
  constexpr int kCtaQ = Tr::kCtaQ;
  constexpr int kNT = BLOCK_N / 8;   // n8 tiles of S
  constexpr int kDT = HEAD_DIM / 8;  // n8 tiles of O
  constexpr int kSub = BLOCK_N / kBlkK;  // 64-token K scale blocks per K block
  static_assert(pv_is_16bit(PV), "16-bit P.V");

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t s0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = s0;
  const uint32_t sK = sQ + Tr::kQBytes;
  const uint32_t sV = sK + 2 * Tr::kKBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wgi = warp >> 2, wq = warp & 3;  // warpgroup, warp inside it
  [[maybe_unused]] const uint32_t sP = sV + 2 * Tr::kVBytes + wgi * Tr::kPBytes;  // this WG's P
  const int g = lane >> 2, t = lane & 3;
  const CtaTile cta(p, kCtaQ, BLOCK_N);
  const int b = cta.b, h = cta.h, hkv = cta.hkv, q0 = cta.q0, n_kblocks = cta.n_kblocks;
  const int64_t bh = cta.bh, bhkv = cta.bhkv;

  const int8_t* gQ = p.q + (bh * p.q_pad + q0) * HEAD_DIM;
  const int8_t* gK = p.k + bhkv * p.k_pad * HEAD_DIM;
  const __half* gV = reinterpret_cast<const __half*>(p.v) + b * p.v_sb + hkv * p.v_sh;  // 16-bit

  // ---- async copies into the swizzled layouts ----
  constexpr int kQKChunks = HEAD_DIM / 16;  // 16-byte chunks per int8 row
  constexpr int kVChunks = HEAD_DIM / 8;    // per 16-bit V row
  auto load_k = [&](int kb, int buf) {
    const uint32_t dst = sK + buf * Tr::kKBytes;
    #pragma unroll
    for (int i = 0; i < BLOCK_N * kQKChunks / kThreads; ++i) {
      const int c = tid + i * kThreads, r = c / kQKChunks, ch = c % kQKChunks;
      const int tok = kb * BLOCK_N + r;
      const bool ok = tok < p.k_pad;  // K is padded to 64 tokens (zeros past kv_len)
      cp_async_16(dst + wg::swizzled<HEAD_DIM>(r, ch),
                  ok ? gK + static_cast<int64_t>(tok) * HEAD_DIM + ch * 16 : gK, ok);
    }
  };
  auto load_v = [&](int kb, int buf) {
    const uint32_t dst = sV + buf * Tr::kVBytes;
    #pragma unroll
    for (int i = 0; i < BLOCK_N * kVChunks / kThreads; ++i) {
      const int c = tid + i * kThreads, r = c / kVChunks, ch = c % kVChunks;
      const int tok = kb * BLOCK_N + r;
      const bool ok = tok < p.kv_len;  // zero-fill past the end: P is 0 there, V must not be NaN
      cp_async_16(dst + (ch / 8) * (BLOCK_N * 128) + wg::swizzled<128>(r, ch % 8),
                  ok ? gV + static_cast<int64_t>(tok) * p.v_sn + ch * 8 : gV, ok);
    }
  };
  #pragma unroll
  for (int i = 0; i < kCtaQ * kQKChunks / kThreads; ++i) {
    const int c = tid + i * kThreads, r = c / kQKChunks, ch = c % kQKChunks;
    cp_async_16(sQ + wg::swizzled<HEAD_DIM>(r, ch), gQ + r * HEAD_DIM + ch * 16, true);
  }
  load_k(0, 0);
  load_v(0, 0);
  cp_async_commit();

  // ---- per-thread state: rows row0 + g and row0 + g + 8 ----
  const int wrow0 = wgi * 64 + wq * 16;  // inside the CTA
  const float qs = p.q_scale[bh * p.q_groups + q_scale_index(p.gran, q0 + wrow0, g)];
  const bool k_per_thread = p.gran == QuantGran::kPerThread;
  const float* const ks_src = p.k_scale + bhkv * p.k_groups + (k_per_thread ? t : 0);
  const int ks_step = k_per_thread ? 4 : 1;

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[HEAD_DIM / 2];
  #pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;

  const uint64_t desc_q = wg::make_desc(sQ + wgi * 64 * HEAD_DIM, 16, Tr::kQKSbo, Tr::kQKSwizzle);
  // Accumulators start at kScoreBias (the scores come out as the floats 1.5*2^23 + S). Written
  // before wgmma_fence: registers a wgmma reads must be final when the fence executes.
  auto preset_s = [&](int32_t (&acc)[BLOCK_N / 2]) {
    #pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) acc[i] = kScoreBias;
  };
  auto issue_qk = [&](int32_t (&acc)[BLOCK_N / 2], int kb) {
    const uint64_t desc_k = wg::make_desc(sK + (kb & 1) * Tr::kKBytes, 16, Tr::kQKSbo, Tr::kQKSwizzle);
    #pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 32; ++kk)  // +32 bytes along d per step
      wg::qk_wgmma<BLOCK_N>(acc, desc_q + 2 * kk, desc_k + 2 * kk, kScoreBias != 0 || kk > 0);
  };
  auto issue_pv = [&](const uint32_t (&pa)[BLOCK_N / 16][4], int kb) {
#ifdef SAGE_WG_VSWAP  // tuning probe: the MN-major atom / 8-row-group strides the other way round
    const uint64_t desc_v = wg::make_desc(sV + (kb & 1) * Tr::kVBytes, 1024, BLOCK_N * 128, 1);
#else
    const uint64_t desc_v = wg::make_desc(sV + (kb & 1) * Tr::kVBytes, BLOCK_N * 128, 1024, 1);
#endif
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc) {
#if SAGE_WG_P_SMEM
      // A = P tile: 64-key atom kc / 4, +32 bytes (16 keys) per step inside it; 8 rows = 1024 B
      const uint64_t desc_p = wg::make_desc(sP + (kc / 4) * (64 * 128) + (kc % 4) * 32, 16, 1024, 1);
      wg::pv_wgmma_ss<HEAD_DIM, PV>(o, desc_p, desc_v + 128 * kc);
#else
      wg::pv_wgmma<HEAD_DIM, PV>(o, pa[kc], desc_v + 128 * kc);  // +16 key rows of 128 bytes
#endif
    }
  };

  // Pipeline (one warpgroup's view): S_{j+1} = Q K_{j+1} and O += P_j V_j are issued together;
  // the softmax of S_{j+1} then runs while P_j V_j is still on the tensor cores. K is copied two
  // blocks ahead, V one.
  if (n_kblocks > 1) load_k(1, 1);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_smem();
  __syncthreads();
  int32_t s_i[BLOCK_N / 2];
  preset_s(s_i);
  wgmma_fence();
  issue_qk(s_i, 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(s_i);

  uint32_t pa[BLOCK_N / 16][4];
  for (int kb = 0; kb < n_kblocks; ++kb) {
    // ---- softmax of S_kb (base 2) while P_{kb-1} V_{kb-1} runs ----
    float dq[kSub];
    #pragma unroll
    for (int sub = 0; sub < kSub; ++sub) {
      const int blk = kb * kSub + sub;
      dq[sub] = qs * (blk < p.k_pad / kBlkK ? ks_src[blk * ks_step] : 1.f);
    }
    const int k0 = kb * BLOCK_N;
    const bool need_mask = (k0 + BLOCK_N > p.kv_len) || (p.causal && k0 + BLOCK_N - 1 > q0 + wrow0);
    float sf[BLOCK_N / 2];
    int limit[2];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + wrow0 + g + 8 * r;
      limit[r] = (p.causal ? min(p.kv_len, row + 1) : p.kv_len) - (k0 + 2 * t);
    }
    #pragma unroll
    for (int j = 0; j < kNT; ++j)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = score_to_f32(s_i[4 * j + e]);
        if (need_mask && j * 8 + (e & 1) >= limit[e >> 1]) v = -INFINITY;
        sf[4 * j + e] = v;
      }
    float alpha[2];
    uint32_t pn[BLOCK_N / 16][4];
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
      #pragma unroll
      for (int sub = 0; sub < kSub; ++sub) {
        float mraw;
        if constexpr (kScoreBias != 0) {
          // biased scores are positive floats (masked: -inf): their bits order like the values
          int max_bits = __float_as_int(-INFINITY);
          #pragma unroll
          for (int j = 8 * sub; j < 8 * sub + 8; ++j)
            max_bits = __vimax3_s32(max_bits, __float_as_int(sf[4 * j + 2 * r]),
                                    __float_as_int(sf[4 * j + 2 * r + 1]));
          mraw = __int_as_float(max_bits);
        } else {
          mraw = -INFINITY;
          #pragma unroll
          for (int j = 8 * sub; j < 8 * sub + 8; ++j)
            mraw = fmaxf(mraw, fmaxf(sf[4 * j + 2 * r], sf[4 * j + 2 * r + 1]));
        }
        mraw -= kScoreBiasF;  // exact (an integer below 2^24), or -inf
        mx = sub == 0 ? mraw * dq[sub] : fmaxf(mx, mraw * dq[sub]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[r], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a fully masked row stays at 0
      alpha[r] = fast_exp2(m_run[r] - m_use);
      m_run[r] = m_new;
      float neg_c[kSub];  // p = exp2((s - bias) * dq - m) = exp2(s * dq - (bias * dq + m))
      #pragma unroll
      for (int sub = 0; sub < kSub; ++sub) neg_c[sub] = -fmaf(kScoreBiasF, dq[sub], m_use);
      float rowsum = 0.f;
      #pragma unroll
      for (int j = 0; j < kNT; ++j)
        #pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = fast_exp2(fmaf(sf[4 * j + 2 * r + e], dq[j / 8], neg_c[j / 8]));
          sf[4 * j + 2 * r + e] = pv;
          rowsum += pv;
        }
      l_run[r] = l_run[r] * alpha[r] + rowsum;
    }
    // P's A fragments: n8 tiles 2kc, 2kc+1 = keys 16kc .. 16kc+15 (mma.m16n8k16 A layout)
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc) {
      pn[kc][0] = pack_p16<PV>(sf[8 * kc + 0], sf[8 * kc + 1]);
      pn[kc][1] = pack_p16<PV>(sf[8 * kc + 2], sf[8 * kc + 3]);
      pn[kc][2] = pack_p16<PV>(sf[8 * kc + 4], sf[8 * kc + 5]);
      pn[kc][3] = pack_p16<PV>(sf[8 * kc + 6], sf[8 * kc + 7]);
    }

    // ---- P_{kb-1} V_{kb-1} done: rescale O, hand over the buffers ----
    wgmma_wait<0>();
    wgmma_pin(o);
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc) wgmma_pin(pa[kc]);  // P_{kb-1} live until its wgmma is done
    #pragma unroll
    for (int j = 0; j < kDT; ++j) {
      o[4 * j + 0] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc)
      #pragma unroll
      for (int e = 0; e < 4; ++e) pa[kc][e] = pn[kc][e];
#if SAGE_WG_P_SMEM
    // P_kb to this warpgroup's tile (P_{kb-1} V_{kb-1}, its reader, is done); the fence and the
    // barrier below make it visible to the tensor cores. Thread: rows wq*16 + g (+8), keys
    // 16kc + 2t (+1) and 16kc + 8 + 2t (+1).
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = wq * 16 + g + 8 * (e & 1), j = 2 * kc + (e >> 1);  // n8 tile j
        const uint32_t addr = sP + (j / 8) * (64 * 128) + wg::swizzled<128>(row, j % 8) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pn[kc][e]) : "memory");
      }
#endif
    cp_async_wait<0>();
    fence_proxy_async_smem();  // cp.async data -> the tensor cores' (async proxy) reads
    __syncthreads();           // V_kb and K_{kb+1} landed; every warpgroup is past P V_{kb-1}, S_kb
    if (kb + 1 < n_kblocks) load_v(kb + 1, (kb + 1) & 1);
    if (kb + 2 < n_kblocks) load_k(kb + 2, kb & 1);
    cp_async_commit();

    // ---- issue S_{kb+1} = Q K_{kb+1} and O += P_kb V_kb ----
    // The last block issues an unused S too (on the other K buffer's stale tile): no branch around
    // the wgmma groups, which ptxas would otherwise serialize.
    preset_s(s_i);
    wgmma_fence();
    issue_qk(s_i, kb + 1);
    wgmma_commit();
    issue_pv(pa, kb);
    wgmma_commit();
#if SAGE_WG_PV_OVERLAP
    wgmma_wait<1>();  // S_{kb+1} ready; P_kb V_kb may still run
#else
    wgmma_wait<0>();  // S_{kb+1} and P_kb V_kb done: no register of an in-flight wgmma is live
#endif
    wgmma_pin(s_i);
  }
  wgmma_wait<0>();
  wgmma_pin(o);

  // ---- epilogue: O / l, LSE ----
  OutT* out = reinterpret_cast<OutT*>(p.out) + b * p.o_sb + h * p.o_sh;
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(l_run[r]);
    const int row = q0 + wrow0 + g + 8 * r;
    if (row >= p.q_len) continue;
    const float inv = 1.f / l;
    OutT* orow = out + row * p.o_sn;
    #pragma unroll
    for (int j = 0; j < kDT; ++j) {
      const int d = j * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(orow + d) =
          pack_out2<OutT>(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (p.lse && t == 0) store_lse(p, bh, row, l, m_run[r]);
  }
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel
#endif
}

template <int HEAD_DIM, int NWG, int BLOCK_N, PvKind PV, typename OutT>
cudaError_t launch_attn_wgmma(const AttnParams& p, cudaStream_t stream) {
  return launch_over_query_blocks<attn_wgmma_kernel<HEAD_DIM, NWG, BLOCK_N, PV, OutT>,
                                  WgmmaTraits<HEAD_DIM, NWG, BLOCK_N>>(p, stream);
}

}  // namespace sage
