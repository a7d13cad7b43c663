"""sageattn keeps the validated call of a keyword-free signature (core._plain_calls): a repeat skips
validation and request building, never a check a first call would make, and the backend is still
chosen per call."""

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention import core


@pytest.fixture(autouse=True)
def no_kept_calls():
    core._plain_calls.clear()
    yield
    core._plain_calls.clear()


def _qkv(q_len=5, kv_len=7, heads=2, head_dim=16, **kw):
    g = torch.Generator().manual_seed(q_len * 100 + kv_len)
    return tuple(torch.randn(1, heads, n, head_dim, generator=g, **kw) for n in (q_len, kv_len, kv_len))


def test_a_repeated_signature_is_validated_once_and_values_are_never_kept(monkeypatch):
    parsed = []
    real_parse = core.parse_call
    monkeypatch.setattr(core, "parse_call", lambda *a, **kw: parsed.append(kw) or real_parse(*a, **kw))
    q, k, v = _qkv()
    sa.sageattn(q, k, v)
    out = sa.sageattn(2 * q, k, v.flip(2))  # same signature, other values
    assert len(parsed) == 1
    torch.testing.assert_close(out, F.scaled_dot_product_attention(2 * q, k, v.flip(2)))
    sa.sageattn(q, k, v, is_causal=True)
    sa.sageattn(q, k, v, sm_scale=0.5)
    sa.sageattn(q, k, v, return_lse=True)
    assert len(parsed) == 4 and len(core._plain_calls) == 4


def test_bad_input_raises_on_every_call_and_is_not_kept():
    q, k, v = _qkv()
    for _ in range(2):
        with pytest.raises(ValueError, match="head dims differ"):
            sa.sageattn(q, k[..., :8], v)
        with pytest.raises(ValueError, match="tensor_layout"):
            sa.sageattn(q, k, v, "BHND")
    assert not core._plain_calls


def test_a_sparse_tensor_of_a_kept_shape_is_still_refused():
    q, k, v = _qkv()
    sa.sageattn(q, k, v)
    for _ in range(2):
        with pytest.raises(TypeError, match="v must be a dense"):
            sa.sageattn(q, k, v.to_sparse())
    assert len(core._plain_calls) == 1


def test_grad_mode_is_part_of_the_signature():
    q, k, v = _qkv(requires_grad=True)
    assert sa.sageattn(q, k, v).requires_grad
    with torch.no_grad():
        assert not sa.sageattn(q, k, v).requires_grad
    assert sa.sageattn(q, k, v).requires_grad
    assert sorted(call.problem.requires_grad for call, _ in core._plain_calls.values()) == [False, True]


def test_forcing_still_applies_to_a_kept_signature():
    q, k, v = _qkv()
    sa.sageattn(q, k, v)
    assert sa.last_backend() == "sdpa"
    with sa.force_backend("cuda-sm90-fp16"):
        with pytest.raises(sa.BackendUnavailableError, match="cuda-sm90-fp16"):
            sa.sageattn(q, k, v)
    sa.sageattn(q, k, v)
    assert sa.last_backend() == "sdpa"


def test_plain_keywords_are_part_of_the_signature(monkeypatch):
    parsed = []
    real_parse = core.parse_call
    monkeypatch.setattr(core, "parse_call", lambda *a, **kw: parsed.append(kw) or real_parse(*a, **kw))
    q, k, v = _qkv()
    for _ in range(3):  # as a UI's attention wrapper calls it, every layer and step
        out = sa.sageattn(q, k, v, attn_mask=None, is_causal=False, tensor_layout="HND")
        sa.sageattn(q, k, v, tensor_layout="HND", attn_mask=None, is_causal=False)  # keyword order
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert len(parsed) == 1
    sa.sageattn(q, k, v, smooth_k=False)
    sa.sageattn(q, k, v, scale=0.25)
    torch.testing.assert_close(sa.sageattn(q, k, v, scale=0.25), F.scaled_dot_product_attention(q, k, v, scale=0.25))
    sa.sageattn(q, k, v, dropout_p=0.0, enable_gqa=True)
    assert len(parsed) == 4 and len(core._plain_calls) == 4
    # a wrong keyword value raises on every call, as a kept one never does
    for _ in range(2):
        with pytest.raises(ValueError, match="dropout_p"):
            sa.sageattn(q, k, v, dropout_p=2.0)
        with pytest.raises(ValueError, match="pv_accum_dtype"):
            sa.sageattn(q, k, v, pv_accum_dtype="fp64")
    assert len(core._plain_calls) == 4


def test_keywords_and_other_argument_kinds_take_the_full_path(monkeypatch):
    monkeypatch.setattr(sa.inputs, "_warned_kwargs", set())  # the unknown keyword below warns here
    q, k, v = _qkv()
    mask = torch.ones(5, 7, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(sa.sageattn(q, k, v, attn_mask=mask), expected)
    sa.sageattn(q, k, v, sm_scale=1)      # an int scale
    sa.sageattn(q, k, v, is_causal=1)     # an int flag, which check_bool accepts
    sa.sageattn(q, k, v, smooth_k=1)      # an int keyword flag
    sa.sageattn(torch.nn.Parameter(q), k, v)
    with pytest.warns(UserWarning, match="'block_size'"):
        sa.sageattn(q, k, v, block_size=64)  # an unknown keyword: the full path, which warns
    assert not core._plain_calls
    # a mask is never served from a signature kept without one
    sa.sageattn(q, k, v)
    torch.testing.assert_close(sa.sageattn(q, k, v, attn_mask=mask), expected)


def test_the_kept_signatures_are_bounded(monkeypatch):
    monkeypatch.setattr(core, "_PLAIN_CALLS_KEPT", 3)
    for n in range(1, 8):
        sa.sageattn(*_qkv(q_len=n))
        assert 1 <= len(core._plain_calls) <= 3


def test_the_sdpa_drop_in_keeps_its_plain_calls_too():
    q, k, v = _qkv()
    for _ in range(2):
        out = sa.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3))
    assert len(core._plain_calls) == 1
    (call, _), = core._plain_calls.values()
    assert call.is_causal and call.sm_scale == 0.3
    # dropout, masks and argument errors take the full path, as before
    with pytest.raises(TypeError, match="dropout_p"):
        sa.scaled_dot_product_attention(q, k, v, dropout_p=None)
    with pytest.raises(TypeError, match="is_causal"):
        sa.scaled_dot_product_attention(q, k, v, is_causal="yes")
    with pytest.raises(TypeError, match="enable_gqa"):
        sa.scaled_dot_product_attention(q, k, v, enable_gqa="yes")
    assert len(core._plain_calls) == 1


def test_the_native_kernel_functions_keep_their_plain_calls_per_function_and_options(monkeypatch):
    parsed = []
    real_parse = core.parse_call
    monkeypatch.setattr(core, "parse_call", lambda *a, **kw: parsed.append(kw) or real_parse(*a, **kw))
    q, k, v = _qkv()
    for _ in range(2):  # on the CPU they run SDPA, as the input needs
        sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v)
        sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v)
        sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, pv_accum_dtype="fp16")
    assert len(parsed) == 3 and len(core._plain_calls) == 3
    assert {kw["options"]["pv_accum_dtype"] for kw in parsed} == {"fp32", "fp32+fp16", "fp16"}
    # an option the function refuses raises on every call, kept signatures or not
    for _ in range(2):
        with pytest.raises(ValueError, match="pv_accum_dtype"):
            sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, pv_accum_dtype="fp32+fp16")
        with pytest.raises(TypeError, match="smooth_k"):
            sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, smooth_k="yes")
    assert len(core._plain_calls) == 3
