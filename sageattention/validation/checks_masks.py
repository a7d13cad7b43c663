"""Attention masks (boolean and additive), compared with SDPA given the same mask, and the
unmasked native path after masked calls."""

from __future__ import annotations

import torch

from .accuracy import errors
from .runner import Context, Recorder
from .tensors import make_qkv, random_additive_mask, random_bool_mask, reference

F16, BF16 = torch.float16, torch.bfloat16


def _masked(ctx: Context, rec: Recorder, label: str, dtype, mask_for) -> None:
    p = ctx.profile
    seq_q, seq_k = p.seq_len, p.seq_len
    q, k, v = make_qkv(p.batch, p.heads, seq_q, 128, dtype=dtype, device=ctx.device, seed=51)
    for heads_in_mask in (p.heads, 1):  # per-head mask, and one broadcast over heads
        mask = mask_for(p.batch, heads_in_mask, seq_q, seq_k)
        ref = reference(q, k, v, attn_mask=mask)
        # the test is only worth something if ignoring the mask would fail it
        rec.require(errors(reference(q, k, v), ref).cosine < 0.99,
                    f"{label}: the mask barely changes the result; the test would not notice a "
                    f"mask being ignored")
        out, ran = ctx.call(rec, None, q, k, v, tensor_layout="HND", is_causal=False,
                            attn_mask=mask)
        rec.compare(f"{label} mask [{p.batch},{heads_in_mask},{seq_q},{seq_k}] {mask.dtype}",
                    out, ref, ran=ran)


def bool_masks(ctx: Context, rec: Recorder, backend):
    for dtype in (F16, BF16):
        _masked(ctx, rec, f"{dtype}", dtype, lambda b, h, nq, nk: random_bool_mask(
            b, h, nq, nk, device=ctx.device, seed=52))


def additive_masks(ctx: Context, rec: Recorder, backend):
    for dtype in (F16, BF16):
        _masked(ctx, rec, f"{dtype}", dtype, lambda b, h, nq, nk, dtype=dtype:
                random_additive_mask(b, h, nq, nk, dtype=dtype, device=ctx.device, seed=53))


def fp32_additive_masks(ctx: Context, rec: Recorder, backend):
    for dtype in (F16, BF16):
        _masked(ctx, rec, f"{dtype} q/k/v", dtype, lambda b, h, nq, nk: random_additive_mask(
            b, h, nq, nk, dtype=torch.float32, device=ctx.device, seed=54))


def unmasked_regression(ctx: Context, rec: Recorder, backend):
    """After masked calls, unmasked calls must go back to the native path, over a small grid."""
    p = ctx.profile
    n = max(1, p.seq_len // 2)
    q, k, v = make_qkv(p.batch, p.heads, n, 128, dtype=F16, device=ctx.device, seed=61)
    mask = random_bool_mask(p.batch, 1, n, n, device=ctx.device, seed=62)
    _, masked_ran = ctx.call(rec, None, q, k, v, tensor_layout="HND", attn_mask=mask)
    rec.note(f"masked call ran {masked_ran}")
    if ctx.expectation.execution == "native":
        ctx.default_dispatch(rec, "default dispatch after a masked call", reference(q, k, v),
                             q, k, v, tensor_layout="HND", is_causal=False)
    else:
        rec.note("PTX-JIT run: the dispatcher does not pick a family for a GPU it was not built "
                 "for, so the default dispatch after a masked call is not checked; each native "
                 "backend is forced")
    for name in ctx.native_names:
        for dtype in (F16, BF16):
            for layout in ("HND", "NHD"):
                for d in p.head_dims:
                    for causal in (False, True):
                        qq, kk, vv = make_qkv(p.batch, p.heads, n, d, dtype=dtype,
                                              device=ctx.device, layout=layout, seed=63)
                        out, ran = ctx.call(rec, name, qq, kk, vv, tensor_layout=layout,
                                            is_causal=causal)
                        rec.compare(f"[{name}] {dtype} {layout} d={d} causal={causal}", out,
                                    reference(qq, kk, vv, layout=layout, is_causal=causal),
                                    ran=ran)
