"""The public attention functions: validate -> choose a backend -> run it.

Signatures (names, order, defaults) match the SageAttention 2.2 API. Every call validates its
arguments first (inputs.py), asks dispatch.py for a backend, runs it and records its name for
`last_backend()`. The SDPA fallback is exact PyTorch SDPA, masks, dropout and autograd included.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from . import dispatch
from .backends import MAX_GRID_YZ, MAX_QUANTIZED_SCALE, SDPA, backend
from .dispatch import BackendChoice, log_once, record_backend
from .inputs import (PV_ACCUM_DTYPES_FP8, PV_ACCUM_DTYPES_FP16, QUANTIZATION_BACKENDS, SAGEATTN_KEYWORDS,
                     AttnCall, check_bool, check_choice, check_dropout, check_varlen, parse_call, resolve_sm_scale,
                     split_kwargs)

__all__ = ["sageattn", "sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp16_triton",
           "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_varlen"]

# Upstream's CUDA functions accept these two granularities; per_block is the Triton path's.
CUDA_QK_QUANT_GRANS = ("per_warp", "per_thread")
_SDPA_KEYWORDS = {name: SAGEATTN_KEYWORDS[name] for name in ("attn_mask", "dropout_p", "scale", "enable_gqa")}
# Tried in backends.preference_order(); on a 9.0 GPU the wgmma backend runs when its family is
# installed and provides the options asked for, else the mma.sync one: cuda-sm90-fp16 ("fp32"
# accumulation) else cuda-sm80-fp16; cuda-sm90-fp8 ("fp32+fp32", "fp32") else cuda-sm89-fp8.
_FP16_NATIVE = ("cuda-sm90-fp16", "cuda-sm80-fp16", "cuda-sm75-fp16")
_FP8_NATIVE = ("cuda-sm90-fp8", "cuda-sm89-fp8")

# Saved at import so the SDPA fallback still reaches torch while sdpa_compat patches it.
_torch_sdpa = F.scaled_dot_product_attention


# --- running a choice -----------------------------------------------------------------------

_checked_devices: set = set()
_guard_lock = threading.Lock()


def _check_device_once(device: torch.device) -> None:
    """The build guard must pass before the first native call on each device."""
    index = device.index
    if index is None and device.type == "cuda":
        index = torch.cuda.current_device()
    key = (device.type, index)
    if key in _checked_devices:
        return
    try:
        from sageattention import guard
    except ImportError:  # source checkout without the factory's guard: nothing to check against
        guard = None
    if guard is not None:
        guard.check_device(torch.device(device.type, index) if index is not None else device)
    with _guard_lock:
        _checked_devices.add(key)


def _to_hnd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(1, 2) if layout == "NHD" else t


# Scores the SDPA path's LSE holds at once (fp32 elements, 1 GiB): it takes as many query rows
# per block as fit, at least one.
LSE_SCORE_BUDGET = 1 << 28


# Device types with an autocast in every torch we support. For these torch.amp.is_autocast_available
# is not asked: torch 2.11's dynamo refuses to trace it (fullgraph calls with grad failed on the GPU).
_AUTOCAST_DEVICE_TYPES = ("cuda", "cpu")


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype an enabled torch.autocast of this device type casts to, else None."""
    available = device_type in _AUTOCAST_DEVICE_TYPES or torch.amp.is_autocast_available(device_type)
    if available and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _sdpa_lse(q, k, mask, is_causal: bool, sm_scale: float) -> torch.Tensor:
    """Natural-log LSE of the SDPA scores, HND inputs, in fp32, a block of query rows at a time.
    GQA without copying K per query head: the query heads of one kv head share its K. Under
    torch.autocast too: autocast ran its fp32 products in fp16/bf16 (a bfloat16 LSE on the CPU)."""
    if autocast_dtype(q.device.type) is not None:
        with torch.autocast(q.device.type, enabled=False):
            return _sdpa_lse(q, k, mask, is_causal, sm_scale)
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = hq // hkv
    kt = k.float().transpose(-1, -2)[:, :, None]   # [B, Hkv, 1, D, Nk]
    step = max(1, min(nq, LSE_SCORE_BUDGET // max(1, b * hq * nk)))
    pieces = []
    for r0 in range(0, nq, step):
        qb = q[:, :, r0:r0 + step].float()
        rows = qb.shape[2]   # not -1 in the reshapes: with head dim 0 it is ambiguous
        s = (qb.reshape(b, hkv, group, rows, d) @ kt).reshape(b, hq, rows, nk) * sm_scale
        if is_causal:
            row_ids = torch.arange(r0, r0 + rows, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(nk, device=q.device)[None, :] > row_ids, -math.inf)
        if mask is not None:
            m = mask[..., r0:r0 + step, :] if mask.dim() >= 2 and mask.shape[-2] != 1 else mask
            s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.float()
        pieces.append(torch.logsumexp(s, dim=-1))
    return torch.cat(pieces, dim=-1)


# Scales smaller in magnitude than float32's smallest normal number run as scale 0: the kernels
# and torch's SDPA take the scale as a float32, where 1e-300 is 0 (and torch's CPU SDPA with
# is_causal returned NaN for it, as for 0); times such a scale a score moves its weight by under
# 1e-8 unless |q.k| > 1e30, so equal weights are the same attention in float32.
_TINY_SCALE = torch.finfo(torch.float32).tiny


# Scales above this run the exact softmax below instead of torch's SDPA. SDPA multiplies the
# scale into the scores (on the CPU in float32 for fp16/bf16/fp32 inputs: NaN from about 1e40 on
# for unit-size q and k, and from 1e30 where |q.k| reaches 1e9; float64 inputs past 1.8e308 / |q.k|),
# and the softmax of a row holding inf is NaN. The quantized backends' limit is the same number, so
# every call that falls back for its scale, and only such a call, takes this path.
EXACT_SOFTMAX_SCALE = MAX_QUANTIZED_SCALE


def _exact_softmax_attention(q, k, v, mask, is_causal: bool, scale: float, dropout_p: float, gqa: bool,
                             return_lse: bool):
    """softmax(scale * q.k^T + mask) @ v for a positive scale of any finite size, as (out, lse):
    each row's scores are shifted by their maximum before the scale multiplies them, in float64, so
    nothing overflows: as the scale grows the weights tend to equal ones over the keys that tie
    for the row's maximum. An additive mask enters as mask / scale on the unscaled scores (the same
    row after multiplying). A query row without a visible key gets 0 and LSE -inf. The LSE (float32,
    natural log) is scale * max + log(sum), float32's rounding of the true value: +-inf where that
    is beyond float32's range. Inputs [..., H, N, D] (SDPA's; leading dims broadcast), the query
    heads in groups over the key/value heads where gqa; a block of query rows at a time
    (LSE_SCORE_BUDGET); differentiable, dropout as SDPA's (on the weights, kept ones / (1 - p))."""
    squeeze = q.dim() == 2   # SDPA takes [N, D] too
    if squeeze:
        q, k, v = q[None], k[None], v[None]
    hq, nq, nk = q.shape[-3], q.shape[-2], k.shape[-2]
    hkv = k.shape[-3]
    group = hq // hkv if gqa else 1
    kt = k.double().transpose(-1, -2)
    vd = v.double()
    if group > 1:   # the query heads of one kv head share its K and V, not copied
        kt, vd = kt.unsqueeze(-3), vd.unsqueeze(-3)
    lead = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    rows_total = math.prod(lead) * hq * nk
    step = max(1, min(nq, LSE_SCORE_BUDGET // 2 // max(1, rows_total)))   # float64: half the elements
    outs, lses = [], []
    # at least one block: without queries it gives the empty output and LSE of the right shape
    # (torch.cat of no blocks raised), as torch's SDPA returns them
    for r0 in range(0, max(nq, 1), step):
        qb = q[..., r0:r0 + step, :].double()
        rows = qb.shape[-2]
        if group > 1:
            x = (qb.reshape(*qb.shape[:-3], hkv, group, rows, qb.shape[-1]) @ kt)
            x = x.reshape(*x.shape[:-4], hq, rows, nk)
        else:
            x = qb @ kt
        if is_causal:   # SDPA's: top-left, query i sees keys j <= i
            row_ids = torch.arange(r0, r0 + rows, device=q.device)[:, None]
            x = x.masked_fill(torch.arange(nk, device=q.device)[None, :] > row_ids, -math.inf)
        if mask is not None:
            m = mask[..., r0:r0 + step, :] if mask.dim() >= 2 and mask.shape[-2] != 1 else mask
            x = x.masked_fill(~m, -math.inf) if m.dtype == torch.bool else x + m.double() / scale
        # the shift changes no weight: no gradient; without keys there is no maximum (amax raised)
        top = x.amax(dim=-1, keepdim=True).detach() if nk else x.new_zeros((*x.shape[:-1], 1))
        top = top.masked_fill(top == -math.inf, 0.0)   # a row without keys: every weight exp(-inf) = 0
        weights = torch.exp((x - top) * scale)
        total = weights.sum(dim=-1, keepdim=True)
        p = weights / total.clamp_min(torch.finfo(torch.float64).tiny)   # 0 / tiny = 0 without keys
        if dropout_p > 0:
            p = F.dropout(p, dropout_p)
        if group > 1:
            o = (p.reshape(*p.shape[:-3], hkv, group, rows, nk) @ vd)
            o = o.reshape(*o.shape[:-4], hq, rows, vd.shape[-1])
        else:
            o = p @ vd
        outs.append(o)
        if return_lse:
            lses.append((top * scale + torch.log(total)).squeeze(-1))
    out = torch.cat(outs, dim=-2).to(q.dtype)
    lse = torch.cat(lses, dim=-1).float() if return_lse else None
    if squeeze:
        out = out[0]
        lse = lse[0] if lse is not None else None
    return out, lse


def _positive_scale(q, scale: float):
    """(q, scale) with the same attention and a positive scale, which the quantized kernels take:
    a negative scale is -q with |scale|; a zero (or tiny, _TINY_SCALE) one, every score 0 and
    equal weights, a zero q with 1. The LSE is unchanged too."""
    if scale >= _TINY_SCALE:
        return q, scale
    if scale > -_TINY_SCALE:
        return q * 0.0, 1.0   # not zeros_like: SDPA's autograd still reaches q (a zero gradient)
    return torch.neg(q), -scale


def _without_overlap(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy where two of its elements share memory other than along a stride-0
    (expanded) dim: torch's CPU SDPA read such a q wrongly (torch 2.14: a q whose token, head or
    batch stride is 1 like its head dim's, e.g. as_strided windows over one buffer, gave outputs off
    by 2 to 1e37, float64 too; a contiguous copy of it was right). Expanded dims are read right and
    are kept (a K/V expanded over heads is not copied)."""
    if t.is_contiguous():
        return t
    end = 1   # every dim, innermost first, must step past the extent of the dims inside it
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] > 1 and d[1] != 0),
                               key=lambda d: d[1]):
        if stride < end:
            return t.contiguous()
        end = stride * size
    return t


def _sdpa_kv(k, v, q_heads: int, kv_heads: int):
    """(k, v, enable_gqa) for torch's SDPA on HND tensors with q_heads query heads. SDPA's enable_gqa
    (cuDNN, its default there) returned a wrong output, cosine 0 against fp32, with 65536 or more
    query heads per kv head (torch 2.11, H200: benchmarks/results/h200-2026-12-03-sdpa-gqa.txt); so
    past the grid limit each query head gets its kv head's copy."""
    if q_heads == kv_heads:
        return k, v, False
    if q_heads > MAX_GRID_YZ:
        group = q_heads // kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), False
    return k, v, True


def _run_sdpa(call: AttnCall, q, k, v):
    with _autocast_off(q.device.type):
        return _run_sdpa_as_given(call, q, k, v)


def _run_sdpa_as_given(call: AttnCall, q, k, v):
    p = call.problem
    qh, kh, vh = (q, k, v) if p.tensor_layout == "HND" else (_to_hnd(t, p.tensor_layout) for t in (q, k, v))
    mask = call.attn_mask
    if mask is not None and mask.dtype != torch.bool and mask.dtype != p.dtype:
        if p.dtype == torch.float64:
            # An fp32 additive mask with float64 inputs: the mask widens exactly; running the
            # inputs in fp32 instead would silently lose float64's precision.
            mask = mask.double()
        else:
            # An fp32 additive mask with fp16/bf16 inputs: SDPA in fp32, then back to the input dtype.
            # Passing the pair straight through returned NaN on CUDA (torch 2.11, H200, 2026-12-02).
            qh, kh, vh = qh.float(), kh.float(), vh.float()
    qh, kh, vh = (_without_overlap(t) for t in (qh, kh, vh))
    # torch's SDPA returned NaN/Inf for a zero or negative scale (CUDA; on the CPU with is_causal;
    # torch 2.11 and 2.14), so it gets the same attention with a positive one.
    qh, scale = _positive_scale(qh, call.sm_scale)
    if scale > EXACT_SOFTMAX_SCALE:
        out, lse = _exact_softmax_attention(qh, kh, vh, mask, call.is_causal, scale, call.dropout_p,
                                            gqa=True, return_lse=call.return_lse)
        out = out.to(p.dtype)
        if p.tensor_layout == "NHD":
            out = out.transpose(1, 2).contiguous()
        return out, lse
    kh, vh, gqa = _sdpa_kv(kh, vh, p.q_heads, p.kv_heads)
    out = _torch_sdpa(qh, kh, vh, attn_mask=mask, dropout_p=call.dropout_p, is_causal=call.is_causal,
                      scale=scale, enable_gqa=gqa)
    if out.dtype != p.dtype:  # the fp32 pass for an fp32 additive mask
        out = out.to(p.dtype)
    if mask is not None:
        # A query whose every key is masked gets 0, as from the Triton kernels and torch's CPU SDPA;
        # torch's CUDA kernels have returned NaN there (pytorch/pytorch#103749, #110213).
        visible = mask if mask.dtype == torch.bool else mask != -math.inf
        out = out.masked_fill(~visible.any(dim=-1, keepdim=True), 0)
    if p.tensor_layout == "NHD":
        out = out.transpose(1, 2).contiguous()
    lse = _sdpa_lse(qh, kh, mask, call.is_causal, scale) if call.return_lse else None
    return out, lse


def _run(call: AttnCall, choice: BackendChoice, q, k, v):
    for note in choice.adjustments:
        log_once(f"sageattention: {note}")
    if choice.fallback:
        log_once(f"sageattention falls back to PyTorch SDPA: {choice.reason}")
        out, lse = _run_sdpa(call, q, k, v)
    else:
        with _autocast_off(q.device.type):
            out, lse = _run_quantized(call, choice, q, k, v)
    record_backend(choice.name)
    return (out, lse) if call.return_lse else out


def _autocast_off(device_type: str):
    """torch.autocast of this device type off, where it is on: every backend, the SDPA fallback
    included, computes in q's dtype (and fp32) as written. sageattn is not on autocast's lists, so
    its inputs arrive as given; the fallback's SDPA ran in the autocast dtype eagerly (bfloat16 for
    float32 inputs under CPU autocast) but in q's dtype under torch.compile, whose compiled graph
    runs the custom op with autocast off. Under an enabled autocast the ATen calls inside a custom op are cast
    down too (the dispatcher passes the op through autocast without excluding it there), so the
    native ops' K-smoothing LSE term (glue::add_smoothing_lse, an fp32 at::matmul) would come out
    in bfloat16: shown on the CPU with a Python-registered op; the CUDA ops not yet measured."""
    if autocast_dtype(device_type) is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def _run_quantized(call: AttnCall, choice: BackendChoice, q, k, v):
    row = backend(choice.name)
    # The kernels take any batch/head/token strides but need a unit-stride head dim.
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    q, sm_scale = _positive_scale(q, call.sm_scale)
    if row.kind == "triton":
        from sageattention import triton as triton_backend
        return triton_backend.attention(
            q, k, v, tensor_layout=call.problem.tensor_layout, is_causal=call.is_causal,
            attn_mask=call.attn_mask, sm_scale=sm_scale, smooth_k=call.smooth_k,
            return_lse=call.return_lse, pv_dtype="fp8" if row.op == "qk_int8_pv_fp8" else "fp16")
    _check_device_once(q.device)
    from sageattention import native
    op = getattr(native, row.op)
    head_dim = q.shape[-1]
    width = row.padded_head_dim(head_dim)   # e.g. 96 runs the 128 kernel on zero-padded q, k, v
    if width != head_dim:
        q, k, v = (F.pad(t, (0, width - head_dim)) for t in (q, k, v))
    out, lse = op(q, k, v, family=row.family, tensor_layout=call.problem.tensor_layout,
                  is_causal=call.is_causal, sm_scale=sm_scale,
                  qk_quant_gran=choice.qk_quant_gran, pv_accum_dtype=choice.pv_accum_dtype,
                  smooth_k=call.smooth_k, smooth_v=call.smooth_v, return_lse=call.return_lse)
    if width != head_dim:
        out = out[..., :head_dim].contiguous()
    return out, lse


def _tied(out: torch.Tensor, *sources) -> torch.Tensor:
    """`out`, recorded by autograd against each source that requires grad (a zero gradient), where
    it is not already: as SDPA's output is, so backward() runs and q.grad is zeros, not None. The
    sum of an empty slice adds an exact 0 whatever the source holds (inf and NaN included)."""
    if out.requires_grad or not torch.is_grad_enabled():
        return out
    for t in sources:
        if t is not None and t.requires_grad:
            out = out + t[None, ..., :0].sum()
    return out


def _empty_outputs(call: AttnCall, q, k, v):
    """Nothing to attend over: (zeros of q's shape, LSE of -inf), the LSE None unless asked for.
    With head dim 0 alone, every score is an empty dot product, 0: the LSE is over those."""
    p = call.problem
    out = _tied(torch.zeros_like(q, memory_format=torch.contiguous_format), q, k, v, call.attn_mask)
    if not call.return_lse:
        return out, None
    if p.batch and p.q_heads and p.q_len and p.kv_len:
        lse = _sdpa_lse(_to_hnd(q, p.tensor_layout), _to_hnd(k, p.tensor_layout), call.attn_mask,
                        call.is_causal, call.sm_scale)
    else:
        lse = torch.full((p.batch, p.q_heads, p.q_len), -math.inf, dtype=torch.float32, device=p.device)
    return out, _tied(lse, q, k, v, call.attn_mask)


def _empty_result(call: AttnCall, q, k, v):
    """Nothing to attend over: zeros of q's shape (no keys) or an empty tensor (no queries)."""
    record_backend(None)
    out, lse = _empty_outputs(call, q, k, v)
    return (out, lse) if call.return_lse else out


def _attend(call: AttnCall, q, k, v, *, candidates=None, allow_fallback=True, request=None):
    if call.problem.empty:
        return _empty_result(call, q, k, v)
    choice = dispatch.choose_for_call(call, candidates=candidates, allow_fallback=allow_fallback,
                                      request=request)
    return _run(call, choice, q, k, v)


# A model calls attention with the same few signatures over and over (its layers, every decoding
# step). For a sageattn or native-kernel function call without a mask (or other non-plain
# argument), the validated call and its dispatch request are kept per signature, so a repeat skips
# both (about 15 us of Python per call on the CPU path); the backend is still chosen per call
# (forcing, calibration switches and their variables apply as before).
_plain_calls: dict[tuple, tuple[AttnCall, dispatch.Request]] = {}
_PLAIN_CALLS_KEPT = 1024


# The extra keywords a kept signature may hold, with the value types it takes for each (a mask is a
# tensor, so only its absence).
_PLAIN_KEYWORD_TYPES = {"attn_mask": (type(None),), "dropout_p": (float, int), "scale": (float, type(None)),
                        "enable_gqa": (bool, type(None)), "qk_quant_gran": (str, type(None)),
                        "pv_accum_dtype": (str, type(None)), "smooth_k": (bool,), "smooth_v": (bool,)}


def _plain_keywords(kwargs: dict, known) -> tuple | None:
    """A call's extra keywords as part of its signature, or None where one is not of the plain
    kind: a name the function does not know (its warning comes from the full path), a mask, or a
    value of another type."""
    items = []
    for name, value in kwargs.items():
        kinds = _PLAIN_KEYWORD_TYPES.get(name)
        if kinds is None or name not in known or type(value) not in kinds:
            return None
        items.append((name, value))
    return tuple(sorted(items))


def _plain_signature(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, *options,
                     kwargs: dict | None = None, known=SAGEATTN_KEYWORDS) -> tuple | None:
    """All that validation and request_for read from a call, or None where an argument is not of
    the plain kind (then every check runs, and raises where it should). options: the calling
    function's name and its own arguments (strings and bools); kwargs: its extra keywords, of
    `known`."""
    keywords = _plain_keywords(kwargs, known) if kwargs else ()
    if not (keywords is not None and type(q) is torch.Tensor and type(k) is torch.Tensor
            and type(v) is torch.Tensor and q.layout is k.layout is v.layout is torch.strided
            and not (q.is_nested or k.is_nested or v.is_nested)
            and type(tensor_layout) is str and type(is_causal) is bool
            and type(return_lse) is bool and (sm_scale is None or type(sm_scale) is float)
            and all(type(o) is str or type(o) is bool for o in options)):
        return None
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, grad,
            tensor_layout, is_causal, sm_scale, return_lse, *options, keywords)


def _plain_call(signature, parse) -> tuple[AttnCall, dispatch.Request | None]:
    """The kept (call, request) of `signature`, or parse() validated now and kept; with no
    signature (not a plain call), parse() and no request, every time."""
    if signature is None:
        return parse(), None
    kept = _plain_calls.get(signature)
    if kept is None:
        call = parse()
        kept = (call, dispatch.request_for(call))
        if len(_plain_calls) >= _PLAIN_CALLS_KEPT:
            _plain_calls.clear()
        _plain_calls[signature] = kept
    return kept


# --- the six public functions ---------------------------------------------------------------

def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    """Quantized attention on the best backend for this GPU and build, or exact PyTorch SDPA.

    q `[B, Hq, Nq, D]`, k/v `[B, Hkv, Nk, D]` for tensor_layout="HND" (`[B, N, H, D]` for "NHD");
    Hq a multiple of Hkv. Keywords: SDPA's `attn_mask`, `dropout_p`, `scale` (alias of sm_scale),
    `enable_gqa`; upstream's `qk_quant_gran`, `pv_accum_dtype`, `smooth_k`, `smooth_v`. Causal is
    SDPA's (top-left). Returns the output in q's layout and dtype, or (output, lse) with lse
    `[B, Hq, Nq]` fp32 (natural log) when return_lse. See `explain()` for the backend it runs.
    """
    def parse():
        options = split_kwargs("sageattn", kwargs, SAGEATTN_KEYWORDS)
        return parse_call(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal,
                          sm_scale=sm_scale, return_lse=return_lse, options=options)

    def eager():
        signature = _plain_signature(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs=kwargs)
        call, request = _plain_call(signature, parse)
        return _attend(call, q, k, v, request=request)

    if _tracing(q):  # one opaque custom op, so fullgraph=True traces it
        from . import traced
        return traced.sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, eager)
    return eager()


def sageattn_qk_int8_pv_fp16_triton(q, k, v, tensor_layout="HND", quantization_backend="triton",
                                    is_causal=False, attn_mask=None, sm_scale=None, smooth_k=True,
                                    return_lse=False, **kwargs):
    """INT8 QK / FP16 PV attention on the Triton kernels (which take masks); SDPA where the input
    needs it (CPU, fp32, grad, dropout). `quantization_backend` is accepted for compatibility: the
    Triton backend always quantizes with its own kernels."""
    _check_triton_attn_mask(attn_mask)   # here, not in parse(): while tracing too
    _check_triton_sm_scale(sm_scale)

    def parse():
        check_choice("quantization_backend", quantization_backend, QUANTIZATION_BACKENDS)
        options = split_kwargs("sageattn_qk_int8_pv_fp16_triton", kwargs, _SDPA_KEYWORDS)
        options.update(attn_mask=attn_mask, smooth_k=smooth_k)
        return parse_call(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal,
                          sm_scale=sm_scale, return_lse=return_lse, options=options)

    def eager():
        return _attend(parse(), q, k, v, candidates=("triton-fp16",), allow_fallback=False)

    params = dict(tensor_layout=tensor_layout, quantization_backend=quantization_backend,
                  is_causal=is_causal, attn_mask=attn_mask, sm_scale=sm_scale, smooth_k=smooth_k,
                  return_lse=return_lse)
    return _traceable("sageattn_qk_int8_pv_fp16_triton", q, k, v, params, kwargs, eager, parse=parse)


def _check_triton_attn_mask(attn_mask) -> None:
    """A number, or a 0-d tensor that is not bool, as the Triton function's attn_mask is most likely a
    scale passed by position for upstream's signature, which has no attn_mask: its 7th positional
    parameter is sm_scale. As a mask a 0-d float adds one constant to every score, which changes
    no output: it was taken so, silently."""
    if isinstance(attn_mask, torch.Tensor):
        if attn_mask.dim() != 0 or attn_mask.dtype == torch.bool:
            return
        shown = f"a 0-d {attn_mask.dtype} tensor"
        hint = "sm_scale=<that tensor>"
    elif isinstance(attn_mask, numbers.Real) and not isinstance(attn_mask, bool):
        shown = f"{type(attn_mask).__name__} {attn_mask!r}"
        hint = f"sm_scale={attn_mask!r}"
    else:
        return
    raise TypeError(f"attn_mask (7th positional parameter here; upstream SageAttention's 7th is sm_scale) "
                    f"must be a bool or additive mask tensor of at least one dim, or None, got {shown}; "
                    f"for a softmax scale pass {hint} by keyword")


def _check_triton_sm_scale(sm_scale) -> None:
    """A bool as the Triton function's sm_scale is most likely upstream's positional order again:
    after our attn_mask (7th) everything shifts by one, so upstream's 8th positional argument,
    smooth_k, lands on sm_scale (and its 9th, return_lse, on smooth_k). check_scale refused it as
    "must be a real number", which named neither the shift nor the fix."""
    if not isinstance(sm_scale, bool) and not (type(sm_scale).__module__ == "numpy"
                                                and type(sm_scale).__name__ in ("bool", "bool_")):
        return
    raise TypeError(f"sm_scale (8th positional parameter here, after attn_mask; upstream SageAttention's 8th "
                    f"is smooth_k, its 9th return_lse) must be a real number or None, got bool {sm_scale!r}; "
                    f"pass smooth_k=... and return_lse=... by keyword")


def _tracing(q) -> bool:
    """Whether the call is traced rather than run: under torch.compile, or on fake tensors
    (FakeTensorMode), which the custom ops' fake implementations give their shapes. The dispatcher
    would ask the driver for the device (none on a machine without a GPU), varlen would read the
    offsets' values and the kernels their data."""
    return torch.compiler.is_compiling() or isinstance(q, FakeTensor)


def _traceable(name, q, k, v, params: dict, kwargs: dict, eager, cu_seqlens=(None, None), parse=None):
    """``eager()``, or while torch.compile traces, one opaque custom op that runs it, or for inputs
    that need grad, the SDPA path on the call ``parse()`` validates (traced.py)."""
    if _tracing(q):
        from . import traced
        return traced.call(name, q, k, v, params, kwargs, eager, cu_seqlens, parse)
    return eager()


def _cuda_function(name, candidates, accum_choices, q, k, v, tensor_layout, is_causal, qk_quant_gran,
                   sm_scale, pv_accum_dtype, smooth_k, smooth_v, return_lse, kwargs, *,
                   takes_smooth_v=True):
    def parse():
        check_choice("qk_quant_gran", qk_quant_gran, CUDA_QK_QUANT_GRANS)
        check_choice("pv_accum_dtype", pv_accum_dtype, accum_choices)
        options = split_kwargs(name, kwargs, _SDPA_KEYWORDS)
        options.update(qk_quant_gran=qk_quant_gran, pv_accum_dtype=pv_accum_dtype,
                       smooth_k=smooth_k, smooth_v=smooth_v)
        return parse_call(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal,
                          sm_scale=sm_scale, return_lse=return_lse, options=options)

    def eager():
        signature = _plain_signature(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, name, qk_quant_gran,
                                     pv_accum_dtype, smooth_k, smooth_v, kwargs=kwargs, known=_SDPA_KEYWORDS)
        call, request = _plain_call(signature, parse)
        return _attend(call, q, k, v, candidates=candidates, allow_fallback=False, request=request)

    params = dict(tensor_layout=tensor_layout, is_causal=is_causal, qk_quant_gran=qk_quant_gran,
                  sm_scale=sm_scale, pv_accum_dtype=pv_accum_dtype, smooth_k=smooth_k,
                  return_lse=return_lse)
    if takes_smooth_v:
        params["smooth_v"] = smooth_v
    return _traceable(name, q, k, v, params, kwargs, eager, parse=parse)


def sageattn_qk_int8_pv_fp16_cuda(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                  sm_scale=None, pv_accum_dtype="fp32", smooth_k=True, smooth_v=False,
                                  return_lse=False, **kwargs):
    """INT8 QK / FP16 PV attention on the native CUDA kernels: the sm90 family (wgmma, compute
    capability 9.0 only) for "fp32" accumulation, else the sm80 family, else the sm75 family.

    pv_accum_dtype: "fp32", "fp16+fp32" (fp16 inside a K block, fp32 across) or "fp16". Where the
    installed family lacks the granularity or accumulator asked for, its own is used and a warning
    is logged once. No compiled family for this GPU: BackendUnavailableError naming what the build
    contains. Inputs that need SDPA (mask, CPU, fp32, grad, dropout) fall back with a logged reason.
    """
    return _cuda_function("sageattn_qk_int8_pv_fp16_cuda", _FP16_NATIVE, PV_ACCUM_DTYPES_FP16, q, k, v,
                          tensor_layout, is_causal, qk_quant_gran, sm_scale, pv_accum_dtype, smooth_k,
                          smooth_v, return_lse, kwargs)


def sageattn_qk_int8_pv_fp8_cuda(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                 sm_scale=None, pv_accum_dtype="fp32+fp16", smooth_k=True, smooth_v=False,
                                 return_lse=False, **kwargs):
    """INT8 QK / FP8 (e4m3) PV attention on the native CUDA kernels: the sm90_fp8 family (wgmma,
    compute capability 9.0 only) for "fp32+fp32" and "fp32" accumulation, else the sm89 family
    (sm89 and sm90 GPUs).

    pv_accum_dtype: "fp32+fp16" (sm89 family only), "fp32+fp32" (two-level) or "fp32". Errors and
    fallbacks as sageattn_qk_int8_pv_fp16_cuda.
    """
    return _cuda_function("sageattn_qk_int8_pv_fp8_cuda", _FP8_NATIVE, PV_ACCUM_DTYPES_FP8, q, k, v,
                          tensor_layout, is_causal, qk_quant_gran, sm_scale, pv_accum_dtype, smooth_k,
                          smooth_v, return_lse, kwargs)


def sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout="HND", is_causal=False,
                                      qk_quant_gran="per_thread", sm_scale=None, pv_accum_dtype="fp32+fp32",
                                      smooth_k=True, return_lse=False, **kwargs):
    """Upstream's sm90 entry point: INT8 QK / FP8 PV on the sm90_fp8 family (wgmma, compute
    capability 9.0 only) for "fp32+fp32" and "fp32" accumulation, else on the sm89 family, which
    serves sm90 too and also takes "fp32+fp16". Errors and fallbacks as
    sageattn_qk_int8_pv_fp8_cuda."""
    return _cuda_function("sageattn_qk_int8_pv_fp8_cuda_sm90", _FP8_NATIVE, PV_ACCUM_DTYPES_FP8, q, k, v,
                          tensor_layout, is_causal, qk_quant_gran, sm_scale, pv_accum_dtype, smooth_k,
                          False, return_lse, kwargs, takes_smooth_v=False)


def sageattn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                    sm_scale=None, smooth_k=True, **kwargs):
    """Attention over packed sequences: q `[total_q, Hq, D]`, k/v `[total_k, Hkv, D]`, sequence i
    being rows `cu_seqlens[i]:cu_seqlens[i+1]` (int32 or int64 offsets, on q's device or the CPU;
    max_seqlen_q/k at least the longest sequence). Runs the Triton varlen kernel where it can, else
    SDPA per sequence (also past 2**31 - 1 packed tokens). Causal is top-left within each sequence
    (SDPA's is_causal). Keywords: SDPA's `scale`, `dropout_p` and `enable_gqa`; `attn_mask` and
    `return_lse=True` are refused. The offsets are read on the host: no CUDA graph capture."""
    params = dict(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, is_causal=is_causal,
                  sm_scale=sm_scale, smooth_k=smooth_k)
    return _traceable("sageattn_varlen", q, k, v, params, kwargs,
                      lambda: _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      is_causal, sm_scale, smooth_k, kwargs),
                      (cu_seqlens_q, cu_seqlens_k))


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, sm_scale,
            smooth_k, kwargs):
    # SDPA's keywords that change the result are honoured or refused, never dropped with a warning;
    # so is the dense functions' return_lse, which would change what the call returns.
    options = split_kwargs("sageattn_varlen", kwargs, {"scale": None, "attn_mask": None, "dropout_p": 0.0,
                                                       "enable_gqa": None, "return_lse": False})
    if options["attn_mask"] is not None:
        raise ValueError("sageattn_varlen() takes no attn_mask: cu_seqlens_q/cu_seqlens_k keep the sequences "
                         "apart and is_causal=True masks within each; for another mask, call sageattn per "
                         "sequence with attn_mask=...")
    if check_bool("return_lse", options["return_lse"]):
        raise ValueError("sageattn_varlen() returns no LSE (return_lse=True): it returns the output alone, "
                         "as upstream's does; for the LSE, call sageattn per sequence with return_lse=True")
    dropout_p = check_dropout(options["dropout_p"])
    enable_gqa = options["enable_gqa"]
    if isinstance(q, torch.Tensor) and q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # the offsets are read on the host (checked, and the launch sized by the longest sequence),
        # which a capturing stream refuses with a CUDA error that names none of this
        raise RuntimeError("sageattn_varlen() cannot be captured in a CUDA graph: it reads cu_seqlens_q/"
                           "cu_seqlens_k on the host to check them and size its launch; capture the dense "
                           "sageattn (padded batch), or call sageattn_varlen outside the graph")
    problem = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           enable_gqa=None if enable_gqa is None else check_bool("enable_gqa", enable_gqa))
    is_causal = check_bool("is_causal", is_causal)
    smooth_k = check_bool("smooth_k", smooth_k)
    scale = resolve_sm_scale(sm_scale, options["scale"], problem.head_dim)
    req = dispatch.Request(device_type=problem.device.type,
                           capability=dispatch.device_capability(problem.device), dtype=problem.dtype,
                           head_dim=problem.head_dim, requires_grad=problem.requires_grad, dropout=dropout_p > 0,
                           batch=len(problem.q_offsets) - 1, q_heads=problem.q_heads,
                           seq_q=problem.longest_q, seq_k=problem.longest_k,
                           scale_magnitude=dispatch.scale_magnitude(scale))
    if q.numel() == 0:   # no queries, no heads or head dim 0: nothing to attend over (as dense
        record_backend(None)   # sageattn, before any backend is chosen: a forced one included)
        return _tied(torch.zeros_like(q), q, k, v)
    forced = dispatch.forced_backend()
    choice = dispatch.choose(req, dispatch.current_inventory(problem.device), candidates=("triton-fp16",),
                             allow_fallback=True, forced=forced)
    too_big = None if choice.fallback else _past_varlen_kernel_index(q, k)
    if too_big is not None:
        if forced is not None:
            raise dispatch.BackendUnavailableError(f"backend {forced!r} is forced but cannot run this call: "
                                                   f"{too_big}")
        choice = BackendChoice(SDPA, f"triton-fp16: {too_big}", True)
    q, scale = _positive_scale(q, scale)   # for the kernel and for SDPA alike
    if not choice.fallback:
        from sageattention import triton as triton_backend
        # The kernel reads int32 offsets on q's device and takes Python ints; check_varlen also
        # accepts int64 or CPU offsets and numpy integers (a no-op for int32 offsets on q's device).
        cu_q, cu_k = (cu.to(device=q.device, dtype=torch.int32) for cu in (cu_seqlens_q, cu_seqlens_k))
        out = triton_backend.varlen_attention(
            q, k, v, cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k), is_causal=is_causal,
            sm_scale=scale, smooth_k=smooth_k)
        record_backend(choice.name)
        return out
    log_once(f"sageattention falls back to PyTorch SDPA: {choice.reason}")
    # Each sequence's output comes in q's dtype (a query with no keys gets zeros), as the kernel's
    # and dense sageattn's, with autocast off: under it SDPA returned the autocast dtype, and a
    # torch.cat of the pieces raised "Unexpected floating ScalarType" (fp16 with bf16).
    with _autocast_off(q.device.type):
        out = _varlen_sdpa(q, k, v, problem, dropout_p, is_causal, scale)
    record_backend(SDPA)
    return _tied(out, q, k, v)   # every sequence without keys: still recorded


