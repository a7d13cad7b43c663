"""Argument validation for the public API: every bad input fails here, before any kernel launch.

Each check raises ValueError (bad value or shape) or TypeError (bad type or dtype) with a message
that names the argument, what it was, and what is accepted.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import warnings
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor

TENSOR_LAYOUTS = ("HND", "NHD")
QK_QUANT_GRANS = ("per_block", "per_warp", "per_thread")
PV_ACCUM_DTYPES_FP16 = ("fp32", "fp16+fp32", "fp16")
PV_ACCUM_DTYPES_FP8 = ("fp32+fp16", "fp32+fp32", "fp32")
PV_ACCUM_DTYPES = tuple(dict.fromkeys(PV_ACCUM_DTYPES_FP16 + PV_ACCUM_DTYPES_FP8))
QUANTIZATION_BACKENDS = ("triton", "cuda")
# float8 and other exotic floats pass dtype.is_floating_point but SDPA cannot take them.
INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_warned_kwargs: set[tuple[str, str]] = set()  # (function, keyword): each function says what it ignores


@dataclass(frozen=True)
class AttnProblem:
    """The validated shape of one attention call, always described in HND terms."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    tensor_layout: str
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    @property
    def empty(self) -> bool:
        return self.batch == 0 or self.q_heads == 0 or self.q_len == 0 or self.kv_len == 0 \
            or self.head_dim == 0


def check_choice(name: str, value, accepted) -> str:
    """Return value if it is one of the accepted strings, else raise naming them all."""
    if not isinstance(value, str) or value not in accepted:
        listed = ", ".join(repr(a) for a in accepted)
        shown = repr(value) if isinstance(value, (str, int, float, type(None))) else f"<{type(value).__name__}>"
        raise ValueError(f"{name}={shown} is not accepted; use one of: {listed}")
    return value


def _type_name(value) -> str:
    """A value's type as a user would look it up: `numpy.bool`, not `bool`, for numpy's."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def check_bool(name: str, value) -> bool:
    """Python and numpy bools and integers, never floats, strings or tensors."""
    kind = type(value)
    if isinstance(value, numbers.Integral) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {_type_name(value)}")


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _caller_stacklevel() -> int:
    """The warnings.warn stacklevel (from the function calling this one) of the first frame
    outside this package: the user's line that called sageattention."""
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def split_kwargs(func_name: str, kwargs: dict, known: dict) -> dict:
    """Return the known keywords (defaults filled in); warn once per function and unknown keyword
    name (the functions accept different keywords: one's warning says nothing of another's)."""
    resolved = dict(known)
    for name, value in kwargs.items():
        if name in known:
            resolved[name] = value
        elif (func_name, name) not in _warned_kwargs:
            _warned_kwargs.add((func_name, name))
            warnings.warn(f"{func_name}() ignores the unknown keyword argument {name!r}; accepted extra "
                          f"keywords are: {', '.join(sorted(known))}", UserWarning,
                          stacklevel=_caller_stacklevel())
    return resolved


def _check_one_device_and_dtype(q, k, v) -> None:
    """q, k and v share one device and one floating-point dtype (dense and varlen alike)."""
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in INPUT_DTYPES:
        accepted = ", ".join(str(d).removeprefix("torch.") for d in INPUT_DTYPES)
        raise TypeError(f"q, k, v must be floating point ({accepted}), got {q.dtype}")


def _check_tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_type_name(t)}")
    # Checked before any shape is read: a nested tensor has no sizes, and sparse or mkldnn ones
    # fail deep inside the kernels and SDPA with messages that do not name the argument.
    if t.is_nested:
        raise TypeError(f"{name} is a nested tensor, which is not accepted; pass dense (strided) "
                        "tensors, or pack variable-length sequences for sageattn_varlen "
                        "(tokens concatenated, with cu_seqlens)")
    if t.layout is not torch.strided:
        raise TypeError(f"{name} must be a dense (torch.strided) tensor, got layout {t.layout}")
    return t


def check_head_groups(hq: int, hkv: int, enable_gqa: bool | None = None) -> None:
    """GQA/MQA: the query heads come in groups of equal size, one per key/value head (no heads at
    all is an empty call, not an error); enable_gqa=False (SDPA's keyword) forbids Hq != Hkv."""
    if hkv == 0 and hq != 0 or hkv and hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv}) for GQA/MQA")
    if enable_gqa is False and hq != hkv:
        raise ValueError(f"enable_gqa=False but query heads ({hq}) != key/value heads ({hkv}); "
                         "pass enable_gqa=True (or omit it) for GQA/MQA")


