"""torch.compile support: under tracing, `sageattn` is one opaque custom op.

The dispatcher is Python that dynamo cannot trace (package resources, calibration tables, locks,
thread-local bookkeeping), and should not: the backend is a per-call decision, not graph
structure. So while torch.compile traces, `sageattn` calls the custom op `sageattention::sageattn`
instead. Its eager implementation is the normal `sageattn` (dispatch, kernels, fallbacks,
`last_backend`); its fake implementation validates the call exactly as `sageattn` does and gives
the output's shape, so `torch.compile(..., fullgraph=True)` works and bad input still raises the
same ValueError/TypeError while tracing.

Inputs that require grad (with grad mode on) do not go through the op, which defines no
backward: the dispatcher's answer for them is always SDPA (the quantized kernels are forward-only),
or BackendUnavailableError when another backend is forced, so that answer is traced directly:
the call validated by `parse_call` (or the function's own parse), then the SDPA path with its
backward (`grad_sdpa`). `last_backend()` is not updated by it. Arguments whose Python types do
not fit the op's schema take the eager path (which raises the usual error for them).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import numbers
import threading
from typing import Optional

import torch

from .inputs import FLOAT_OVERFLOW_INT, SAGEATTN_KEYWORDS, check_number_tensor, given_scale, numpy_number, parse_call


@torch.library.custom_op("sageattention::sageattn", mutates_args=())
def sageattn_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
                tensor_layout: str, is_causal: bool, sm_scale: Optional[float], return_lse: bool,
                dropout_p: float, enable_gqa: Optional[bool], qk_quant_gran: Optional[str],
                pv_accum_dtype: Optional[str], smooth_k: bool, smooth_v: bool,
                scale_tensor: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    from .core import sageattn

    if scale_tensor is not None:   # a scale that is data (_data_scale): its value checked here
        sm_scale = scale_tensor
    with _running_op():
        result = sageattn(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
                          return_lse=return_lse, **_options(attn_mask, dropout_p, enable_gqa,
                                                            qk_quant_gran, pv_accum_dtype, smooth_k,
                                                            smooth_v))
    out, lse = result if return_lse else (result, None)
    # Outputs are fresh, contiguous tensors in q's layout (what the fake promises).
    out = out.contiguous()
    lse = lse.contiguous() if lse is not None else out.new_empty((0,), dtype=torch.float32)
    return out, lse


@sageattn_op.register_fake
def _sageattn_fake(q, k, v, attn_mask, tensor_layout, is_causal, sm_scale, return_lse, dropout_p,
                   enable_gqa, qk_quant_gran, pv_accum_dtype, smooth_k, smooth_v, scale_tensor):
    if scale_tensor is not None:
        check_number_tensor("sm_scale", scale_tensor)
    call = parse_call(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
                      return_lse=return_lse,
                      options=_options(attn_mask, dropout_p, enable_gqa, qk_quant_gran,
                                       pv_accum_dtype, smooth_k, smooth_v))
    p = call.problem
    out = q.new_empty(q.shape)
    lse = q.new_empty((p.batch, p.q_heads, p.q_len) if return_lse else (0,), dtype=torch.float32)
    return out, lse


# How deep this thread is in the real implementation of one of the ops. torch.compiler.is_compiling()
# (which core._tracing asks) reads a process-wide flag that torch 2.14 holds for a whole compile
# session: while one thread compiles, another running a compiled graph got True inside the op's
# implementation, whose sageattn then called the op again, without end (RecursionError). Inside
# the implementation the call is never traced: it runs eagerly.
_op_depth = threading.local()


@contextlib.contextmanager
def _running_op():
    depth = getattr(_op_depth, "n", 0)
    _op_depth.n = depth + 1
    try:
        yield
    finally:
        _op_depth.n = depth


def _inside_op() -> bool:
    """Whether this thread runs an op's real implementation (not while dynamo traces: there the
    thread-local is not read, so the check adds nothing to the graph and breaks none)."""
    return not torch.compiler.is_dynamo_compiling() and getattr(_op_depth, "n", 0) > 0


def _options(attn_mask, dropout_p, enable_gqa, qk_quant_gran, pv_accum_dtype, smooth_k, smooth_v):
    return {"attn_mask": attn_mask, "dropout_p": dropout_p, "enable_gqa": enable_gqa,
            "qk_quant_gran": qk_quant_gran, "pv_accum_dtype": pv_accum_dtype, "smooth_k": smooth_k,
            "smooth_v": smooth_v}


def _is_number(x) -> bool:
    """A Python int or float that float() takes (of a larger int it raised dynamo's internal
    OverflowError: such a call takes the eager path, which names the problem)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return -FLOAT_OVERFLOW_INT < x < FLOAT_OVERFLOW_INT
    return isinstance(x, float)


