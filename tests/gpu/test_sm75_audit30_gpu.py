"""GPU tests of the sm75 family defect fixed in audit 30 (tests/unit/test_sm75_audit30.py has the
CPU side): a small bfloat16 V lost its bits in the fp16 conversion of the P.V mma (the per-channel
scale was at least 1), so a V of magnitude 1e-7 came out about 17% off and 1e-8 as zeros. On a GPU
newer than Turing the extension runs as its compute_75 PTX: the Turing code path, not Turing hardware.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sageattention.native import sm75

SDPA_COSINE, SDPA_REL_L1 = 0.9998, 0.02  # design.md, INT8 QK + FP16 PV against fp32 SDPA


def _inputs(b, hq, hkv, nq, nk, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=gen, device="cuda")
    k = torch.randn(b, hkv, nk, d, generator=gen, device="cuda")
    v = torch.randn(b, hkv, nk, d, generator=gen, device="cuda")
    return q, k, v


def _sdpa(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                          is_causal=causal)


def _cosine(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _rel_l1(a, b):
    return ((a.double() - b.double()).abs().sum() / b.double().abs().sum()).item()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("magnitude", [1e-5, 1e-6, 1e-7, 1e-8, 1e-20])
def test_small_bf16_v_is_as_accurate_as_ordinary_v(sm75_ops, magnitude, d, causal):
    q, k, v = _inputs(2, 4, 2, 300, 300, d, seed=int(-math.log10(magnitude)) + d + causal)
    q, k, v = q.bfloat16(), k.bfloat16(), (v * magnitude).bfloat16()
    out, _ = sm75.qk_int8_pv_fp16(q, k, v, tensor_layout="HND", is_causal=causal, sm_scale=None,
                                  qk_quant_gran="per_thread", pv_accum_dtype="fp32", smooth_k=True,
                                  smooth_v=False, return_lse=False)
    exact = _sdpa(q.float(), k.float(), v.float(), causal)
    assert torch.isfinite(out).all()
    got = out.float() / magnitude
    assert _cosine(got, exact / magnitude) >= SDPA_COSINE, _cosine(got, exact / magnitude)
    assert _rel_l1(got, exact / magnitude) <= SDPA_REL_L1, _rel_l1(got, exact / magnitude)


def test_channels_from_tiny_to_huge_each_keep_their_accuracy(sm75_ops):
    """Each (kv head, channel) of a bfloat16 V gets its own magnitude, 1e-9 to 1e5: every output
    channel, divided by its magnitude, must meet the bar (small channels weigh as much as large)."""
    d = 128
    q, k, v = _inputs(2, 4, 2, 500, 500, d, seed=7)
    gen = torch.Generator(device="cuda").manual_seed(8)
    mag = 10.0 ** (14 * torch.rand(2, 1, d, generator=gen, device="cuda") - 9)  # [kv head, 1, channel]
    q, k, v = q.bfloat16(), k.bfloat16(), (v * mag).bfloat16()
    out, _ = sm75.qk_int8_pv_fp16(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None,
                                  qk_quant_gran="per_warp", pv_accum_dtype="fp32", smooth_k=True,
                                  smooth_v=False, return_lse=False)
    per_q_head = mag.repeat_interleave(2, dim=0)
    exact = _sdpa(q.float(), k.float(), v.float(), False) / per_q_head
    got = out.float() / per_q_head
    assert torch.isfinite(got).all()
    assert _cosine(got, exact) >= SDPA_COSINE and _rel_l1(got, exact) <= SDPA_REL_L1
