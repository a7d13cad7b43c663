"""Pure-PyTorch reference of the SageAttention 2 algorithm: the oracle every kernel is checked against.

It reproduces the quantization semantics of docs/architecture.md step by step (INT8 Q/K with the
kernels' scale groups, K/V smoothing, FP16 or FP8 e4m3 PV with exact rounding emulation, base-2 online
softmax over K blocks) in fp32, on any device. It is slow by design: clarity over speed, but K is
processed block by block and batch/heads are vectorised, so small CPU shapes run in milliseconds.
"""

from __future__ import annotations

import math

import torch

from .inputs import check_head_groups

__all__ = [
    "FAMILY_BLOCK_SIZES",
    "FP16_V_MAX",
    "FP8_V_SCALE_FLOOR",
    "FP8_V_TERMS",
    "PV_ACCUM_DTYPES",
    "QK_QUANT_GRANS",
    "fp16_v_scale",
    "fp16_v_scale_of_amax",
    "pv16_dtype",
    "quantize_int8",
    "sageattn_reference",
    "scale_group_ids",
]

LOG2E = math.log2(math.e)
FP8_E4M3_MAX = 448.0
INT8_MAX = 127.0
SCALE_FLOOR = 1e-8  # INT8 Q/K scales: a tiny Q or K only flattens an already flat softmax
# V's per-channel FP8 scale floor (2^-100): 1e-8 put a channel with max |V| near 1e-10 or below (a
# bfloat16 or fp16 V holds such values) into e4m3's subnormals or onto 0 (relative L1 0.06 at 1e-10,
# 0.56 at 1e-11, zeros below). 2^-100 is normal in fp32 and 1 / 2^-100 is finite, so V / scale stays
# exact and a channel of zeros still gives zeros.
FP8_V_SCALE_FLOOR = 2.0 ** -100

QK_QUANT_GRANS = ("per_block", "per_warp", "per_thread")
PV_ACCUM_DTYPES = {
    "fp16": ("fp32", "fp16+fp32", "fp16"),
    "fp8": ("fp32", "fp32+fp32", "fp32+fp16"),
}
# Token counts of one tensor-core instruction's reduction dimension: where an fp16 accumulator rounds.
_MMA_K = {"fp16": 16, "fp8": 32}

# Block sizes of each kernel family (architecture.md, "Granularity"); pass them as keyword arguments.
FAMILY_BLOCK_SIZES = {
    "sm75": {"blkq": 128, "blkk": 32, "warpq": 16},
    "sm80": {"blkq": 128, "blkk": 64, "warpq": 32},
    "sm89": {"blkq": 128, "blkk": 64, "warpq": 32},
    # the sm80 family's quantization kernels; the wgmma kernel's online softmax steps 128 keys
    "sm90": {"blkq": 128, "blkk": 64, "warpq": 32, "softmax_blkk": 128},
    # the sm89 family's quantization (FP8 V included), the same 128-key wgmma softmax step as sm90
    "sm90_fp8": {"blkq": 128, "blkk": 64, "warpq": 32, "softmax_blkk": 128},
    "triton": {"blkq": 128, "blkk": 64, "warpq": 32},
}


