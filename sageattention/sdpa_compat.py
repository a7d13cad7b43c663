"""Using sageattn where code calls `torch.nn.functional.scaled_dot_product_attention`.

Assigning `sageattn` to SDPA breaks callers: SDPA's fourth positional argument is `attn_mask`,
sageattn's is `tensor_layout`. `scaled_dot_product_attention` here has SDPA's exact signature and
maps every argument by name; `patch_sdpa()` installs it for a `with` block and restores what was there.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from . import core, dispatch
from .dispatch import record_backend
from .inputs import check_scale, numpy_number

__all__ = ["patch_sdpa", "scaled_dot_product_attention"]


_NOT_STRIDED = "inputs that are not strided tensors (nested or sparse)"


def _torch_handles_it(query, key, value, enable_gqa) -> str | None:
    """Why the call goes to torch unchanged (so it behaves, and fails, exactly as SDPA), or None:
    batch shapes other than 4-D, nested (torch's SDPA takes jagged ones) or sparse tensors, a value
    head dim unlike the query's, batch sizes or K/V head counts that differ (SDPA broadcasts them),
    GQA without enable_gqa."""
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and not t.is_nested and t.layout is torch.strided for t in tensors):
        return _NOT_STRIDED
    if not all(t.dim() == 4 for t in tensors):
        return "inputs that are not 4-D strided tensors"
    if value.shape[-1] != query.shape[-1]:
        return "a value head dim unlike the query's"
    if not query.shape[0] == key.shape[0] == value.shape[0] or key.shape[1] != value.shape[1]:
        return "batch sizes or key/value head counts that differ"
    if not enable_gqa and query.shape[1] != key.shape[1]:
        return "query and key/value head counts that differ without enable_gqa=True"
    return None


def _bool_as_float(value):
    """A dropout_p or scale as torch's SDPA reads it: a bool (Python's, numpy's or a 0-d bool
    tensor) is 0.0 or 1.0 there (`dropout_p=self.training and p` gives False), where sageattn's
    checks refuse a bool; any other value unchanged (checked where it is used)."""
    if isinstance(value, torch.Tensor):
        return value.double() if value.dtype == torch.bool and value.dim() == 0 else value
    return float(value) if isinstance(numpy_number(value), bool) else value


def _autocast(*tensors):
    """The tensors as torch's autocast passes them to SDPA (on its lower-precision list): under an
    enabled autocast of their device, floating-point ones but float64 in the autocast dtype, so the
    output is in that dtype too. (sageattn itself keeps q's dtype.)"""
    dtype = core.autocast_dtype(tensors[0].device.type)
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 else t for t in tensors)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                                 scale=None, enable_gqa=False):
    """Drop-in for torch.nn.functional.scaled_dot_product_attention, run by sageattn.

    Same signature and semantics as SDPA ([batch, heads, tokens, head_dim] inputs); calls that the
    quantized kernels cannot serve (masks without Triton, dropout, grad, fp32, CPU...) run torch's SDPA.
    """
    dropout_p, scale = _bool_as_float(dropout_p), _bool_as_float(scale)
    why_torch = _torch_handles_it(query, key, value, enable_gqa)
    if why_torch is not None:
        # a forced quantized backend never falls back silently, here neither (docs/api.md)
        forced = dispatch.forced_backend_plain() if torch.compiler.is_compiling() else dispatch.forced_backend()
        dispatch.refuse_quantized_forced(
            forced, f"scaled_dot_product_attention sends {why_torch} to torch's SDPA unchanged")
        # checked as sageattn checks it (torch returned NaN for a NaN or infinite scale); torch
        # also returned NaN for zero (or tiny) or negative ones, so those get the same attention instead
        scale = check_scale("scale", scale)
        if scale is not None:
            query, scale = core._positive_scale(query, scale)
        out = None
        if scale is not None and scale > core.EXACT_SOFTMAX_SCALE and why_torch != _NOT_STRIDED:
            # torch returned NaN where scale * q.k overflowed: the exact softmax instead, once
            # torch's own checks (on meta copies, no compute) have passed the arguments
            core._torch_sdpa(*(t.to("meta") if isinstance(t, torch.Tensor) else t
                               for t in (query, key, value, attn_mask)),
                             dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
            out, _ = core._exact_softmax_attention(query, key, value, attn_mask, is_causal, scale, dropout_p,
                                                   gqa=enable_gqa, return_lse=False)
        if out is None:
            out = core._torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                   is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        record_backend("sdpa")
        return out
    query, key, value, attn_mask = _autocast(query, key, value, attn_mask)
    return core.sageattn(query, key, value, tensor_layout="HND", is_causal=is_causal, attn_mask=attn_mask,
                         dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)


@contextlib.contextmanager
def patch_sdpa():
    """Within the block, `torch.nn.functional.scaled_dot_product_attention` is sageattention's
    SDPA-compatible function; the previous function is restored on exit, errors included.

    It patches the module attribute (process-wide, not per thread); code that imported the function
    by name (`from torch.nn.functional import scaled_dot_product_attention`) keeps the original.
    """
    previous = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield scaled_dot_product_attention
    finally:
        F.scaled_dot_product_attention = previous