def check_qkv(q, k, v, tensor_layout: str, *, enable_gqa: bool | None = None) -> AttnProblem:
    """Validate 4-D q/k/v in `tensor_layout`; enable_gqa=False (SDPA's keyword) forbids Hq != Hkv."""
    if isinstance(tensor_layout, torch.Tensor):
        raise ValueError("tensor_layout (sageattn's 4th positional argument) got a tensor; pass a mask as "
                         "attn_mask=..., or use sageattention.scaled_dot_product_attention for SDPA's "
                         "positional order")
    check_choice("tensor_layout", tensor_layout, TENSOR_LAYOUTS)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
        if t.dim() != 4:
            axes = "[batch, heads, tokens, head_dim]" if tensor_layout == "HND" else \
                "[batch, tokens, heads, head_dim]"
            raise ValueError(f"{name} must be 4-D {axes} for tensor_layout={tensor_layout!r}, "
                             f"got shape {tuple(t.shape)}")
    _check_one_device_and_dtype(q, k, v)
    h_ax, n_ax = (1, 2) if tensor_layout == "HND" else (2, 1)
    qs, ks, vs = q.shape, k.shape, v.shape   # read once: each .shape builds a new torch.Size
    b, hq, nq, d = qs[0], qs[h_ax], qs[n_ax], qs[3]
    hkv, nk = ks[h_ax], ks[n_ax]
    if ks[0] != b or vs[0] != b:
        raise ValueError(f"batch sizes differ: q {b}, k {ks[0]}, v {vs[0]}")
    if ks[3] != d or vs[3] != d:
        raise ValueError(f"head dims differ: q {d}, k {ks[3]}, v {vs[3]} (they must be equal)")
    if vs[n_ax] != nk:
        raise ValueError(f"k and v token counts differ: k {nk}, v {vs[n_ax]}")
    if vs[h_ax] != hkv:
        raise ValueError(f"k and v head counts differ: k {hkv}, v {vs[h_ax]}")
    check_head_groups(hq, hkv, enable_gqa)
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return AttnProblem(b, hq, hkv, nq, nk, d, tensor_layout, q.dtype, q.device, requires_grad)


# The refusal of an additive mask holding NaN or +inf (here, and the Triton kernels' own check).
ADDITIVE_MASK_NAN = ("attn_mask (additive) contains NaN or +inf; SDPA returns NaN for such rows. "
                     "Use -inf (or False in a bool mask) to hide a key, finite values otherwise")


def _values_unreadable(t: torch.Tensor) -> bool:
    """Whether t's values cannot be read on the host now: while torch.compile traces or on fake or
    meta tensors (no data), or while a CUDA graph is being captured (no synchronisation allowed)."""
    return (torch.compiler.is_compiling() or isinstance(t, FakeTensor) or t.device.type == "meta"
            or (t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()))


def _check_additive_values(mask: torch.Tensor) -> None:
    """An additive mask holding NaN or +inf makes SDPA return NaN for its rows: refused here, on every
    path (the Triton kernels refused it already while the SDPA fallback returned NaN for the same
    call, so the answer depended on the GPU and the installed build). One host read of a flag;
    skipped where values cannot be read (_values_unreadable)."""
    if mask.numel() == 0 or _values_unreadable(mask):
        return
    if bool((torch.isnan(mask) | (mask == math.inf)).any()):
        raise ValueError(ADDITIVE_MASK_NAN)


def check_mask(attn_mask, problem: AttnProblem, is_causal: bool):
    """Validate an SDPA-style mask: bool (True = attend) or additive float, broadcastable to
    [batch, q_heads, q_len, kv_len] (HND terms, whatever the tensor_layout)."""
    if attn_mask is None:
        return None
    _check_tensor("attn_mask", attn_mask)
    if is_causal:
        raise ValueError("attn_mask and is_causal=True cannot be combined (as in SDPA); "
                         "fold the causal pattern into the mask instead")
    additive = tuple(dict.fromkeys((problem.dtype, torch.float32)))
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in additive:
        raise TypeError(f"attn_mask dtype {attn_mask.dtype} is not accepted; use torch.bool (True = attend) "
                        f"or an additive {' or '.join(map(str, additive))} mask")
    if attn_mask.device != problem.device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but q is on {problem.device}")
    target = (problem.batch, problem.q_heads, problem.q_len, problem.kv_len)
    try:
        ok = attn_mask.dim() <= 4 and torch.broadcast_shapes(attn_mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"[batch, q_heads, q_len, kv_len] = {list(target)}")
    if attn_mask.dtype != torch.bool:
        _check_additive_values(attn_mask)
    while attn_mask.dim() < 2:   # a [kv_len] or scalar mask: torch's SDPA indexes dim -2 (IndexError)
        attn_mask = attn_mask.unsqueeze(0)
    return attn_mask


