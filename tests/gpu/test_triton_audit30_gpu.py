"""Triton backend audit (2026-12-07) on a real GPU: the compiled kernels of the fixes that
tests/unit/test_triton_audit30.py checks under the interpreter.

* key tiles wider than K's 64-token scale block (``KernelConfig(..., block_n=128)``): no NaN;
* batch 0 / no query heads: an empty result (the Hopper path's tensor descriptors refuse size 0);
* a padded head dim on a GPU with tensor descriptors runs the pointer-load tiles.
"""

from __future__ import annotations

import pytest
import torch
from triton_helpers import triton_or_skip as _triton

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

COS_MIN = 0.9998
REL_L1_MAX = 0.02


def _qkv(b, hq, hkv, nq, nk, d, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, nq, d, device="cuda", generator=g).to(dtype)
    k = (torch.randn(b, hkv, nk, d, device="cuda", generator=g) + 1.0).to(dtype)
    v = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(dtype)
    return q, k, v


def _assert_bars(out, q, k, v, causal, what):
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           is_causal=causal)
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    o, r = out.float().flatten(), ref.flatten()
    cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
    l1 = ((o - r).abs().sum() / r.abs().sum()).item()
    assert cos >= COS_MIN and l1 <= REL_L1_MAX, f"{what}: cos={cos:.6f} rel_l1={l1:.5f}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_key_tiles_wider_than_the_k_scale_block(causal, d):
    _triton()
    from sageattention.triton import attn, varlen

    q, k, v = _qkv(2, 4, 2, 300, 1000, d)   # 1000 keys: a partial 128-key tile
    cfg = attn.KernelConfig(64, 128, 4, 2)
    out, lse = attn.run_attention(q, k, v, is_causal=causal, attn_mask=None, sm_scale=d ** -0.5,
                                  smooth_k=True, return_lse=True, config=cfg)
    assert torch.isfinite(lse).all()
    _assert_bars(out, q, k, v, causal, f"dense d={d} causal={causal}")
    # varlen: each batch entry as one packed sequence
    qp, kp, vp = (t.transpose(1, 2).reshape(-1, t.shape[1], d) for t in (q, k, v))
    cu_q = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 1000, 2000], dtype=torch.int32, device="cuda")
    outp = varlen.run_varlen(qp, kp, vp, cu_q, cu_k, 300, 1000, is_causal=causal, sm_scale=d ** -0.5,
                             smooth_k=True, config=cfg)
    _assert_bars(outp.reshape(2, 300, 4, d).transpose(1, 2), q, k, v, causal, f"varlen d={d}")


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
@pytest.mark.parametrize("b,h", [(0, 4), (2, 0)])
def test_empty_batch_or_heads(pv, b, h):
    st = _triton()
    if pv == "fp8" and torch.cuda.get_device_capability() < st.MIN_CAPABILITY_FP8:
        pytest.skip("the FP8-PV kernel needs compute capability 8.9+")
    q = torch.randn(b, h, 100, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(b, max(h, 1), 90, 128, device="cuda", dtype=torch.float16)
    out, lse = st.attention(q, k, k.clone(), return_lse=True, pv_dtype=pv)
    assert out.shape == q.shape and lse.shape == (b, h, 100)


def test_padded_head_dim_runs_the_pointer_load_tiles(monkeypatch):
    st = _triton()
    from sageattention.triton import attn

    picked = []
    pick = attn.pick_config
    monkeypatch.setattr(attn, "pick_config", lambda *a, **kw: picked.append(pick(*a, **kw)) or picked[-1])
    q, k, v = _qkv(1, 8, 8, 500, 700, 80)
    out, _ = st.attention(q, k, v)
    assert not picked[-1].use_tma and picked[-1] == pick(128, False, False)
    _assert_bars(out, q, k, v, False, "d=80")
