"""The raw ops' argument checks, in Python: csrc/common/op_checks.h's, check for check and word for
word, for the ops' fake implementations (so ``torch.compile`` refuses, while tracing, the calls the
compiled ops refuse) and for the wrappers' early checks. tests/unit/test_native_checks_host.py
compiles op_checks.h on the host and compares the two sides' messages case by case.

A fake sees meta tensors (the unit tests, ``torch.library.opcheck``) or fake CUDA tensors
(``torch.compile``): "meta" stands in for "cuda" here.
"""
from __future__ import annotations

import math

__all__ = ["MAX_GRID_YZ", "MAX_TOKENS", "OpArgumentError", "check_finite", "check_mean", "check_qkv",
           "check_quant_int8_args", "check_quant_v_fp8_args", "check_sm75_head_dim_strides", "parse_accum",
           "parse_gran", "parse_layout", "parse_sm75_gran"]

#: csrc/common/grid_limits.h: kMaxGridYZ (batch and heads) and kMaxTokens (tokens per sequence)
MAX_GRID_YZ = 65535
MAX_TOKENS = 1 << 30
_DEVICE_TYPES = ("cuda", "meta")
_QUANT_GRANS = ("per_block", "per_warp", "per_thread")


class OpArgumentError(ValueError, RuntimeError):
    """An argument the op refuses. A ValueError, as the wrappers' own checks raise, and a
    RuntimeError, as the compiled op's TORCH_CHECK raises: code written against either catches it."""


def _require(ok, message: str) -> None:
    if not ok:
        raise OpArgumentError(message)


def _shape(t) -> str:
    return str(tuple(int(s) for s in t.shape))


def parse_layout(tensor_layout: str) -> bool:
    """True for "HND", False for "NHD" (glue::parse_layout)."""
    _require(tensor_layout in ("HND", "NHD"), f"tensor_layout must be 'HND' or 'NHD', got '{tensor_layout}'")
    return tensor_layout == "HND"


def parse_gran(qk_quant_gran: str) -> str:
    """glue::parse_gran: the granularities of the sm80 .. sm90_fp8 families' ops."""
    _require(qk_quant_gran in _QUANT_GRANS,
             f"qk_quant_gran must be 'per_block', 'per_warp' or 'per_thread', got '{qk_quant_gran}'")
    return qk_quant_gran


# family -> (its ops' pv_accum_dtype values, the refusal of any other): each family's
# bindings.cpp (parse_accum / check_accum), word for word.
_ACCUM = {
    "sm80": (("fp32", "fp16+fp32", "fp16"),
             "pv_accum_dtype for the sm80 family must be 'fp32', 'fp16+fp32' or 'fp16', got '{}'"),
    "sm89": (("fp32", "fp32+fp32", "fp32+fp16"),
             "pv_accum_dtype for the sm89 family must be 'fp32', 'fp32+fp32' or 'fp32+fp16', got '{}'"),
    "sm90": (("fp32",),
             "pv_accum_dtype for the sm90 family must be 'fp32' (its only accumulation mode), got '{}'; "
             "'fp16+fp32' and 'fp16' are the sm80 family's"),
    "sm90_fp8": (("fp32+fp32", "fp32"),
                 "pv_accum_dtype for the sm90_fp8 family must be 'fp32+fp32' or 'fp32', got '{}'; "
                 "'fp32+fp16' is the sm89 family's"),
}


def parse_accum(family: str, pv_accum_dtype: str) -> str:
    """The family's attention op's pv_accum_dtype, or its refusal."""
    accepted, refusal = _ACCUM[family]
    _require(pv_accum_dtype in accepted, refusal.format(pv_accum_dtype))
    return pv_accum_dtype


def parse_sm75_gran(qk_quant_gran: str) -> str:
    """csrc/sm75/bindings.cpp's parse_gran."""
    _require(qk_quant_gran in ("per_thread", "per_warp"),
             f"sageattention_sm75: qk_quant_gran must be 'per_thread' or 'per_warp', got '{qk_quant_gran}'")
    return qk_quant_gran


def check_sm75_head_dim_strides(q, k, v) -> None:
    """csrc/sm75/bindings.cpp's check_head_dim_stride of q, k and v."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require(t.stride(3) == 1, f"sageattention_sm75: the head dim of {name} must be contiguous (stride 1), "
                                   f"got stride {t.stride(3)}")


def _view(t, hnd: bool):
    """(B, H, N, D) of a 4-D tensor (glue::view_of)."""
    b, s1, s2, d = t.shape
    return (b, s1, s2, d) if hnd else (b, s2, s1, d)


def check_input(t, name: str, ref, ref_name: str) -> None:
    """glue::check_input: 4-D, float16 or bfloat16, on ref's CUDA device."""
    _require(t.dim() == 4, f"{name} must be 4-D ([B, H, N, D] for HND, [B, N, H, D] for NHD), got shape "
                           f"{_shape(t)}")
    _require(t.device.type in _DEVICE_TYPES, f"{name} must be a CUDA tensor, got one on {t.device}")
    _require(t.device == ref.device, f"{name} is on {t.device} but {ref_name} is on {ref.device}; "
                                     "pass all of the op's tensors on one device")
    import torch

    _require(t.dtype in (torch.float16, torch.bfloat16), f"{name} must be float16 or bfloat16, got {t.dtype}")


