"""Audit 32: the drop-in's exact softmax (scales above EXACT_SOFTMAX_SCALE on calls torch handles)
with no keys or no queries returns what torch's SDPA returns instead of raising."""

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa


@pytest.mark.parametrize("scale", [5000.0, -5000.0])
@pytest.mark.parametrize("q_shape, k_shape", [
    ((3, 5, 8), (3, 0, 8)),            # 3-D: torch handles it
    ((5, 8), (0, 8)),                  # 2-D
    ((2, 1, 5, 8), (1, 1, 0, 8)),      # 4-D with a broadcast batch
    ((3, 0, 8), (3, 4, 8)),            # no queries
    ((2, 1, 0, 8), (1, 1, 4, 8)),
])
def test_the_drop_in_with_a_huge_scale_and_no_keys_or_no_queries_matches_torch(q_shape, k_shape, scale):
    torch.manual_seed(0)
    q, k, v = torch.randn(q_shape), torch.randn(k_shape), torch.randn(k_shape)
    expected = F.scaled_dot_product_attention(q, k, v, scale=scale)
    out = sa.scaled_dot_product_attention(q, k, v, scale=scale)
    assert out.shape == expected.shape
    assert torch.equal(out, torch.zeros_like(expected))   # queries without keys: 0, as torch's


def test_the_drop_in_with_a_huge_scale_no_keys_gqa_mask_and_grad():
    q = torch.randn(4, 5, 8, requires_grad=True)
    k, v = torch.randn(2, 0, 8), torch.randn(2, 0, 8)
    mask = torch.zeros(5, 0, dtype=torch.bool)
    out = sa.scaled_dot_product_attention(q, k, v, mask, scale=3000.0, enable_gqa=True)
    assert out.shape == (4, 5, 8) and torch.equal(out, torch.zeros(4, 5, 8))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
