"""Checks of results against fp32 SDPA over dtypes, layouts, shapes and arguments."""

from __future__ import annotations

import torch

from .runner import Context, Recorder
from .tensors import make_qkv, randn, reference, reference_lse

F16, BF16 = torch.float16, torch.bfloat16


def _dtype_name(dtype: torch.dtype) -> str:
    return {F16: "fp16", BF16: "bf16"}.get(dtype, str(dtype))


def run_case(ctx: Context, rec: Recorder, backend: str | None, label: str, *, dtype=F16,
             layout="HND", causal=False, batch=None, heads=None, kv_heads=None, seq_q=None,
             seq_k=None, head_dim=128, scale=None, seed=0):
    """Make inputs, call sageattn (forced to ``backend``), compare with fp32 SDPA."""
    p = ctx.profile
    q, k, v = make_qkv(batch or p.batch, heads or p.heads, seq_q or p.seq_len, head_dim,
                       dtype=dtype, device=ctx.device, layout=layout, kv_heads=kv_heads,
                       seq_k=seq_k, seed=seed)
    kwargs = {"tensor_layout": layout, "is_causal": causal}
    if scale is not None:
        kwargs["sm_scale"] = scale
    out, ran = ctx.call(rec, backend, q, k, v, **kwargs)
    rec.require(out.dtype == dtype, f"{label}: output dtype {out.dtype}, expected {dtype}")
    ref = reference(q, k, v, layout=layout, is_causal=causal, scale=scale)
    return rec.compare(label, out, ref, ran=ran)


def fp16(ctx: Context, rec: Recorder, backend):
    for causal in (False, True):
        run_case(ctx, rec, backend, f"fp16 causal={causal}", dtype=F16, causal=causal)


def bf16(ctx: Context, rec: Recorder, backend):
    for causal in (False, True):
        run_case(ctx, rec, backend, f"bf16 causal={causal}", dtype=BF16, causal=causal)


def layouts(ctx: Context, rec: Recorder, backend):
    for layout in ("HND", "NHD"):
        for dtype in (F16, BF16):
            run_case(ctx, rec, backend, f"{layout} {_dtype_name(dtype)}", dtype=dtype,
                     layout=layout, seed=3)


def causal_and_not(ctx: Context, rec: Recorder, backend):
    for dtype in (F16, BF16):
        for causal in (False, True):
            run_case(ctx, rec, backend, f"{_dtype_name(dtype)} causal={causal}", dtype=dtype,
                     causal=causal, seed=5)


def head_dims(ctx: Context, rec: Recorder, backend):
    for d in ctx.profile.head_dims:
        for causal in (False, True):
            run_case(ctx, rec, backend, f"head_dim={d} causal={causal}", head_dim=d,
                     causal=causal, seed=7)


def padded_head_dims(ctx: Context, rec: Recorder, backend):
    """Head dims the native kernels were not compiled for: they run zero-padded to the next
    width (40 at 64, 96 at 128), so a slicing or scale slip shows up as an accuracy failure."""
    for d in ctx.profile.padded_head_dims:
        for causal in (False, True):
            run_case(ctx, rec, backend, f"head_dim={d} causal={causal}", head_dim=d,
                     causal=causal, seed=8)


def sequence_boundaries(ctx: Context, rec: Recorder, backend):
    """Lengths around every block size; memory past each sequence's end holds NaN, so a kernel
    that reads beyond the last token produces NaN instead of passing by luck."""
    p = ctx.profile
    longest = max(p.boundary_lengths)
    for n in p.boundary_lengths:
        for causal in (False, True):
            full = [randn((1, 4, longest + 64, 128), dtype=F16, device=ctx.device, seed=100 + j)
                    for j in range(3)]
            for t in full:
                t[:, :, n:] = float("nan")
            q, k, v = (t[:, :, :n] for t in full)
            out, ran = ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=causal)
            ref = reference(q, k, v, is_causal=causal)
            rec.compare(f"N={n} causal={causal}", out, ref, ran=ran)
    rec.note("inputs are views of longer buffers whose tail is NaN")