def check_tokens(n, name: str) -> None:
    _require(n <= MAX_TOKENS, f"{name} has {n} tokens; the kernels take at most {MAX_TOKENS} (split the sequence)")


def check_grid_limit(b, h, name: str) -> None:
    _require(b <= MAX_GRID_YZ and h <= MAX_GRID_YZ,
             f"{name} has batch {b} and {h} heads; the kernels take at most {MAX_GRID_YZ} of each (split the "
             "call, or use sageattn, which runs such calls on PyTorch SDPA)")


def _float_text(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def check_finite(x, name: str) -> None:
    """glue::check_finite (an sm_scale or scale_mult)."""
    x = float(x)
    if not math.isfinite(x):
        raise OpArgumentError(f"{name} must be finite, got {_float_text(x)}")


def check_qkv(q, k, v, tensor_layout: str, v_fp16_with_bf16: bool = False) -> None:
    """glue::check_qkv: the attention ops' q, k and v (after their layout, granularity and
    accumulation strings)."""
    import torch

    hnd = parse_layout(tensor_layout)
    check_input(q, "q", q, "q")
    check_input(k, "k", q, "q")
    check_input(v, "v", q, "q")
    v_fp16_ok = v_fp16_with_bf16 and q.dtype == torch.bfloat16 and v.dtype == torch.float16
    _require(k.dtype == q.dtype and (v.dtype == q.dtype or v_fp16_ok),
             ("q, k and v must have one dtype (or v float16 with bfloat16 q and k)" if v_fp16_with_bf16
              else "q, k and v must have one dtype") + f", got {q.dtype}, {k.dtype}, {v.dtype}")
    (qb, qh, qn, qd), (kb, kh, kn, kd), (vb, vh, vn, vd) = (_view(t, hnd) for t in (q, k, v))
    _require(qd in (64, 128), f"head dim must be 64 or 128, got {qd}")
    _require(kd == qd and vd == qd, f"q, k and v must share the head dim, got {qd}, {kd}, {vd}")
    _require(kb == qb and vb == qb, f"q, k and v must share the batch size, got {qb}, {kb}, {vb}")
    _require(kh == vh and kn == vn,
             f"k and v must have the same heads and tokens, got k {kh} heads x {kn} tokens, v {vh} x {vn}")
    _require(qb > 0 and qh > 0 and kh > 0 and qn > 0 and kn > 0,
             f"q, k and v need a batch, heads and tokens (at least one of each), got batch {qb}, q {qh} heads x "
             f"{qn} tokens, k and v {kh} heads x {kn} tokens")
    _require(qh % kh == 0, f"q heads ({qh}) must be a multiple of kv heads ({kh})")
    check_tokens(qn, "q")
    check_tokens(kn, "k")
    check_grid_limit(qb, qh, "q")


def check_quant_int8_args(x, mean, tensor_layout: str, scale_mult) -> None:
    """glue::check_quant_int8_args: x, then K's token mean (read as fp32 [B, H, D] on x's device),
    then scale_mult."""
    hnd = parse_layout(tensor_layout)
    check_input(x, "x", x, "x")
    b, h, n, d = _view(x, hnd)
    _require(d % 8 == 0 and 8 <= d <= 256, f"head dim must be a multiple of 8 from 8 to 256, got {d}")
    check_tokens(n, "x")
    check_grid_limit(b, h, "x")
    check_finite(scale_mult, "scale_mult")
    if mean is not None:
        check_mean(mean, x, b, h, d)


def check_mean(mean, x, b, h, d) -> None:
    """quant_int8's mean: K's token mean, read by the kernel as fp32 [B, H, D] on x's device."""
    _require(mean.device == x.device, f"mean is on {mean.device} but x is on {x.device}; "
                                      "pass K's mean on x's device")
    _require(tuple(mean.shape) == (b, h, d) and mean.dtype.is_floating_point,
             f"mean must be a floating-point [B, H, D] = [{b}, {h}, {d}] tensor (x's mean over its "
             f"tokens), got shape {_shape(mean)} ({mean.dtype})")


def check_quant_v_fp8_args(v, tensor_layout: str) -> None:
    """glue::check_quant_v_fp8_args."""
    hnd = parse_layout(tensor_layout)
    check_input(v, "v", v, "v")
    b, h, n, d = _view(v, hnd)
    _require(d % 8 == 0 and 8 <= d <= 128, f"head dim must be a multiple of 8 from 8 to 128, got {d}")
    _require(n > 0, f"v needs at least one token (its scale is taken over its tokens), got shape {_shape(v)}")
    check_tokens(n, "v")
    check_grid_limit(b, h, "v")