def scale_group_ids(n_tokens: int, *, granularity: str, is_query: bool, blkq: int = 128,
                    blkk: int = 64, warpq: int = 32, device=None) -> tuple[torch.Tensor, int]:
    """Return (group id of each token, number of groups) for one INT8 scale layout.

    Group ids are ordered block by block, so they index the kernels' `[B, H, n_scale_groups]`
    scale tensors directly.
    """
    if granularity not in QK_QUANT_GRANS:
        raise ValueError(f"qk_quant_gran={granularity!r} is not accepted; use one of {QK_QUANT_GRANS}")
    t = torch.arange(n_tokens, device=device)
    if is_query:
        if granularity == "per_block":
            return t // blkq, -(-n_tokens // blkq)
        if granularity == "per_warp":
            return t // warpq, -(-n_tokens // warpq)
        # per_thread: the rows g, g+8, ... of a WARPQ block share the scale of one mma thread.
        return (t // warpq) * 8 + t % 8, -(-n_tokens // warpq) * 8
    if granularity in ("per_block", "per_warp"):
        return t // blkk, -(-n_tokens // blkk)
    # per_thread: columns 2t, 2t+1 of each n8 tile belong to one thread: 4 groups per K block.
    return (t // blkk) * 4 + (t % 8) // 2, -(-n_tokens // blkk) * 4


def _divide(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """``x / divisor`` rounded as one IEEE division, on every device: on CUDA, PyTorch turns the
    division of a tensor by a Python number into a multiplication by its rounded reciprocal, one ulp
    off at times, which moves a quantized value across a rounding boundary now and then."""
    return x / torch.full((), divisor, dtype=x.dtype, device=x.device)


def quantize_int8(x: torch.Tensor, *, granularity: str, is_query: bool, blkq: int = 128,
                  blkk: int = 64, warpq: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric INT8 quantization of an HND fp32 tensor `[B, H, N, D]`.

    Returns (int8 values held exactly in fp32, per-token scale `[B, H, N]`, group scales
    `[B, H, n_scale_groups]` as the kernels store them).
    """
    b, h, n, _ = x.shape
    gid, n_groups = scale_group_ids(n, granularity=granularity, is_query=is_query, blkq=blkq,
                                    blkk=blkk, warpq=warpq, device=x.device)
    token_amax = x.abs().amax(dim=-1)
    group_amax = torch.zeros(b, h, n_groups, dtype=torch.float32, device=x.device)
    group_amax.scatter_reduce_(-1, gid.expand(b, h, n), token_amax, reduce="amax", include_self=True)
    group_scale = torch.clamp_min(_divide(group_amax, INT8_MAX), SCALE_FLOOR)
    token_scale = group_scale[..., gid]
    values = torch.round(x / token_scale[..., None]).clamp_(-INT8_MAX, INT8_MAX)
    return values, token_scale, group_scale


def _check_reference_args(q, k, v, tensor_layout, qk_quant_gran, pv_dtype, pv_accum_dtype,
                          blkq, blkk, warpq, softmax_blkk=None):
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"tensor_layout={tensor_layout!r} is not accepted; use 'HND' or 'NHD'")
    if qk_quant_gran not in QK_QUANT_GRANS:
        raise ValueError(f"qk_quant_gran={qk_quant_gran!r} is not accepted; use one of {QK_QUANT_GRANS}")
    if pv_dtype not in PV_ACCUM_DTYPES:
        raise ValueError(f"pv_dtype={pv_dtype!r} is not accepted; use 'fp16' or 'fp8'")
    if pv_accum_dtype not in PV_ACCUM_DTYPES[pv_dtype]:
        raise ValueError(f"pv_accum_dtype={pv_accum_dtype!r} is not accepted with pv_dtype={pv_dtype!r};"
                         f" use one of {PV_ACCUM_DTYPES[pv_dtype]}")
    for name, size in (("blkq", blkq), ("blkk", blkk), ("warpq", warpq)):
        if not isinstance(size, int) or size <= 0 or size % 8:
            raise ValueError(f"{name}={size!r} must be a positive multiple of 8")
    if softmax_blkk is not None and (not isinstance(softmax_blkk, int) or softmax_blkk <= 0
                                     or softmax_blkk % blkk):
        raise ValueError(f"softmax_blkk={softmax_blkk!r} must be None or a positive multiple of "
                         f"blkk={blkk}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor in {tensor_layout} layout")
    if q.shape[0] != k.shape[0] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v shapes do not match: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _accumulate(acc: torch.Tensor, p: torch.Tensor, v_terms: list[torch.Tensor], chunk: int) -> torch.Tensor:
    """acc + p @ sum(v_terms) with an fp16 accumulator that rounds after every `chunk`-token mma
    step, each term's step in turn (FP8 V's two terms: the kernels issue hi, then lo, per chunk)."""
    for c0 in range(0, p.shape[-1], chunk):
        for v in v_terms:
            acc = (acc + p[..., c0:c0 + chunk] @ v[..., c0:c0 + chunk, :]).half().float()
    return acc


def pv16_dtype(v_dtype: torch.dtype, pv_accum_dtype: str) -> torch.dtype:
    """The 16-bit type P and V take in FP16 PV on sm80+ (the sm80 family and the Triton kernels).

    bfloat16 for a bfloat16 V with "fp32" accumulation: the mma takes bf16 operands and V keeps its
    range. float16 otherwise: the fp16-accumulating modes need fp16 operands. Turing (the sm75
    family) has no bf16 mma and always uses float16. `sageattn_reference` divides a bfloat16 V
    taken as float16 by a per-channel power of two first (`fp16_v_scale`), as the sm75 family does.
    """
    return torch.bfloat16 if v_dtype == torch.bfloat16 and pv_accum_dtype == "fp32" else torch.float16


# A bfloat16 V converted to fp16 is divided per channel by the power of two that brings its amax to
# at most 2^15, the largest power of two below fp16's max (65504). The sm75 kernel also scales a
# small channel up, into (2^14, 2^15] (csrc/sm75/v16_scale.h), so that values below fp16's normal
# range keep their bits; the two give the same fp16 values wherever |V| >= 2^-14 (the scale is a
# power of two), so this oracle keeps s >= 1, which the fp16-accumulating modes need.
FP16_V_MAX = 32768.0


def fp16_v_scale(v: torch.Tensor) -> torch.Tensor:
    """Per-channel power-of-two scale `[B, H, 1, D]` of an fp32 V `[B, H, N, D]` before fp16 rounding.

    s = 2**e with e = max(0, ceil(log2(amax / FP16_V_MAX))), amax = max |V| over the channel's tokens:
    the smallest power of two >= 1 with amax / s <= 32768. Dividing by s and multiplying the output
    back are exact in fp32; ordinary data (amax <= 32768, s = 1) gives exactly the unscaled result.
    Computed without log2 (which may round): x = amax / 2**15 = m * 2**k with 0.5 <= m < 1 (frexp);
    s = x when x is a power of two (m = 0.5), else x / m = 2**k. A non-finite amax keeps s = 1.
    """
    return fp16_v_scale_of_amax(v.abs().amax(dim=2, keepdim=True))


def fp16_v_scale_of_amax(amax: torch.Tensor) -> torch.Tensor:
    """fp16_v_scale from each channel's max |V| (any shape): s >= 1, amax / s <= 32768."""
    x = amax / FP16_V_MAX  # dividing by a power of two: exact
    return torch.where((x > 1) & torch.isfinite(x), power_of_two_at_least(x), torch.ones_like(x))


def power_of_two_at_least(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= x for positive finite x, without log2 (which may round): x = m * 2**k
    with 0.5 <= m < 1 (frexp); x itself when m = 0.5, else x / m = 2**k. Other x: unspecified."""
    mant, _ = torch.frexp(x)
    return torch.where(mant == 0.5, x, x / torch.where(mant == 0, torch.ones_like(mant), mant))


# V's per-channel amax maps here when P.V accumulates in fp16 inside a K block: a 64-key block then
# sums to at most 64 * 448 * 2.25 = 64512 < 65504 (fp16's max). csrc/sm89/bindings.cpp uses the same.
FP8_V_MAX_FP16_INNER = 2.25


# FP8 P.V takes V as two e4m3 terms: hi = e4m3(x) and lo = e4m3(x - hi), x = V / scale (per channel),
# both multiplied by the same e4m3 P. One term leaves e4m3's 3-bit mantissa on V as well as on P:
# cosine about 0.99929 against fp32 SDPA on normal inputs, below design.md's 0.9993 bar (upstream's own
# sm90 kernel: 0.99926); the second term takes V's error out (about 0.9996, relative L1 0.028) for
# twice the P.V tensor work. The native kernels (kFp8VTerms, csrc/common/attn_params.h) and the Triton
# FP8 kernel use the same number.
FP8_V_TERMS = 2


def fp8_v_max_for(pv_accum_dtype: str) -> float:
    """The value V's per-channel amax maps to in FP8 PV for this accumulation mode."""
    return FP8_V_MAX_FP16_INNER if pv_accum_dtype == "fp32+fp16" else FP8_E4M3_MAX


def sageattn_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tensor_layout: str = "HND",
                       is_causal: bool = False, sm_scale: float | None = None,
                       qk_quant_gran: str = "per_thread", smooth_k: bool = True, smooth_v: bool = False,
                       pv_dtype: str = "fp16", pv_accum_dtype: str = "fp32", blkq: int = 128,
                       blkk: int = 64, warpq: int = 32, return_lse: bool = False,
                       fp8_p_scale: float = FP8_E4M3_MAX, fp8_v_max: float | None = None,
                       pv16: torch.dtype | None = None, softmax_blkk: int | None = None,
                       fp8_v_terms: int = FP8_V_TERMS):
    """Quantized attention exactly as the kernels compute it, in fp32 with fp16/e4m3 rounding emulated.

    q: `[B, Hq, Nq, D]` (HND) or `[B, Nq, Hq, D]` (NHD); k, v: the same with Hkv heads and Nk tokens,
    Hq a multiple of Hkv (GQA/MQA). Causal is top-left aligned like SDPA's `is_causal`.
    pv_dtype "fp16" takes pv_accum_dtype "fp32" | "fp16+fp32" | "fp16"; "fp8" takes "fp32" |
    "fp32+fp32" | "fp32+fp16". Note: the hardware's reduced-precision FP8 fp32 accumulator is not
    emulated ("fp32" and "fp32+fp32" give the same result here).
    fp8_p_scale / fp8_v_max: FP8 static P scale and the value V's per-channel amax maps to. By default
    (architecture.md) P * 448 and V's amax -> `fp8_v_max_for(pv_accum_dtype)`: 448, or 2.25 for the fp16
    inner accumulator of "fp32+fp16", which 448 * 448 > 65504 would overflow (pass 448 to see it).
    fp8_v_terms: e4m3 terms of V in FP8 P.V (`FP8_V_TERMS`): 2, hi = e4m3(x) and lo = e4m3(x - hi) with
    x = V / scale clamped to +-448, or 1 (hi alone, the one-term recipe of upstream SageAttention).
    softmax_blkk: keys per online-softmax step (the kernel's K tile), a multiple of blkk; None: blkk.
    It matters because P is rounded (fp16, e4m3) relative to the running row maximum at each step:
    the sm90 and sm90_fp8 wgmma kernels step 128 keys while their K scales stay per 64-key block.
    pv16: the 16-bit type of P and V in FP16 PV; None: `pv16_dtype(v.dtype, pv_accum_dtype)` (sm80+).
    The sm75 family passes torch.float16. When P.V runs in float16 on a bfloat16 V, V is divided by
    its per-channel power of two `fp16_v_scale` before the fp16 rounding and each output channel is
    multiplied back, as the sm75 family does: V's fp16 copy is finite, and with "fp32" accumulation
    so is the output. A float32 or float64 V (no kernel takes one: such calls run SDPA) is scaled
    the same way, so a value past 65504 does not turn into inf (and the output into inf or NaN).
    The sm80 family's fp16-accumulating modes convert V unscaled. This gives bit
    for bit what an unscaled conversion gives (what those kernels are checked against) in output
    channel d of a batch and kv head's queries whenever max |V[..., d]| over that batch and kv
    head's tokens is <= 32768: the scale is 1 there, and x / 1 * 1 changes nothing. Above 32768
    (scale >= 2) results often still match, but values that land in fp16's subnormal range (in V or
    in the fp16 accumulator) round differently, and past 65504 the unscaled V is inf. Their fp16
    accumulators can overflow either way (a flat softmax over a V near 30000 does).
    smooth_v: V's token mean out before P.V and back after, where the kernels take it: FP8 P.V, and
    FP16 P.V with an fp16-accumulating mode; with FP16 P.V and "fp32" accumulation it is an identity
    the kernels skip, so it is skipped here too (applying it would round V minus its mean to the
    16-bit type, an error the kernels do not make).
    Returns the output (q's dtype and layout), or (output, lse) with lse `[B, Hq, Nq]` fp32 in natural
    log when return_lse.
    """
    _check_reference_args(q, k, v, tensor_layout, qk_quant_gran, pv_dtype, pv_accum_dtype,
                          blkq, blkk, warpq, softmax_blkk)
    if fp8_v_terms not in (1, 2):
        raise ValueError(f"fp8_v_terms={fp8_v_terms!r} is not accepted; use 1 or 2")
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    check_head_groups(hq, hkv)
    if d == 0:
        raise ValueError("head dim 0 is not accepted: there is nothing to quantize (sageattn answers such "
                         "calls without a kernel)")
    if sm_scale is None:
        sm_scale = d ** -0.5
    dev = q.device
    qf, kf, vf = q.float(), k.float(), v.float()

    out_hnd = torch.zeros(b, hq, nq, d, dtype=torch.float32, device=dev)
    lse = torch.full((b, hq, nq), -math.inf, dtype=torch.float32, device=dev)
    if nq == 0 or nk == 0 or hq == 0:
        return _finish(out_hnd, lse, q.dtype, tensor_layout, return_lse)

    km = kf.mean(dim=2, keepdim=True) if smooth_k else None
    q_i8, q_scale, _ = quantize_int8(qf * (sm_scale * LOG2E), granularity=qk_quant_gran, is_query=True,
                                     blkq=blkq, blkk=blkk, warpq=warpq)
    k_i8, k_scale, _ = quantize_int8(kf - km if smooth_k else kf, granularity=qk_quant_gran,
                                     is_query=False, blkq=blkq, blkk=blkk, warpq=warpq)

    smooth_v = smooth_v and not (pv_dtype == "fp16" and pv_accum_dtype == "fp32")  # see the docstring
    vm = vf.mean(dim=2, keepdim=True) if smooth_v else None
    v_s = vf - vm if smooth_v else vf
    if pv16 is None:
        pv16 = pv16_dtype(v.dtype, pv_accum_dtype)
    if pv16 not in (torch.float16, torch.bfloat16) or (pv16 == torch.bfloat16 and pv_accum_dtype != "fp32"):
        raise ValueError(f"pv16={pv16!r} is not accepted with pv_accum_dtype={pv_accum_dtype!r}; use "
                         "torch.float16, or torch.bfloat16 with 'fp32' accumulation")
    if pv_dtype == "fp16":
        v_scale = fp16_v_scale(v_s) if pv16 == torch.float16 and v.dtype != torch.float16 else None
        v_terms = [(v_s if v_scale is None else v_s / v_scale).to(pv16).float()]
        p_scale = 1.0
    else:
        if fp8_v_max is None:
            fp8_v_max = fp8_v_max_for(pv_accum_dtype)
        v_scale = torch.clamp_min(_divide(v_s.abs().amax(dim=2, keepdim=True), fp8_v_max), FP8_V_SCALE_FLOOR)
        x = (v_s / v_scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        v_terms = [x.to(torch.float8_e4m3fn).float()]
        if fp8_v_terms == 2:
            v_terms.append((x - v_terms[0]).to(torch.float8_e4m3fn).float())
        p_scale = fp8_p_scale

    # GQA/MQA: query head h reads kv head h // (Hq // Hkv).
    group = hq // hkv
    k_i8, k_scale = (t.repeat_interleave(group, dim=1) for t in (k_i8, k_scale))
    v_terms = [t.repeat_interleave(group, dim=1) for t in v_terms]

    inner_fp16 = pv_accum_dtype in ("fp16+fp32", "fp32+fp16")
    all_fp16 = pv_accum_dtype == "fp16"
    chunk = _MMA_K[pv_dtype]
    m = torch.full((b, hq, nq), -math.inf, dtype=torch.float32, device=dev)
    row_sum = torch.zeros(b, hq, nq, dtype=torch.float32, device=dev)
    acc = out_hnd
    q_idx = torch.arange(nq, device=dev)[:, None]
    step = softmax_blkk or blkk
    for j0 in range(0, nk, step):
        j1 = min(j0 + step, nk)
        s = (q_i8 @ k_i8[:, :, j0:j1].transpose(-1, -2)) * q_scale[..., None] * k_scale[:, :, None, j0:j1]
        if is_causal:
            s = s.masked_fill(torch.arange(j0, j1, device=dev)[None, :] > q_idx, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows fully masked so far
        alpha = torch.exp2(m - m_safe)
        p = torch.exp2(s - m_safe[..., None])
        row_sum = row_sum * alpha + p.sum(dim=-1)
        if pv_dtype == "fp16":
            p_q = p.to(pv16).float()
        else:
            p_q = (p * p_scale).to(torch.float8_e4m3fn).float()
        v_blk = [t[:, :, j0:j1] for t in v_terms]
        if all_fp16:
            acc = _accumulate((acc * alpha[..., None]).half().float(), p_q, v_blk, chunk)
        elif inner_fp16:
            acc = acc * alpha[..., None] + _accumulate(torch.zeros_like(acc), p_q, v_blk, chunk)
        else:
            acc = acc * alpha[..., None] + sum(p_q @ t for t in v_blk)  # hi, then lo
        m = m_new

    out_hnd = acc / row_sum[..., None]
    if v_scale is not None:
        out_hnd = out_hnd / p_scale * v_scale.repeat_interleave(group, dim=1)
    if smooth_v:
        out_hnd = out_hnd + vm.repeat_interleave(group, dim=1)
    lse = (torch.log2(row_sum) + m) / LOG2E
    if smooth_k:
        lse = lse + (qf * km.repeat_interleave(group, dim=1)).sum(dim=-1) * sm_scale
    return _finish(out_hnd, lse, q.dtype, tensor_layout, return_lse)


def _finish(out_hnd, lse, dtype, tensor_layout, return_lse):
    out = out_hnd.to(dtype)
    if tensor_layout == "NHD":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out
