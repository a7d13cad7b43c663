"""sm80 family (Ampere, Ada, Hopper through mma.sync): INT8 QK^T with FP16 PV.

Wraps the ops of ``sageattention._kernels_sm80`` (namespace ``torch.ops.sageattention_sm80``,
schemas in csrc/sm80/bindings.cpp) and registers their fake implementations.
"""
from __future__ import annotations

import torch

from .. import reference
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

    Whenever this wrapper hands the op an fp16 V it made (a bfloat16 V beside bfloat16 q with an
    fp16-accumulating mode, or the centered V of ``smooth_v``), each channel of each (batch, kv
    head) is first divided by the power of two ``fp16_v_scale`` picks and the output channel is
    multiplied back (exact both ways): a channel past 32768 comes down into (2^14, 2^15], as
    ``sageattention.reference`` scales it (unscaled, |V| > 65504 was inf in fp16 and the output
    inf or NaN), and a channel below fp16's normal range (2^-14) goes up into (1/2, 1] (unscaled, a
    V of 1e-7 kept 1 to 2 bits, 17% off, and 1e-8 became 0). Every other channel keeps scale 1:
    the fp16 values, and so the results, are those of an unscaled conversion.
    """
    load()
    v_mean = v_scale = None
    fp16_modes = pv_accum_dtype in FP16_ACCUMULATING and tensor_layout in ("HND", "NHD")
    is_v = isinstance(v, torch.Tensor) and v.dim() == 4 and v.numel() > 0  # no keys: nothing to take
    if smooth_v and fp16_modes and is_v:
        # fp16 for a bfloat16 V beside bfloat16 q (the op takes that pair); a V whose dtype is not
        # q's keeps it, so the op refuses the mix as it does without smooth_v (it was converted, and
        # an fp16 q with a bfloat16 V ran with smooth_v=True only)
        to_fp16 = v.dtype == torch.bfloat16 and getattr(q, "dtype", None) == torch.bfloat16
        v, v_mean, v_scale = _centered_fp16_v(v, tensor_layout, to_fp16)
    elif (fp16_modes and is_v and v.dtype == torch.bfloat16
          and getattr(q, "dtype", None) == torch.bfloat16):
        # the op would convert this V to fp16 itself, unscaled
        v, v_scale = _scaled_fp16_v(v, tensor_layout)
    out, lse = _attention_op(
        q, k, v, tensor_layout, bool(is_causal), float(sm_scale), qk_quant_gran, pv_accum_dtype,
        bool(smooth_k), bool(return_lse))
    if v_mean is not None or v_scale is not None:
        out = _restore_output(out, v_scale, v_mean, tensor_layout)
    return out, (lse if return_lse else None)


#: fp16_v_scale's bounds: a channel's max |V| / s ends in (2^14, 2^15] when above 2^15 (fp16's max
#: is 65504), in (1/2, 1] when below 2^-14 (fp16's smallest normal). Scaled up no further than to 1:
#: the fp16 accumulators sum P (up to 1) times V over a 64-key block ("fp16+fp32") or a whole row
#: ("fp16"), and a V near 2^15 would overflow them where the unscaled one did not.
FP16_V_MIN = 2.0 ** -14
#: the smallest scale: 1 / s stays finite in bfloat16 and fp32 for any amax (csrc/sm75/v16_scale.h)
FP16_V_MIN_SCALE = 2.0 ** -100


def fp16_v_scale(amax):
    """The per-channel power-of-two scale s (fp32, ``amax``'s shape) a V is divided by before its
    fp16 conversion: the smallest power of two with amax / s <= 2^15 where amax > 2^15
    (``sageattention.reference.fp16_v_scale_of_amax``), the power of two with amax / s in (1/2, 1]
    where 0 < amax < 2^-14 (at least 2^-100), else 1 (an all-zero channel, an inf or NaN in it too)."""
    amax = amax.float()
    up = torch.clamp_min(reference.power_of_two_at_least(amax), FP16_V_MIN_SCALE)
    small = torch.isfinite(amax) & (amax > 0) & (amax < FP16_V_MIN)
    return torch.where(small, up, reference.fp16_v_scale_of_amax(amax))


def _token_dim(tensor_layout):
    return 2 if tensor_layout == "HND" else 1


def _scaled_fp16_v(v, tensor_layout):
    """(V divided by its per-channel ``fp16_v_scale`` and rounded once to fp16; the scale, keepdim
    over the tokens). A bfloat16 V times a power of two in bfloat16 is exact (fp32's exponent
    range), so only the conversion rounds."""
    scale = fp16_v_scale(v.abs().amax(dim=_token_dim(tensor_layout), keepdim=True))
    return (v * torch.reciprocal(scale).to(v.dtype)).to(torch.float16), scale


def _centered_fp16_v(v, tensor_layout, to_fp16):
    """smooth_v's V: (V minus its token mean, for fp16 scaled as ``_scaled_fp16_v`` and rounded
    once; the fp32 mean; the scale or None), keepdim over the tokens. A V that goes to the op in
    its own dtype (one the op refuses beside q's) is not scaled."""
    if not (to_fp16 or v.dtype == torch.float16):
        centered, mean = subtract_token_mean(v, tensor_layout)
        return centered, mean, None
    centered, mean = subtract_token_mean(v, tensor_layout, dtype=torch.float32)
    scale = fp16_v_scale(centered.abs().amax(dim=_token_dim(tensor_layout), keepdim=True))
    return (centered / scale).to(torch.float16), mean, scale


def _restore_output(out, scale, mean, tensor_layout):
    """The output of the op on V / scale - mean / scale, times scale plus mean (either None),
    repeated over each key/value head's query heads (GQA), in the output's dtype, rounded once."""
    heads = 1 if tensor_layout == "HND" else 2
    ref = scale if scale is not None else mean
    group = out.shape[heads] // ref.shape[heads]
    res = out.float()
    if scale is not None:
        res = res * scale.repeat_interleave(group, dim=heads)
    if mean is not None:
        res = res + mean.repeat_interleave(group, dim=heads)
    return res.to(out.dtype)


def subtract_token_mean(v, tensor_layout, dtype=None):
    """(V minus its mean over tokens, rounded once to ``dtype`` (default V's); the fp32 mean,
    keepdim) for ``smooth_v``."""
    vf = v.float()
    mean = vf.mean(dim=_token_dim(tensor_layout), keepdim=True)
    return (vf - mean).to(dtype or v.dtype), mean
