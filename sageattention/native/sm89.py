"""sm89 family (Ada, Hopper through mma.sync): INT8 QK^T with FP8 e4m3 PV.

Wraps the ops of ``sageattention._kernels_sm89`` (namespace ``torch.ops.sageattention_sm89``,
schemas in csrc/sm89/bindings.cpp) and registers their fake implementations. The sm90_fp8 family
defines the same ops; both call them through the helpers in ``sageattention.native``.
"""
from __future__ import annotations

from . import (ExtensionLoader, fp8_family_attention, fp8_family_quant_int8, fp8_family_quant_v_fp8,
               register_fp8_family_fakes)

EXTENSION = "sageattention._kernels_sm89"
NAMESPACE = "sageattention_sm89"


def _register_fakes() -> None:
    register_fp8_family_fakes(NAMESPACE, "sm89")


# Import the extension (registering its ops) and the fake implementations, once; ImportError
# saying why when the extension is not usable here.
load = ExtensionLoader(EXTENSION, "sm89", _register_fakes)


def quant_int8(x, **options):
    """Quantize Q (is_key=False) or K (is_key=True) to INT8 as the kernels do; options and result
    as ``sageattention.native.fp8_family_quant_int8``."""
    load()
    return fp8_family_quant_int8(NAMESPACE, x, **options)


def quant_v_fp8(v, **options):
    """V to e4m3 with a per-channel scale; options and result as
    ``sageattention.native.fp8_family_quant_v_fp8``."""
    load()
    return fp8_family_quant_v_fp8(NAMESPACE, v, **options)


def qk_int8_pv_fp8(q, k, v, **options):
    """INT8 QK^T, FP8 e4m3 PV attention (P scaled by 448, V per-channel scale), "fp32+fp16",
    "fp32+fp32" or "fp32" accumulation; options and result as
    ``sageattention.native.fp8_family_attention``."""
    load()
    return fp8_family_attention(NAMESPACE, q, k, v, **options)
