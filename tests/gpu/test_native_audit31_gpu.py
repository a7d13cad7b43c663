"""GPU test of the 31st session's head-dim padding.

The native kernels are compiled for head dims 64 and 128; a call whose head dim is narrower runs
them on q, k, v zero-padded to the next of those (sageattention/core.py, Backend.padded_head_dim)
instead of falling back to SDPA: every kernel-specific function and each native backend forced
through sageattn must then run its kernel (last_backend() says which) and meet design.md's bars
against fp32 SDPA, with the call's own default scale. Skipped where a backend cannot run here.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention.backends import capability_table

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

NATIVE = [b.name for b in capability_table() if b.kind == "native"]
# design.md's bars against fp32 SDPA on normal inputs
BARS = {"qk_int8_pv_fp16": (0.9998, 0.02), "qk_int8_pv_fp8": (0.9993, 0.04)}


def _qkv(d, layout, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, hq, hkv, nq, nk = 2, 8, 2, 333, 517
    shape = (lambda h, n: (b, h, n, d)) if layout == "HND" else (lambda h, n: (b, n, h, d))
    q = torch.randn(shape(hq, nq), generator=g, device="cuda").to(dtype)
    k = (torch.randn(shape(hkv, nk), generator=g, device="cuda") + 2.0).to(dtype)   # smoothing's job
    v = torch.randn(shape(hkv, nk), generator=g, device="cuda").to(dtype)
    return q, k, v


def _reference(q, k, v, layout, causal):
    to_hnd = (lambda t: t) if layout == "HND" else (lambda t: t.transpose(1, 2))
    qh, kh, vh = (to_hnd(t).float() for t in (q, k, v))
    rep = qh.shape[1] // kh.shape[1]
    kh, vh = (t.repeat_interleave(rep, dim=1) for t in (kh, vh))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    lse = torch.logsumexp((qh @ kh.transpose(-1, -2)) * qh.shape[-1] ** -0.5
                          + (torch.full((qh.shape[2], kh.shape[2]), -torch.inf, device="cuda").triu(1)
                             if causal else 0.0), dim=-1)
    return to_hnd(out), lse


@pytest.mark.parametrize("d", [40, 80, 96, 8])
@pytest.mark.parametrize("name", NATIVE)
def test_a_native_backend_runs_a_narrower_head_dim_zero_padded(name, d):
    row = next(b for b in capability_table() if b.name == name)
    layout, dtype, causal = ("NHD", torch.bfloat16, True) if d in (40, 96) else ("HND", torch.float16, False)
    q, k, v = _qkv(d, layout, dtype, seed=d)
    try:
        with sa.force_backend(name):
            out, lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    except sa.BackendUnavailableError as exc:
        pytest.skip(f"{name} cannot run here: {exc}")
    assert sa.last_backend() == name
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ref, ref_lse = _reference(q, k, v, layout, causal)
    o, r = out.float().flatten(), ref.flatten()
    cos = F.cosine_similarity(o, r, dim=0).item()
    rel = ((o - r).abs().sum() / r.abs().sum()).item()
    cos_min, rel_max = BARS[row.op]
    assert cos >= cos_min and rel <= rel_max, f"{name} d={d}: cosine {cos:.6f}, relative L1 {rel:.4f}"
    assert (lse - ref_lse).abs().max().item() < 0.05, f"{name} d={d}: LSE off"


@pytest.mark.parametrize("function", ["sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp8_cuda",
                                      "sageattn_qk_int8_pv_fp8_cuda_sm90"])
def test_the_kernel_functions_run_their_kernel_at_head_dim_96(function):
    q, k, v = _qkv(96, "HND", torch.float16, seed=7)
    try:
        out = getattr(sa, function)(q, k, v, is_causal=True)
    except sa.BackendUnavailableError as exc:
        pytest.skip(f"{function}: {exc}")
    if sa.last_backend() == "sdpa":
        pytest.skip(f"{function}: no kernel of it runs on this GPU")
    assert sa.last_backend().startswith("cuda-")
    ref, _ = _reference(q, k, v, "HND", True)
    cos = F.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0).item()
    assert cos >= 0.9993, f"{function} ({sa.last_backend()}): cosine {cos:.6f}"
