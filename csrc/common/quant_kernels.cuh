// Fused quantization kernels shared by the sm80 and sm89 families.
//   * quant_int8_kernel: Q or K -> INT8, symmetric, one scale per group (per_block, per_warp,
//     per_thread as in docs/architecture.md), optional mean subtraction (K smoothing) fused in,
//     Q's scale multiplied by sm_scale*log2(e). Writes a padded HND-contiguous buffer whose rows
//     past the sequence end are zero.
//   * quant_v_fp8_kernel: V -> e4m3 terms hi and lo (kFp8VTerms, attn_params.h), transposed to
//     [B, H, kFp8VTerms * D, Npad] with the token order permuted inside each 16-token group so one
//     ldmatrix yields the mma's B fragment (see attn_kernel.cuh).
//   * v_scale_kernel: V's per-channel FP8 scale over the tokens (and its mean when smoothing), the
//     reduction and its end in one kernel.
// CUDA headers only.
#pragma once
#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "attn_params.h"
#include "exact_div.h"

namespace sage {

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// The two 16-bit values of a 32-bit word as floats (the lower one in .x), by bit operations for
// bfloat16: element-wise conversion had ptxas split and spill the halves (quant_v_fp8_kernel).
template <typename T>
__device__ __forceinline__ float2 unpack_pair(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack_pair<__half>(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, sizeof(w));
  return __half22float2(h);
}
template <>
__device__ __forceinline__ float2 unpack_pair<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// Group of a token inside its block. per_thread follows the mma fragment layout:
// Q rows g and g+8 of a 16-row tile (token % 8); K columns 2t, 2t+1 of an n8 tile ((token % 8) / 2).
__device__ __forceinline__ int group_in_block(int token_in_block, int groups_per_block) {
  if (groups_per_block == 8) return token_in_block & 7;
  if (groups_per_block == 4) return (token_in_block & 7) >> 1;
  return 0;
}

constexpr int kQuantThreads = 128;
// quant_int8_kernel's launch shape (tuning knobs, benchmarks/gpu_dev_quant_bench.cu): threads per
// CTA, the most chunks per thread kept as floats between the two passes, and the CTAs per SM
// asked of the register allocator (0: no request).
#ifndef SAGE_QUANT_THREADS
#define SAGE_QUANT_THREADS 128
#endif
#ifndef SAGE_QUANT_KEEP_MAX
#define SAGE_QUANT_KEEP_MAX 8
#endif
#ifndef SAGE_QUANT_MIN_CTAS
#define SAGE_QUANT_MIN_CTAS 0
#endif
constexpr int kInt8QuantThreads = SAGE_QUANT_THREADS;
constexpr float kScaleFloor = 1e-8f;  // INT8 Q/K scales: a tiny Q or K only flattens a flat softmax
// V's FP8 scale has its own, much smaller floor: kFp8VScaleFloor (2^-100, attn_params.h).

// The means of channels d0..d0+7 (K smoothing), or zeros without a mean.
__device__ __forceinline__ void load_mean8(const float* mean, int d0, float (&m)[8]) {
  if (!mean) {
    #pragma unroll
    for (int i = 0; i < 8; ++i) m[i] = 0.f;
    return;
  }
  // 32-byte aligned: [B, H, D] fp32 contiguous with D % 8 == 0
  const float4 lo = *reinterpret_cast<const float4*>(mean + d0);
  const float4 hi = *reinterpret_cast<const float4*>(mean + d0 + 4);
  m[0] = lo.x; m[1] = lo.y; m[2] = lo.z; m[3] = lo.w;
  m[4] = hi.x; m[5] = hi.y; m[6] = hi.z; m[7] = hi.w;
}

// The 8 channels of one token (a 16-byte chunk), minus their means, times scale_mult.
template <typename T>
__device__ __forceinline__ void chunk_values(const uint4& raw, const float (&m)[8], float scale_mult,
                                             float (&v)[8]) {
  const T* e = reinterpret_cast<const T*>(&raw);
  #pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = (to_f32(e[i]) - m[i]) * scale_mult;
}

// v / scale correctly rounded, as sageattention.reference's IEEE division (the same int8 values
// bit for bit), with the reciprocal of the group's scale computed once: the steps are those of
// the compiler's own __fdiv_rn (reciprocal refined by one Newton step, quotient by one
// residual correction) without its per-division range check and slow-path call. That check
// guards quotients near the ends of the float range, which cannot occur here: scale is normal
// (at least kScaleFloor, at most float max / 127; V's FP8 scale at least kFp8VScaleFloor) and
// |v / scale| <= 127 (448 for V); a quotient too small for the fast path to be exact rounds to 0
// either way (below 2^-10 at the V floor, where its residual is subnormal: e4m3's step is 2^-9;
// tests/unit/test_exact_divisor.py).
struct ExactDivisor {
  float b, r;
  __device__ __forceinline__ explicit ExactDivisor(float scale) : b(scale) {
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(scale));
    r = refine_reciprocal(scale, r0);
  }
  __device__ __forceinline__ float operator()(float a) const {
    return quotient_from_reciprocal(a, b, r);
  }
};
// round(q) as the low byte of an int: adding 1.5 * 2^23 leaves the integer, rounded to nearest
// even like rintf, in the float's low mantissa bits (|q| <= 127), two's complement for negative
// values. No F2I/FRND (quarter-rate on sm_80..sm_90) and no clamp (in range).
__device__ __forceinline__ uint32_t round_to_int_bits(float q) {
  return __float_as_uint(__fadd_rn(q, 12582912.f));
}
// The low bytes of a, b, c, d packed into one word (a lowest).
__device__ __forceinline__ uint32_t pack_low_bytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// Grid: (n_blocks, H, B). One CTA quantizes `block_tokens` tokens of one (batch, head). Each thread
// holds its CHUNKS 16-byte chunks (8 channels of one token) in registers between the absmax
// pass and the rounding pass: x is read from memory once, with all loads in flight together.
// Up to SAGE_QUANT_KEEP_MAX chunks per thread the chunks are kept as the floats the absmax pass
// computed (converted once); more would cost occupancy, so those are converted again.
// The kernel is bound by instruction issue, not memory (ncu on the H200: the schedulers issued in
// 77% of cycles at 53% of DRAM bandwidth), so the per-chunk work is kept small:
// SAME_CHANNELS (D / 8 divides the thread count: D = 8 .. 256 in powers of two) gives a thread
// the same 8 channels in every chunk, so their means are loaded and the chunk's place computed
// once, not by integer division per chunk; when all of a thread's tokens fall in one scale group
// (the token step a multiple of 8), the lanes of a token reduce their absmax by shuffles before
// one shared atomic; and each group's scale and refined reciprocal are computed once, by one
// thread, and read from shared memory.
template <typename T, int CHUNKS, bool SAME_CHANNELS>
__global__ void __launch_bounds__(kInt8QuantThreads, SAGE_QUANT_MIN_CTAS) quant_int8_kernel(QuantInt8Params p) {
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int n0 = blk * p.block_tokens;
  const int chunks_per_row = p.head_dim / 8;
  __shared__ unsigned int s_amax[8];  // bit patterns of non-negative floats: int max == float max
  __shared__ float s_scale[8], s_recip[8];
  if (threadIdx.x < 8) s_amax[threadIdx.x] = 0u;

  const T* x = reinterpret_cast<const T*>(p.x) + b * p.x_sb + h * p.x_sh;
  const float* mean = p.mean ? p.mean + (static_cast<int64_t>(b) * p.heads + h) * p.head_dim : nullptr;
  // Chunk i of this thread: token tok(i) of the block, channels d0(i) .. d0(i) + 7.
  const int same_d0 = SAME_CHANNELS ? (threadIdx.x % chunks_per_row) * 8 : 0;
  const int tok0 = SAME_CHANNELS ? threadIdx.x / chunks_per_row : 0;
  const int tok_step = SAME_CHANNELS ? kInt8QuantThreads / chunks_per_row : 0;
  auto tok_of = [&](int i) {
    return SAME_CHANNELS ? tok0 + i * tok_step : (threadIdx.x + i * kInt8QuantThreads) / chunks_per_row;
  };
  auto d0_of = [&](int i) {
    return SAME_CHANNELS ? same_d0 : (threadIdx.x + i * kInt8QuantThreads) % chunks_per_row * 8;
  };
  // Every token of this thread in one scale group (groups follow token % 8).
  const bool one_group = p.groups_per_block == 1 || (SAME_CHANNELS && tok_step % 8 == 0);

  uint4 raw[CHUNKS];
  #pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int tok = tok_of(i);
    raw[i] = make_uint4(0u, 0u, 0u, 0u);
    if (tok < p.block_tokens && n0 + tok < p.tokens)  // never read past the end
      raw[i] = *reinterpret_cast<const uint4*>(x + (n0 + tok) * p.x_sn + d0_of(i));
  }
  float m[8];
  if (SAME_CHANNELS) load_mean8(mean, same_d0, m);
  __syncthreads();  // s_amax initialised

  constexpr bool kKeepFloats = CHUNKS <= SAGE_QUANT_KEEP_MAX;
  [[maybe_unused]] float vals[kKeepFloats ? CHUNKS : 1][8];
  float local[8];
  #pragma unroll
  for (int gi = 0; gi < 8; ++gi) local[gi] = 0.f;
  #pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int tok = tok_of(i);
    if (tok >= p.block_tokens || n0 + tok >= p.tokens) continue;
    if (!SAME_CHANNELS) load_mean8(mean, d0_of(i), m);
    float v[8];
    chunk_values<T>(raw[i], m, p.scale_mult, v);
    if constexpr (kKeepFloats) {
      #pragma unroll
      for (int k = 0; k < 8; ++k) vals[kKeepFloats ? i : 0][k] = v[k];
    }
    float a = 0.f;
    #pragma unroll
    for (int k = 0; k < 8; ++k) a = fmaxf(a, fabsf(v[k]));
    if (one_group) {
      local[0] = fmaxf(local[0], a);
    } else {
      const int gi = group_in_block(tok, p.groups_per_block);
      #pragma unroll
      for (int j = 0; j < 8; ++j)
        if (j == gi) local[j] = fmaxf(local[j], a);  // constant indices keep `local` in registers
    }
  }
  if (one_group) {
    int gi = 0;
    if (SAME_CHANNELS) {
      // the chunks_per_row lanes of a token (consecutive, a power of two <= 32) share its group
      for (int off = 1; off < chunks_per_row; off <<= 1)
        local[0] = fmaxf(local[0], __shfl_xor_sync(0xffffffffu, local[0], off));
      gi = group_in_block(tok0, p.groups_per_block);
    }
    if ((!SAME_CHANNELS || same_d0 == 0) && local[0] > 0.f) atomicMax(&s_amax[gi], __float_as_uint(local[0]));
  } else {
    for (int gi = 0; gi < p.groups_per_block; ++gi)
      if (local[gi] > 0.f) atomicMax(&s_amax[gi], __float_as_uint(local[gi]));
  }
  __syncthreads();

  if (threadIdx.x < p.groups_per_block) {
    const int64_t scale_base = (static_cast<int64_t>(b) * p.heads + h) * p.scale_groups +
                               static_cast<int64_t>(blk) * p.groups_per_block;
    const float scale = fmaxf(__uint_as_float(s_amax[threadIdx.x]) / 127.f, kScaleFloor);
    p.scale_out[scale_base + threadIdx.x] = scale;
    const ExactDivisor div(scale);
    s_scale[threadIdx.x] = div.b;
    s_recip[threadIdx.x] = div.r;
  }
  __syncthreads();

  int8_t* out = p.out + ((static_cast<int64_t>(b) * p.heads + h) * p.padded_tokens + n0) * p.head_dim;
  const int my_group = one_group && SAME_CHANNELS ? group_in_block(tok0, p.groups_per_block) : 0;
  const float b1 = s_scale[my_group], r1 = s_recip[my_group];  // the group of one_group threads
  #pragma unroll
  for (int i = 0; i < CHUNKS; ++i) {
    const int tok = tok_of(i);
    if (tok >= p.block_tokens) break;
    const int d0 = d0_of(i);
    uint2 packed = make_uint2(0u, 0u);  // rows past the end are written as zeros
    if (n0 + tok < p.tokens) {
      float sb = b1, sr = r1;
      if (!one_group) {
        const int gi = group_in_block(tok, p.groups_per_block);
        sb = s_scale[gi];
        sr = s_recip[gi];
      }
      float v[8];
      if constexpr (kKeepFloats) {
        #pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = vals[kKeepFloats ? i : 0][k];
      } else {
        if (!SAME_CHANNELS) load_mean8(mean, d0, m);
        chunk_values<T>(raw[i], m, p.scale_mult, v);
      }
      uint32_t r[8];
      #pragma unroll
      for (int k = 0; k < 8; ++k) r[k] = round_to_int_bits(quotient_from_reciprocal(v[k], sb, sr));
      packed = make_uint2(pack_low_bytes(r[0], r[1], r[2], r[3]),
                          pack_low_bytes(r[4], r[5], r[6], r[7]));
    }
    *reinterpret_cast<uint2*>(out + tok * p.head_dim + d0) = packed;
  }
}

