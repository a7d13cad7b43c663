"""The quantization kernels' division (csrc/common/exact_div.h) run on the host against IEEE division.

The INT8 kernel computes round(v / scale) with one hardware reciprocal per scale and the quotient
steps of exact_div.h instead of __fdiv_rn, claiming the same float, hence the same int8, for every
scale and value the kernel sees (scale normal, |v / scale| <= 127). The FP8 V kernel does the same
with |v / scale| <= 448 and casts the quotient to e4m3, so equal floats suffice there. The hardware reciprocal is
within 1 ulp of 1/scale; here it is emulated anywhere within 2 ulp. The GPU test
(tests/gpu/test_native_sm80_sm89.py) checks the kernel itself against sageattention.reference.
"""
from __future__ import annotations

import subprocess

import pytest
from host_cpp import compile_driver

DRIVER = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include "exact_div.h"

static float ulps(float x, int k) { uint32_t u; std::memcpy(&u, &x, 4); u += k; std::memcpy(&x, &u, 4); return x; }
// The kernel's rounding: q + 1.5 * 2^23, low byte of the bit pattern, as int8.
static int magic_round(float q) {
  volatile float s = q + 12582912.f; float t = s; uint32_t u; std::memcpy(&u, &t, 4);
  return (int)(int8_t)(u & 0xFF);
}

int main(int argc, char** argv) {
  const long long trials = std::atoll(argv[1]);
  const float qmax = std::atof(argv[2]);  // 127: INT8 Q/K; 448: e4m3 V
  // the smallest scale's exponent: -27 (INT8 floor 1e-8), -100 (V's FP8 floor 2^-100)
  const int exp_min = argc > 3 ? std::atoi(argv[3]) : -27;
  // quotients below 2^exempt may differ: 2^-100 (they round to int8 0), 2^-10 (to e4m3 0)
  const float exempt = std::ldexp(1.f, argc > 4 ? std::atoi(argv[4]) : -100);
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> exp_b(exp_min, 119), off(-2, 2);
  long long checked = 0, wrong_quotient = 0, wrong_int = 0;
  for (long long i = 0; i < trials; ++i) {
    const float b = std::ldexp((float)mant(rng), exp_b(rng));   // 2^exp_min .. 1.3e36: the kernel's scales
    const float amax = b * qmax;
    if (!std::isfinite(amax)) continue;                                     // no such scale exists
    float a;
    switch (i % 5) {
      case 0: a = (float)(((double)(rng() % (int)qmax) + 0.5) * b); break;    // next to a tie
      case 1: a = amax; break;                                              // the largest value
      case 2: a = std::ldexp((float)mant(rng), std::ilogb(amax) - 140); break; // tiny, even subnormal
      default: a = std::ldexp((float)mant(rng), std::ilogb(amax) - (int)(rng() % 30));
    }
    if (!(std::fabs(a) <= amax)) continue;
    if (rng() & 1) a = -a;
    const float r = sage::refine_reciprocal(b, ulps(1.f / b, off(rng)));
    const float q = sage::quotient_from_reciprocal(a, b, r);
    const float ieee = a / b;
    ++checked;
    if (q != ieee && !(std::fabs(ieee) < exempt)) ++wrong_quotient;  // a tiny one rounds to 0 anyway
    if (qmax <= 127.f && magic_round(q) != (int)std::nearbyint(ieee)) ++wrong_int;
  }
  std::printf("%lld %lld %lld\n", checked, wrong_quotient, wrong_int);
  return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return compile_driver(tmp_path_factory.mktemp("exact_div"), "driver", DRIVER)


def test_quotient_steps_equal_ieee_division_and_round_the_same(driver):
    out = subprocess.run([str(driver), "3000000", "127"], check=True, capture_output=True, text=True).stdout
    checked, wrong_quotient, wrong_int = (int(x) for x in out.split())
    assert checked > 2_500_000
    assert wrong_quotient == 0
    assert wrong_int == 0


def test_quotient_steps_equal_ieee_division_up_to_the_e4m3_range(driver):
    # quant_v_fp8_kernel: |v / scale| <= 448; a quotient the check exempts (below 2^-100) is far
    # below e4m3's smallest step (2^-9) and casts to zero either way.
    out = subprocess.run([str(driver), "3000000", "448"], check=True, capture_output=True, text=True).stdout
    checked, wrong_quotient, _ = (int(x) for x in out.split())
    assert checked > 2_500_000
    assert wrong_quotient == 0


def test_quotient_steps_equal_ieee_division_down_to_the_fp8_v_scale_floor(driver):
    # V's FP8 scale is floored at 2^-100 (attn_params.h kFp8VScaleFloor), not 1e-8: scales down
    # to it (normal floats, reciprocals finite). Near the floor the residual of a small quotient is
    # subnormal and may round, but only for quotients far below 2^-10, which e4m3 rounds to 0
    # (its smallest step is 2^-9) whatever their last bits.
    out = subprocess.run([str(driver), "3000000", "448", "-100", "-10"], check=True, capture_output=True,
                         text=True).stdout
    checked, wrong_quotient, _ = (int(x) for x in out.split())
    assert checked > 2_500_000
    assert wrong_quotient == 0
