"""Edges of the public API on the SDPA path: overlapping inputs, and scales so large that
scale * q.k overflows float32 (torch's SDPA returned NaN there)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention import core


def exact_attention(q, k, v, scale, *, mask=None, is_causal=False):
    """The limit-safe attention in float64, HND, K/V copied out to the query heads: (out, lse)."""
    q, k, v = q.double(), k.double(), v.double()
    if scale < 0:
        q, scale = -q, -scale
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    x = q @ k.transpose(-1, -2)
    if is_causal:
        x = x.masked_fill(torch.ones(x.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    if mask is not None:
        x = x.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else x + mask.double() / scale
    top = x.amax(-1, keepdim=True)
    w = torch.exp((x - top) * scale)
    out, lse = (w / w.sum(-1, keepdim=True)) @ v, (top * scale + w.sum(-1, keepdim=True).log()).squeeze(-1)
    no_keys = top.squeeze(-1) == -math.inf   # a query without a visible key: 0 and LSE -inf
    return out.masked_fill(no_keys[..., None], 0.0), lse.masked_fill(no_keys, -math.inf)


def qkv(*shape_q, kv_heads=None, nk=7, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, hq, nq, d = shape_q
    hkv = kv_heads or hq
    return (torch.randn(b, hq, nq, d, generator=g, dtype=dtype),
            torch.randn(b, hkv, nk, d, generator=g, dtype=dtype),
            torch.randn(b, hkv, nk, d, generator=g, dtype=dtype))


# --- overlapping inputs ---------------------------------------------------------------------

@pytest.mark.parametrize("strides", [(400, 80, 1, 1), (400, 1, 16, 1), (1, 80, 16, 1)],
                         ids=["token-stride-1", "head-stride-1", "batch-stride-1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_q_whose_rows_overlap_gives_the_attention_of_its_values(strides, dtype):
    # torch 2.14's CPU SDPA read such a q wrongly (off by 2 to 1e37); a copy of it was right
    buffer = torch.randn(1000, generator=torch.Generator().manual_seed(1), dtype=dtype)
    q = buffer.as_strided((2, 4, 5, 16), strides)
    _, k, v = qkv(2, 4, 5, 16, kv_heads=2, dtype=dtype)
    for is_causal in (False, True):
        want, _ = exact_attention(q, k, v, 0.25, is_causal=is_causal)
        got = sa.sageattn(q, k, v, is_causal=is_causal)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_expanded_inputs_are_not_copied_for_the_fallback():
    base = torch.randn(2, 1, 7, 16)
    k = base.expand(2, 4, 7, 16)
    assert core._without_overlap(k) is k
    q = torch.randn(2, 4, 5, 16).transpose(1, 2).contiguous().transpose(1, 2)   # NHD storage
    assert core._without_overlap(q) is q
    overlapping = torch.randn(100).as_strided((2, 4, 5, 16), (0, 0, 1, 1))
    copied = core._without_overlap(overlapping)
    assert copied.is_contiguous() and torch.equal(copied, overlapping)


def test_varlen_with_an_overlapping_q_is_right():
    q = torch.randn(400).as_strided((9, 2, 16), (1, 20, 1))
    k, v = torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 5, 4)
    for (q0, q1), (k0, k1) in (((0, 4), (0, 3)), ((4, 9), (3, 7))):
        want, _ = exact_attention(*(t[a:b].transpose(0, 1)[None] for t, a, b in
                                    ((q, q0, q1), (k, k0, k1), (v, k0, k1))), 0.25)
        torch.testing.assert_close(out[q0:q1].double(), want[0].transpose(0, 1), atol=1e-5, rtol=1e-5)


# --- huge scales ----------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e300, 1.7e308, -1e300, 1e40, 2000.0])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_a_huge_scale_is_the_finite_limit_of_the_softmax(scale, is_causal, dtype):
    q, k, v = qkv(2, 4, 9, 16, kv_heads=2, dtype=dtype)   # Nq > Nk with is_causal, GQA
    want, _ = exact_attention(q, k, v, scale, is_causal=is_causal)
    out = sa.sageattn(q, k, v, sm_scale=scale, is_causal=is_causal)
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), want, atol=1e-2 if dtype.itemsize == 2 else 1e-6, rtol=0)


def test_keys_that_tie_for_the_maximum_share_the_weight_equally():
    q = torch.tensor([[[[1.0, 0.0]]]])
    k = torch.tensor([[[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.0]]]])
    v = torch.tensor([[[[1.0, 0.0], [3.0, 0.0], [100.0, 5.0], [50.0, 50.0]]]])
    for scale in (1e300, 1.7e308, 1e39):
        out, lse = sa.sageattn(q, k, v, sm_scale=scale, return_lse=True)
        assert out.tolist() == [[[[2.0, 0.0]]]]
        assert lse.tolist() == [[[math.inf]]]   # scale * 1 + log 2: beyond float32, its rounding
    out = sa.scaled_dot_product_attention(q, k, v, scale=1e300)
    assert out.tolist() == [[[[2.0, 0.0]]]]


def test_an_lse_within_float32_is_right_at_a_huge_scale():
    q, k, v = qkv(1, 2, 6, 8, nk=5)
    scale = 1e30
    out, lse = sa.sageattn(q, k, v, sm_scale=scale, return_lse=True)
    want_out, want_lse = exact_attention(q, k, v, scale)
    assert torch.isfinite(lse).all()
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=0)
    torch.testing.assert_close(out.double(), want_out, rtol=0, atol=1e-6)
    # a negative scale's lse at the same magnitude overflows to -inf honestly, never NaN
    _, lse = sa.sageattn(q, k, v, sm_scale=-1.7e308, return_lse=True)
    assert not torch.isnan(lse).any() and torch.isinf(lse).all()


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_masks_are_honoured_at_a_huge_scale(layout):
    q, k, v = qkv(2, 4, 5, 16, kv_heads=2)
    g = torch.Generator().manual_seed(3)
    bool_mask = torch.rand(2, 1, 5, 7, generator=g) > 0.4
    bool_mask[0, 0, 2] = False   # a query without a visible key: 0 and LSE -inf
    float_mask = torch.randn(1, 4, 5, 7, generator=g)
    float_mask[..., 3] = -math.inf
    to_layout = (lambda t: t.transpose(1, 2).contiguous()) if layout == "NHD" else (lambda t: t)
    for mask in (bool_mask, float_mask):
        want, want_lse = exact_attention(q, k, v, 1e30, mask=mask)
        out, lse = sa.sageattn(*(to_layout(t) for t in (q, k, v)), tensor_layout=layout, sm_scale=1e30,
                               attn_mask=mask, return_lse=True)
        out = out.transpose(1, 2) if layout == "NHD" else out
        torch.testing.assert_close(out.double(), want, atol=1e-6, rtol=0)
        torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=0)
        if mask is bool_mask:
            assert (out[0, :, 2] == 0).all() and (lse[0, :, 2] == -math.inf).all()


def test_an_additive_mask_moves_the_weights_at_a_moderate_large_scale():
    # at scale 2000 a mask of a few units still matters: the exact path adds mask / scale
    q, k, v = qkv(1, 2, 4, 8, nk=6, dtype=torch.float64)
    mask = torch.randn(4, 6, dtype=torch.float64) * 3000
    got = sa.sageattn(q, k, v, sm_scale=2000.0, attn_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=2000.0)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_gradients_through_the_exact_path_match_sdpas_where_sdpa_is_finite():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 5, 8, nk=5, dtype=torch.float64))
    out, lse = sa.sageattn(q, k, v, sm_scale=3000.0, is_causal=True, return_lse=True)
    (out.sum() + lse.sum()).backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q2, k2, v2, scale=3000.0, is_causal=True)
    x = (q2 @ k2.transpose(-1, -2) * 3000.0).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
    (want.sum() + torch.logsumexp(x, -1).sum()).backward()
    torch.testing.assert_close(out, want)
    for got_t, want_t in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(got_t.grad, want_t.grad, atol=1e-8, rtol=1e-8)


def test_a_huge_scales_gradient_is_finite():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 5, 8))
    sa.sageattn(q, k, v, sm_scale=1e300).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_varlen_at_a_huge_scale_is_finite_and_right():
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(9, 4, 16, generator=g), torch.randn(7, 2, 16, generator=g), torch.randn(7, 2, 16, generator=g)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 5, 4, is_causal=True, sm_scale=1e300)
    assert torch.isfinite(out).all()
    for (q0, q1), (k0, k1) in (((0, 4), (0, 3)), ((4, 9), (3, 7))):
        want, _ = exact_attention(*(t[a:b].transpose(0, 1)[None] for t, a, b in
                                    ((q, q0, q1), (k, k0, k1), (v, k0, k1))), 1e300, is_causal=True)
        torch.testing.assert_close(out[q0:q1].double(), want[0].transpose(0, 1), atol=1e-6, rtol=0)


def test_the_drop_in_is_right_where_torch_returns_nan():
    q, k, v = qkv(2, 4, 5, 16)
    assert torch.isnan(F.scaled_dot_product_attention(q, k, v, scale=1e300)).any()   # torch's
    want, _ = exact_attention(q, k, v, 1e300)
    torch.testing.assert_close(sa.scaled_dot_product_attention(q, k, v, scale=1e300).double(), want,
                               atol=1e-6, rtol=0)
    # calls torch handles itself (3-D, a mask broadcast over batch) are right too
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(5)) > 0.3
    want, _ = exact_attention(q, k, v, 1e300, mask=mask)
    got = sa.scaled_dot_product_attention(q[0], k[0], v[0], mask, scale=1e300)
    torch.testing.assert_close(got.double(), want[0], atol=1e-6, rtol=0)


def test_the_drop_in_keeps_torchs_errors_at_a_huge_scale():
    q, k, v = qkv(1, 2, 5, 16)
    with pytest.raises(RuntimeError, match="same dtype"):
        sa.scaled_dot_product_attention(q[0], k[0].double(), v[0], scale=1e300)
    with pytest.raises(RuntimeError, match="is_causal"):
        sa.scaled_dot_product_attention(q[0], k[0], v[0], torch.ones(5, 7, dtype=torch.bool), is_causal=True,
                                        scale=1e300)


def test_scales_up_to_the_limit_take_torchs_sdpa_unchanged(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("the exact softmax ran for an ordinary scale")

    monkeypatch.setattr(core, "_exact_softmax_attention", refused)
    q, k, v = qkv(1, 2, 5, 16)
    for scale in (None, 0.125, -3.0, core.EXACT_SOFTMAX_SCALE):
        sa.sageattn(q, k, v, sm_scale=scale, return_lse=True)
        sa.scaled_dot_product_attention(q[0], k[0], v[0], scale=scale)
    with pytest.raises(AssertionError, match="exact softmax"):
        sa.sageattn(q, k, v, sm_scale=core.EXACT_SOFTMAX_SCALE * 2)
