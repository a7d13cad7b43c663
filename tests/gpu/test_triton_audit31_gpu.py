"""Triton backend audit (2026-12-07, second pass) on a real GPU: what
tests/unit/test_triton_audit31.py checks on the CPU, with the device's own memory counters.

* An ``attn_mask`` passed as an expanded view (zero strides) is not materialised at its broadcast
  size: before the fix a ``[Nk]`` padding mask expanded to ``[B, H, Nq, Nk]`` cost a full-size bool
  copy (and padding, and a float mask's full-size temporaries) on the GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_helpers import triton_or_skip as _triton

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

COS_MIN = 0.9998
MIB = 2**20


def _qkv(b, h, n, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, n, d, device="cuda", generator=g).half()
    k = (torch.randn(b, h, n, d, device="cuda", generator=g) + 1.0).half()
    v = torch.randn(b, h, n, d, device="cuda", generator=g).half()
    return q, k, v


@pytest.mark.parametrize("kind", ["bool_padding", "float_bias"])
def test_expanded_mask_costs_no_full_size_memory(kind):
    st = _triton()
    b, h, n, d = 2, 16, 4096, 64   # 537 M (query, key) pairs: 512 MiB as bool, 2 GiB as fp32
    q, k, v = _qkv(b, h, n, d)
    g = torch.Generator(device="cuda").manual_seed(1)
    if kind == "bool_padding":
        real = torch.rand(n, device="cuda", generator=g) > 0.1
    else:
        real = torch.randn(n, n, device="cuda", generator=g)
        real[torch.rand(n, n, device="cuda", generator=g) > 0.8] = -math.inf
    expanded = real.expand(b, h, n, n)
    st.attention(q, k, v, attn_mask=real)   # compile outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, _ = st.attention(q, k, v, attn_mask=expanded)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # q8, k8 (8 MiB each), scales, the output (16 MiB), the block map: well under 128 MiB. Before:
    # >= 512 MiB (the bool block-map pass) and, for the float bias, several GiB of temporaries.
    assert extra < 128 * MIB, f"{kind}: {extra / MIB:.0f} MiB beyond the inputs"
    want, _ = st.attention(q, k, v, attn_mask=real)
    assert torch.equal(out, want)
    mask = real if kind == "float_bias" else torch.where(real, 0.0, -math.inf)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           attn_mask=mask.float())
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0).item()
    assert cos >= COS_MIN, f"{kind}: cos={cos:.6f}"


@pytest.mark.parametrize("dim", [0, 1, 2], ids=["batch", "heads", "tokens"])
@pytest.mark.parametrize("d", [64, 128])
def test_a_v_expanded_along_any_dim_gives_the_copied_result(dim, d):
    # On Hopper, V of d=64/128 without a mask is read through a TMA descriptor built on its own
    # strides; one of them 0 (an expanded V) must read as the copy would, or go the pointer way.
    st = _triton()
    b, h, n = 2, 4, 300
    q, k, _ = _qkv(b, h, n, d, seed=5)
    shape = [b, h, n, d]
    shape[dim] = 1
    g = torch.Generator(device="cuda").manual_seed(6)
    v = torch.randn(shape, device="cuda", generator=g).half().expand(b, h, n, d)
    out, _ = st.attention(q, k, v)
    want, _ = st.attention(q, k, v.contiguous())
    torch.cuda.synchronize()
    assert torch.equal(out, want), f"dim {dim}: max |diff| {(out.float() - want.float()).abs().max().item()}"
