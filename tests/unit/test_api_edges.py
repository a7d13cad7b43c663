"""Edge cases of the public API found by an adversarial pass: each test failed before its fix.

Arguments whose Python type torch.compile traces differently from eager code (numpy scalars,
0-d tensors, ints beyond float's range), a 0-d tensor where upstream's signature has a number,
torch.autocast around the SDPA fallback, and scales that float32 rounds to zero.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from exception_chain import chain_text

import sageattention as sa


def qkv(b=1, hq=4, hkv=2, nq=24, nk=40, d=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(11)
    return tuple(torch.randn(b, h, n, d, generator=g, dtype=dtype) for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))



@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# --- 1. a 0-d tensor as the Triton function's 7th positional argument -------------------------

@pytest.mark.parametrize("scale", [torch.tensor(0.1), torch.tensor(0.1, dtype=torch.float16), torch.tensor(2)])
def test_triton_function_refuses_a_0d_number_tensor_where_upstream_has_sm_scale(scale):
    # upstream: (q, k, v, tensor_layout, quantization_backend, is_causal, sm_scale, ...); here the
    # 7th is attn_mask, and a 0-d float was taken as an additive mask (a constant: no effect)
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"upstream SageAttention's 7th is sm_scale.*pass sm_scale=<that tensor>"):
        sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, "HND", "triton", False, scale)
    fn = torch.compile(lambda q, k, v: sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, "HND", "triton", False, scale),
                       fullgraph=True, backend="eager")
    with pytest.raises(Exception) as info:
        fn(q, k, v)
    assert "7th is sm_scale" in chain_text(info.value)


def test_triton_function_still_takes_masks_of_any_other_shape():
    q, k, v = qkv()
    for mask in (torch.tensor(True), torch.zeros(40), torch.zeros(24, 40, dtype=torch.bool)):
        out = sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, attn_mask=mask)
        assert out.shape == q.shape and torch.isfinite(out).all()


# --- 2. an int too large for a float as the scale under torch.compile --------------------------

@pytest.mark.parametrize("name", ["sageattn", "sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp16_cuda",
                                  "scaled_dot_product_attention"])
@pytest.mark.parametrize("huge", [10 ** 400, -10 ** 400, 2 ** 1024 - 2 ** 970])
def test_an_int_beyond_float_range_is_the_same_value_error_compiled(name, huge):
    # compiled, float() of it raised dynamo's InternalTorchDynamoError (OverflowError), not the
    # ValueError eager code raises
    q, k, v = qkv()
    fn = getattr(sa, name)
    key = "scale" if name == "scaled_dot_product_attention" else "sm_scale"
    with pytest.raises(ValueError, match="too large for a float"):
        fn(q, k, v, **{key: huge})
    with pytest.raises(Exception) as info:
        torch.compile(lambda q, k, v: fn(q, k, v, **{key: huge}), fullgraph=True, backend="eager")(q, k, v)
    assert "too large for a float" in chain_text(info.value) and "InternalTorchDynamo" not in chain_text(info.value)


def test_the_largest_int_a_float_takes_is_still_a_scale():
    from sageattention.inputs import check_scale
    assert check_scale("sm_scale", 2 ** 1024 - 2 ** 970 - 1) == float(2 ** 1024 - 2 ** 970 - 1)


# --- 3. numpy scalars and 0-d tensors as the scale under torch.compile(fullgraph=True) ----------

SCALES = [np.float32(0.1), np.float64(0.1), np.float16(0.25), np.int64(2), np.array(0.3),
          torch.tensor(0.1), torch.tensor(0.1, dtype=torch.float64)]


@pytest.mark.parametrize("scale", SCALES, ids=lambda s: f"{type(s).__name__}-{getattr(s, 'dtype', '')}")
@pytest.mark.parametrize("name", ["sageattn", "sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp16_cuda",
                                  "sageattn_qk_int8_pv_fp8_cuda_sm90", "scaled_dot_product_attention"])
def test_numpy_and_tensor_scales_trace_with_fullgraph_as_eager(name, scale):
    # dynamo traces a numpy scalar as a 0-d array: fullgraph failed ("got numpy.ndarray"), and a
    # 0-d tensor on a data-dependent guard; eager takes both
    q, k, v = qkv()
    fn = getattr(sa, name)
    kw = dict(scale=scale, enable_gqa=True) if name == "scaled_dot_product_attention" else dict(sm_scale=scale)
    want = fn(q, k, v, **kw)
    got = torch.compile(lambda q, k, v: fn(q, k, v, **kw), fullgraph=True, backend="eager")(q, k, v)
    assert torch.equal(got, want)
    kw[next(iter(kw))] = float(scale)
    assert torch.equal(want, fn(q, k, v, **kw))


def test_a_scale_passed_as_a_numpy_argument_is_read_each_call():
    q, k, v = qkv()
    fn = torch.compile(lambda q, k, v, s: sa.sageattn(q, k, v, scale=s), fullgraph=True, backend="eager")
    for s in (np.float32(0.1), np.float32(0.7), torch.tensor(-0.5)):
        assert torch.equal(fn(q, k, v, s), sa.sageattn(q, k, v, sm_scale=float(s)))


def test_varlen_takes_a_numpy_scale_under_fullgraph():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(60, 4, 32, generator=g) for _ in range(3))
    cu = torch.tensor([0, 17, 60], dtype=torch.int32)
    fn = lambda q, k, v: sa.sageattn_varlen(q, k, v, cu, cu, 43, 43, sm_scale=np.float32(0.2))  # noqa: E731
    assert torch.equal(torch.compile(fn, fullgraph=True, backend="eager")(q, k, v), fn(q, k, v))


@pytest.mark.parametrize("bad,match", [(np.bool_(True), "sm_scale must be a real number"),
                                       (torch.tensor([0.1, 0.2]), "0-d real tensor"),
                                       (torch.tensor(0.1, requires_grad=True), "requiring grad"),
                                       (np.float32("nan"), "must be finite")])
def test_bad_numpy_and_tensor_scales_are_the_eager_errors_compiled(bad, match):
    q, k, v = qkv()
    with pytest.raises((TypeError, ValueError), match=match):
        sa.sageattn(q, k, v, sm_scale=bad)
    with pytest.raises(Exception) as info:
        torch.compile(lambda q, k, v: sa.sageattn(q, k, v, sm_scale=bad), fullgraph=True, backend="eager")(q, k, v)
    assert match.split(" ")[-1] in chain_text(info.value)


# --- 4. torch.autocast around the SDPA fallback ---------------------------------------------------

@pytest.mark.parametrize("name", ["sageattn", "sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp16_cuda"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_the_fallback_ignores_the_callers_autocast_eager_and_compiled(name, return_lse):
    # eagerly, CPU autocast ran the fallback's SDPA in bfloat16 (error ~3e-3 for float32 inputs);
    # compiled, the op ran with autocast off (error ~3e-7): the same call, two precisions
    q, k, v = qkv()
    fn = lambda q, k, v: getattr(sa, name)(q, k, v, return_lse=return_lse)  # noqa: E731
    plain = fn(q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = fn(q, k, v)
        compiled = torch.compile(fn, fullgraph=True, backend="eager")(q, k, v)
    for got in (eager, compiled):
        for a, b in zip(got if return_lse else (got,), plain if return_lse else (plain,)):
            assert a.dtype == b.dtype and torch.equal(a, b)


def test_varlen_fallback_ignores_the_callers_autocast():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(60, 4, 32, generator=g) for _ in range(3))
    cu = torch.tensor([0, 17, 60], dtype=torch.int32)
    plain = sa.sageattn_varlen(q, k, v, cu, cu, 43, 43)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(sa.sageattn_varlen(q, k, v, cu, cu, 43, 43), plain)


def test_grad_through_the_fallback_under_autocast_is_in_q_dtype():
    q, k, v = (t.requires_grad_(True) for t in qkv())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sa.sageattn(q, k, v, is_causal=True)
    out.sum().backward()
    ref = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=True).sum().backward()
    assert (q.grad - ref[0].grad).abs().max() < 1e-5


# --- 5. scales float32 rounds to zero -----------------------------------------------------------

@pytest.mark.parametrize("scale", [1e-300, -1e-300, 5e-324, 1e-39])
@pytest.mark.parametrize("causal", [False, True])
def test_a_scale_that_float32_rounds_to_zero_is_equal_weights(scale, causal):
    # torch's CPU SDPA takes the scale as a float32 (0 here) and returned NaN with is_causal
    q, k, v = qkv()
    out, lse = sa.sageattn(q, k, v, is_causal=causal, sm_scale=scale, return_lse=True)
    want, want_lse = sa.sageattn(q, k, v, is_causal=causal, sm_scale=0.0, return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    # the drop-in's torch path (3-D inputs) too
    q3, k3, v3 = (t[0, :2] for t in (q, k, v))
    got = sa.scaled_dot_product_attention(q3, k3, v3, is_causal=causal, scale=scale)
    want = sa.scaled_dot_product_attention(q3, k3, v3, is_causal=causal, scale=0.0)
    assert torch.isfinite(got).all() and torch.equal(got, want)
    if not causal:   # equal weights: every query gets the mean of V
        assert torch.allclose(got, v3.mean(1, keepdim=True).expand_as(got), atol=1e-6)
