// Tensor-core wrappers for Turing (sm_75) mma.sync shapes.
// Fragment layouts follow the PTX ISA ("Matrix fragments for mma.m8n8k16" and
// "mma.m16n8k8"); with g = lane / 4 and t = lane % 4:
//   m8n8k16 s8:  A word = A[g][4t..4t+3], B word = B[4t..4t+3][g], D = D[g][2t..2t+1]
//   m16n8k8 f16: A = {A[g][2t..2t+1], A[g+8][2t..2t+1]}, B = B[2t..2t+1][g],
//                D = {D[g][2t..2t+1], D[g+8][2t..2t+1]}
// The S accumulator of two m8n8k16 tiles (rows g and g+8) therefore is, element
// for element, the A operand of an m16n8k8 product: P never leaves registers.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace sageattention_sm75 {

// D(8x8, s32) += A(8x16, s8, row) * B(16x8, s8, col)
__device__ __forceinline__ void mma_m8n8k16_s8(int32_t (&d)[2], uint32_t a, uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 "
      "{%0, %1}, {%2}, {%3}, {%0, %1};\n"
      : "+r"(d[0]), "+r"(d[1])
      : "r"(a), "r"(b));
}

// D(16x8, f32) += A(16x8, f16, row) * B(8x8, f16, col)
__device__ __forceinline__ void mma_m16n8k8_f16_f32(float (&d)[4], uint32_t a0, uint32_t a1,
                                                    uint32_t b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// Two floats -> one f16x2 register (low half = lo), round to nearest even.
// (cvt.rn.f16x2.f32 needs sm_80; two scalar conversions work on sm_75.)
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace sageattention_sm75
