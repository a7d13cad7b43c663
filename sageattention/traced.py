"""torch.compile support: under tracing, `sageattn` is one opaque custom op.

The dispatcher is Python that dynamo cannot trace (package resources, calibration tables, locks,
thread-local bookkeeping), and should not: the backend is a per-call decision, not graph
structure. So while torch.compile traces, `sageattn` calls the custom op `sageattention::sageattn`
instead. Its eager implementation is the normal `sageattn` (dispatch, kernels, fallbacks,
`last_backend`); its fake implementation validates the call exactly as `sageattn` does and gives
the output's shape, so `torch.compile(..., fullgraph=True)` works and bad input still raises the
same ValueError/TypeError while tracing.

Calls that the op cannot carry take the eager path instead: inputs that require grad (the op
defines no backward; the dispatcher would run SDPA, which dynamo traces) and arguments whose
Python types do not fit the op's schema (the eager path raises the usual error for them).
"""

from __future__ import annotations

from typing import Optional

import torch

from .inputs import SAGEATTN_KEYWORDS, parse_call


@torch.library.custom_op("sageattention::sageattn", mutates_args=())
def sageattn_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
                tensor_layout: str, is_causal: bool, sm_scale: Optional[float], return_lse: bool,
                dropout_p: float, enable_gqa: Optional[bool], qk_quant_gran: Optional[str],
                pv_accum_dtype: Optional[str], smooth_k: bool,
                smooth_v: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from .core import sageattn

    result = sageattn(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
                      return_lse=return_lse, **_options(attn_mask, dropout_p, enable_gqa,
                                                        qk_quant_gran, pv_accum_dtype, smooth_k,
                                                        smooth_v))
    out, lse = result if return_lse else (result, None)
    # Outputs are fresh, contiguous tensors in q's layout (what the fake promises).
    out = out.contiguous()
    lse = lse.contiguous() if lse is not None else out.new_empty((0,), dtype=torch.float32)
    return out, lse


@sageattn_op.register_fake
def _sageattn_fake(q, k, v, attn_mask, tensor_layout, is_causal, sm_scale, return_lse, dropout_p,
                   enable_gqa, qk_quant_gran, pv_accum_dtype, smooth_k, smooth_v):
    call = parse_call(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
                      return_lse=return_lse,
                      options=_options(attn_mask, dropout_p, enable_gqa, qk_quant_gran,
                                       pv_accum_dtype, smooth_k, smooth_v))
    p = call.problem
    out = q.new_empty(q.shape)
    lse = q.new_empty((p.batch, p.q_heads, p.q_len) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _options(attn_mask, dropout_p, enable_gqa, qk_quant_gran, pv_accum_dtype, smooth_k, smooth_v):
    return {"attn_mask": attn_mask, "dropout_p": dropout_p, "enable_gqa": enable_gqa,
            "qk_quant_gran": qk_quant_gran, "pv_accum_dtype": pv_accum_dtype, "smooth_k": smooth_k,
            "smooth_v": smooth_v}


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _fits_schema(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, opts) -> bool:
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return False
    if any(t.requires_grad for t in (q, k, v)):
        return False
    mask = opts["attn_mask"]
    checks = (
        isinstance(tensor_layout, str), isinstance(is_causal, bool), isinstance(return_lse, bool),
        sm_scale is None or _is_number(sm_scale), opts["scale"] is None or _is_number(opts["scale"]),
        opts["scale"] is None or sm_scale is None,
        mask is None or (isinstance(mask, torch.Tensor) and not mask.requires_grad),
        _is_number(opts["dropout_p"]), opts["enable_gqa"] is None or isinstance(opts["enable_gqa"], bool),
        opts["qk_quant_gran"] is None or isinstance(opts["qk_quant_gran"], str),
        opts["pv_accum_dtype"] is None or isinstance(opts["pv_accum_dtype"], str),
        isinstance(opts["smooth_k"], bool), isinstance(opts["smooth_v"], bool),
    )
    return all(checks)


def sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, eager):
    """`sageattn` while torch.compile traces: the custom op, or ``eager()`` when it cannot carry
    the call (see the module docstring)."""
    if any(name not in SAGEATTN_KEYWORDS for name in kwargs):
        return eager()  # it warns about the unknown keyword
    opts = dict(SAGEATTN_KEYWORDS)
    opts.update(kwargs)
    if not _fits_schema(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, opts):
        return eager()
    scale = sm_scale if opts["scale"] is None else opts["scale"]
    out, lse = sageattn_op(q, k, v, opts["attn_mask"], tensor_layout, is_causal,
                           None if scale is None else float(scale), return_lse,
                           float(opts["dropout_p"]), opts["enable_gqa"], opts["qk_quant_gran"],
                           opts["pv_accum_dtype"], opts["smooth_k"], opts["smooth_v"])
    return (out, lse) if return_lse else out