def numpy_number(value):
    """A numpy scalar (np.float32(0.1), np.int64(2), np.bool_) or 0-d array as the Python float, int
    or bool it holds; anything else unchanged. torch.compile sees a numpy scalar as a 0-d ndarray,
    which is no numbers.Real and has no dtype to ask, so it is read through torch.as_tensor: the
    same number traced as run eagerly (where numpy's floats and ints are numbers.Real already)."""
    if type(value).__module__ != "numpy" or isinstance(value, numbers.Number) \
            or getattr(value, "ndim", None) != 0:
        return value
    kind = torch.as_tensor(value).dtype
    if kind == torch.bool:
        return bool(value)
    if kind.is_complex:
        return value
    return float(value) if kind.is_floating_point else int(value)


def check_number_tensor(name: str, value: torch.Tensor, accepted: str = "a real number, None") -> torch.Tensor:
    """A tensor given for a number: 0-d, real, without grad (its value is read where it is used)."""
    if value.dim() != 0 or value.requires_grad or value.dtype == torch.bool or value.dtype.is_complex:
        grad = ", requiring grad" if value.requires_grad else ""
        raise TypeError(f"{name} must be {accepted} or a 0-d real tensor without grad, got a tensor of "
                        f"shape {tuple(value.shape)} ({value.dtype}{grad})")
    return value


def _tensor_number(name: str, value, accepted: str):
    """value, or the value of a 0-d real tensor without grad, which torch's SDPA takes for its float
    arguments (a model may keep its scale or dropout in a buffer), or of a numpy scalar."""
    if not isinstance(value, torch.Tensor):
        return numpy_number(value)
    return check_number_tensor(name, value, accepted).item()


# The smallest int whose float() overflows (it rounds up to 2**1024): compared before converting,
# because under torch.compile float() of a larger int raised dynamo's internal OverflowError.
FLOAT_OVERFLOW_INT = 2 ** 1024 - 2 ** 970


def check_scale(name: str, value) -> float | None:
    """A scale argument (a real number or a 0-d tensor) as a finite float, or None."""
    value = _tensor_number(name, value, "a real number, None")
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a real number or None, got {_type_name(value)}")
    if value is None:
        return None
    if isinstance(value, int) and not -FLOAT_OVERFLOW_INT < value < FLOAT_OVERFLOW_INT:
        raise ValueError(f"{name} must be finite, got a number too large for a float")
    try:
        number = float(value)
    except OverflowError:   # an int (or Fraction) past float's range
        raise ValueError(f"{name} must be finite, got a number too large for a float") from None
    # Comparisons, not math.isfinite: torch.compile traces them for a symbolic (dynamic) scale.
    if number != number or abs(number) == math.inf:
        raise ValueError(f"{name} must be finite, got {value}")
    return number


def given_scale(sm_scale, scale) -> float | None:
    """The scale a call gives, as a float, or None: sm_scale and SDPA's `scale` are aliases; both
    given and different is an error."""
    sm_scale, scale = check_scale("sm_scale", sm_scale), check_scale("scale", scale)
    if sm_scale is not None and scale is not None and sm_scale != scale:
        raise ValueError(f"sm_scale={sm_scale} and scale={scale} disagree; pass one of them")
    return sm_scale if sm_scale is not None else scale


def resolve_sm_scale(sm_scale, scale, head_dim: int) -> float:
    """The call's scale (given_scale), else the default 1/sqrt(head_dim)."""
    chosen = given_scale(sm_scale, scale)
    return chosen if chosen is not None else (head_dim ** -0.5 if head_dim else 1.0)


def check_dropout(dropout_p) -> float:
    dropout_p = _tensor_number("dropout_p", dropout_p, "a float")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {_type_name(dropout_p)}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")
    return float(dropout_p)


def _check_cu_seqlens(name: str, cu, total: int, device: torch.device, packed: str) -> list[int]:
    """The offsets of `cu` as a list; `packed` names the tensor whose tokens they split."""
    _check_tensor(name, cu)
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be a 1-D tensor [batch + 1] of offsets, got shape {tuple(cu.shape)}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be torch.int32 (or int64), got {cu.dtype}")
    if cu.device.type != "cpu" and cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; put it on q's device or the CPU")
    offsets = cu.tolist()
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    # The first offending pair only: the whole list of a large batch made a message of megabytes.
    for i in range(1, len(offsets)):
        if offsets[i] < offsets[i - 1]:
            raise ValueError(f"{name} must be non-decreasing, but {name}[{i}] = {offsets[i]} < "
                             f"{name}[{i - 1}] = {offsets[i - 1]}")
    if offsets[-1] != total:
        raise ValueError(f"{name} must end at the total token count {total} ({packed}.shape[0]), "
                         f"got {offsets[-1]}")
    return offsets


