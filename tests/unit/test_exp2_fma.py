"""The softmax's MUFU-free exp2 (csrc/common/exp2_fma.h) run on the host against exp2.

The attention kernels take some of their exp2s from exp2_fma instead of the MUFU unit
(SAGE_EXP2_FMA / SAGE_WG_EXP2_FMA), claiming a relative error of at most 1.02e-4 (under fp16's smallest relative
half ulp, 2.4e-4, so P's rounding dominates) for every exponent the softmax computes: x <= log2(448) (FP8 P.V folds
P's 448 into the exponent), down to the masked scores' -inf, which must give exactly 0.
"""
from __future__ import annotations

import subprocess

import pytest
from host_cpp import compile_driver

DRIVER = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include "exp2_fma.h"

int main(int argc, char** argv) {
  const float lo = std::atof(argv[1]), hi = std::atof(argv[2]);
  const long long steps = std::atoll(argv[3]);
  double worst = 0; float worst_x = 0; long long checked = 0, not_finite = 0;
  for (long long i = 0; i <= steps; ++i) {
    const float x = lo + (float)((double)(hi - lo) * i / steps);
    const float y = sage::exp2_fma(x);
    if (!std::isfinite(y) || y < 0) { ++not_finite; continue; }
    const double want = std::exp2((double)x);
    if (want < 0x1p-126) continue;  // subnormal results: relative error is not the measure there
    const double rel = std::fabs(y / want - 1.0);
    if (rel > worst) { worst = rel; worst_x = x; }
    ++checked;
  }
  std::printf("%lld %lld %.9g %.9g\n", checked, not_finite, worst, worst_x);
  return 0;
}
"""

SPECIALS = r"""
#include <cmath>
#include <cstdio>
#include "exp2_fma.h"

int main() {
  const float xs[] = {-INFINITY, -1e30f, -200.f, -127.f, -126.9f, -126.f, -0.5f, 0.f, 0.5f, 1.f, 8.807355f, 127.f};
  for (float x : xs) std::printf("%a\n", (double)sage::exp2_fma(x));
  return 0;
}
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exp2_fma")
    return lambda name, source: compile_driver(folder, name, source)


@pytest.mark.parametrize("lo, hi", [(-126.0, 9.0), (-1.0, 1.0), (-20.0, 0.0)])
def test_relative_error_below_fp16_half_ulp(build, lo, hi):
    exe = build("sweep", DRIVER)
    out = subprocess.run([str(exe), str(lo), str(hi), "2000000"], check=True, capture_output=True,
                         text=True).stdout
    checked, not_finite, worst, worst_x = out.split()
    assert int(not_finite) == 0
    assert int(checked) > 1_000_000
    assert float(worst) < 1.03e-4, f"relative error {worst} at x = {worst_x}"


def test_masked_and_extreme_exponents(build):
    exe = build("specials", SPECIALS)
    got = [float.fromhex(line) for line in
           subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    neg_inf, huge_neg, below, at_floor, near_floor, floor1, m_half, zero, half, one, log2_448, top = got
    assert neg_inf == 0.0 and huge_neg == 0.0 and below == 0.0 and at_floor == 0.0  # masked scores
    assert 0.0 < near_floor < 2.0 ** -126  # a small subnormal, never negative or NaN
    assert floor1 == pytest.approx(2.0 ** -126, rel=1.03e-4)
    for value, want in [(m_half, 2 ** -0.5), (zero, 1.0), (half, 2 ** 0.5), (one, 2.0),
                        (log2_448, 448.0), (top, 2.0 ** 127)]:
        assert value == pytest.approx(want, rel=1.03e-4)
