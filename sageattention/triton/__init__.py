"""Triton backend: INT8 QK^T / FP16 PV attention (dense with masks, and variable length).

Public entry points for the dispatcher (``sageattention.core``):

* ``is_available() -> (bool, reason)``
* ``attention(q, k, v, *, tensor_layout, is_causal, attn_mask, sm_scale, smooth_k, return_lse)``
* ``varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, is_causal,
  sm_scale, smooth_k)``

Triton itself is imported lazily, so ``import sageattention.triton`` works without it. Arguments are
checked here too (the kernels rely on them), with ValueError/TypeError naming what is accepted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os

import torch

from sageattention.backends import MAX_GRID_YZ  # the kernels' grids carry heads and batch in y and z

MIN_CAPABILITY = (8, 0)
MAX_HEAD_DIM = 256
# Token positions inside the kernels are int32 (addresses are int64); 2**30 tokens per sequence
# leaves room for every padding and tile end (n rounded up to 128, plus a 128-row tile).
MAX_TOKENS = 2**30
# The FP8-PV kernel (attn_fp8.py): FP8 tensor cores, tiles sized for head dims up to 128.
MIN_CAPABILITY_FP8 = (8, 9)
MAX_HEAD_DIM_FP8 = 128
PV_DTYPES = ("fp16", "fp8")
DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("HND", "NHD")


def padded_head_dim(head_dim: int) -> int:
    """Head dim the kernels work with: a power of two, at least 32 (the int8 dot's minimum K).
    Here, not in quant.py, so the capability table reads it without importing Triton."""
    return max(32, 1 << max(head_dim - 1, 0).bit_length())


def _interpreting() -> bool:
    # quant.interpreting's twin: this module must import without Triton (is_available says why).
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_available(device: torch.device | int | None = None) -> tuple[bool, str]:
    """Whether these kernels can run on ``device`` (default: the current CUDA device), and why not."""
    if importlib.util.find_spec("triton") is None:
        return False, "Triton is not installed (pip install triton)"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU is visible to torch"
    if getattr(torch.version, "hip", None):
        return False, "ROCm GPUs are not supported by these kernels (built and tested for NVIDIA)"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return False, (f"GPU compute capability {cap[0]}.{cap[1]} is below the "
                       f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} these Triton kernels need "
                       "(INT8 and BF16 tensor-core paths)")
    try:
        import triton  # noqa: F401  (a broken install fails here, not inside a launch)
    except Exception as exc:  # pragma: no cover - depends on the environment
        return False, f"Triton failed to import: {exc}"
    return True, f"Triton kernels run on compute capability {cap[0]}.{cap[1]}"


def _check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; put all inputs on one device")


def _check_qkv(q, k, v, ndim: int, shape_doc: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the Triton backend accepts torch.float16 "
                            "and torch.bfloat16")
        if t.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {list(t.shape)}")
        _check_device(name, t, q.device)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"the Triton backend needs CUDA tensors, got {q.device} (CPU tensors run "
                         "only under TRITON_INTERPRET=1, for tests)")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim:
        raise ValueError(f"q and k must have the same head dim, got {head_dim} and {k.shape[-1]}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {head_dim} is not supported; the Triton backend accepts 1.."
                         f"{MAX_HEAD_DIM}")


def _check_heads(hq: int, hkv: int) -> None:
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv}) for GQA/MQA")
    if hq > MAX_GRID_YZ:
        raise ValueError(f"{hq} query heads exceed the {MAX_GRID_YZ} the kernels' launch grid allows")


def _check_tokens(name: str, n: int) -> None:
    if n > MAX_TOKENS:
        raise ValueError(f"{name} = {n} tokens in one sequence exceeds the {MAX_TOKENS} (2**30) the "
                         "Triton kernels index with 32-bit token positions; split the sequence or "
                         "use another backend")


def _check_batch(batch: int) -> None:
    if batch > MAX_GRID_YZ:
        raise ValueError(f"batch {batch} exceeds the {MAX_GRID_YZ} the kernels' launch grid allows; "
                         "split the batch")


def _resolve_scale(sm_scale, head_dim: int) -> float:
    if sm_scale is None:
        return head_dim ** -0.5
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__}")
    if not math.isfinite(sm_scale) or sm_scale <= 0:
        raise ValueError(f"sm_scale must be a positive finite number, got {sm_scale}")
    return float(sm_scale)


def attention(q, k, v, *, tensor_layout: str = "HND", is_causal: bool = False, attn_mask=None,
              sm_scale: float | None = None, smooth_k: bool = True, return_lse: bool = False,
              pv_dtype: str = "fp16"):
    """INT8 QK^T / FP16 PV attention; returns ``(out, lse or None)``.

    ``q [B, Hq, Nq, D]`` and ``k, v [B, Hkv, Nk, D]`` in HND (``[B, N, H, D]`` in NHD), fp16/bf16.
    ``attn_mask``: bool (True keeps) or float (added to the scores, natural-log units),
    broadcastable to ``[B, Hq, Nq, Nk]`` in either layout, as SDPA's; not combined with
    ``is_causal``. Query rows whose keys are all masked return 0 (LSE ``-inf``).
    ``lse`` is ``[B, Hq, Nq]`` fp32 (natural log), including the K-smoothing correction.
    ``pv_dtype``: "fp16" (masks allowed) or "fp8" (``attn_fp8``: FP8 e4m3 P and V, GPUs of compute
    capability 8.9+, head dims up to ``MAX_HEAD_DIM_FP8``, no mask).
    """
    from . import attn  # imports triton
    from .mask import check_mask

    if tensor_layout not in LAYOUTS:
        raise ValueError(f"tensor_layout must be one of {LAYOUTS}, got {tensor_layout!r}")
    if pv_dtype not in PV_DTYPES:
        raise ValueError(f"pv_dtype must be one of {PV_DTYPES}, got {pv_dtype!r}")
    _check_qkv(q, k, v, 4, "[B, H, N, D] (HND) or [B, N, H, D] (NHD)")
    if pv_dtype == "fp8":
        if attn_mask is not None:
            raise ValueError("the FP8-PV Triton kernel takes no attn_mask; use pv_dtype='fp16'")
        if q.shape[-1] > MAX_HEAD_DIM_FP8:
            raise ValueError(f"head dim {q.shape[-1]} is not supported by the FP8-PV Triton kernel "
                             f"(1..{MAX_HEAD_DIM_FP8})")
        if q.device.type == "cuda" and torch.cuda.get_device_capability(q.device) < MIN_CAPABILITY_FP8:
            cap = torch.cuda.get_device_capability(q.device)
            raise ValueError(f"the FP8-PV Triton kernel needs compute capability "
                             f"{MIN_CAPABILITY_FP8[0]}.{MIN_CAPABILITY_FP8[1]}+ (FP8 tensor cores), "
                             f"this GPU is {cap[0]}.{cap[1]}")
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    batch, hq, n_q, head_dim = q.shape
    if k.shape[0] != batch:
        raise ValueError(f"q and k must have the same batch size, got {batch} and {k.shape[0]}")
    _check_batch(batch)
    _check_heads(hq, k.shape[1])
    if k.shape[2] == 0:
        raise ValueError("k and v must have at least one token")
    _check_tokens("q's sequence length", n_q)
    _check_tokens("k's sequence length", k.shape[2])
    if attn_mask is not None:
        if is_causal:
            raise ValueError("pass either attn_mask or is_causal=True, not both (as SDPA)")
        check_mask(attn_mask, (batch, hq, n_q, k.shape[2]))
        _check_device("attn_mask", attn_mask, q.device)
    scale = _resolve_scale(sm_scale, head_dim)
    if n_q == 0 or batch == 0 or hq == 0:
        # Nothing to compute; and no launch either: the Hopper path's tensor descriptors refuse a
        # dimension of size 0 (batch 0 failed there with "shape must be positive").
        out = torch.empty((batch, n_q, hq, head_dim) if tensor_layout == "NHD" else (batch, hq, n_q, head_dim),
                          dtype=q.dtype, device=q.device)
        lse = torch.empty((batch, hq, n_q), dtype=torch.float32, device=q.device) if return_lse else None
        return out, lse

    # The output is allocated in the caller's layout; the kernel writes it through an HND view.
    out = torch.empty((batch, n_q, hq, head_dim) if tensor_layout == "NHD" else q.shape,
                      dtype=q.dtype, device=q.device)
    out_hnd = out.transpose(1, 2) if tensor_layout == "NHD" else out
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        if pv_dtype == "fp8":
            from . import attn_fp8
            _, lse = attn_fp8.run_attention_fp8(q, k, v, is_causal=bool(is_causal), sm_scale=scale,
                                                smooth_k=bool(smooth_k), return_lse=bool(return_lse),
                                                out=out_hnd)
        else:
            _, lse = attn.run_attention(q, k, v, is_causal=bool(is_causal), attn_mask=attn_mask,
                                        sm_scale=scale, smooth_k=bool(smooth_k),
                                        return_lse=bool(return_lse), out=out_hnd)
    return out, lse


def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int, device: torch.device) -> list[int]:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {list(cu.shape)}")
    _check_device(name, cu, device)
    values = cu.tolist()  # one small device->host copy; malformed offsets would read out of bounds
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(f"{name} must be non-decreasing, but {name}[{i}] = {values[i]} < "
                             f"{name}[{i - 1}] = {values[i - 1]}")
    if values[-1] != total:
        raise ValueError(f"{name}[-1] = {values[-1]} must equal the number of packed tokens ({total})")
    return values


def _check_max_seqlen(name: str, given, lengths: list[int]) -> int:
    if isinstance(given, bool) or not isinstance(given, int):
        raise TypeError(f"{name} must be an int, got {type(given).__name__}")
    longest = max(lengths, default=0)
    if given < longest:
        raise ValueError(f"{name} = {given} is smaller than the longest sequence ({longest})")
    return longest


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     is_causal: bool = False, sm_scale: float | None = None, smooth_k: bool = True):
    """Attention over packed sequences ``q [total_q, Hq, D]``, ``k, v [total_k, Hkv, D]``.

    Sequence ``i`` is ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` of q and likewise of k/v (int32
    offsets, starting at 0, non-decreasing, ending at the token count). K smoothing uses each
    sequence's own mean; causal is top-left within each sequence. A sequence with queries but no
    keys returns zeros. Returns ``out [total_q, Hq, D]`` in q's dtype.
    """
    from . import varlen  # imports triton

    _check_qkv(q, k, v, 3, "[total_tokens, heads, head_dim]")
    _check_heads(q.shape[1], k.shape[1])
    cu_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    cu_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device)
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, "
                         f"got {len(cu_q) - 1} and {len(cu_k) - 1}")
    _check_batch(len(cu_q) - 1)
    lens_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    lens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    # The kernel sizes its grid from the true maxima; the arguments are only checked.
    longest_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q, lens_q)
    longest_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k, lens_k)
    _check_tokens("the longest q sequence", longest_q)
    _check_tokens("the longest k sequence", longest_k)
    scale = _resolve_scale(sm_scale, q.shape[-1])
    # The kernels read the offsets as contiguous; the checks above read a strided view correctly.
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        return varlen.run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, longest_q, longest_k,
                                 is_causal=bool(is_causal), sm_scale=scale, smooth_k=bool(smooth_k))


__all__ = ["is_available", "attention", "varlen_attention", "MIN_CAPABILITY", "MAX_HEAD_DIM",
           "MAX_TOKENS", "MIN_CAPABILITY_FP8", "MAX_HEAD_DIM_FP8", "PV_DTYPES"]
