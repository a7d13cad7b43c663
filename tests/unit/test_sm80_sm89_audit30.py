"""No-GPU audit tests of the sm80 family's Python wrapper (sageattention/native/sm80.py) for a V
the op would hand to fp16 badly: the fp16-accumulating modes ("fp16+fp32", "fp16") take V in fp16,
and the op converted a bfloat16 V (and smooth_v's centered V) to fp16 unscaled, so a channel past
65504 became inf (the output inf or NaN) and one of 1e-7 kept 1 to 2 bits (1e-8: zeros). The
wrapper now divides such a channel by a power of two first (fp16_v_scale) and multiplies the
output channel back. The op is replaced by a stand-in that does what the compiled op does with V
(converts a bfloat16 V to fp16 as given) and then exact attention, or by the reference oracle."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sageattention.native import sm80
from test_native_sm80_smooth_v import _exact_attention  # exact attention on the op's arguments

FP16_MODES = ["fp16", "fp16+fp32"]


def _op_like_the_kernel(calls):
    """The compiled op's V handling (bindings.cpp: a bfloat16 V with an fp16-accumulating mode is
    converted to fp16, unscaled), then attention in fp32 on that fp16 V."""
    def op(q, k, v, layout, causal, scale, gran, accum, smooth_k, return_lse):
        calls.append({"v": v.clone(), "accum": accum})
        assert v.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype
        assert v.dtype == q.dtype or (q.dtype == torch.bfloat16 and v.dtype == torch.float16)
        if accum != "fp32":
            v = v.to(torch.float16)
        return exact(q, k, v, layout, causal, scale, gran, accum, smooth_k, return_lse)
    exact = _exact_attention([])   # its own record of the calls is not read
    return op


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(sm80, "load", lambda: None)
    monkeypatch.setattr(sm80, "_attention_op", _op_like_the_kernel(seen))
    return seen


def _qkv(layout="HND", dtype=torch.bfloat16, v_mag=1.0, hq=4, hkv=2, n=40):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, n, 64, generator=g) for h in (hq, hkv, hkv))
    v = v * v_mag
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _call(q, k, v, layout, accum, smooth_v=False, causal=True):
    return sm80.qk_int8_pv_fp16(q, k, v, tensor_layout=layout, is_causal=causal, sm_scale=0.125,
                                qk_quant_gran="per_thread", pv_accum_dtype=accum, smooth_k=True,
                                smooth_v=smooth_v, return_lse=False)[0]


def _exact(q, k, v, layout, causal=True):
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    out = F.scaled_dot_product_attention(q.double(), k, v, is_causal=causal, scale=0.125)
    return out if layout == "HND" else out.transpose(1, 2)


def _rel(out, exact):
    return ((out.double() - exact).abs().sum() / exact.abs().sum()).item()


@pytest.mark.parametrize("accum", FP16_MODES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_a_bfloat16_v_past_fp16s_max_gives_a_finite_output(calls, accum, layout, smooth_v):
    # |V| up to about 4e5: unscaled, every fp16 V past 65504 was inf and the output inf or NaN
    q, k, v = _qkv(layout, v_mag=1e5)
    out = _call(q, k, v, layout, accum, smooth_v)
    assert calls[0]["v"].dtype == torch.float16 and torch.isfinite(calls[0]["v"]).all()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert _rel(out, _exact(q, k, v, layout)) < 0.01   # GQA: 2 query heads on each kv head


@pytest.mark.parametrize("accum", FP16_MODES)
@pytest.mark.parametrize("mag", [1e-7, 1e-8, 1e-12])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_a_tiny_bfloat16_v_keeps_its_bits(calls, accum, mag, smooth_v):
    # unscaled: 1e-7 lands in fp16's subnormals (1 to 2 bits, 17% off), 1e-8 and below on 0
    q, k, v = _qkv(v_mag=mag)
    out = _call(q, k, v, "HND", accum, smooth_v)
    assert _rel(out, _exact(q, k, v, "HND")) < 0.01


@pytest.mark.parametrize("accum", FP16_MODES)
def test_ordinary_v_goes_to_the_op_as_the_unscaled_conversion(calls, accum):
    # scale 1 between 2^-14 and 2^15: the fp16 V, and so the results, are what they were
    q, k, v = _qkv(v_mag=3.0)
    v[0, 0, :, 5] = 30000.0            # a large channel within 2^15 keeps scale 1 too
    v[1, 1, :, 7] = 2.0 ** -13         # and a small one above 2^-14
    _call(q, k, v, "HND", accum)
    assert torch.equal(calls[0]["v"], v.half())


def test_only_the_channels_out_of_range_are_scaled(calls):
    q, k, v = _qkv(v_mag=1.0)
    v[0, 1, :, 3] *= 1e5
    v[1, 0, :, 9] *= 1e-9
    _call(q, k, v, "HND", "fp16")
    sent = calls[0]["v"].float()
    scale = v.float().abs().amax(dim=2, keepdim=True) / sent.abs().amax(dim=2, keepdim=True)
    assert scale[0, 1, 0, 3] > 2 and scale[1, 0, 0, 9] < 2.0 ** -20
    others = torch.ones_like(scale, dtype=torch.bool)
    others[0, 1, 0, 3] = others[1, 0, 0, 9] = False
    assert (scale[others] == 1).all()
    pow2 = torch.frexp(scale.flatten())[0] == 0.5
    assert pow2.all()   # powers of two: the division and the multiplication back are exact


def test_fp32_accumulation_and_fp16_v_are_left_alone(calls):
    q, k, v = _qkv(v_mag=1e5)
    _call(q, k, v, "HND", "fp32")   # bf16 P.V on V as given: no conversion, nothing to scale
    assert calls[0]["v"].dtype == torch.bfloat16 and torch.equal(calls[0]["v"], v)
    q, k, v = _qkv(dtype=torch.float16, v_mag=1e-7)
    _call(q, k, v, "HND", "fp16")   # an fp16 V is the op's as given
    assert torch.equal(calls[1]["v"], v)


@pytest.mark.parametrize("accum", FP16_MODES)
def test_smooth_v_of_an_fp16_v_whose_deviations_pass_65504(calls, accum):
    # an fp16 V channel of 60000s and one -60000: V minus its mean reaches about -117000, which
    # the centered V's fp16 rounding made inf
    q, k, v = _qkv(dtype=torch.float16, v_mag=1.0)
    v[:, :, :, 0] = 60000.0
    v[:, :, 0, 0] = -60000.0
    out = _call(q, k, v, "HND", accum, smooth_v=True, causal=False)
    assert torch.isfinite(calls[0]["v"]).all() and torch.isfinite(out).all()
    assert _rel(out, _exact(q, k, v, "HND", causal=False)) < 0.01


@pytest.mark.parametrize("accum", FP16_MODES)
def test_matches_the_reference_oracle_for_a_v_past_fp16s_max(monkeypatch, accum):
    # The reference scales a bfloat16 V taken as fp16 down by fp16_v_scale (reference.py); the op
    # stand-in is the reference on the fp16 V the wrapper hands over (no scale of its own there).
    from sageattention.reference import FAMILY_BLOCK_SIZES, sageattn_reference

    kw = dict(qk_quant_gran="per_thread", pv_accum_dtype=accum, smooth_k=True,
              **FAMILY_BLOCK_SIZES["sm80"])

    def kernel(q, k, v, layout, causal, scale, gran, acc, smooth_k, return_lse):
        return sageattn_reference(q, k, v, tensor_layout=layout, is_causal=causal, sm_scale=scale,
                                  **kw), torch.empty(0)

    monkeypatch.setattr(sm80, "load", lambda: None)
    monkeypatch.setattr(sm80, "_attention_op", kernel)
    q, k, v = _qkv(v_mag=1.0, n=70)
    q = q * 10   # a peaked softmax: P's row sums near 1, so the fp16 accumulators hold V / s <= 2^15
    v[:, :, :, :4] *= 2e5
    out = _call(q, k, v, "HND", accum)
    ref = sageattn_reference(q, k, v, tensor_layout="HND", is_causal=True, sm_scale=0.125, **kw)
    assert torch.isfinite(ref).all() and torch.isfinite(out).all()
    assert torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2 * ref.float().abs().max().item())


def test_the_scaling_runs_on_meta_tensors_without_reading_data(monkeypatch):
    # torch.compile traces the wrapper on fake tensors: nothing may need the values on the host
    seen = []

    def op(q, k, v, layout, causal, scale, gran, accum, smooth_k, return_lse):
        seen.append(v.dtype)
        return q.new_empty(q.shape), q.new_empty((0,), dtype=torch.float32)

    monkeypatch.setattr(sm80, "load", lambda: None)
    monkeypatch.setattr(sm80, "_attention_op", op)
    q, k, v = (torch.empty(1, h, 33, 128, dtype=torch.bfloat16, device="meta") for h in (4, 1, 1))
    for smooth_v in (False, True):
        out = _call(q, k, v, "HND", "fp16+fp32", smooth_v)
        assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.device.type == "meta"
    assert seen == [torch.float16, torch.float16]


def test_fp16_v_scale_rule():
    amax = torch.tensor([0.0, 1e-39, 3e-8, 2.0 ** -14, 1.0, 32768.0, 32769.0, 65536.0, 1e5,
                         float("inf"), float("nan")])
    s = sm80.fp16_v_scale(amax)
    assert s.tolist() == [1.0, 2.0 ** -100, 2.0 ** -24, 1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 1.0, 1.0]
