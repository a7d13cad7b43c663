// The division steps of quant_int8_kernel's ExactDivisor (quant_kernels.cuh) that follow the
// hardware reciprocal, as plain C++ so the host can run them too:
// tests/unit/test_exact_divisor.py checks them against IEEE division.
#pragma once
#include <cmath>

#include "host_device.h"

namespace sage {

// One Newton step on an approximate reciprocal r0 of b (the hardware's is within 1 ulp).
SAGE_HOST_DEVICE float refine_reciprocal(float b, float r0) {
  return std::fma(r0, std::fma(-b, r0, 1.f), r0);
}

// a / b rounded to nearest from the refined reciprocal r: the quotient, then one correction by
// its residual (exact in an FMA). This is what the compiler's __fdiv_rn computes when its range
// check lets the fast path through; that check guards quotients near the ends of the float
// range. The product must be rounded on its own, not contracted into an FMA.
SAGE_HOST_DEVICE float quotient_from_reciprocal(float a, float b, float r) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(a, r);
#else
  volatile float q_rounded = a * r;  // a separate rounding whatever the host's contraction flags
  const float q = q_rounded;
#endif
  return std::fma(r, std::fma(-b, q, a), q);
}

}  // namespace sage