# sageattn's keywords that are flags (bool slots of the op's schema).
_FLAG_KEYWORDS = ("enable_gqa", "smooth_k", "smooth_v")


def _flag(value):
    """An int given for a flag as the bool eager code reads it (inputs.check_bool takes any integer:
    is_causal=1 runs causal), so the op's bool slot carries it; anything else unchanged. Without
    it such a call took the eager path, whose dispatcher dynamo cannot trace: under
    fullgraph=True torch.compile failed with "Attempted to call function marked as skipped"."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return bool(value)
    return value


def _data_scale(value) -> torch.Tensor | None:
    """A scale whose value is data to torch.compile, as a 0-d tensor, else None: a tensor (SDPA
    takes a 0-d one), or a numpy float, which dynamo traces as a 0-d array (float() of it is a
    value the trace cannot check). It reaches the op as a tensor and its value is checked when the
    graph runs, as eager code checks it; its shape, dtype and grad while tracing."""
    if isinstance(value, torch.Tensor):
        return value
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        tensor = torch.as_tensor(value)
        if tensor.dtype.is_floating_point:
            return tensor
    return None


def needs_grad(q, k, v, mask=None) -> bool:
    """Whether autograd records this call (the eager dispatcher's `requires_grad`, mask included)."""
    tensors = [t for t in (q, k, v, mask) if isinstance(t, torch.Tensor)]
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def grad_sdpa(call, q, k, v):
    """The dispatcher's choice for a call that needs grad, in a form dynamo traces: SDPA (output
    and backward from torch), or BackendUnavailableError where a quantized backend is forced."""
    from . import core, dispatch

    dispatch.refuse_quantized_forced(dispatch.forced_backend_plain(), "forward only (inputs require grad)",
                                     "run the call without grad")
    # core._empty_result's outputs without its last_backend bookkeeping (thread-local: not traced)
    out, lse = core._empty_outputs(call, q, k, v) if call.problem.empty else core._run_sdpa(call, q, k, v)
    return (out, lse) if call.return_lse else out


def _fits_schema(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, opts) -> bool:
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return False
    mask = opts["attn_mask"]
    checks = (
        isinstance(tensor_layout, str), isinstance(is_causal, bool), isinstance(return_lse, bool),
        sm_scale is None or _is_number(sm_scale), opts["scale"] is None or _is_number(opts["scale"]),
        mask is None or isinstance(mask, torch.Tensor),
        _is_number(opts["dropout_p"]), opts["enable_gqa"] is None or isinstance(opts["enable_gqa"], bool),
        opts["qk_quant_gran"] is None or isinstance(opts["qk_quant_gran"], str),
        opts["pv_accum_dtype"] is None or isinstance(opts["pv_accum_dtype"], str),
        isinstance(opts["smooth_k"], bool), isinstance(opts["smooth_v"], bool),
    )
    return all(checks)


def sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, eager):
    """`sageattn` while torch.compile traces: the custom op, or ``eager()`` when it cannot carry
    the call (see the module docstring)."""
    if _inside_op():
        return eager()
    if any(name not in SAGEATTN_KEYWORDS for name in kwargs):
        return eager()  # it warns about the unknown keyword
    opts = {**SAGEATTN_KEYWORDS, **kwargs}
    scale_tensor = _data_scale(sm_scale) if opts["scale"] is None else \
        _data_scale(opts["scale"]) if sm_scale is None else None
    if scale_tensor is not None:
        check_number_tensor("sm_scale" if sm_scale is not None else "scale", scale_tensor)
        sm_scale = opts["scale"] = None
    # numpy scalars as the Python numbers eager code reads them as (dynamo sees a 0-d ndarray)
    opts = {name: numpy_number(value) for name, value in opts.items()}
    is_causal, sm_scale, return_lse = (numpy_number(x) for x in (is_causal, sm_scale, return_lse))
    is_causal, return_lse = _flag(is_causal), _flag(return_lse)
    opts.update({name: _flag(opts[name]) for name in _FLAG_KEYWORDS})
    if not _fits_schema(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, opts):
        return eager()
    if needs_grad(q, k, v, opts["attn_mask"]):
        if scale_tensor is not None:
            return eager()   # the SDPA path branches on the scale's value (a graph break)
        call = parse_call(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
                          return_lse=return_lse, options=opts)
        return grad_sdpa(call, q, k, v)
    # one scale slot: the aliases merged as sageattn merges them (both given must agree)
    out, lse = sageattn_op(q, k, v, opts["attn_mask"], tensor_layout, is_causal,
                           given_scale(sm_scale, opts["scale"]), return_lse, float(opts["dropout_p"]),
                           opts["enable_gqa"], opts["qk_quant_gran"], opts["pv_accum_dtype"],
                           opts["smooth_k"], opts["smooth_v"], scale_tensor)
    return (out, lse) if return_lse else out