// Stored position q (0..15) in a 16-token group holds token perm16(q): the mma A fragment of P
// for byte 4t+i is the S accumulator column 2t + (i & 1) + 8 * (i >> 1).
__host__ __device__ __forceinline__ int perm16(int q) {
  const int t = q >> 2, i = q & 3;
  return 2 * t + (i & 1) + 8 * (i >> 1);
}

constexpr int kVBlock = 64;
constexpr int kVMaxHeadDim = 128;
constexpr float kE4m3Max = 448.f;  // e4m3's largest finite value, where a saturating conversion stops
// Row pitch of the byte tile: 33 words, so the 16 tokens of one channel that a warp reads at once
// in the transposed pass fall in distinct banks but for pairs 32 tokens apart.
constexpr int kVTilePitch = kVMaxHeadDim + 4;
constexpr int kVChunksPerThread = kVBlock * (kVMaxHeadDim / 8) / kQuantThreads;  // 8

// Grid: (n_blocks of 64 tokens, H, B). scale/mean: fp32 [B, H, D] (mean may be null); scale is at
// least kFp8VScaleFloor (2^-100), so its reciprocal is a finite fp32 value.
// Pass 1 reads the block's tokens, divides each value by its channel's scale exactly
// (ExactDivisor: the same quotient as IEEE division, as the reference computes it; quotients too
// small for its fast path to be exact round to e4m3 zero anyway) and stores the e4m3 bytes
// token-major in shared memory; pass 2 writes them channel-major, permuted within 16-token
// groups. Bytes rather than floats in shared memory (8.4 KB, not 33 KB) let more CTAs share an
// SM: the kernel is bound by memory traffic and needs many loads in flight.
// SAME_CHANNELS: D / 8 divides the thread count (D = 8, 16, 32, 64, 128), so a thread meets the
// same 8 channels in every chunk: their divisors and means are set up once and all its loads
// are issued together. Otherwise each chunk sets up its own. At least 6 CTAs per SM (80 registers): 8 spill.
template <typename T, bool SAME_CHANNELS>
__global__ void __launch_bounds__(kQuantThreads, 6) quant_v_fp8_kernel(QuantFp8Params p) {
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int n0 = blk * kVBlock;
  const int D = p.head_dim;
  const int chunks_per_row = D / 8, n_chunks = kVBlock * chunks_per_row;
  __shared__ __align__(16) uint8_t tile[kFp8VTerms][kVBlock * kVTilePitch];  // hi, then lo bytes
  const T* x = reinterpret_cast<const T*>(p.x) + b * p.x_sb + h * p.x_sh;
  const int64_t bh = static_cast<int64_t>(b) * p.heads + h;
  const float* scale = p.scale + bh * D;
  const float* mean = p.mean ? p.mean + bh * D : nullptr;

  auto load = [&](int tok, int d0) {
    return n0 + tok < p.tokens ? *reinterpret_cast<const uint4*>(x + (n0 + tok) * p.x_sn + d0)
                               : make_uint4(0u, 0u, 0u, 0u);
  };
  float m[8] = {}, sb[8], sr[8];  // the 8 channels' means, scales and refined reciprocals
  auto set_channels = [&](int d0) {
    #pragma unroll
    for (int k = 0; k < 8; ++k) {
      const ExactDivisor div(scale[d0 + k]);
      sb[k] = div.b;
      sr[k] = div.r;
      if (mean) m[k] = mean[d0 + k];
    }
  };
  auto quantize_to_tile = [&](int tok, int d0, const uint4& raw) {
    const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t words[kFp8VTerms][2] = {};  // tokens past the end are stored as zeros
    if (n0 + tok < p.tokens) {
      #pragma unroll
      for (int k = 0; k < 8; k += 2) {
        const float2 v = unpack_pair<T>(in[k / 2]);
        const float2 pair = make_float2(quotient_from_reciprocal(v.x - m[k], sb[k], sr[k]),
                                        quotient_from_reciprocal(v.y - m[k + 1], sb[k + 1], sr[k + 1]));
        // saturating, round to nearest even; pair.x in the low byte
        const __nv_fp8x2_storage_t two = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
        words[0][k / 4] |= static_cast<uint32_t>(two) << (k % 4 == 0 ? 0 : 16);
        if constexpr (kFp8VTerms == 2) {
          // lo = e4m3(x - hi), x clamped as hi saturates; e4m3 values are exact in fp16
          const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3)));
          const float2 rest = make_float2(fminf(fmaxf(pair.x, -kE4m3Max), kE4m3Max) - hi.x,
                                          fminf(fmaxf(pair.y, -kE4m3Max), kE4m3Max) - hi.y);
          const uint32_t lo = __nv_cvt_float2_to_fp8x2(rest, __NV_SATFINITE, __NV_E4M3);
          words[1][k / 4] |= lo << (k % 4 == 0 ? 0 : 16);
        }
      }
    }
    #pragma unroll
    for (int term = 0; term < kFp8VTerms; ++term) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(tile[term] + tok * kVTilePitch + d0);
      dst[0] = words[term][0];
      dst[1] = words[term][1];
    }
  };

  if constexpr (SAME_CHANNELS) {
    // chunks_per_row is a power of two: thread t takes channels d0 of tokens tok0 + i * tok_step.
    const int shift = __ffs(chunks_per_row) - 1;
    const int d0 = (threadIdx.x & (chunks_per_row - 1)) * 8;
    const int tok0 = threadIdx.x >> shift, tok_step = kQuantThreads >> shift;
    set_channels(d0);  // first: the raw chunks then wait in registers for nothing else
    uint4 raw[kVChunksPerThread];
    #pragma unroll
    for (int i = 0; i < kVChunksPerThread; ++i)
      if (tok0 + i * tok_step < kVBlock) raw[i] = load(tok0 + i * tok_step, d0);
    #pragma unroll
    for (int i = 0; i < kVChunksPerThread; ++i)
      if (tok0 + i * tok_step < kVBlock) quantize_to_tile(tok0 + i * tok_step, d0, raw[i]);
  } else {
    #pragma unroll 1
    for (int c = threadIdx.x; c < n_chunks; c += kQuantThreads) {
      const int tok = c / chunks_per_row, d0 = (c % chunks_per_row) * 8;
      const uint4 raw = load(tok, d0);
      set_channels(d0);
      quantize_to_tile(tok, d0, raw);
    }
  }
  __syncthreads();
  // One 32-bit word = 4 stored positions of one channel; term t's rows follow term t-1's D rows.
  uint8_t* out = p.out + bh * kFp8VTerms * D * p.padded_tokens + n0;
  for (int w = threadIdx.x; w < kFp8VTerms * D * (kVBlock / 4); w += kQuantThreads) {
    const int row = w / (kVBlock / 4), q0 = (w % (kVBlock / 4)) * 4;
    const int term = row / D, d = row % D;
    const int base = q0 & ~15;
    uint32_t word = 0;
    #pragma unroll
    for (int i = 0; i < 4; ++i)
      word |= static_cast<uint32_t>(tile[term][(base + perm16((q0 + i) & 15)) * kVTilePitch + d]) << (8 * i);
    *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * p.padded_tokens + q0) = word;
  }
}


