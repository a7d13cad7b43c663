"""sm75 (Turing) kernel family: the Python side of `torch.ops.sageattention_sm75`.

The op schema is defined once in csrc/sm75/bindings.cpp. This module loads the compiled extension
(`sageattention._kernels_sm75`), registers the op's fake implementation (for `torch.compile` and
`torch.library.opcheck`) and wraps the op with argument checks. What the family supports is read
from families.json, the table the build and the dispatcher also read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import ExtensionLoader, check_4d, checks

__all__ = ["EXTENSION", "OP_NAMESPACE", "SUPPORT", "load", "qk_int8_pv_fp16"]

FAMILY = "sm75"
OP_NAMESPACE = "sageattention_sm75"
SUPPORT = json.loads((Path(__file__).with_name("families.json")).read_text())["families"][FAMILY]
EXTENSION = SUPPORT["extension"]
TENSOR_LAYOUTS = ("HND", "NHD")
DTYPES = (torch.float16, torch.bfloat16)


def _register_fake() -> None:
    if not hasattr(getattr(torch.ops, OP_NAMESPACE), "qk_int8_pv_fp16"):
        raise ImportError(f"{EXTENSION} imported but did not register {OP_NAMESPACE}::qk_int8_pv_fp16")
    torch.library.register_fake(f"{OP_NAMESPACE}::qk_int8_pv_fp16")(_qk_int8_pv_fp16_fake)


# Import the compiled extension (registering its op) and the fake implementation, once;
# ImportError naming the reason when the extension is not usable.
load = ExtensionLoader(EXTENSION, FAMILY, _register_fake)


def _qk_int8_pv_fp16_fake(
    q, k, v, tensor_layout, is_causal, sm_scale, qk_quant_gran, smooth_k, return_lse
):
    # Mirrors bindings.cpp: its checks, in its order; a contiguous output shaped like q, LSE
    # [B, Hq, Nq] fp32 or an empty [0].
    check_4d(q=q, k=k, v=v)
    checks.parse_layout(tensor_layout)
    checks.parse_sm75_gran(qk_quant_gran)
    checks.check_qkv(q, k, v, tensor_layout)
    checks.check_sm75_head_dim_strides(q, k, v)
    checks.check_finite(sm_scale, "sm_scale")
    out = q.new_empty(q.shape)
    if not return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    heads, tokens = (q.shape[1], q.shape[2]) if tensor_layout == "HND" else (q.shape[2], q.shape[1])
    return out, q.new_empty((q.shape[0], heads, tokens), dtype=torch.float32)


def _check(q, k, v, tensor_layout, qk_quant_gran, pv_accum_dtype) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(
                f"{name} must be float16 or bfloat16 for the {FAMILY} kernels, got {t.dtype}"
            )
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D in {tensor_layout} layout, got shape {tuple(t.shape)}"
            )
    if tensor_layout not in TENSOR_LAYOUTS:
        raise ValueError(
            f"tensor_layout={tensor_layout!r} is not accepted; use one of {TENSOR_LAYOUTS}"
        )
    if qk_quant_gran not in SUPPORT["qk_quant_gran"]:
        raise ValueError(
            f"qk_quant_gran={qk_quant_gran!r} is not supported by the {FAMILY} kernels;"
            f" supported: {tuple(SUPPORT['qk_quant_gran'])}"
        )
    if pv_accum_dtype not in SUPPORT["pv_accum_dtype"]:
        raise ValueError(
            f"pv_accum_dtype={pv_accum_dtype!r} is not supported by the {FAMILY} kernels;"
            f" supported: {tuple(SUPPORT['pv_accum_dtype'])}"
        )
    head_dim = q.shape[-1]
    if head_dim not in SUPPORT["head_dims"] or k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise ValueError(
            f"head dims (q {q.shape[-1]}, k {k.shape[-1]}, v {v.shape[-1]}) must be equal and"
            f" one of {tuple(SUPPORT['head_dims'])} for the {FAMILY} kernels"
        )


def qk_int8_pv_fp16(
    q,
    k,
    v,
    *,
    tensor_layout,
    is_causal,
    sm_scale,
    qk_quant_gran,
    pv_accum_dtype,
    smooth_k,
    smooth_v,
    return_lse,
):
    """INT8 QK^T, FP16 PV with fp32 accumulation.

    qk_quant_gran: "per_thread" (the default of sageattn on this family: 8 Q scales per 16 query
    tokens, 4 K scales per 32 key tokens) or "per_warp" (one scale per 16 query / 32 key tokens);
    the groups are those of `sageattention.reference.scale_group_ids` with the sm75 block sizes.
    Returns (out, lse or None); out has q's shape and dtype, lse is [B, Hq, Nq] fp32 (natural log).
    smooth_v is accepted but has no effect here: with fp32 PV accumulation, subtracting V's mean and
    adding it back is an identity (each row of P sums to 1), so the kernel skips both steps.
    """
    _check(q, k, v, tensor_layout, qk_quant_gran, pv_accum_dtype)
    load()
    if sm_scale is None:
        sm_scale = q.shape[-1] ** -0.5
    # The kernels read any batch/head/token strides but need a contiguous head dim.
    q, k, v = [t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v)]
    op = getattr(torch.ops, OP_NAMESPACE).qk_int8_pv_fp16
    out, lse = op(
        q,
        k,
        v,
        tensor_layout,
        bool(is_causal),
        float(sm_scale),
        qk_quant_gran,
        bool(smooth_k),
        bool(return_lse),
    )
    return out, (lse if return_lse else None)