# The Triton varlen path takes int32 offsets (cu_seqlens as int32: int64 ones past this wrapped): a
# call with more packed tokens runs SDPA.
VARLEN_KERNEL_INDEX_LIMIT = 2**31 - 1


def _past_varlen_kernel_index(q, k) -> str | None:
    """Why the Triton varlen kernel cannot index this call (VARLEN_KERNEL_INDEX_LIMIT), or None."""
    limit = VARLEN_KERNEL_INDEX_LIMIT
    tokens = max(q.shape[0], k.shape[0])
    if tokens > limit:
        return f"{tokens} packed tokens exceed the {limit} its 32-bit offsets (cu_seqlens as int32) hold"
    return None


def _varlen_sdpa(q, k, v, problem, dropout_p, is_causal, scale) -> torch.Tensor:
    """SDPA per sequence, as a contiguous tensor of q's shape and dtype (the kernel's), zeros for
    queries without keys; the exact softmax for a scale above EXACT_SOFTMAX_SCALE (a positive one:
    _positive_scale). With grad, the inputs are split and the outputs concatenated by one op each:
    a slice and a write per sequence made backward build a gradient of the whole q, k, v and output
    once per sequence, quadratic in the sequence count (CPU, 2000 sequences of 8 tokens: backward
    47 s, forward 0.4 s). Without grad each output is written into one buffer (no second copy)."""
    q, k, v = (_without_overlap(t) for t in (q, k, v))
    pieces = [] if problem.requires_grad else None
    out = None if problem.requires_grad else torch.zeros_like(q, memory_format=torch.contiguous_format)
    offsets_q, offsets_k = problem.q_offsets, problem.k_offsets
    lens_q = [b - a for a, b in zip(offsets_q, offsets_q[1:])]
    lens_k = [b - a for a, b in zip(offsets_k, offsets_k[1:])]
    for q0, qs, ks, vs in zip(offsets_q, q.split(lens_q), k.split(lens_k), v.split(lens_k)):
        if qs.shape[0] == 0:
            continue
        if ks.shape[0] == 0:
            if pieces is not None:
                pieces.append(q.new_zeros(qs.shape))
            continue
        q1 = q0 + qs.shape[0]
        qs, ks, vs = (t.transpose(0, 1)[None] for t in (qs, ks, vs))
        if scale > EXACT_SOFTMAX_SCALE:
            o, _ = _exact_softmax_attention(qs, ks, vs, None, is_causal, scale, dropout_p, gqa=True,
                                            return_lse=False)
        else:
            ks, vs, gqa = _sdpa_kv(ks, vs, problem.q_heads, problem.kv_heads)
            o = _torch_sdpa(qs, ks, vs, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=gqa)
        if pieces is not None:
            pieces.append(o[0].transpose(0, 1).to(q.dtype))
        else:
            out[q0:q1] = o[0].transpose(0, 1)
    # q has tokens here (_varlen returns before for none): at least one piece
    return out if pieces is None else torch.cat(pieces)