# --- the other five public functions ----------------------------------------------------------
# One op for all of them: which function, its tensors, and every non-tensor parameter any of them
# takes as an optional slot; `names` says which slots the function receives (exactly what the
# caller passed, defaults filled in; comma-separated: op schemas take no list of str), so the
# eager function sees the call it would have seen.

_SLOTS = ("tensor_layout", "quantization_backend", "is_causal", "qk_quant_gran", "sm_scale",
          "pv_accum_dtype", "smooth_k", "smooth_v", "return_lse", "max_seqlen_q", "max_seqlen_k",
          "dropout_p", "enable_gqa", "scale")
_SLOT_TYPES = {"tensor_layout": str, "quantization_backend": str, "is_causal": bool,
               "qk_quant_gran": str, "sm_scale": float, "pv_accum_dtype": str, "smooth_k": bool,
               "smooth_v": bool, "return_lse": bool, "max_seqlen_q": int, "max_seqlen_k": int,
               "dropout_p": float, "enable_gqa": bool, "scale": float}
FUNCTIONS = ("sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp16_cuda",
             "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_varlen")


@torch.library.custom_op("sageattention::call", mutates_args=())
def call_op(function: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            attn_mask: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
            cu_seqlens_k: Optional[torch.Tensor], names: str,
            tensor_layout: Optional[str], quantization_backend: Optional[str],
            is_causal: Optional[bool], qk_quant_gran: Optional[str], sm_scale: Optional[float],
            pv_accum_dtype: Optional[str], smooth_k: Optional[bool], smooth_v: Optional[bool],
            return_lse: Optional[bool], max_seqlen_q: Optional[int], max_seqlen_k: Optional[int],
            dropout_p: Optional[float], enable_gqa: Optional[bool],
            scale: Optional[float], scale_tensor: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    from . import core

    slots = dict(zip(_SLOTS, (tensor_layout, quantization_backend, is_causal, qk_quant_gran, sm_scale,
                              pv_accum_dtype, smooth_k, smooth_v, return_lse, max_seqlen_q,
                              max_seqlen_k, dropout_p, enable_gqa, scale)))
    # "@name": that scale parameter was data (_data_scale), carried in scale_tensor
    kwargs = {name.lstrip("@"): scale_tensor if name.startswith("@") else slots[name]
              for name in names.split(",") if name}
    if attn_mask is not None:
        kwargs["attn_mask"] = attn_mask
    fn = getattr(core, function)
    with _running_op():
        if function == "sageattn_varlen":
            result = fn(q, k, v, cu_seqlens_q, cu_seqlens_k, **kwargs)
        else:
            result = fn(q, k, v, **kwargs)
    out, lse = result if kwargs.get("return_lse") else (result, None)
    out = out.contiguous()
    lse = lse.contiguous() if lse is not None else out.new_empty((0,), dtype=torch.float32)
    return out, lse


@call_op.register_fake
def _call_fake(function, q, k, v, attn_mask, cu_seqlens_q, cu_seqlens_k, names, tensor_layout,
               quantization_backend, is_causal, qk_quant_gran, sm_scale, pv_accum_dtype, smooth_k,
               smooth_v, return_lse, max_seqlen_q, max_seqlen_k, dropout_p, enable_gqa, scale, scale_tensor):
    if scale_tensor is not None:
        check_number_tensor(next(n for n in names.split(",") if n.startswith("@"))[1:], scale_tensor)
    out = q.new_empty(q.shape)
    if function == "sageattn_varlen":  # its offsets are data: checked when the graph runs
        return out, q.new_empty((0,), dtype=torch.float32)
    # The dense checks every function shares; function-specific choices (granularity names,
    # accumulators) are checked by the function itself when the graph runs.
    given = dict(zip(_SLOTS, (tensor_layout, quantization_backend, is_causal, qk_quant_gran,
                              sm_scale, pv_accum_dtype, smooth_k, smooth_v, return_lse, max_seqlen_q,
                              max_seqlen_k, dropout_p, enable_gqa, scale)))
    options = dict(SAGEATTN_KEYWORDS)
    # only what the function takes: a keyword it does not know it ignores (with a warning)
    takes = _takes(function)
    options.update({n: given[n] for n in names.split(",") if n in SAGEATTN_KEYWORDS and n in takes},
                   attn_mask=attn_mask)
    call = parse_call(q, k, v, tensor_layout=tensor_layout or "HND", is_causal=bool(is_causal),
                      sm_scale=sm_scale, return_lse=bool(return_lse), options=options)
    p = call.problem
    lse_shape = (p.batch, p.q_heads, p.q_len) if return_lse else (0,)
    return out, q.new_empty(lse_shape, dtype=torch.float32)


@functools.cache
def _takes(function: str) -> frozenset:
    """The keywords `function` takes: its parameters and the SDPA keywords its **kwargs accept."""
    from . import core

    return frozenset(inspect.signature(getattr(core, function)).parameters) | frozenset(core._SDPA_KEYWORDS)


def _fits(value, kind) -> bool:
    if value is None:
        return True
    if kind is float:
        return _is_number(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def call(function: str, q, k, v, params: dict, kwargs: dict, eager, cu_seqlens=(None, None), parse=None):
    """`function` while torch.compile traces: the custom op, or ``eager()`` when the op cannot carry
    the call (an unknown keyword, a value of a type its slot does not take, or grad without
    `parse`, the function's own validation, which gives the call `grad_sdpa` runs)."""
    if _inside_op():
        return eager()
    params = {**params, **kwargs}
    scale_tensor = None
    data = [name for name in ("sm_scale", "scale") if _data_scale(params.get(name)) is not None]
    if len(data) == 1 and params.get("scale" if data[0] == "sm_scale" else "sm_scale") is None:
        scale_tensor = check_number_tensor(data[0], _data_scale(params.pop(data[0])))
    # numpy scalars as the Python numbers eager code reads them as (dynamo sees a 0-d ndarray)
    params = {name: numpy_number(value) for name, value in params.items()}
    params = {name: _flag(value) if _SLOT_TYPES.get(name) is bool else value for name, value in params.items()}
    mask = params.pop("attn_mask", None)
    tensors = (q, k, v, *(t for t in cu_seqlens if t is not None))
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return eager()
    if mask is not None and not isinstance(mask, torch.Tensor):
        return eager()
    if any(name not in _SLOT_TYPES or not _fits(value, _SLOT_TYPES[name]) for name, value in params.items()):
        return eager()
    if needs_grad(q, k, v, mask):
        # with a scale that is data, the SDPA path branches on its value (a graph break)
        return eager() if parse is None or scale_tensor is not None else grad_sdpa(parse(), q, k, v)
    slots = [params.get(name) for name in _SLOTS]
    slots = [float(x) if _SLOT_TYPES[n] is float and x is not None else x for n, x in zip(_SLOTS, slots)]
    names = [*params, *(f"@{name}" for name in data if scale_tensor is not None)]
    out, lse = call_op(function, q, k, v, mask, cu_seqlens[0], cu_seqlens[1], ",".join(names),
                       *slots, scale_tensor)
    return (out, lse) if params.get("return_lse") else out
