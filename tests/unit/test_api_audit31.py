"""Public API audit (round 31): messages that named the wrong function or the wrong cause."""

import warnings

import numpy as np
import pytest
import torch

import sageattention as sa
from sageattention import inputs


def _qkv():
    g = torch.Generator().manual_seed(31)
    return tuple(torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))


@pytest.mark.parametrize("function", ["explain", "select_backend"])
def test_an_unknown_keyword_warning_names_the_function_that_was_called(monkeypatch, function):
    # explain() warned "select_backend() ignores the unknown keyword argument ...", a function the
    # user had not called (and its once-per-function record then silenced select_backend's own).
    monkeypatch.setattr(inputs, "_warned_kwargs", set())
    q, k, v = _qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(sa, function)(q, k, v, not_a_keyword=1)
    texts = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any(t.startswith(f"{function}() ignores the unknown keyword argument 'not_a_keyword'")
               for t in texts), texts


def test_explain_and_select_backend_each_warn_once_for_their_own_unknown_keyword(monkeypatch):
    monkeypatch.setattr(inputs, "_warned_kwargs", set())
    q, k, v = _qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sa.explain(q, k, v, not_a_keyword=1)
        sa.select_backend(q, k, v, not_a_keyword=1)
    names = sorted(str(w.message).split("(")[0] for w in caught if "not_a_keyword" in str(w.message))
    assert names == ["explain", "select_backend"]


@pytest.mark.parametrize("upstream_args", [
    ("HND", "triton", False, None, False),          # upstream: sm_scale=None, smooth_k=False
    ("HND", "triton", False, None, True, True),     # upstream: smooth_k=True, return_lse=True
])
def test_upstream_positional_smooth_k_on_the_triton_function_says_why_it_is_refused(upstream_args):
    # Upstream's signature has no attn_mask, so its 8th positional argument (smooth_k, a bool) is
    # our sm_scale: the refusal said only "sm_scale must be a real number or None, got bool",
    # naming neither the shifted order nor the keyword to use.
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"upstream SageAttention's 8th is smooth_k.*smooth_k=\.\.\. and "
                                        r"return_lse=\.\.\. by keyword"):
        sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, *upstream_args)


def test_a_numpy_bool_sm_scale_on_the_triton_function_gets_the_same_hint():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"upstream SageAttention's 8th is smooth_k"):
        sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, sm_scale=np.bool_(True))


def test_the_triton_function_still_takes_upstream_positional_calls_up_to_is_causal_and_real_scales():
    q, k, v = _qkv()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    got = sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, "HND", "triton", True, None, 0.25, False)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, sm_scale=np.float32(0.25),
                                                                  is_causal=True), want)


@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("_fresh_dynamo")
@pytest.mark.parametrize("call", [
    lambda q, k, v: sa.sageattn(q, k, v, is_causal=1, return_lse=1),
    lambda q, k, v: sa.sageattn(q, k, v, smooth_k=0, smooth_v=1, enable_gqa=1),
    lambda q, k, v: sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, "HND", 1, return_lse=1),
    lambda q, k, v: sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, is_causal=1, smooth_k=0),
    lambda q, k, v: sa.sageattn_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                       torch.tensor([0, 4], dtype=torch.int32),
                                       torch.tensor([0, 4], dtype=torch.int32), 4, 4, is_causal=1),
], ids=["sageattn-causal-lse", "sageattn-keywords", "cuda-fn", "triton-fn", "varlen"])
def test_an_integer_flag_compiles_under_fullgraph_as_it_runs_eagerly(call):
    # Eager code reads an int flag as its bool (is_causal=1 is causal); under torch.compile such a
    # call did not fit the op's bool slot and took the eager dispatcher, which dynamo cannot trace:
    # fullgraph=True failed with "Attempted to call function marked as skipped".
    q, k, v = _qkv()
    want = call(q, k, v)
    got = torch.compile(call, fullgraph=True, backend="aot_eager")(q, k, v)
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    else:
        torch.testing.assert_close(got, want)
