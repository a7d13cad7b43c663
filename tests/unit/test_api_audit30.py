"""Public API audit (round 30): inputs whose answer depended on the path a call took."""

import math

import pytest
import torch

import sageattention as sa

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _qkv(dtype=torch.float32):
    g = torch.Generator().manual_seed(30)
    return (torch.randn(1, 2, 4, 8, generator=g, dtype=dtype), torch.randn(1, 2, 5, 8, generator=g, dtype=dtype),
            torch.randn(1, 2, 5, 8, generator=g, dtype=dtype))


@pytest.mark.parametrize("bad", [math.inf, math.nan])
@pytest.mark.parametrize("call", [
    lambda q, k, v, m: sa.sageattn(q, k, v, attn_mask=m),
    lambda q, k, v, m: sa.sageattn(q, k, v, attn_mask=m, return_lse=True),
    lambda q, k, v, m: sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, attn_mask=m),
    lambda q, k, v, m: sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, attn_mask=m),
    lambda q, k, v, m: sa.scaled_dot_product_attention(q, k, v, m),
], ids=["sageattn", "sageattn-lse", "triton-fn", "cuda-fn", "drop-in"])
def test_an_additive_mask_with_nan_or_plus_inf_is_refused_on_the_fallback_too(call, bad):
    # The Triton kernels refused it (ValueError); the SDPA fallback returned NaN rows for the same
    # call, so the answer depended on the GPU, dtype and build. Now every path refuses it.
    q, k, v = _qkv()
    mask = torch.zeros(4, 5)
    mask[1, 2] = bad
    with pytest.raises(ValueError, match=r"NaN or \+inf"):
        call(q, k, v, mask)


def test_a_half_mask_with_plus_inf_is_refused_and_minus_inf_still_hides_keys():
    q, k, v = _qkv(torch.float64)
    mask = torch.zeros(4, 5, dtype=torch.float64)
    mask[0, 1] = math.inf
    with pytest.raises(ValueError, match=r"NaN or \+inf"):
        sa.sageattn(q, k, v, attn_mask=mask)
    mask[0, 1] = -math.inf   # -inf is the hard mask, as in SDPA
    out = sa.sageattn(q, k, v, attn_mask=mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want)
    # a mask of the input's 16-bit type is checked too
    half = torch.zeros(4, 5, dtype=torch.float16)
    half[3, 0] = math.inf
    with pytest.raises(ValueError, match=r"NaN or \+inf"):
        sa.sageattn(*(t.half() for t in _qkv()), attn_mask=half)


def test_the_mask_values_are_not_read_on_meta_tensors():
    # No data to read (as while tracing): the check is skipped, the call still gives its shape.
    q, k, v = (t.to("meta") for t in _qkv())
    out = sa.sageattn(q, k, v, attn_mask=torch.zeros(4, 5, device="meta"))
    assert out.shape == q.shape and out.device.type == "meta"
