"""No-GPU tests of an sm75 family defect (audit 30): a bfloat16 V is converted to fp16 for the P.V mma
(Turing has no bf16 mma), divided per channel by a power of two s first. s was at least 1, which
keeps a V past fp16's 65504 finite but leaves a small V in fp16's subnormals: a bfloat16 V of
magnitude 1e-7 lost about 17% (relative L1) in the conversion alone, 1e-8 became zeros. The scale
(csrc/sm75/v16_scale.h, host and device) now brings each channel's amax into (2^14, 2^15].
Compiled here with g++ and checked on the CPU; tests/gpu/test_sm75_audit30_gpu.py runs the kernel.
"""
from __future__ import annotations

import math

import pytest
import torch

from host_cpp import ROOT, compile_driver

HEADER = ROOT / "csrc" / "sm75" / "v16_scale.h"

DRIVER = f"""
#include <cstdio>
#include <cstdlib>
#include "{HEADER}"
int main(int argc, char** argv) {{
  for (int i = 1; i < argc; ++i) {{
    const float amax = std::strtof(argv[i], nullptr);
    std::printf("%a\\n", static_cast<double>(sageattention_sm75::v16_scale_for(amax)));
  }}
  return 0;
}}
"""


@pytest.fixture(scope="module")
def scale_for(tmp_path_factory):
    """v16_scale_for of csrc/sm75/v16_scale.h, compiled on the host: amax list -> scale list."""
    import subprocess

    exe = compile_driver(tmp_path_factory.mktemp("sm75_v16"), "v16_scale", DRIVER)

    def run(amaxes):
        args = [a if isinstance(a, str) else float(a).hex() for a in amaxes]
        out = subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout
        return [float.fromhex(line) for line in out.split()]

    return run


def _is_power_of_two(s: float) -> bool:
    mant, _ = math.frexp(s)
    return s > 0 and mant == 0.5


@pytest.mark.parametrize("amax,scale", [(32768.0, 1.0), (32769.0, 2.0), (65536.0, 2.0), (1e5, 4.0),
                                        (3e38, 2.0 ** 113), (16384.0, 0.5), (1.0, 2.0 ** -15)])
def test_scale_is_the_smallest_power_of_two_that_fits(scale_for, amax, scale):
    assert scale_for([amax]) == [scale]


@pytest.mark.parametrize("amax", ["0", "inf", "nan"])
def test_zero_and_non_finite_channels_keep_scale_one(scale_for, amax):
    assert scale_for([amax]) == [1.0]


def test_every_scale_brings_amax_into_the_top_octave_below_2_15(scale_for):
    gen = torch.Generator().manual_seed(30)
    amaxes = (10.0 ** (torch.rand(2000, generator=gen, dtype=torch.float64) * 45 - 25)).tolist()  # above the clamp (2^-85)
    amaxes = [float(torch.tensor(a, dtype=torch.float32)) for a in amaxes] + [2.0 ** k for k in range(-85, 60)]
    for amax, s in zip(amaxes, scale_for(amaxes)):
        assert _is_power_of_two(s), (amax, s)
        assert 2.0 ** 14 < amax / s <= 2.0 ** 15, (amax, s)


def test_tiny_amax_is_clamped_so_the_inverse_stays_finite(scale_for):
    for amax, s in zip([1e-38, 1e-40, 2.0 ** -90], scale_for([1e-38, 1e-40, 2.0 ** -90])):
        assert s == 2.0 ** -100 and math.isfinite(1.0 / s) and amax / s <= 2.0 ** 15


@pytest.mark.parametrize("magnitude", [1e-5, 1e-6, 1e-7, 1e-8, 1e-20])
def test_small_bf16_v_converts_to_fp16_exactly(scale_for, magnitude):
    """What the V transpose does (V * (1 / s), then fp16) on a small bfloat16 V: exact per channel
    with the new scales; with s = 1 the fp16 values were subnormal or zero."""
    gen = torch.Generator().manual_seed(int(-math.log10(magnitude)))
    v = (torch.randn(256, 8, generator=gen) * magnitude).to(torch.bfloat16).float()  # [tokens, channels]
    s = torch.tensor(scale_for(v.abs().amax(dim=0).tolist()), dtype=torch.float32)
    converted = (v * (1.0 / s)).half().float() * s
    assert torch.equal(converted, v)
    unscaled = v.half().float()  # the old conversion (s = 1 below 32768)
    assert not torch.equal(unscaled, v)
