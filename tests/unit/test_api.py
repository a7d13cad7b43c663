"""The public API: signatures, the exact SDPA fallback, empty and strided inputs, and how the
quantized backends are called (through stand-in modules, since this machine has no GPU)."""

import dataclasses
import inspect
import logging
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention import backends, core, dispatch
from sageattention.dispatch import BackendChoice
from sageattention.reference import sageattn_reference

# The SageAttention 2.2 API, verbatim from the issue: (name, default) in order; "*" marks **kwargs.
EXPECTED_SIGNATURES = {
    "sageattn": [("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
                 ("sm_scale", None), ("return_lse", False), ("**kwargs", None)],
    "sageattn_varlen": [("q", None), ("k", None), ("v", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
                        ("max_seqlen_q", None), ("max_seqlen_k", None), ("is_causal", False),
                        ("sm_scale", None), ("smooth_k", True), ("**kwargs", None)],
    "sageattn_qk_int8_pv_fp16_triton": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("quantization_backend", "triton"),
        ("is_causal", False), ("attn_mask", None), ("sm_scale", None), ("smooth_k", True),
        ("return_lse", False), ("**kwargs", None)],
    "sageattn_qk_int8_pv_fp16_cuda": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
        ("qk_quant_gran", "per_thread"), ("sm_scale", None), ("pv_accum_dtype", "fp32"), ("smooth_k", True),
        ("smooth_v", False), ("return_lse", False), ("**kwargs", None)],
    "sageattn_qk_int8_pv_fp8_cuda": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
        ("qk_quant_gran", "per_thread"), ("sm_scale", None), ("pv_accum_dtype", "fp32+fp16"),
        ("smooth_k", True), ("smooth_v", False), ("return_lse", False), ("**kwargs", None)],
    "sageattn_qk_int8_pv_fp8_cuda_sm90": [
        ("q", None), ("k", None), ("v", None), ("tensor_layout", "HND"), ("is_causal", False),
        ("qk_quant_gran", "per_thread"), ("sm_scale", None), ("pv_accum_dtype", "fp32+fp32"),
        ("smooth_k", True), ("return_lse", False), ("**kwargs", None)],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_SIGNATURES))
def test_signature_matches_sageattention_2_2(name):
    params = list(inspect.signature(getattr(sa, name)).parameters.values())
    got = []
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            got.append(("**" + p.name, None))
        else:
            assert p.kind is p.POSITIONAL_OR_KEYWORD, p
            got.append((p.name, None if p.default is p.empty else p.default))
    assert got == EXPECTED_SIGNATURES[name]
    for p in params:  # required parameters really have no default
        if p.name in ("q", "k", "v") or p.name.startswith(("cu_seqlens", "max_seqlen")):
            assert p.default is p.empty


def test_import_exposes_version_and_api():
    assert sa.__version__.startswith("2.2.0")
    for name in ("sageattn", "select_backend", "explain", "force_backend", "last_backend", "patch_sdpa",
                 "scaled_dot_product_attention"):
        assert callable(getattr(sa, name))


def qkv(b=2, hq=4, hkv=2, nq=24, nk=40, d=64, dtype=torch.float16, layout="HND"):
    def shape(h, n):
        return (b, h, n, d) if layout == "HND" else (b, n, h, d)
    return (torch.randn(shape(hq, nq), dtype=dtype), torch.randn(shape(hkv, nk), dtype=dtype),
            torch.randn(shape(hkv, nk), dtype=dtype))


def sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **kw)


# --- the SDPA fallback is SDPA -----------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(24, 40), (40, 24)])
def test_cpu_fallback_is_exactly_sdpa(causal, nq, nk):
    q, k, v = qkv(nq=nq, nk=nk)
    assert torch.equal(sa.sageattn(q, k, v, is_causal=causal), sdpa(q, k, v, is_causal=causal))
    assert sa.last_backend() == "sdpa"


@pytest.mark.parametrize("causal", [False, True])
def test_gqa_fallback_past_the_grid_limit_expands_kv(causal, monkeypatch):
    # Past the limit, the fallback gives each query head its kv head's copy instead of enable_gqa
    # (wrong on CUDA there); the limit is made small here so that the path runs on CPU.
    q, k, v = qkv(hq=8, hkv=2)
    monkeypatch.setattr(core, "MAX_GRID_YZ", 4)
    out, lse = sa.sageattn(q, k, v, is_causal=causal, return_lse=True)
    torch.testing.assert_close(out, sdpa(q, k, v, is_causal=causal), rtol=0, atol=1e-3)
    monkeypatch.undo()
    assert torch.equal(lse, sa.sageattn(q, k, v, is_causal=causal, return_lse=True)[1])


def test_nhd_fallback_is_exactly_sdpa():
    q, k, v = qkv(layout="NHD")
    out = sa.sageattn(q, k, v, tensor_layout="NHD", sm_scale=0.3)
    ref = sdpa(*(t.transpose(1, 2) for t in (q, k, v)), scale=0.3).transpose(1, 2)
    assert out.shape == q.shape and torch.equal(out, ref)


