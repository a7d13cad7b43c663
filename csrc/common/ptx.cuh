// Thin wrappers around the PTX instructions the kernels use (mma.sync, ldmatrix, cp.async).
// CUDA headers only: no torch, so objects built from this can be cached per (CUDA, SM).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exp2_fma.h"

namespace sage {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared-memory operands are 32-bit shared-window addresses (smem_u32): kernels keep per-thread
// base addresses and add compile-time offsets, which ptxas folds into the instruction.

// 16-byte async copy global -> shared. When `valid` is false nothing is read from `src`
// (src-size 0) and the 16 destination bytes are zero-filled: tails never read past the end.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ldmatrix: four 8x8 b16 matrices (8 rows of 16 bytes each); lane l gives the row address of
// matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A(16x32 s8, row) * B(32x8 s8, col) + D, int32 accumulators (sm80+).
__device__ __forceinline__ void mma_m16n8k32_s8(int32_t (&d)[4], const uint32_t (&a)[4],
                                                uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x16 f16) * B(16x8 f16) + D with fp32 accumulators (sm80+).
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A(16x16 bf16) * B(16x8 bf16) + D with fp32 accumulators (sm80+): P.V for bfloat16 V, which
// keeps V's range (fp16 would turn |V| > 65504 into inf).
__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float (&d)[4], const uint32_t (&a)[4],
                                                      uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Same product with fp16 accumulators: d holds two half2 (row g and row g+8).
__device__ __forceinline__ void mma_m16n8k16_f16_f16(uint32_t (&d)[2], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, "
      "{%0,%1};\n"
      : "+r"(d[0]), "+r"(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define SAGE_HAS_FP8_MMA 1
#endif

// D = A(16x32 e4m3, row) * B(32x8 e4m3, col) + D, fp32 accumulators (sm89+).
__device__ __forceinline__ void mma_m16n8k32_e4m3_f32(float (&d)[4], const uint32_t (&a)[4],
                                                      uint32_t b0, uint32_t b1) {
#ifdef SAGE_HAS_FP8_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Same with fp16 accumulators (PTX 8.7+, sm89+): d holds two half2.
__device__ __forceinline__ void mma_m16n8k32_e4m3_f16(uint32_t (&d)[2], const uint32_t (&a)[4],
                                                      uint32_t b0, uint32_t b1) {
#ifdef SAGE_HAS_FP8_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, "
      "{%0,%1};\n"
      : "+r"(d[0]), "+r"(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Two fp32 -> packed e4m3x2 (saturating; lo goes in the low byte).
__device__ __forceinline__ uint16_t f32x2_to_e4m3x2(float lo, float hi) {
#ifdef SAGE_HAS_FP8_MMA
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  __trap();
  return 0;
#endif
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// fp16x2 rounded toward zero (lo in the low half): with e4m3x4_from_f16x2_scaled's round to
// nearest after it, the two roundings give the nearest e4m3 (to nearest after to-nearest would
// move values just below an e4m3 midpoint onto it, and then up: 0.4% of them).
__device__ __forceinline__ uint32_t pack_half2_rz(float lo, float hi) {
  uint32_t r;
  asm("cvt.rz.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four e4m3 codes from two fp16x2 words (pack_half2_rz) holding the values times 2^-8, each in
// [0, 448 * 2^-8]: e4m3's exponent bias (7) is fp16's (15) less 8, and e4m3's subnormal step
// (2^-9) is 2^7 fp16 subnormal steps at that scale, so a value's code is its half's bits 7..14
// rounded to nearest (ties away; the hardware pack rounds ties to even): add 0x40, shift up by
// one (as one multiply-add), keep bytes 1 and 3 of each word. No carry crosses halves (a half is
// at most 0x3f00) and 448 maps to 0x7e, e4m3's largest finite.
__device__ __forceinline__ uint32_t e4m3x4_from_f16x2_scaled(uint32_t lo, uint32_t hi) {
  const uint32_t a = lo * 2u + 0x00800080u, b = hi * 2u + 0x00800080u;
  return __byte_perm(a, b, 0x7531);  // lo's two codes in bytes 0, 1; hi's in bytes 2, 3
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^lo and 2^hi as one fp16x2 word (lo in the low half), for a P that goes to an fp16 P.V
// anyway: the arguments rounded to fp16 (|x| * 2^-11 absolute, so the error is largest where P is
// smallest), then one ex2.approx.f16x2 for both (the tuning knobs SAGE_EXP2_F16X2 and
// SAGE_WG_EXP2_F16X2). Measured on an H100: sm_90 runs it as two MUFU.EX2.F16, no faster than two
// f32 exponentials, and the sm90 kernel with it was 0.969x (docs/kernels.md, 2026-12-06).
__device__ __forceinline__ uint32_t exp2_f16x2(float lo, float hi) {
  const uint32_t x = pack_half2(lo, hi);
  uint32_t y;
  asm("ex2.approx.f16x2 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The sum of N fp16x2 words' 2N halves, as a float: a pairwise tree of HADD2 (depth log2 N, so
// each half's partial sum is rounded at most log2 N times), then the two halves in fp32. On
// uint32_t through asm: taking a local word's address as a __half2 puts the array on the stack.
template <int N>
__device__ __forceinline__ float sum_f16x2(const uint32_t (&w)[N]) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
  uint32_t v[N];
  #pragma unroll
  for (int i = 0; i < N; ++i) v[i] = w[i];
  // level by level with compile-time strides (a `step /= 2` loop is not unrolled: v went to the stack)
  #pragma unroll
  for (int level = 1; level < N; level *= 2)
    #pragma unroll
    for (int i = 0; i < N; i += 2 * level)
      asm("add.rn.f16x2 %0, %1, %2;\n" : "=r"(v[i]) : "r"(v[i]), "r"(v[i + level]));
  float lo, hi;
  asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n"
      : "=f"(lo), "=f"(hi) : "r"(v[0]));
  return lo + hi;
}

// The softmaxes' exp2 of score column tile j (an n8 tile): the first FMA_TILES tiles of every 8
// take exp2_fma, the rest the MUFU (j is a compile-time constant once the loop is unrolled).
template <int FMA_TILES>
__device__ __forceinline__ float softmax_exp2(float x, int j) {
  static_assert(FMA_TILES >= 0 && FMA_TILES <= 8, "tiles out of 8");
  return j % 8 < FMA_TILES ? exp2_fma(x) : fast_exp2(x);
}

}  // namespace sage