// Grid: (chunks, H, B), kVScaleThreads threads. One CTA reduces v_scale_chunk_tokens(D) tokens of one
// (batch, head) over each channel into a partial result; the last of its (batch, head) to arrive
// reduces the partials in a fixed order and writes the scale (and mean): no atomics on values,
// the same result on every run. Thread t keeps the same 8 channels for all its tokens and has its
// kVScaleRowsPerThread loads in flight together. It replaces ATen's aminmax over the token dim
// (2.0-2.6 TB/s on the H200) and the four small element-wise launches after it.
// STATS: TokenStats::kAmax (V's scale), kSmooth (V's scale over v - mean, and the mean) or
// kMeanOnly (K's token mean for smoothing: ATen's mean over the token dim ran at 1.8 TB/s on the
// H100, 10% of a call at 8x32x1024x128, benchmarks/results/h100-2026-12-06-trace-6f496e1.log).
enum class TokenStats { kAmax, kSmooth, kMeanOnly };
template <typename T, TokenStats STATS>
__global__ void __launch_bounds__(kVScaleThreads) v_scale_kernel(VScaleParams p) {
  constexpr bool SMOOTH = STATS == TokenStats::kSmooth, kMeanOnly = STATS == TokenStats::kMeanOnly;
  constexpr bool kSum = SMOOTH || kMeanOnly, kExtrema = !kMeanOnly;
  constexpr int kParts = SMOOTH ? 3 : 1;  // v_scale_partials(SMOOTH); mean only: the sum
  constexpr int kRows = kVScaleRowsPerThread;
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int D = p.head_dim, chunks_per_row = D / 8;
  const int lanes_per_pass = kVScaleThreads / chunks_per_row;  // tokens read at once
  const int d0 = (threadIdx.x % chunks_per_row) * 8, row0 = threadIdx.x / chunks_per_row;
  const int n0 = chunk * kRows * lanes_per_pass;  // v_scale_chunk_tokens(D)
  const int64_t bh = static_cast<int64_t>(b) * p.heads + h;
  const T* v = reinterpret_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh;
  const float inf = __int_as_float(0x7f800000);

  uint4 raw[kRows];
  #pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int tok = n0 + row0 + i * lanes_per_pass;
    raw[i] = tok < p.tokens ? *reinterpret_cast<const uint4*>(v + tok * p.v_sn + d0)
                            : make_uint4(0u, 0u, 0u, 0u);
  }
  // Tokens past the end were read as zeros: they add nothing to the sum or to max |v|, but
  // min and max must skip them.
  float sum[8], lo[8], hi[8];
  #pragma unroll
  for (int k = 0; k < 8; ++k) { sum[k] = 0.f; lo[k] = inf; hi[k] = SMOOTH ? -inf : 0.f; }
  #pragma unroll
  for (int i = 0; i < kRows; ++i) {
    [[maybe_unused]] const bool valid = n0 + row0 + i * lanes_per_pass < p.tokens;
    const uint32_t in[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
    #pragma unroll
    for (int k = 0; k < 8; k += 2) {
      const float2 x = unpack_pair<T>(in[k / 2]);
      if constexpr (kSum) {
        sum[k] += x.x; sum[k + 1] += x.y;
      }
      if constexpr (SMOOTH) {
        if (valid) {
          lo[k] = fminf(lo[k], x.x); lo[k + 1] = fminf(lo[k + 1], x.y);
          hi[k] = fmaxf(hi[k], x.x); hi[k + 1] = fmaxf(hi[k + 1], x.y);
        }
      } else if constexpr (kExtrema) {
        hi[k] = fmaxf(hi[k], fabsf(x.x));
        hi[k + 1] = fmaxf(hi[k + 1], fabsf(x.y));
      }
    }
  }
  // [row][channel] of each statistic, then summed / min'd / max'd over the rows in row order.
  __shared__ float s_sum[kSum ? kVScaleThreads * 8 : 1];
  __shared__ float s_lo[SMOOTH ? kVScaleThreads * 8 : 1];
  __shared__ float s_hi[kExtrema ? kVScaleThreads * 8 : 1];
  __shared__ int s_last;
  const int slot = row0 * D + d0;
  #pragma unroll
  for (int k = 0; k < 8; ++k) {
    if constexpr (kSum) s_sum[slot + k] = sum[k];
    if constexpr (SMOOTH) s_lo[slot + k] = lo[k];
    if constexpr (kExtrema) s_hi[slot + k] = hi[k];
  }
  __syncthreads();
  float* part = p.partial + (bh * p.chunks + chunk) * kParts * D;
  for (int d = threadIdx.x; d < D; d += kVScaleThreads) {
    float s = 0.f, l = inf, m = SMOOTH ? -inf : 0.f;
    for (int r = 0; r < lanes_per_pass; ++r) {
      if constexpr (kSum) s += s_sum[r * D + d];
      if constexpr (SMOOTH) l = fminf(l, s_lo[r * D + d]);
      if constexpr (kExtrema) m = fmaxf(m, s_hi[r * D + d]);
    }
    if constexpr (SMOOTH) { part[d] = s; part[D + d] = l; part[2 * D + d] = m; }
    else part[d] = kMeanOnly ? s : m;
  }

  // The last CTA of this (batch, head) reduces the partials (release: fence, then arrive).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(p.arrivals + bh, 1) == p.chunks - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // acquire: the other CTAs' partials are visible from here (read past L1)
  const float* parts = p.partial + bh * p.chunks * kParts * D;
  for (int d = threadIdx.x; d < D; d += kVScaleThreads) {
    float s = 0.f, l = inf, m = SMOOTH ? -inf : 0.f;
    #pragma unroll 4
    for (int c = 0; c < p.chunks; ++c) {
      const float* pc = parts + static_cast<int64_t>(c) * kParts * D;
      if constexpr (kSum) s += __ldcg(pc + d);
      if constexpr (SMOOTH) l = fminf(l, __ldcg(pc + D + d));
      if constexpr (kExtrema) m = fmaxf(m, __ldcg(pc + (kParts - 1) * D + d));
    }
    const int64_t o = bh * D + d;
    if constexpr (kMeanOnly) {
      p.mean[o] = __fdiv_rn(s, static_cast<float>(p.tokens));
      continue;
    }
    float amax = m;
    if constexpr (SMOOTH) {
      const float mean = __fdiv_rn(s, static_cast<float>(p.tokens));
      p.mean[o] = mean;
      amax = fmaxf(m - mean, mean - l);  // max |v - mean|: rounding is monotonic
    }
    p.scale[o] = fmaxf(__fdiv_rn(amax, p.scale_max), kFp8VScaleFloor);
  }
}

}  // namespace sage