def test_masks_are_honoured():
    q, k, v = qkv()
    bool_mask = torch.rand(2, 1, 24, 40) > 0.3
    bool_mask[..., 0] = True
    assert torch.equal(sa.sageattn(q, k, v, attn_mask=bool_mask), sdpa(q, k, v, attn_mask=bool_mask))
    add16 = torch.randn(24, 40, dtype=torch.float16)
    assert torch.equal(sa.sageattn(q, k, v, attn_mask=add16), sdpa(q, k, v, attn_mask=add16))
    # fp32 additive mask with fp16 inputs: SDPA run in fp32 (CUDA SDPA gave NaN for the raw pairing).
    add32 = torch.randn(1, 4, 24, 40) * 3
    out = sa.sageattn(q, k, v, attn_mask=add32)
    assert out.dtype == torch.float16
    assert torch.equal(out, sdpa(q.float(), k.float(), v.float(), attn_mask=add32).half())
    ref = sdpa(q.double(), k.double(), v.double(), attn_mask=add32.double())
    assert (out.double() - ref).abs().max() < 2e-3
    # The mask really changes the result (it is not dropped).
    assert not torch.allclose(out, sa.sageattn(q, k, v))


@pytest.mark.parametrize("shape", [(40,), (), (1, 40)])
def test_masks_of_fewer_than_two_dims_broadcast(shape):
    # A [kv_len] or scalar mask broadcasts (the Triton kernels take it); the SDPA fallback raised
    # torch's IndexError ("Dimension out of range") for it.
    q, k, v = qkv()
    keep = torch.rand(shape) > 0.3 if shape else torch.tensor(True)
    bias = torch.randn(shape, dtype=torch.float16)
    for mask in (keep, bias):
        full = mask.expand(24, 40)
        out, lse = sa.sageattn(q, k, v, attn_mask=mask, return_lse=True)
        ref, ref_lse = sa.sageattn(q, k, v, attn_mask=full, return_lse=True)
        assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_float32_additive_mask_keeps_float64_precision():
    # float64 inputs with an fp32 additive mask ran SDPA in fp32 (error about 1e-7, float32's).
    q, k, v = (t.double() for t in qkv(hkv=4))
    add32 = torch.randn(1, 4, 24, 40) * 3
    ref = sdpa(q, k, v, attn_mask=add32.double())
    out, lse = sa.sageattn(q, k, v, attn_mask=add32, return_lse=True)
    assert out.dtype == torch.float64 and (out - ref).abs().max() < 1e-12
    assert torch.allclose(lse, torch.logsumexp(q @ k.transpose(-1, -2) / 8 + add32.double(), -1).float())
    assert torch.equal(sa.scaled_dot_product_attention(q, k, v, add32), ref)


def test_sdpa_keywords_are_honoured():
    q, k, v = qkv()
    assert torch.equal(sa.sageattn(q, k, v, scale=0.25), sdpa(q, k, v, scale=0.25))
    assert torch.equal(sa.sageattn(q, k, v, scale=0.25, sm_scale=0.25), sdpa(q, k, v, scale=0.25))
    torch.manual_seed(1)
    a = sa.sageattn(q.float(), k.float(), v.float(), dropout_p=0.5)
    torch.manual_seed(1)
    b = sdpa(q.float(), k.float(), v.float(), dropout_p=0.5)
    assert torch.equal(a, b) and not torch.allclose(a, sa.sageattn(q.float(), k.float(), v.float()))
    assert sa.sageattn(q, k, v, enable_gqa=True).shape == q.shape


def test_fp32_fp64_and_grad_fall_back_with_gradients():
    q, k, v = (t.float().requires_grad_() for t in qkv())
    out = sa.sageattn(q, k, v, is_causal=True)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    q64, k64, v64 = (t.double() for t in qkv())
    assert sa.sageattn(q64, k64, v64).dtype == torch.float64


