"""sm90 family (Hopper, sm_90a only: warpgroup MMA): INT8 QK^T with FP16 PV, "fp32" accumulation.

Wraps the ops of ``sageattention._kernels_sm90`` (namespace ``torch.ops.sageattention_sm90``,
schemas in csrc/sm90/bindings.cpp) and registers their fake implementations. Same contract as
the sm80 family's "fp32" mode; its kernels run only on GPUs of compute capability 9.0.
"""
from __future__ import annotations

import torch

from . import ExtensionLoader, check_quant_mean

EXTENSION = "sageattention._kernels_sm90"
NAMESPACE = "sageattention_sm90"


def _register_fakes() -> None:
    from . import register_qk_int8_pv_fp16_fake, register_quant_int8_fake

    register_quant_int8_fake(NAMESPACE)
    register_qk_int8_pv_fp16_fake(NAMESPACE, "sm90")


# Import the extension (registering its ops) and the fake implementations, once; ImportError
# saying why when the extension is not usable here.
load = ExtensionLoader(EXTENSION, "sm90", _register_fakes)


def _ops():
    """The op namespace (looked up per call, so a test can put the schema under another name)."""
    return getattr(torch.ops, NAMESPACE)


def quant_int8(x, *, tensor_layout, qk_quant_gran, is_key, scale_mult=1.0, mean=None):
    """Quantize Q (is_key=False) or K (is_key=True) to INT8 as the kernels do.

    Returns (int8 [B, H, Npad, D] in HND order, fp32 scales [B, H, groups]).
    """
    check_quant_mean(x, mean, tensor_layout)
    load()
    return _ops().quant_int8(x, mean, tensor_layout, qk_quant_gran, bool(is_key), float(scale_mult))


def qk_int8_pv_fp16(q, k, v, *, tensor_layout, is_causal, sm_scale, qk_quant_gran,
                    pv_accum_dtype, smooth_k, smooth_v, return_lse):
    """INT8 QK^T, FP16 PV attention ("fp32" accumulation only). ``smooth_v`` has no effect: with
    fp32 accumulation, taking V's mean out and adding it back is an identity."""
    load()
    out, lse = _ops().qk_int8_pv_fp16(
        q, k, v, tensor_layout, bool(is_causal), float(sm_scale), qk_quant_gran, pv_accum_dtype,
        bool(smooth_k), bool(return_lse))
    return out, (lse if return_lse else None)
