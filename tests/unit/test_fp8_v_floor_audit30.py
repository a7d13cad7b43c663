"""V's per-channel FP8 scale floor (audit 30): 2^-100, not the INT8 Q/K scales' 1e-8.

Where V is quantized to e4m3 for the P.V product its per-channel scale is max(amax / v_max, floor).
With the floor at 1e-8 a channel whose max |V| is near 1e-10 or below (bfloat16 and fp16 hold such
values) was divided by 1e-8 into e4m3's subnormals or onto 0: relative L1 against exact attention
0.061 at 1e-10, 0.56 at 1e-11, zeros below (the FP8 bar is 0.04). The floor is now 2^-100 in every
place that computes the scale (csrc/common/attn_params.h kFp8VScaleFloor for the native kernels,
sageattention.reference.FP8_V_SCALE_FLOOR, the Triton FP8 kernel's V_SCALE_FLOOR): a normal float
whose reciprocal is finite, so a channel of zeros still gives zeros. The Q/K floor stays 1e-8.

The reference cases run in-process; the Triton FP8 kernel runs in Triton's interpreter in one
subprocess (this file with ``--worker``, as tests/unit/test_triton_fp8_interpret.py does).
"""
from __future__ import annotations

import json
import sys

import pytest

torch = pytest.importorskip("torch")

FP8_COS, FP8_L1 = 0.9993, 0.04  # design.md's INT8-QK / FP8-PV bars (tests/unit/test_reference.py)
TINY = [1e-10, 1e-12]
# (family block sizes, pv_accum_dtype, smooth_v): the FP8 P.V settings the families run
SETTINGS = [("sm89", "fp32+fp32", False), ("sm89", "fp32", True), ("sm89", "fp32+fp16", False),
            ("sm90_fp8", "fp32+fp32", False), ("sm90_fp8", "fp32", True)]


def _qkv(magnitude, *, seed=0, b=1, hq=4, hkv=2, nq=128, nk=192, d=64, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=gen).to(dtype)
    k = torch.randn(b, hkv, nk, d, generator=gen).to(dtype)
    v = (torch.randn(b, hkv, nk, d, generator=gen) * magnitude).to(dtype)
    return q, k, v


def _sdpa64(q, k, v, is_causal=False):
    group = q.shape[1] // k.shape[1]
    kk, vv = (t.repeat_interleave(group, dim=1).double() for t in (k, v))
    return torch.nn.functional.scaled_dot_product_attention(q.double(), kk, vv, is_causal=is_causal)


def _metrics(out, ref):
    o, r = out.double().flatten(), ref.double().flatten()
    # brought to unit size first: cosine_similarity clamps the norms' product at 1e-8
    unit = r.abs().max().clamp_min(1e-300)
    o, r = o / unit, r / unit
    return (torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
            ((o - r).abs().sum() / r.abs().sum()).item())


def _reference(q, k, v, fam, accum, smooth_v, **kw):
    from sageattention.reference import FAMILY_BLOCK_SIZES, sageattn_reference
    return sageattn_reference(q, k, v, pv_dtype="fp8", pv_accum_dtype=accum, smooth_v=smooth_v,
                              **FAMILY_BLOCK_SIZES[fam], **kw)


def test_the_v_floor_is_its_own_and_the_qk_floor_is_unchanged():
    from sageattention import reference
    assert reference.FP8_V_SCALE_FLOOR == 2.0 ** -100 and "FP8_V_SCALE_FLOOR" in reference.__all__
    assert reference.SCALE_FLOOR == 1e-8
    # 2^-100 is a normal float32 and so is its reciprocal: V / scale and out * scale stay exact
    floor = torch.tensor(reference.FP8_V_SCALE_FLOOR, dtype=torch.float32)
    assert floor.item() == 2.0 ** -100 and torch.isfinite(1 / floor) and (1 / floor).item() == 2.0 ** 100
    # the Q/K INT8 scale keeps 1e-8: an all-zero head's group scale
    x = torch.zeros(1, 1, 64, 64)
    _, _, group_scale = reference.quantize_int8(x, granularity="per_block", is_query=True, blkq=64)
    assert torch.all(group_scale == 1e-8)


@pytest.mark.parametrize("magnitude", TINY)
@pytest.mark.parametrize("fam,accum,smooth_v", SETTINGS)
def test_tiny_bfloat16_v_meets_the_fp8_bar(fam, accum, smooth_v, magnitude):
    # fails with the 1e-8 floor: relative L1 ~0.06 at 1e-10, 1.0 (zeros) at 1e-12
    q, k, v = _qkv(magnitude, seed=3)
    assert v.abs().max().item() < 10 * magnitude and v.abs().max().item() > 0  # bfloat16 holds it
    out = _reference(q, k, v, fam, accum, smooth_v)
    assert torch.isfinite(out).all()
    cos, rel = _metrics(out, _sdpa64(q, k, v))
    assert rel <= FP8_L1 and cos >= FP8_COS, (rel, cos)