def gqa_mqa(ctx: Context, rec: Recorder, backend):
    heads = ctx.profile.heads
    for kv_heads, kind in ((max(1, heads // 4), "GQA"), (1, "MQA")):
        for causal in (False, True):
            run_case(ctx, rec, backend, f"{kind} Hq={heads} Hkv={kv_heads} causal={causal}",
                     heads=heads, kv_heads=kv_heads, causal=causal, seed=11)


def cross_attention(ctx: Context, rec: Recorder, backend):
    nq, nk = ctx.profile.cross_lengths
    for dtype in (F16, BF16):
        for seq_q, seq_k in ((nq, nk), (nk, nq)):
            for causal in (False, True):
                run_case(ctx, rec, backend,
                         f"{_dtype_name(dtype)} Nq={seq_q} Nk={seq_k} causal={causal}",
                         dtype=dtype, seq_q=seq_q, seq_k=seq_k, causal=causal, seed=13)


def return_lse(ctx: Context, rec: Recorder, backend):
    p = ctx.profile
    for layout in ("HND", "NHD"):
        for causal in (False, True):
            q, k, v = make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=F16, device=ctx.device,
                               layout=layout, seed=17)
            res, ran = ctx.call(rec, backend, q, k, v, tensor_layout=layout, is_causal=causal,
                                return_lse=True)
            label = f"{layout} causal={causal}"
            if not rec.require(isinstance(res, (tuple, list)) and len(res) == 2,
                               f"{label}: return_lse=True must return (out, lse), got "
                               f"{type(res).__name__}"):
                continue
            out, lse = res
            rec.compare(f"{label} out", out, reference(q, k, v, layout=layout, is_causal=causal),
                        ran=ran)
            ref_lse = reference_lse(q, k, layout=layout, is_causal=causal)
            if not rec.require(tuple(lse.shape) == tuple(ref_lse.shape)
                               and lse.dtype == torch.float32,
                               f"{label}: lse is {tuple(lse.shape)} {lse.dtype}, expected "
                               f"{tuple(ref_lse.shape)} torch.float32"):
                continue
            diff = float((lse.float() - ref_lse).abs().max())
            rec.require(diff <= p.lse_tolerance,
                        f"{label}: max |lse - lse_ref| = {diff:.4g} > {p.lse_tolerance}")
            rec.note(f"{label}: max |lse - lse_ref| = {diff:.3g}")


def custom_scale(ctx: Context, rec: Recorder, backend):
    for scale in (0.05, 0.2):
        for causal in (False, True):
            run_case(ctx, rec, backend, f"sm_scale={scale} causal={causal}", scale=scale,
                     causal=causal, seed=19)


def long_sequence(ctx: Context, rec: Recorder, backend):
    p = ctx.profile
    for dtype in (F16, BF16):
        for causal in (False, True):
            run_case(ctx, rec, backend, f"N={p.long_seq_len} {_dtype_name(dtype)} "
                     f"causal={causal}", dtype=dtype, batch=1, heads=p.long_heads,
                     seq_q=p.long_seq_len, causal=causal, seed=23)


def non_contiguous(ctx: Context, rec: Recorder, backend):
    p, dev = ctx.profile, ctx.device
    b, h, n, d = p.batch, p.heads, p.seq_len, 128
    views = {
        # NHD storage seen as HND: heads and tokens swapped in memory.
        "transposed (NHD storage, HND view)": lambda s: randn((b, n, h, d), dtype=F16,
                                                             device=dev, seed=s).transpose(1, 2),
        # every other token of a longer sequence
        "token stride 2": lambda s: randn((b, h, 2 * n, d), dtype=F16, device=dev,
                                          seed=s)[:, :, ::2],
        # q, k, v cut from one fused projection of width 3*d
        "fused qkv slice": lambda s: randn((b, h, n, 3 * d), dtype=F16, device=dev,
                                           seed=s)[..., d:2 * d],
    }
    for label, make in views.items():
        q, k, v = make(31), make(32), make(33)
        rec.require(not q.is_contiguous(), f"{label}: the test input is unexpectedly contiguous")
        out, ran = ctx.call(rec, backend, q, k, v, tensor_layout="HND", is_causal=False)
        rec.compare(label, out, reference(q, k, v), ran=ran)


def extreme_magnitudes(ctx: Context, rec: Recorder, backend):
    p = ctx.profile
    for dtype in (F16, BF16):
        name = _dtype_name(dtype)
        q, k, v = make_qkv(p.batch, p.heads, p.seq_len, 128, dtype=dtype, device=ctx.device,
                           seed=41)
        cases = {
            # a large shared offset in a few K channels, as LLM keys have (what smoothing is for)
            "K channel outliers +30": (q, _offset_channels(k, 30.0), v),
            "V magnitude 1e3": (q, k, (v.float() * 1e3).to(dtype)),
            "Q, K magnitude 1e-3": ((q.float() * 1e-3).to(dtype), (k.float() * 1e-3).to(dtype), v),
        }
        if dtype == BF16:  # beyond fp16's 65504: a kernel that casts V to fp16 returns inf
            cases["V magnitude 1e5"] = (q, k, (v.float() * 1e5).to(dtype))
        for label, (qq, kk, vv) in cases.items():
            out, ran = ctx.call(rec, backend, qq, kk, vv, tensor_layout="HND", is_causal=False)
            rec.compare(f"{name} {label}", out, reference(qq, kk, vv), ran=ran)


def _offset_channels(k: torch.Tensor, offset: float) -> torch.Tensor:
    k = k.clone()
    k[..., ::16] += offset
    return k
