"""sm80 family (Ampere, Ada, Hopper through mma.sync): INT8 QK^T with FP16 PV.

Wraps the ops of ``sageattention._kernels_sm80`` (namespace ``torch.ops.sageattention_sm80``,
schemas in csrc/sm80/bindings.cpp) and registers their fake implementations.
"""
from __future__ import annotations

import torch

from . import ExtensionLoader, check_quant_mean

EXTENSION = "sageattention._kernels_sm80"
NAMESPACE = "sageattention_sm80"


def _register_fakes() -> None:
    from . import register_qk_int8_pv_fp16_fake, register_quant_int8_fake

    register_quant_int8_fake(NAMESPACE)
    register_qk_int8_pv_fp16_fake(NAMESPACE, "sm80")


# Import the extension (registering its ops) and the fake implementations, once; ImportError
# saying why when the extension is not usable here.
load = ExtensionLoader(EXTENSION, "sm80", _register_fakes)


def quant_int8(x, *, tensor_layout, qk_quant_gran, is_key, scale_mult=1.0, mean=None):
    """Quantize Q (is_key=False) or K (is_key=True) to INT8 as the kernels do.

    Returns (int8 [B, H, Npad, D] in HND order, fp32 scales [B, H, groups]).
    """
    check_quant_mean(x, mean, tensor_layout)
    load()
    return getattr(torch.ops, NAMESPACE).quant_int8(x, mean, tensor_layout, qk_quant_gran,
                                                    bool(is_key), float(scale_mult))


# The accumulation modes whose P.V sums are fp16 (a whole row, or each 64-key block), so V's distance
# from zero counts against fp16's range: smooth_v takes V's token mean out for them.
FP16_ACCUMULATING = ("fp16+fp32", "fp16")


def _attention_op(*args):
    return torch.ops.sageattention_sm80.qk_int8_pv_fp16(*args)


def qk_int8_pv_fp16(q, k, v, *, tensor_layout, is_causal, sm_scale, qk_quant_gran,
                    pv_accum_dtype, smooth_k, smooth_v, return_lse):
    """INT8 QK^T, FP16 PV attention.

    ``smooth_v`` applies to the fp16-accumulating modes ("fp16", as upstream's, and "fp16+fp32"):
    V's mean over its tokens is subtracted before the kernel and added to the output after (each
    row of softmax(QK^T) sums to 1), so the fp16 accumulator sums V's deviations from the mean, not
    V: a V far from zero no longer overflows it ("fp16+fp32" sums each 64-key block in fp16, which
    overflows past |V| of about 1000; upstream skips smooth_v there). With "fp32" accumulation it
    would be an identity and is skipped, as upstream skips it. The centered V goes to the kernel in
    fp16, the type those modes' P.V takes it in, so a bfloat16 V is rounded once, not once to
    bfloat16 and again to fp16 (which cost relative L1 0.0202 against 0.0130 for the reference's
    single rounding on a drawn case, 2026-12-07).
    """
    load()
    v_mean = None
    if smooth_v and pv_accum_dtype in FP16_ACCUMULATING and v.numel():  # no keys: no mean to take
        # fp16 for a bfloat16 V beside bfloat16 q (the op takes that pair); a V whose dtype is not
        # q's keeps it, so the op refuses the mix as it does without smooth_v (it was converted, and
        # an fp16 q with a bfloat16 V ran with smooth_v=True only)
        to_fp16 = v.dtype == torch.bfloat16 and getattr(q, "dtype", None) == torch.bfloat16
        v, v_mean = subtract_token_mean(v, tensor_layout, dtype=torch.float16 if to_fp16 else None)
    out, lse = _attention_op(
        q, k, v, tensor_layout, bool(is_causal), float(sm_scale), qk_quant_gran, pv_accum_dtype,
        bool(smooth_k), bool(return_lse))
    if v_mean is not None:
        out = add_token_mean(out, v_mean, tensor_layout)
    return out, (lse if return_lse else None)


def subtract_token_mean(v, tensor_layout, dtype=None):
    """(V minus its mean over tokens, rounded once to ``dtype`` (default V's); the fp32 mean,
    keepdim) for ``smooth_v``."""
    tokens = 2 if tensor_layout == "HND" else 1
    vf = v.float()
    mean = vf.mean(dim=tokens, keepdim=True)
    return (vf - mean).to(dtype or v.dtype), mean


def add_token_mean(out, mean, tensor_layout):
    """The attention output of V minus ``mean`` plus ``mean``, repeated over each key/value head's
    query heads (GQA), in the output's dtype."""
    heads = 1 if tensor_layout == "HND" else 2
    group = out.shape[heads] // mean.shape[heads]
    return (out.float() + mean.repeat_interleave(group, dim=heads)).to(out.dtype)