@dataclass(frozen=True)
class VarlenProblem:
    q_offsets: tuple[int, ...]
    k_offsets: tuple[int, ...]
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    longest_q: int   # the longest sequence of each side (the dispatcher's per-sequence limits)
    longest_k: int


def longest_sequence(offsets) -> int:
    """The longest sequence of a varlen batch, from its cumulative offsets."""
    return max((b - a for a, b in zip(offsets, offsets[1:])), default=0)


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                 enable_gqa: bool | None = None) -> VarlenProblem:
    """Validate packed varlen inputs: q `[total_q, Hq, D]`, k/v `[total_k, Hkv, D]`; enable_gqa as
    check_qkv's."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [total_tokens, heads, head_dim] for sageattn_varlen, "
                             f"got shape {tuple(t.shape)}")
    _check_one_device_and_dtype(q, k, v)
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    hq, d, hkv = q.shape[1], q.shape[2], k.shape[1]
    if k.shape[2] != d:
        raise ValueError(f"head dims differ: q {d}, k/v {k.shape[2]}")
    check_head_groups(hq, hkv, enable_gqa)
    q_off = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device, "q")
    k_off = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device, "k")
    if len(q_off) != len(k_off):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k describe different batch sizes: "
                         f"{len(q_off) - 1} vs {len(k_off) - 1}")
    longest_q, longest_k = longest_sequence(q_off), longest_sequence(k_off)
    for name, limit, longest in (("max_seqlen_q", max_seqlen_q, longest_q), ("max_seqlen_k", max_seqlen_k, longest_k)):
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {_type_name(limit)}")
        if limit < longest:
            raise ValueError(f"{name}={limit} is smaller than the longest sequence ({longest}); pass at "
                             f"least {longest} (a larger value is accepted: it is only an upper bound)")
    requires_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return VarlenProblem(tuple(q_off), tuple(k_off), hq, hkv, d, q.dtype, q.device, requires_grad,
                         longest_q, longest_k)


# SDPA's keywords (honoured, never dropped) and upstream's tuning keywords that sageattn accepts.
SAGEATTN_KEYWORDS = {"attn_mask": None, "dropout_p": 0.0, "scale": None, "enable_gqa": None,
                     "qk_quant_gran": None, "pv_accum_dtype": None, "smooth_k": True, "smooth_v": False}


@dataclass(frozen=True, eq=False)
class AttnCall:
    """One validated attention call: the problem plus every resolved option."""

    problem: AttnProblem
    is_causal: bool
    sm_scale: float
    return_lse: bool
    attn_mask: torch.Tensor | None
    dropout_p: float
    qk_quant_gran: str | None      # None: the backend's default
    pv_accum_dtype: str | None     # None: the backend's default
    smooth_k: bool
    smooth_v: bool


def parse_call(q, k, v, *, tensor_layout, is_causal, sm_scale, return_lse, options: dict,
               qk_quant_grans=QK_QUANT_GRANS, pv_accum_dtypes=PV_ACCUM_DTYPES) -> AttnCall:
    """Validate everything about a dense attention call; `options` holds SAGEATTN_KEYWORDS."""
    enable_gqa = options.get("enable_gqa")
    if enable_gqa is not None:
        enable_gqa = check_bool("enable_gqa", enable_gqa)
    problem = check_qkv(q, k, v, tensor_layout, enable_gqa=enable_gqa)
    is_causal = check_bool("is_causal", is_causal)
    return_lse = check_bool("return_lse", return_lse)
    mask = check_mask(options.get("attn_mask"), problem, is_causal)
    gran = options.get("qk_quant_gran")
    if gran is not None:
        check_choice("qk_quant_gran", gran, qk_quant_grans)
    accum = options.get("pv_accum_dtype")
    if accum is not None:
        check_choice("pv_accum_dtype", accum, pv_accum_dtypes)
    return AttnCall(
        problem=problem, is_causal=is_causal,
        sm_scale=resolve_sm_scale(sm_scale, options.get("scale"), problem.head_dim),
        return_lse=return_lse, attn_mask=mask, dropout_p=check_dropout(options.get("dropout_p", 0.0)),
        qk_quant_gran=gran, pv_accum_dtype=accum,
        smooth_k=check_bool("smooth_k", options.get("smooth_k", True)),
        smooth_v=check_bool("smooth_v", options.get("smooth_v", False)))
