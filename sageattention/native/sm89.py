"""sm89 family (Ada, Hopper through mma.sync): INT8 QK^T with FP8 e4m3 PV.

Wraps the ops of ``sageattention._kernels_sm89`` (namespace ``torch.ops.sageattention_sm89``,
schemas in csrc/sm89/bindings.cpp) and registers their fake implementations.
"""
from __future__ import annotations

import torch

from . import ExtensionLoader

EXTENSION = "sageattention._kernels_sm89"
NAMESPACE = "sageattention_sm89"


def _register_fakes() -> None:
    from . import attention_fake_outputs, bhnd, register_quant_int8_fake

    register_quant_int8_fake(NAMESPACE)

    @torch.library.register_fake(f"{NAMESPACE}::quant_v_fp8")
    def _quant_v_fake(v, tensor_layout, smooth_v):
        b, h, n, d = bhnd(v, tensor_layout)
        padded = (n + 63) // 64 * 64
        return (v.new_empty((b, h, d, padded), dtype=torch.float8_e4m3fn),
                v.new_empty((b, h, d), dtype=torch.float32),
                v.new_empty((b, h, d) if smooth_v else (0,), dtype=torch.float32))

    @torch.library.register_fake(f"{NAMESPACE}::qk_int8_pv_fp8")
    def _attn_fake(q, k, v, tensor_layout, is_causal, sm_scale, qk_quant_gran, pv_accum_dtype,
                   smooth_k, smooth_v, return_lse):
        return attention_fake_outputs(q, tensor_layout, return_lse)


# Import the extension (registering its ops) and the fake implementations, once; ImportError
# saying why when the extension is not usable here.
load = ExtensionLoader(EXTENSION, "sm89", _register_fakes)


def quant_int8(x, *, tensor_layout, qk_quant_gran, is_key, scale_mult=1.0, mean=None):
    """Quantize Q (is_key=False) or K (is_key=True) to INT8 as the kernels do."""
    load()
    return torch.ops.sageattention_sm89.quant_int8(x, mean, tensor_layout, qk_quant_gran,
                                                   bool(is_key), float(scale_mult))


def quant_v_fp8(v, *, tensor_layout, smooth_v):
    """V -> (e4m3 [B, H, D, Npad] with tokens permuted in 16-groups, scale [B, H, D], mean)."""
    load()
    return torch.ops.sageattention_sm89.quant_v_fp8(v, tensor_layout, bool(smooth_v))


def qk_int8_pv_fp8(q, k, v, *, tensor_layout, is_causal, sm_scale, qk_quant_gran,
                   pv_accum_dtype, smooth_k, smooth_v, return_lse):
    """INT8 QK^T, FP8 e4m3 PV attention (P scaled by 448, V per-channel scale)."""
    load()
    out, lse = torch.ops.sageattention_sm89.qk_int8_pv_fp8(
        q, k, v, tensor_layout, bool(is_causal), float(sm_scale), qk_quant_gran, pv_accum_dtype,
        bool(smooth_k), bool(smooth_v), bool(return_lse))
    return out, (lse if return_lse else None)
