"""sm90_fp8 family (Hopper, sm_90a only: warpgroup MMA): INT8 QK^T with FP8 e4m3 PV.

Wraps the ops of ``sageattention._kernels_sm90_fp8`` (namespace
``torch.ops.sageattention_sm90_fp8``, schemas in csrc/sm90_fp8/bindings.cpp) and registers their
fake implementations. Same ops, schemas and quantization as the sm89 family (both call them
through the helpers in ``sageattention.native``), with "fp32+fp32" and "fp32" accumulation only;
its online softmax steps 128 keys at a time while K scales stay per 64-key block, and its kernels
run only on GPUs of compute capability 9.0.
"""
from __future__ import annotations

from . import (ExtensionLoader, fp8_family_attention, fp8_family_quant_int8, fp8_family_quant_v_fp8,
               register_fp8_family_fakes)

EXTENSION = "sageattention._kernels_sm90_fp8"
NAMESPACE = "sageattention_sm90_fp8"


def _register_fakes() -> None:
    register_fp8_family_fakes(NAMESPACE, "sm90_fp8")


# Import the extension (registering its ops) and the fake implementations, once; ImportError
# saying why when the extension is not usable here.
load = ExtensionLoader(EXTENSION, "sm90_fp8", _register_fakes)


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
    """INT8 QK^T, FP8 e4m3 PV attention (P scaled by 448, V per-channel scale), "fp32+fp32" or
    "fp32" accumulation; options and result as ``sageattention.native.fp8_family_attention``."""
    load()
    return fp8_family_attention(NAMESPACE, q, k, v, **options)
