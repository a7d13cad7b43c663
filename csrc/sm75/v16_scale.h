// The per-channel power-of-two scale that a bfloat16 V is divided by before its fp16 conversion
// (Turing has no bf16 mma: P.V takes V in fp16). No CUDA headers: the host tests compile it with g++
// (tests/unit/test_sm75_audit30.py).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define SA75_HD __host__ __device__ __forceinline__
#else
#define SA75_HD inline
#endif

namespace sageattention_sm75 {

// max |V| / s is brought into (kV16Max / 2, kV16Max]: fp16 tops out at 65504 (2^15 is the largest
// power of two below it), and a small V is scaled up instead of falling into fp16's subnormals
// (below 2^-14 = 6.1e-5 fp16 keeps fewer than 11 bits; below 2^-25 it is 0). A bfloat16 value has
// 8 significant bits, so every one within 2^-29 of its channel's amax converts exactly.
constexpr float kV16Max = 32768.f;
// The smallest scale: 1 / s stays finite (and far from float's max) for any amax.
constexpr float kV16MinScale = 7.8886090522101181e-31f;  // 2^-100

// The smallest power of two s with amax / s <= kV16Max, at least kV16MinScale. Every step is exact:
// x = amax / 2^15 = m * 2^e (0.5 <= m < 1); s = x when x is a power of two (m = 0.5), else 2^e.
// An all-zero channel and a non-finite amax (an inf or NaN in V) keep s = 1.
SA75_HD float v16_scale_for(float amax) {
  const float x = amax * (1.f / kV16Max);
  if (!(x > 0.f) || !(x <= 3.4028234663852886e38f)) return 1.f;
  if (!(x > kV16MinScale)) return kV16MinScale;
  int e;
  const float m = frexpf(x, &e);
  return m == 0.5f ? x : ldexpf(1.f, e);
}

}  // namespace sageattention_sm75

#undef SA75_HD