namespace sage {

// Launchers (host). Return the launch error; the caller turns it into an exception.
inline cudaError_t launch_quant_int8(const QuantInt8Params& p, int batch, DType dtype,
                                     cudaStream_t stream) {
  const dim3 grid(p.padded_tokens / p.block_tokens, p.heads, batch);
  // chunks per thread, rounded up to the next instantiated size (head dim <= 256, block <= 128)
  const int per_thread = (p.block_tokens * (p.head_dim / 8) + kInt8QuantThreads - 1) / kInt8QuantThreads;
  const bool same_channels = kInt8QuantThreads % (p.head_dim / 8) == 0;
  auto launch = [&](auto chunks) {
    constexpr int kChunks = decltype(chunks)::value;
    auto go = [&](auto same) {
      constexpr bool kSame = decltype(same)::value;
      if (dtype == DType::kFloat16)
        quant_int8_kernel<__half, kChunks, kSame><<<grid, kInt8QuantThreads, 0, stream>>>(p);
      else
        quant_int8_kernel<__nv_bfloat16, kChunks, kSame><<<grid, kInt8QuantThreads, 0, stream>>>(p);
    };
    if (same_channels) go(std::true_type{});
    else go(std::false_type{});
  };
  if (per_thread <= 2) launch(std::integral_constant<int, 2>{});
  else if (per_thread <= 4) launch(std::integral_constant<int, 4>{});
  else if (per_thread <= 8) launch(std::integral_constant<int, 8>{});
  else if (per_thread <= 16) launch(std::integral_constant<int, 16>{});
  else if (per_thread <= 32) launch(std::integral_constant<int, 32>{});
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

inline cudaError_t launch_quant_v_fp8(const QuantFp8Params& p, int batch, DType dtype,
                                      cudaStream_t stream) {
  const dim3 grid(p.padded_tokens / kVBlock, p.heads, batch);
  auto launch = [&](auto same_channels) {
    constexpr bool kSame = decltype(same_channels)::value;
    if (dtype == DType::kFloat16)
      quant_v_fp8_kernel<__half, kSame><<<grid, kQuantThreads, 0, stream>>>(p);
    else
      quant_v_fp8_kernel<__nv_bfloat16, kSame><<<grid, kQuantThreads, 0, stream>>>(p);
  };
  if (kQuantThreads % (p.head_dim / 8) == 0) launch(std::true_type{});
  else launch(std::false_type{});
  return cudaGetLastError();
}


// The token-statistics kernel for STATS over x (p.v), in x's dtype.
template <TokenStats STATS>
inline cudaError_t launch_token_stats(const VScaleParams& p, int batch, DType dtype, cudaStream_t stream) {
  if (!v_scale_kernel_supported(p.head_dim)) return cudaErrorInvalidValue;
  const dim3 grid(p.chunks, p.heads, batch);
  if (dtype == DType::kFloat16)
    v_scale_kernel<__half, STATS><<<grid, kVScaleThreads, 0, stream>>>(p);
  else
    v_scale_kernel<__nv_bfloat16, STATS><<<grid, kVScaleThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

inline cudaError_t launch_v_scale(const VScaleParams& p, int batch, DType dtype, bool smooth,
                                  cudaStream_t stream) {
  return smooth ? launch_token_stats<TokenStats::kSmooth>(p, batch, dtype, stream)
                : launch_token_stats<TokenStats::kAmax>(p, batch, dtype, stream);
}

// The token mean [B, H, D] of x (p.v) alone, into p.mean (K smoothing); p.scale is not written.
inline cudaError_t launch_token_mean(const VScaleParams& p, int batch, DType dtype, cudaStream_t stream) {
  return launch_token_stats<TokenStats::kMeanOnly>(p, batch, dtype, stream);
}

}  // namespace sage