def _attention64(q, k, v, causal, scale, mask=None):
    """Float64 attention and its LSE, top-left causal as SDPA, a bool mask, GQA by repeating K/V."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(rep, 1) for t in (k, v))
    s = (q.double() @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return s.softmax(-1) @ v, s.logsumexp(-1)


@pytest.mark.parametrize("one_row_blocks", [False, True])
@pytest.mark.parametrize("causal,mask_shape", [(False, None), (True, None), (False, (40, 24)),
                                               (False, (2, 4, 40, 24))])
def test_fallback_lse_is_natural_log(causal, mask_shape, one_row_blocks, monkeypatch):
    # 4 query heads on 2 kv heads; one_row_blocks: a score budget of one query row per block
    # (b * hq * nk), whose blocks must join up
    if one_row_blocks:
        monkeypatch.setattr(core, "LSE_SCORE_BUDGET", 2 * 4 * 24)
    q, k, v = qkv(nq=40, nk=24)
    mask = (torch.rand(mask_shape) > 0.5) if mask_shape else None
    if mask is not None:
        mask[..., 0] = True
    out, lse = sa.sageattn(q, k, v, is_causal=causal, return_lse=True, attn_mask=mask)
    assert lse.shape == (2, 4, 40) and lse.dtype == torch.float32
    _, ref_lse = _attention64(q, k, v, causal, 64 ** -0.5, mask)
    assert (lse.double() - ref_lse).abs().max() < 1e-4


@pytest.mark.parametrize("causal,masked", [(False, False), (True, False), (False, True)])
def test_fallback_lse_under_autocast_is_float32_arithmetic(causal, masked):
    # A bf16 model under torch.autocast asking for the LSE: the LSE's own fp32 products were
    # downcast by autocast (a bfloat16 LSE, off by ~1e-2, where it is float32 and exact)
    q, k, v = qkv(nq=40, nk=24, dtype=torch.bfloat16)
    mask = torch.randn(40, 24) if masked else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, lse = sa.sageattn(q, k, v, is_causal=causal, return_lse=True, attn_mask=mask)
    assert lse.dtype == torch.float32
    _, ref_lse = _attention64(q, k, v, causal, 64 ** -0.5, None)
    if masked:
        s = q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) * 64 ** -0.5
        ref_lse = (s + mask.double()).logsumexp(-1)
    assert (lse.double() - ref_lse).abs().max() < 1e-4


@pytest.mark.parametrize("scale", [0.0, -0.125, -2.0])
@pytest.mark.parametrize("causal", [False, True])
def test_zero_and_negative_scales_are_attention_with_that_scale(causal, scale):
    # torch's SDPA with is_causal and such a scale returned NaN on the CPU; the fallback gives it the
    # same attention with a positive scale
    q, k, v = qkv(nq=40, nk=24)
    out, lse = sa.sageattn(q, k, v, is_causal=causal, sm_scale=scale, return_lse=True)
    ref, ref_lse = _attention64(q, k, v, causal, scale)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert (out.double() - ref).abs().max() < 2e-2 and (lse.double() - ref_lse).abs().max() < 1e-3
    cu = torch.tensor([0, 40], dtype=torch.int32)
    packed = sa.sageattn_varlen(q[0].transpose(0, 1).contiguous(), k[0].transpose(0, 1).contiguous(),
                                v[0].transpose(0, 1).contiguous(), cu, torch.tensor([0, 24], dtype=torch.int32),
                                40, 24, is_causal=causal, sm_scale=scale)
    assert torch.isfinite(packed).all() and (packed.double() - ref[0].transpose(0, 1)).abs().max() < 2e-2


def test_non_contiguous_inputs_give_correct_results():
    q, k, v = qkv()
    qs, ks, vs = (t.transpose(2, 3).contiguous().transpose(2, 3) for t in (q, k, v))
    assert not qs.is_contiguous()
    # SDPA's CPU kernels may round strided inputs differently, so compare at fp16 precision.
    ref = sdpa(q.double(), k.double(), v.double())
    assert (sa.sageattn(qs, ks, vs).double() - ref).abs().max() < 2e-3
    big = torch.randn(2, 4, 24, 128, dtype=torch.float16)
    sliced = big[..., ::2]  # stride 2 in the head dim
    ref = sdpa(*(sliced.double() for _ in range(3)))
    assert (sa.sageattn(sliced, sliced, sliced).double() - ref).abs().max() < 2e-3


@pytest.mark.parametrize("shape_kw", [{"b": 0}, {"nq": 0}, {"nk": 0}, {"hq": 0, "hkv": 0}])
def test_empty_inputs_return_empty_results(shape_kw):
    q, k, v = qkv(**shape_kw)
    out, lse = sa.sageattn(q, k, v, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and not out.any()
    assert lse.shape == (q.shape[0], q.shape[1], q.shape[2])
    assert sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v).shape == q.shape


@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_zero_lse_is_over_scores_of_zero(causal):
    # Every score is an empty dot product, 0: the LSE is log(keys seen), plus a mask's terms; it
    # was -inf everywhere, the LSE of a row with no keys.
    q, k, v = qkv(nq=6, nk=5, d=0, layout="NHD")
    mask = None if causal else torch.randn(6, 5)
    out, lse = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=causal, attn_mask=mask, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 6)
    s = torch.zeros(6, 5)
    if causal:
        s = s.masked_fill(torch.ones(6, 5, dtype=torch.bool).triu(1), -math.inf)
    want = torch.logsumexp(s if mask is None else s + mask, -1)
    torch.testing.assert_close(lse, want.expand(2, 4, 6))


def test_kernel_functions_on_cpu_fall_back_with_a_logged_reason(caplog, monkeypatch):
    monkeypatch.setattr(dispatch, "_logged", set())
    q, k, v = qkv()
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        for fn in (sa.sageattn_qk_int8_pv_fp16_cuda, sa.sageattn_qk_int8_pv_fp8_cuda,
                   sa.sageattn_qk_int8_pv_fp8_cuda_sm90, sa.sageattn_qk_int8_pv_fp16_triton):
            assert torch.equal(fn(q, k, v, is_causal=True), sdpa(q, k, v, is_causal=True))
            assert sa.last_backend() == "sdpa"
    assert any("on cpu" in r.getMessage() for r in caplog.records)
    mask = torch.ones(24, 40, dtype=torch.bool).tril()
    assert torch.equal(sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, attn_mask=mask), sdpa(q, k, v, attn_mask=mask))


def test_unknown_keyword_warns_once_by_name(monkeypatch):
    monkeypatch.setattr(sa.inputs, "_warned_kwargs", set())
    q, k, v = qkv()
    with pytest.warns(UserWarning, match="'tile_size'") as record:
        sa.sageattn(q, k, v, tile_size=4)
    assert record[0].filename == __file__  # the caller's line, not sageattention's
    with pytest.warns(UserWarning, match="'block'") as record:
        sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, block=4)
    assert record[0].filename == __file__
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sa.sageattn(q, k, v, tile_size=4)


@pytest.mark.parametrize("shape_kw", [{"b": 0}, {"nq": 0}, {"nk": 0}, {"hq": 0, "hkv": 0}, {"d": 0}])
def test_empty_inputs_that_require_grad_are_recorded_by_autograd(shape_kw):
    # SDPA's output is recorded here too; ours was a constant: backward() raised "element 0 of
    # tensors does not require grad" and q.grad stayed None (so did a learned mask's).
    q, k, v = qkv(dtype=torch.float32, **shape_kw)
    q[..., :1] = math.inf   # no NaN leaks in through the zero gradient's bookkeeping
    bias = torch.zeros(q.shape[2], k.shape[2], requires_grad=True)
    for t in (q, k, v):
        t.requires_grad_()
    out, lse = sa.sageattn(q, k, v, attn_mask=bias, return_lse=True)
    assert out.requires_grad and lse.requires_grad and not out.any() and not out.isnan().any()
    out.sum().backward()
    for t in (q, k, v, bias):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()
    with torch.no_grad():
        assert not sa.sageattn(q, k, v).requires_grad


@pytest.mark.parametrize("lens_q, lens_k", [((), ()), ((3, 5), (0, 0))])
def test_varlen_without_keys_or_queries_is_recorded_by_autograd(lens_q, lens_k):
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k)
    q, k, v = (t.float().requires_grad_() for t in (q, k, v))
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q, default=0), 0)
    assert out.shape == q.shape and not out.any()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()


@pytest.mark.parametrize("hq, hkv, d", [(0, 0, 64), (0, 2, 64), (4, 2, 0)])
def test_varlen_without_heads_or_head_dim_is_empty_as_dense(monkeypatch, hq, hkv, d):
    # sageattn returns the empty result for these; varlen said "query heads (0) must be a multiple of
    # key/value heads (0)" for the first, and handed the second to the Triton kernel (a launch grid
    # of 0 heads) where the dispatcher picked it
    import sageattention.triton as st
    cu_q, cu_k = torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k = torch.randn(10, hq, d, requires_grad=True), torch.randn(12, hkv, d, requires_grad=True)
    dense = sa.sageattn(q[None].transpose(1, 2), k[None].transpose(1, 2), k[None].transpose(1, 2))
    assert dense.shape == (1, hq, 10, d)
    monkeypatch.setattr(dispatch, "choose", lambda *a, **kw: BackendChoice("triton-fp16", "test", False))
    monkeypatch.setattr(st, "varlen_attention", lambda *a, **kw: pytest.fail("the kernel was reached"))
    out = sa.sageattn_varlen(q, k, k, cu_q, cu_k, 7, 7)
    assert out.shape == q.shape and not out.any() and sa.last_backend() is None
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape



def test_varlen_empty_call_with_a_forced_backend_is_empty_as_dense():
    # An empty call runs no backend, so forcing one that cannot run here (the Triton kernel on the
    # CPU) does not matter: dense sageattn returned the empty result, varlen raised
    # BackendUnavailableError because it chose the backend first.
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    q = torch.randn(10, 0, 64)
    with sa.force_backend("triton-fp16"):
        dense = sa.sageattn(q[None].transpose(1, 2), q[None].transpose(1, 2), q[None].transpose(1, 2))
        out = sa.sageattn_varlen(q, q, q, cu, cu, 7, 7)
    assert dense.shape == (1, 0, 10, 64) and out.shape == q.shape and sa.last_backend() is None
# --- varlen ---------------------------------------------------------------------------------

def packed(lens_q, lens_k, hq=4, hkv=2, d=64):
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.float16)
    k = torch.randn(sum(lens_k), hkv, d, dtype=torch.float16)
    v = torch.randn(sum(lens_k), hkv, d, dtype=torch.float16)
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) for lens in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1]


def test_varlen_honours_dropout_and_refuses_a_mask(monkeypatch):
    # Both were ignored with one UserWarning per process (later calls: silently), giving an
    # output without dropout or without the mask.
    monkeypatch.setattr(sa.inputs, "_warned_kwargs", set())
    lens = (5, 0, 17, 9)
    q, k, v, cu_q, cu_k = packed(lens, lens)
    q, k, v = q.float(), k.float(), v.float()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.manual_seed(3)
        out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 17, is_causal=True, dropout_p=0.5)
        assert torch.equal(sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 17, dropout_p=0.0),
                           sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 17))
    torch.manual_seed(3)
    pieces = [sdpa(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), dropout_p=0.5, is_causal=True)[0]
              .transpose(0, 1) for a, b in zip(cu_q.tolist(), cu_q.tolist()[1:]) if b > a]
    assert torch.equal(out, torch.cat(pieces))
    with pytest.raises(ValueError, match="dropout_p must be in"):
        sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 17, dropout_p=1.5)
    with pytest.raises(ValueError, match="takes no attn_mask"):
        sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 17, attn_mask=torch.ones(31, 31, dtype=torch.bool))


def test_varlen_refuses_return_lse(monkeypatch):
    # return_lse=True was ignored with one UserWarning per process (later calls: silently): the
    # call returned the output alone where the caller unpacks (out, lse)
    monkeypatch.setattr(sa.inputs, "_warned_kwargs", set())
    q, k, v, cu_q, cu_k = packed((5, 9), (7, 3))
    with pytest.raises(ValueError, match=r"sageattn_varlen\(\) returns no LSE \(return_lse=True\)"):
        sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, return_lse=True)
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, return_lse="yes")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # return_lse=False is what the call does: no warning
        assert torch.equal(sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, return_lse=False),
                           sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7))


def test_varlen_takes_enable_gqa_as_the_dense_functions(monkeypatch):
    # SDPA's enable_gqa was "ignored" with one UserWarning per process (later calls: silently):
    # enable_gqa=False with fewer key/value heads than query heads ran GQA, where sageattn, its
    # kernel functions and SDPA refuse it; enable_gqa=True warned that GQA was ignored while it ran
    monkeypatch.setattr(sa.inputs, "_warned_kwargs", set())
    q, k, v, cu_q, cu_k = packed((5, 9), (7, 3), hq=4, hkv=2)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"enable_gqa=False but query heads \(4\) != key/value heads \(2\)"):
            sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, enable_gqa=False)
        with pytest.raises(TypeError, match="enable_gqa must be a bool"):
            sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, enable_gqa="yes")
        plain = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7)
        assert torch.equal(sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, enable_gqa=True), plain)
        assert torch.equal(sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, enable_gqa=None), plain)
        q1, k1, v1, cu_q1, cu_k1 = packed((5, 9), (7, 3), hq=2, hkv=2)
        assert torch.equal(sa.sageattn_varlen(q1, k1, v1, cu_q1, cu_k1, 9, 7, enable_gqa=False),
                           sa.sageattn_varlen(q1, k1, v1, cu_q1, cu_k1, 9, 7))


@pytest.mark.parametrize("lens_q, lens_k", [((5, 0, 9), (7, 3, 0)), ((5, 9), (7, 3))])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_varlen_fallback_under_autocast_keeps_q_dtype_as_dense(dtype, lens_q, lens_k):
    # Under torch.autocast the per-sequence SDPA returned the autocast dtype (bfloat16 for float16
    # or float32 inputs), where dense sageattn and the Triton varlen kernel return q's dtype; with a
    # sequence without keys (its zeros in q's dtype) float16 inputs raised from deep in torch.cat
    # ("Unexpected floating ScalarType in at::autocast::prioritize").
    q, k, v, cu_q, cu_k = (t.to(dtype) if t.is_floating_point() else t for t in packed(lens_q, lens_k))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7)
        dense = sa.sageattn(q[:5].transpose(0, 1)[None], k[:7].transpose(0, 1)[None], v[:7].transpose(0, 1)[None])
    assert dense.dtype == dtype and out.dtype == dtype and out.shape == q.shape and out.is_contiguous()
    assert torch.equal(out[:5], dense[0].transpose(0, 1))
    if len(lens_q) == 3:
        assert not out[5:].any()   # the queries of sequence 3 have no keys


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_fallback_is_sdpa_per_sequence(causal):
    lens_q, lens_k = (5, 0, 17, 9), (7, 3, 12, 0)
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 17, 12, is_causal=causal, sm_scale=0.2)
    assert out.shape == q.shape and sa.last_backend() == "sdpa"
    for i in range(4):
        a, b, c, d = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if b == a:
            continue
        if d == c:
            assert not out[a:b].any()
            continue
        ref = sdpa(q[a:b].transpose(0, 1)[None], k[c:d].transpose(0, 1)[None], v[c:d].transpose(0, 1)[None],
                   is_causal=causal, scale=0.2)[0].transpose(0, 1)
        assert torch.equal(out[a:b], ref)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gqa_fallback_past_the_grid_limit_expands_kv(causal, monkeypatch):
    # As dense sageattn's fallback: past the limit each query head gets its kv head's copy. The
    # per-sequence SDPA passed enable_gqa=True there, which gave cosine 0 on CUDA (65536+ query heads
    # per kv head: benchmarks/results/h200-2026-12-03-sdpa-gqa.txt). The limit is made small so the
    # path runs on CPU, where a stand-in SDPA refuses enable_gqa past it as CUDA's got it wrong.
    q, k, v, cu_q, cu_k = packed((5, 0, 9), (7, 3, 4), hq=8, hkv=2)
    ref = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, is_causal=causal)
    monkeypatch.setattr(core, "MAX_GRID_YZ", 4)

    def sdpa_wrong_past_the_grid(q, k, v, **kw):
        assert not (kw.get("enable_gqa") and q.shape[1] > core.MAX_GRID_YZ), "enable_gqa past the grid"
        return F.scaled_dot_product_attention(q, k, v, **kw)

    monkeypatch.setattr(core, "_torch_sdpa", sdpa_wrong_past_the_grid)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, is_causal=causal)
    assert sa.last_backend() == "sdpa"
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-3)


def test_varlen_request_carries_sequence_count_and_heads(monkeypatch):
    # The sequence count and the query heads reach the dispatcher, which holds them to the Triton
    # kernel's launch grid (past it: SDPA per sequence).
    seen = []
    real_choose = dispatch.choose
    monkeypatch.setattr(dispatch, "choose", lambda req, *a, **kw: seen.append(req) or real_choose(req, *a, **kw))
    q, k, v, cu_q, cu_k = packed((3, 4, 5), (2, 2, 6), hq=6, hkv=3)
    sa.sageattn_varlen(q, k, v, cu_q, cu_k, 5, 6)
    assert (seen[-1].batch, seen[-1].q_heads) == (3, 6)
    past = dataclasses.replace(seen[-1], device_type="cuda", capability=(9, 0), batch=70000)
    inv = dispatch.Inventory(native={}, triton=(True, "ok"))
    choice = real_choose(past, inv, candidates=("triton-fp16",), allow_fallback=True)
    assert choice.fallback and "batch 70000 exceeds the launch grid limit" in choice.reason


def test_varlen_triton_path_gets_the_offsets_and_limits_it_checks(monkeypatch):
    # int64 cu_seqlens (on any device) and numpy max_seqlen pass validation; the Triton path
    # refused them with its own checks' TypeError (int32 only, Python ints only) on every GPU.
    np = pytest.importorskip("numpy")
    import sageattention.triton as st
    seen = {}

    def run_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        seen.update(cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k)
        return torch.zeros_like(q)

    stub = types.SimpleNamespace(run_varlen=run_varlen)   # the real argument checks, no kernel
    monkeypatch.setitem(sys.modules, "sageattention.triton.varlen", stub)
    monkeypatch.setattr(st, "varlen", stub, raising=False)
    monkeypatch.setattr(st, "_interpreting", lambda: True)   # let CPU tensors reach the checks
    monkeypatch.setattr(dispatch, "choose", lambda *a, **kw: BackendChoice("triton-fp16", "test", False))
    q, k, v, cu_q, cu_k = packed((3, 5), (4, 6))
    sa.sageattn_varlen(q, k, v, cu_q.long(), cu_k.long(), np.int64(5), np.int32(6))
    assert seen["cu_q"].dtype == seen["cu_k"].dtype == torch.int32
    assert seen["cu_q"].tolist() == cu_q.tolist() and seen["cu_k"].tolist() == cu_k.tolist()
    assert (seen["max_q"], seen["max_k"]) == (5, 6)
    assert sa.last_backend() == "triton-fp16"
    # A strided view of int32 offsets (a column of a table) passes every check, which read it with
    # its strides; the kernels read it as contiguous (under the interpreter: a double free).
    cu_q2, cu_k2 = (torch.stack([cu, cu + 100], 1)[:, 0] for cu in (cu_q, cu_k))
    assert not cu_q2.is_contiguous()
    sa.sageattn_varlen(q, k, v, cu_q2, cu_k2, 5, 6)
    assert seen["cu_q"].is_contiguous() and seen["cu_k"].is_contiguous()
    assert seen["cu_q"].tolist() == cu_q.tolist() and seen["cu_k"].tolist() == cu_k.tolist()


# --- the quantized paths, through stand-in modules ------------------------------------------

@pytest.fixture
def fake_kernels(monkeypatch):
    """Stand-ins for sageattention.native / .triton / .guard that record their calls and compute the
    reference, plus a dispatcher that returns the choice the test sets."""
    backends.capability_table()   # read the real families' facts before the stand-ins replace them
    calls = []

    def native_op(pv_dtype):
        def op(q, k, v, *, family, tensor_layout, is_causal, sm_scale, qk_quant_gran, pv_accum_dtype,
               smooth_k, smooth_v, return_lse):
            calls.append(dict(op=pv_dtype, family=family, layout=tensor_layout, causal=is_causal,
                              scale=sm_scale, gran=qk_quant_gran, accum=pv_accum_dtype, smooth_k=smooth_k,
                              smooth_v=smooth_v, lse=return_lse, unit_stride=q.stride(-1) == 1,
                              ptr=q.data_ptr()))
            out, lse = sageattn_reference(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal,
                                          sm_scale=sm_scale, qk_quant_gran=qk_quant_gran, pv_dtype=pv_dtype,
                                          pv_accum_dtype=pv_accum_dtype, smooth_k=smooth_k,
                                          smooth_v=smooth_v, return_lse=True)
            return out, (lse if return_lse else None)
        return op

    native = types.SimpleNamespace(qk_int8_pv_fp16=native_op("fp16"), qk_int8_pv_fp8=native_op("fp8"))

    def triton_attention(q, k, v, *, tensor_layout, is_causal, attn_mask, sm_scale, smooth_k, return_lse,
                         pv_dtype):
        calls.append(dict(op="triton", mask=attn_mask, layout=tensor_layout, scale=sm_scale,
                          pv_dtype=pv_dtype))
        return torch.zeros_like(q), None

    triton = types.SimpleNamespace(attention=triton_attention)
    guard = types.SimpleNamespace(check_device=lambda device: calls.append(dict(op="guard", device=device)))
    for name, module in (("native", native), ("triton", triton), ("guard", guard)):
        monkeypatch.setitem(sys.modules, f"sageattention.{name}", module)
        monkeypatch.setattr(sa, name, module, raising=False)
    monkeypatch.setattr(core, "_checked_devices", set())
    state = {}
    monkeypatch.setattr(dispatch, "choose_for_call", lambda call, **kw: state["choice"])
    return calls, state


def test_native_call_receives_resolved_arguments(fake_kernels):
    calls, state = fake_kernels
    state["choice"] = BackendChoice("cuda-sm80-fp16", "test", False, "per_warp", "fp16+fp32")
    q, k, v = qkv(layout="NHD")
    q = q.transpose(2, 3).contiguous().transpose(2, 3)  # head-dim stride != 1: must be copied
    out, lse = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=True, scale=0.1, smooth_v=True,
                           return_lse=True)
    assert calls[0] == dict(op="guard", device=torch.device("cpu"))
    assert calls[1] == dict(op="fp16", family="sm80", layout="NHD", causal=True, scale=0.1, gran="per_warp",
                            accum="fp16+fp32", smooth_k=True, smooth_v=True, lse=True, unit_stride=True,
                            ptr=calls[1]["ptr"])
    assert calls[1]["ptr"] != q.data_ptr()  # copied once to a unit-stride head dim
    assert out.shape == q.shape and lse.shape == (2, 4, 24)
    assert sa.last_backend() == "cuda-sm80-fp16"
    sa.sageattn(q, k, v, tensor_layout="NHD")
    assert [c["op"] for c in calls].count("guard") == 1  # the guard runs once per device


def test_views_with_unit_head_dim_stride_are_not_copied(fake_kernels):
    calls, state = fake_kernels
    state["choice"] = BackendChoice("cuda-sm80-fp16", "test", False, "per_thread", "fp32")
    q, k, v = qkv()
    qn, kn, vn = (t.transpose(1, 2) for t in (q, k, v))  # NHD views of HND memory
    sa.sageattn(qn, kn, vn, tensor_layout="NHD")
    assert calls[-1]["ptr"] == q.data_ptr() and calls[-1]["layout"] == "NHD"


def test_fp8_function_passes_its_accumulator(fake_kernels):
    calls, state = fake_kernels
    state["choice"] = BackendChoice("cuda-sm89-fp8", "test", False, "per_thread", "fp32+fp16")
    q, k, v = qkv()
    sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, smooth_v=True)
    assert calls[-1]["op"] == "fp8" and calls[-1]["family"] == "sm89" and calls[-1]["smooth_v"]
    assert calls[-1]["accum"] == "fp32+fp16" and calls[-1]["gran"] == "per_thread"
    assert sa.last_backend() == "cuda-sm89-fp8"


def test_sm90_entry_point_runs_the_sm90_fp8_family_it_was_given(fake_kernels):
    calls, state = fake_kernels
    state["choice"] = BackendChoice("cuda-sm90-fp8", "test", False, "per_warp", "fp32")
    q, k, v = qkv()
    sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, qk_quant_gran="per_warp", pv_accum_dtype="fp32")
    assert calls[-1]["op"] == "fp8" and calls[-1]["family"] == "sm90_fp8"
    assert (calls[-1]["accum"], calls[-1]["gran"], calls[-1]["smooth_v"]) == ("fp32", "per_warp", False)
    assert sa.last_backend() == "cuda-sm90-fp8"


def test_sm90_entry_point_takes_no_smooth_v_and_says_so(fake_kernels, monkeypatch):
    # upstream's sm90 function has no smooth_v (docs/api.md): V is not smoothed, and the keyword is
    # reported as ignored rather than dropped silently
    calls, state = fake_kernels
    monkeypatch.setattr(sa.inputs, "_warned_kwargs", set())
    state["choice"] = BackendChoice("cuda-sm90-fp8", "test", False, "per_thread", "fp32+fp32")
    q, k, v = qkv()
    with pytest.warns(UserWarning, match="sageattn_qk_int8_pv_fp8_cuda_sm90.*'smooth_v'"):
        sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, smooth_v=True)
    assert calls[-1]["op"] == "fp8" and calls[-1]["smooth_v"] is False


def test_triton_call_receives_the_mask(fake_kernels):
    calls, state = fake_kernels
    state["choice"] = BackendChoice("triton-fp16", "test", False, "per_block", "fp32")
    q, k, v = qkv()
    mask = torch.zeros(24, 40, dtype=torch.float32)
    sa.sageattn(q, k, v, attn_mask=mask)
    assert calls[-1]["op"] == "triton" and calls[-1]["mask"] is mask
    assert calls[-1]["pv_dtype"] == "fp16"
    assert sa.last_backend() == "triton-fp16"


def test_triton_fp8_choice_runs_the_fp8_kernel(fake_kernels):
    calls, state = fake_kernels
    state["choice"] = BackendChoice("triton-fp8", "test", False, "per_block", "fp32+fp32")
    q, k, v = qkv()
    sa.sageattn(q, k, v)
    assert calls[-1]["op"] == "triton" and calls[-1]["pv_dtype"] == "fp8"
    assert sa.last_backend() == "triton-fp8"


@pytest.mark.parametrize("scale", [0.0, -0.125])
@pytest.mark.parametrize("name", ["cuda-sm80-fp16", "triton-fp16"])
def test_quantized_backends_get_a_positive_scale_and_the_same_attention(fake_kernels, name, scale):
    # The kernels take sm_scale > 0 (Triton refuses others; a masked -inf times a scale <= 0 is
    # +inf or NaN): the call reaches them as -q with |scale|, or as a zero q with scale 1.
    calls, state = fake_kernels
    state["choice"] = BackendChoice(name, "test", False, "per_thread" if name.startswith("cuda") else "per_block",
                                    "fp32")
    q, k, v = qkv(nq=40, nk=24)
    result = sa.sageattn(q, k, v, is_causal=True, sm_scale=scale, return_lse=True)
    assert calls[-1]["scale"] == (abs(scale) or 1.0)
    if name == "cuda-sm80-fp16":   # the stand-in computes the reference from what it was given
        out, lse = result
        ref, ref_lse = _attention64(q, k, v, True, scale)
        o, r = out.double().flatten(), ref.flatten()
        assert F.cosine_similarity(o, r, dim=0) > 0.9998 and (o - r).abs().sum() / r.abs().sum() < 0.02
        assert (lse.double() - ref_lse).abs().max() < 0.1   # INT8 QK error, as the fuzz LSE bars


@pytest.mark.parametrize("name", ["cuda-sm80-fp16", "triton-fp16"])
def test_quantized_backends_run_outside_the_callers_autocast(fake_kernels, monkeypatch, name):
    # Under an enabled torch.autocast the ATen calls inside a custom op run cast down too: the native
    # ops' K-smoothing LSE term (an fp32 at::matmul, glue::add_smoothing_lse) came out in bfloat16.
    # The stand-in computes that term as the op does.
    calls, state = fake_kernels
    state["choice"] = BackendChoice(name, "test", False, "per_thread", "fp32")

    def op(q, k, v, **kw):
        km = k.float().mean(dim=2).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        lse = torch.matmul(q.float(), km.unsqueeze(-1)).squeeze(-1) * kw["sm_scale"]
        return torch.zeros_like(q), lse

    monkeypatch.setattr(sa.native, "qk_int8_pv_fp16", op)
    monkeypatch.setattr(sa.triton, "attention", lambda q, k, v, **kw: op(q, k, v, **kw))
    q, k, v = qkv(dtype=torch.bfloat16)
    k = k + 30   # an offset that smoothing takes out: a large correction term
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, lse = sa.sageattn(q, k, v, sm_scale=0.125, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert torch.equal(lse, op(q, k, v, sm_scale=0.125)[1])


@pytest.mark.parametrize("kind", ["bool", "additive", "additive-fp32"])
def test_sdpa_fallback_gives_zero_for_queries_with_every_key_masked(kind, monkeypatch):
    # torch's CUDA kernels have returned NaN for such rows; stand in for them on the CPU
    def nan_rows_sdpa(q, k, v, attn_mask=None, **kw):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)
        visible = attn_mask if attn_mask.dtype == torch.bool else attn_mask != -math.inf
        return out.masked_fill(~visible.any(-1, keepdim=True), math.nan)

    monkeypatch.setattr(core, "_torch_sdpa", nan_rows_sdpa)
    q, k, v = qkv(nq=6, nk=8, layout="NHD")
    keep = torch.rand(2, 1, 6, 8) > 0.3
    keep[..., 0] = True
    keep[1, :, 4] = False   # batch 1, query 4: no key
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    if kind == "additive":
        mask = mask.half()
    out = sa.sageattn(q, k, v, tensor_layout="NHD", attn_mask=mask)
    assert torch.isfinite(out).all() and not out[1, 4].any()
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)),
                                         attn_mask=keep, enable_gqa=True).transpose(1, 2)
    rows = keep.any(-1)[:, 0]   # [batch, query]
    torch.testing.assert_close(out[rows].float(), ref[rows], atol=2e-3, rtol=2e-3)


def test_numpy_bools_are_bools():
    np = pytest.importorskip("numpy")
    q, k, v = (torch.randn(1, 2, n, 16) for n in (5, 7, 7))
    out, lse = sa.sageattn(q, k, v, is_causal=np.bool_(True), return_lse=np.bool_(True), enable_gqa=np.bool_(False))
    want, want_lse = sa.sageattn(q, k, v, is_causal=True, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("name, op, accum, d, width", [
    ("cuda-sm80-fp16", "qk_int8_pv_fp16", "fp32", 96, 128),
    ("cuda-sm75-fp16", "qk_int8_pv_fp16", "fp32", 40, 64),
    ("cuda-sm89-fp8", "qk_int8_pv_fp8", "fp32+fp32", 80, 128),
    ("cuda-sm90-fp16", "qk_int8_pv_fp16", "fp32", 1, 64),
])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_a_head_dim_between_the_kernels_runs_zero_padded(fake_kernels, monkeypatch, name, op, accum, d, width,
                                                         layout):
    # upstream pads 1..127 to the next compiled head dim (64 or 128); these fell back to SDPA here
    calls, state = fake_kernels
    state["choice"] = BackendChoice(name, "test", False, "per_thread", accum)
    widths, inner = [], getattr(sa.native, op)

    def padded_op(q, k, v, **kw):
        widths.append((q.shape[-1], k.shape[-1], v.shape[-1]))
        assert all(t[..., d:].abs().max() == 0 for t in (q, k, v)) if width > d else True
        return inner(q, k, v, **kw)

    monkeypatch.setattr(sa.native, op, padded_op)
    q, k, v = qkv(d=d, layout=layout)
    k = k + 3   # an offset that smoothing takes out: the padded channels' mean must stay 0
    out, lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True, return_lse=True)
    assert widths == [(width, width, width)]
    assert calls[-1]["scale"] == d ** -0.5   # the call's own head dim, not the kernel's
    assert out.shape == q.shape and out.is_contiguous() and lse.shape == (2, 4, 24)
    want, want_lse = sageattn_reference(q, k, v, tensor_layout=layout, is_causal=True, sm_scale=d ** -0.5,
                                        qk_quant_gran="per_thread", pv_dtype=op.rsplit("_", 1)[1],
                                        pv_accum_dtype=accum, smooth_k=True, smooth_v=False, return_lse=True)
    torch.testing.assert_close(out.float(), want.float(), atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-5)
