"""No-GPU tests of the sm80 family's smooth_v (sageattention/native/sm80.py): with "fp16"
accumulation V's token mean is taken out before the kernel and put back after, as upstream does;
with fp32 accumulation V goes to the kernel as given. The kernel is replaced by exact attention."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sageattention.native import sm80


def _exact_attention(calls):
    def op(q, k, v, layout, causal, scale, gran, accum, smooth_k, return_lse):
        calls.append({"v": v.clone(), "accum": accum})
        if layout == "NHD":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        group = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                             scale=scale).to(q.dtype)
        return (out if layout == "HND" else out.transpose(1, 2)), torch.empty(0)
    return op


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(sm80, "load", lambda: None)
    monkeypatch.setattr(sm80, "_attention_op", _exact_attention(seen))
    return seen


def _qkv(layout, dtype=torch.float32, offset=0.0):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 9, 8, generator=g) for h in (4, 2, 2))
    v = v + offset * torch.randn(2, 2, 1, 8, generator=g)  # a per-channel offset of each kv head
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _call(q, k, v, layout, accum, smooth_v):
    return sm80.qk_int8_pv_fp16(q, k, v, tensor_layout=layout, is_causal=True, sm_scale=0.3,
                                qk_quant_gran="per_thread", pv_accum_dtype=accum, smooth_k=True,
                                smooth_v=smooth_v, return_lse=False)[0]


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_fp16_accumulation_gets_v_without_its_token_mean_and_the_same_attention(calls, layout):
    q, k, v = _qkv(layout, offset=50.0)
    out = _call(q, k, v, layout, "fp16", True)
    tokens = 2 if layout == "HND" else 1
    kernel_v = calls[0]["v"]
    assert kernel_v.mean(dim=tokens).abs().max() < 1e-4  # the offsets are gone
    assert torch.allclose(kernel_v, v - v.mean(dim=tokens, keepdim=True), atol=1e-5)
    assert torch.allclose(out, _call(q, k, v, layout, "fp16", False), atol=1e-4)  # GQA: 2 q heads a kv head


@pytest.mark.parametrize("accum", ["fp32", "fp16+fp32"])
def test_fp32_accumulation_takes_v_as_given(calls, accum):
    q, k, v = _qkv("HND", offset=50.0)
    _call(q, k, v, "HND", accum, True)
    assert torch.equal(calls[0]["v"], v)


def test_smoothing_keeps_the_inputs_dtype_and_empty_keys_alone(calls):
    q, k, v = _qkv("HND", dtype=torch.bfloat16, offset=50.0)
    out = _call(q, k, v, "HND", "fp16", True)
    assert calls[0]["v"].dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    q, k, v = (t[:, :, :0] for t in _qkv("HND"))
    _call(q, k, v, "HND", "fp16", True)
    assert calls[1]["v"].numel() == 0  # no mean of zero tokens (NaN) to add back