@pytest.mark.parametrize("magnitude", TINY)
def test_tiny_channels_beside_ordinary_ones_keep_their_accuracy(magnitude):
    # per-channel scales: a tiny channel next to ordinary ones is measured against its own size
    q, k, v = _qkv(1.0, seed=5)
    v[..., :8] = (v[..., :8].float() * magnitude).to(torch.bfloat16)
    out = _reference(q, k, v, "sm90_fp8", "fp32+fp32", False)
    ref = _sdpa64(q, k, v)
    _, rel_tiny = _metrics(out[..., :8], ref[..., :8])
    _, rel_rest = _metrics(out[..., 8:], ref[..., 8:])
    assert rel_tiny <= FP8_L1 and rel_rest <= FP8_L1, (rel_tiny, rel_rest)


@pytest.mark.parametrize("fam,accum,smooth_v", SETTINGS)
def test_an_all_zero_v_channel_gives_a_finite_output_and_zeros(fam, accum, smooth_v):
    q, k, v = _qkv(1.0, seed=9)
    v[:, 1, :, 3] = 0   # one all-zero channel of one kv head
    v[:, 0] = 0         # and a whole kv head of zeros
    out = _reference(q, k, v, fam, accum, smooth_v)
    assert torch.isfinite(out).all()
    group = q.shape[1] // k.shape[1]
    assert not out[:, :group].any()            # query heads reading the all-zero kv head
    assert not out[:, group:, :, 3].any()      # the all-zero channel
    _, rel = _metrics(out, _sdpa64(q, k, v))
    assert rel <= FP8_L1, rel


def test_scale_is_the_floor_only_below_it():
    # the reference's V scale, recovered from a one-key attention (P = 1 exactly): the dequantized V
    from sageattention.reference import FP8_V_SCALE_FLOOR, sageattn_reference
    q = torch.randn(1, 1, 1, 16)
    k = torch.randn(1, 1, 1, 16)
    mags = torch.tensor([0.0, 1e-38, 1e-30, 1e-20, 1e-12, 1e-10, 1e-8, 1.0])
    v = torch.ones(1, 1, 1, 16)
    v[..., :8] = mags
    v[..., 8:] = -mags
    out = sageattn_reference(q, k, v, pv_dtype="fp8", pv_accum_dtype="fp32")[0, 0, 0]
    # amax / 448 above 2^-100 (1e-20 and up): x = 448 exactly, so the value comes back exactly
    for i, m in enumerate(mags.tolist()):
        if m / 448 > FP8_V_SCALE_FLOOR:
            assert out[i].item() == pytest.approx(m, rel=1e-6) and out[8 + i].item() == pytest.approx(-m, rel=1e-6)
    assert out[0].item() == 0 and out[8].item() == 0    # zero stays zero
    assert torch.isfinite(out).all()


# ---- the Triton FP8 kernel in the interpreter -------------------------------------------------------

def _worker() -> dict:
    from sageattention.triton import attn_fp8

    res: dict = {"floor": attn_fp8.V_SCALE_FLOOR, "cases": {}}
    for mag in (*TINY, 0.0):
        q, k, v = _qkv(mag if mag else 1.0, seed=11, hq=2, hkv=1, nq=96, nk=160)
        if not mag:
            v[:, :, :, 5] = 0  # an all-zero channel
        out, _ = attn_fp8.run_attention_fp8(q, k, v, is_causal=False, sm_scale=q.shape[-1] ** -0.5,
                                            smooth_k=True, return_lse=False)
        _, scale = attn_fp8.quantize_v_fp8(v, pad_to=64)
        cos, rel = _metrics(out, _sdpa64(q, k, v))
        res["cases"][str(mag)] = {"cos": cos, "rel_l1": rel, "finite": bool(torch.isfinite(out).all()),
                                  "min_scale": scale.min().item(),
                                  "zero_channel_out_zero": bool(not out[..., 5].any()) if not mag else None}
    return res


@pytest.fixture(scope="module")
def triton_measured() -> dict:
    pytest.importorskip("triton")
    from interpreter_worker import run_worker
    return run_worker(__file__, timeout=900)


def test_triton_fp8_v_floor(triton_measured):
    from sageattention.reference import FP8_V_SCALE_FLOOR
    assert triton_measured["floor"] == FP8_V_SCALE_FLOOR


@pytest.mark.parametrize("magnitude", TINY)
def test_triton_fp8_tiny_v_meets_the_bar(triton_measured, magnitude):
    m = triton_measured["cases"][str(magnitude)]
    assert m["finite"]
    assert m["rel_l1"] <= FP8_L1 and m["cos"] >= FP8_COS, m
    assert m["min_scale"] < 1e-8   # the scale went below the old floor


def test_triton_fp8_zero_channel_is_finite_and_zero(triton_measured):
    m = triton_measured["cases"]["0.0"]
    assert m["finite"] and m["zero_channel_out_zero"]
    assert m["min_scale"] == 2.0 ** -100
    assert m["rel_l1"] <= FP8_L1, m


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(_worker()))
