// 2^x without the MUFU unit, as plain C++ so the host can run it too
// (tests/unit/test_exp2_fma.py checks it against exp2 over the softmax's whole input range).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace sage {

SAGE_HOST_DEVICE float add_rn(float a, float b) {  // never contracted into an FMA
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float s = a + b;
  return s;
#endif
}

// The MUFU unit gives 16 results per clock per SM, a quarter of the FMA pipe's rate. Here x is
// split as round(x) + f with |f| <= 1/2, 2^f comes from 1 + f (c1 + f (c2 + f c3)) (minimax in
// relative error with p(0) = 1 held exact: at most 1.02e-4 after fp32 rounding, below the smallest
// relative half ulp of fp16, 2.4e-4) and round(x) is added to the exponent field: 7 FMA/ALU
// instructions. For x <= 127. x <= -127 (-inf included, the masked scores) gives exactly +0: there
// round(x) = -127 and f = 0, so p = 1.0 and the exponent field wraps to zero. Results below 2^-126
// (which ex2.approx.ftz flushes to 0) come out as small subnormals.
SAGE_HOST_DEVICE float exp2_fma(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: x + kRound keeps round(x) in its low bits
  x = std::fmax(x, -127.f);
  const float t = add_rn(x, kRound);
  const float f = add_rn(x, -add_rn(t, -kRound));
  const float p = std::fma(std::fma(std::fma(0x1.c2a218p-5f, f, 0x1.f00c4cp-3f), f, 0x1.62f5fap-1f), f, 1.f);
  uint32_t pb, tb;
  std::memcpy(&pb, &p, 4);
  std::memcpy(&tb, &t, 4);
  const uint32_t rb = pb + (tb << 23);  // (bits of t) << 23 = round(x) << 23 mod 2^32
  float r;
  std::memcpy(&r, &rb, 4);
  return r;
}

}  // namespace sage
