"""The INT8-QK / FP8-PV Triton kernel (backend triton-fp8) on a real GPU of compute capability 8.9+.

Against sageattention.reference under the same quantization (per_block, 128-token K blocks, FP8
P, V as two e4m3 terms): cosine >= 0.99999. Against fp32 SDPA: design.md's FP8 bars (relative L1
<= 0.04, cosine >= 0.9993) and no NaN/Inf at any length. V's second e4m3 term (reference.FP8_V_TERMS)
lifts the cosine from ~0.9993 (one term) to ~0.9996 on random inputs (H100, 2026-12-05), so the floor
here (0.9995) is one a one-term kernel fails.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LENGTHS = (1, 17, 127, 128, 129, 1000, 4097)


def _triton():
    st = pytest.importorskip("sageattention.triton")
    ok, reason = st.is_available()
    if not ok:
        pytest.skip(f"Triton backend unavailable here: {reason}")
    if torch.cuda.get_device_capability() < st.MIN_CAPABILITY_FP8:
        pytest.skip("the FP8-PV kernel needs compute capability 8.9+ (FP8 tensor cores)")
    return st


def _metrics(out, ref):
    o, r = out.float().flatten(), ref.float().flatten()
    return (torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
            ((o - r).abs().sum() / r.abs().sum()).item())


def _qkv(b, hq, hkv, nq, nk, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, nq, d, device="cuda", generator=g).to(dtype)
    k = (torch.randn(b, hkv, nk, d, device="cuda", generator=g) + 0.3).to(dtype)
    v = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", LENGTHS)
def test_lengths_match_reference_and_sdpa(dtype, d, causal, n):
    st = _triton()
    from sageattention.reference import sageattn_reference

    q, k, v = _qkv(1, 4, 2, n, n, d, dtype, seed=n)
    out, lse = st.attention(q, k, v, is_causal=causal, pv_dtype="fp8", return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ref, ref_lse = sageattn_reference(q, k, v, is_causal=causal, qk_quant_gran="per_block",
                                      pv_dtype="fp8", pv_accum_dtype="fp32", blkk=128,
                                      return_lse=True)
    cos_ref, _ = _metrics(out, ref)
    assert cos_ref >= 0.99999, f"vs reference: cos={cos_ref:.7f}"
    assert (lse - ref_lse).abs().max().item() <= 1e-2
    kk, vv = (t.repeat_interleave(2, dim=1).float() for t in (k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), kk, vv, is_causal=causal)
    cos, l1 = _metrics(out, sdpa)
    if n >= 128:  # a handful of keys per row makes both figures noisy below that
        assert l1 <= 0.04 and cos >= 0.9995, f"vs fp32 SDPA: cos={cos:.6f} rel_l1={l1:.5f}"


def test_cross_attention_nhd_and_sageattn_forced():
    st = _triton()
    import sageattention as sa

    q, k, v = _qkv(2, 8, 1, 300, 777, 128, torch.float16, seed=3)
    hnd, _ = st.attention(q, k, v, pv_dtype="fp8")
    with sa.force_backend("triton-fp8"):
        nhd = sa.sageattn(*(t.transpose(1, 2) for t in (q, k, v)), tensor_layout="NHD")
    assert sa.last_backend() == "triton-fp8"
    assert torch.equal(nhd.transpose(1, 2), hnd)


def test_large_magnitudes_stay_finite():
    st = _triton()
    q, k, v = _qkv(1, 2, 2, 2048, 2048, 128, torch.float16, seed=9)
    out, _ = st.attention(q * 60, k * 60, v * 1000, pv_dtype="fp8")
    assert torch.isfinite(out).all()
