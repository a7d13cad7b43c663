"""INT8 quantization of Q and K for the Triton attention kernels (per-block granularity).

Semantics (docs/architecture.md): symmetric INT8, ``scale = max(amax / 127, 1e-8)``, values rounded
half-to-even and clamped to [-127, 127]; Q blocks of ``BLKQ`` tokens, K blocks of ``BLKK`` tokens;
K optionally smoothed by its per-(sequence, kv head) mean first. Q is multiplied by
``sm_scale * log2(e)`` before quantization (so its scale carries that factor), which puts the
attention kernel's scores in the base-2 domain directly.

One kernel serves the dense (``[B, H, N, D]`` in any strides) and the packed variable-length
(``[total, H, D]`` with ``cu_seqlens``) cases; blocks always start at a sequence's first token.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import padded_head_dim  # noqa: F401  (the kernels' width rule, read as quant.padded_head_dim)

BLKQ = 128
BLKK = 64
SCALE_FLOOR = tl.constexpr(1e-8)
LOG2E = math.log2(math.e)

# 1.5 * 2**23: adding then subtracting it rounds any |x| < 2**22 to the nearest integer with ties to
# even (torch.round / cvt.rni semantics) using plain fp32 adds, which also work in Triton's
# interpreter (libdevice's rint does not).
_RNE_MAGIC = tl.constexpr(12582912.0)


# int32 -> fp32 without the hardware conversion (a fraction of the FP32 rate, a cost like exp2's
# per score): for |i| < 2**22 the bits of 1.5 * 2**23 plus i are the float 1.5 * 2**23 + i exactly,
# so one integer add and one exact float subtract give float(i). The attention kernels' scores stay
# inside that: |q . k| <= 127 * 127 * 256 < 2**22 for every head dim they take.
_I2F_BITS = tl.constexpr(0x4B400000)


# Addresses in the kernels: a tile's start (batch, head, first token) enters as an int64 scalar;
# offsets inside a tile stay int32 (cheaper registers and address math), so a tile of ``rows``
# tokens must span at most INT32_MAX elements. Our own buffers always do (row stride <= heads * Dp
# <= 65535 * 256, 127 of which is still below 2**31); a caller's view into a larger buffer may not.
INT32_MAX = 2**31 - 1


def tile_span(x: torch.Tensor, tile: dict[int, int]) -> int:
    """Largest element offset inside a tile of ``x`` that spans ``tile[dim]`` indices along each
    listed dim: ``sum((tile[dim] - 1) * stride(dim))``."""
    return sum((extent - 1) * x.stride(dim) for dim, extent in tile.items())


def tile_addressable(x: torch.Tensor, token_dim: int, rows: int) -> torch.Tensor:
    """``x`` as the kernels read it: unit last stride, and tiles of ``rows`` tokens whose in-tile
    offsets fit int32 (see INT32_MAX). A view that breaks either is copied contiguous (then the row
    stride is heads * head_dim, which always fits)."""
    tile = {token_dim: rows, -1: x.shape[-1]}
    if x.stride(-1) == 1 and tile_span(x, tile) <= INT32_MAX:
        return x
    x = x.contiguous()
    if tile_span(x, tile) > INT32_MAX:
        raise ValueError(f"a tile of {rows} tokens of a tensor of shape {list(x.shape)} spans "
                         f"{tile_span(x, tile)} elements even when contiguous; the Triton kernels "
                         f"address at most {INT32_MAX} inside one tile (fewer heads or a smaller "
                         "head dim)")
    return x


def interpreting() -> bool:
    """Whether Triton's CPU interpreter runs the kernels (TRITON_INTERPRET=1, the CPU tests)."""
    import os
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _round_half_even(x):
    return (x + _RNE_MAGIC) - _RNE_MAGIC


@triton.jit
def _exact_float(i):
    """float(i) for an int32 |i| < 2**22, bit-exact (see _I2F_BITS)."""
    return (i + _I2F_BITS).to(tl.float32, bitcast=True) - _RNE_MAGIC


@triton.jit(do_not_specialize=["heads", "n_tokens", "out_rows", "n_scale_blocks", "corr_group"])
def _quant_block_kernel(
    X, X_CU, MEAN, OUT, SCALE, CORR, CORR_MEAN,
    sx_b, sx_h, sx_n,
    so_b, so_h, so_n,
    heads, n_tokens, out_rows, n_scale_blocks, scale_mult, corr_mult, corr_group,
    HEAD_DIM: tl.constexpr, D: tl.constexpr, BLK: tl.constexpr,
    VARLEN: tl.constexpr, HAS_MEAN: tl.constexpr, HAS_CORR: tl.constexpr,
):
    """Quantizes one block of BLK tokens of one (batch, head).

    Dense: rows past ``n_tokens`` and below ``out_rows`` (the padded buffer) are written as zeros.
    Varlen: the sequence is ``X_CU[b] .. X_CU[b+1]``; nothing past its end is written.
    HAS_MEAN subtracts ``MEAN[b, h, :]`` first (K smoothing). HAS_CORR (Q only) also writes
    ``CORR[b, h, n] = corr_mult * q[n] . CORR_MEAN[b, h // corr_group]`` (the LSE correction).
    """
    blk = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    # int64: b * heads (the scale and mean indices) passes 2**31 - 1 past sequence 32768 at 65535 heads
    b = tl.program_id(2).to(tl.int64)
    if VARLEN:
        start = tl.load(X_CU + b).to(tl.int64)
        seq_len = tl.load(X_CU + b + 1) - tl.load(X_CU + b)
        limit = seq_len
        x_base = X + start * sx_n + h * sx_h
        o_base = OUT + start * so_n + h * so_h
    else:
        start = 0
        seq_len = n_tokens
        limit = out_rows
        x_base = X + b * sx_b + h * sx_h
        o_base = OUT + b * so_b + h * so_h
    if blk * BLK >= limit:
        return

    offs_l = tl.arange(0, BLK)
    offs_n = blk * BLK + offs_l
    row0 = (blk * BLK).to(tl.int64)  # tile start in addresses as int64, in-tile offsets as int32
    offs_d = tl.arange(0, D)
    d_ok = offs_d < HEAD_DIM
    valid = (offs_n < seq_len)[:, None] & d_ok[None, :]
    x_ptrs = x_base + row0 * sx_n + offs_l[:, None] * sx_n + offs_d[None, :]
    x = tl.load(x_ptrs, mask=valid, other=0.0).to(tl.float32)
    if HAS_CORR:
        km = tl.load(CORR_MEAN + (b * (heads // corr_group) + h // corr_group) * HEAD_DIM + offs_d,
                     mask=d_ok, other=0.0)
        corr = tl.sum(x * km[None, :], axis=1) * corr_mult
        # Dense only: CORR is [B, H, N] contiguous.
        tl.store(CORR + (b * heads + h) * n_tokens + offs_n, corr, mask=offs_n < seq_len)
    if HAS_MEAN:
        mean = tl.load(MEAN + (b * heads + h) * HEAD_DIM + offs_d, mask=d_ok, other=0.0)
        x = tl.where(valid, x - mean[None, :], 0.0)
    # Q is pre-multiplied (by sm_scale * log2(e)) before its scale is taken, as the reference does.
    x = x * scale_mult

    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    # IEEE divisions (Triton's plain fp32 "/" is approximate) so the integers match torch exactly.
    scale = tl.maximum(tl.div_rn(amax, 127.0), SCALE_FLOOR)
    xq = _round_half_even(tl.div_rn(x, scale))
    xq = tl.minimum(tl.maximum(xq, -127.0), 127.0).to(tl.int8)
    tl.store(o_base + row0 * so_n + offs_l[:, None] * so_n + offs_d[None, :], xq,
             mask=(offs_n < limit)[:, None])
    tl.store(SCALE + (b * heads + h) * n_scale_blocks + blk, scale)


def _quant_warps(block: int, dp: int) -> int:
    # One program holds block x dp fp32 values: 32 a thread keeps registers low (~56 on sm_90),
    # so several programs per SM keep enough loads in flight for this memory-bound kernel.
    return max(4, min(16, block * dp // 1024))


def _check_last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def quantize_dense(x: torch.Tensor, *, block: int, pad_to: int, scale_mult: float = 1.0,
                   mean: torch.Tensor | None = None, corr_mean: torch.Tensor | None = None,
                   corr_mult: float = 0.0):
    """Quantizes an HND view ``[B, H, N, D]`` (any strides) per block of ``block`` tokens.

    Returns ``(x_i8 [B, H, Npad, Dp] contiguous with zero tails, scale [B, H, Npad // block] fp32,
    corr [B, H, N] fp32 or None)`` where ``Npad`` is ``N`` rounded up to ``pad_to`` (a multiple of
    ``block``) and ``Dp = padded_head_dim(D)``.
    """
    x = tile_addressable(x, 2, block)
    b, h, n, d = x.shape
    dp = padded_head_dim(d)
    n_pad = triton.cdiv(n, pad_to) * pad_to
    n_blocks = n_pad // block
    out = torch.empty((b, h, n_pad, dp), dtype=torch.int8, device=x.device)
    scale = torch.empty((b, h, n_blocks), dtype=torch.float32, device=x.device)
    corr = None
    if corr_mean is not None:
        corr = torch.empty((b, h, n), dtype=torch.float32, device=x.device)
        corr_group = h // corr_mean.shape[1]
    else:
        corr_group = 1
    dummy = scale
    _quant_block_kernel[(n_blocks, h, b)](
        x, dummy, mean if mean is not None else dummy, out, scale,
        corr if corr is not None else dummy, corr_mean if corr_mean is not None else dummy,
        x.stride(0), x.stride(1), x.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        h, n, n_pad, n_blocks, scale_mult, corr_mult, corr_group,
        HEAD_DIM=d, D=dp, BLK=block, VARLEN=False,
        HAS_MEAN=mean is not None, HAS_CORR=corr is not None,
        num_warps=_quant_warps(block, dp),
    )
    return out, scale, corr


def quantize_qk(q: torch.Tensor, k: torch.Tensor, *, sm_scale: float, smooth_k: bool,
                want_lse: bool, k_block: int = BLKK):
    """Both INT8 operands of a dense attention call (HND views).

    K is smoothed by its per-head token mean when ``smooth_k`` and quantized per ``k_block``
    tokens; Q per ``BLKQ`` tokens with ``sm_scale * log2(e)`` folded into its scale. With
    ``want_lse`` and smoothing, also the LSE correction ``sm_scale * q . mean(k)`` that the
    smoothing took out of the scores. Returns ``(q8, q_scale, k8, k_scale, corr or None)``.
    """
    k_mean = k.mean(dim=2, dtype=torch.float32).contiguous() if smooth_k else None
    k8, k_scale, _ = quantize_dense(k, block=k_block, pad_to=k_block, mean=k_mean)
    q8, q_scale, corr = quantize_dense(
        q, block=BLKQ, pad_to=BLKQ, scale_mult=sm_scale * LOG2E,
        corr_mean=k_mean if want_lse and smooth_k else None, corr_mult=sm_scale)
    return q8, q_scale, k8, k_scale, corr


def quantize_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, *, block: int,
                    pad_to: int, scale_mult: float = 1.0, mean: torch.Tensor | None = None):
    """Quantizes packed ``[total, H, D]`` per sequence, per block of ``block`` tokens.

    Returns ``(x_i8 [total, H, Dp], scale [B, H, n_blocks])``; ``n_blocks`` covers ``max_seqlen``
    rounded up to ``pad_to`` tokens, and scales of blocks past a sequence's end are left unset
    (the attention kernel never reads them unmasked).
    """
    x = tile_addressable(x, 0, block)
    total, h, d = x.shape
    batch = cu_seqlens.numel() - 1
    dp = padded_head_dim(d)
    n_blocks = triton.cdiv(max(max_seqlen, 1), pad_to) * pad_to // block
    out = torch.empty((total, h, dp), dtype=torch.int8, device=x.device)
    scale = torch.zeros((batch, h, n_blocks), dtype=torch.float32, device=x.device)
    _quant_block_kernel[(n_blocks, h, batch)](
        x, cu_seqlens, mean if mean is not None else scale, out, scale, scale, scale,
        0, x.stride(1), x.stride(0),
        0, out.stride(1), out.stride(0),
        h, 0, 0, n_blocks, scale_mult, 0.0, 1,
        HEAD_DIM=d, D=dp, BLK=block, VARLEN=True, HAS_MEAN=mean is not None, HAS_CORR=False,
        num_warps=_quant_warps(block, dp),
    )
    return out, scale


@triton.jit(do_not_specialize=["heads"])
def _segment_mean_kernel(X, X_CU, MEAN, sx_n, sx_h, heads,
                         HEAD_DIM: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr):
    """MEAN[b, h, :] = fp32 mean of X[cu[b]:cu[b+1], h, :] (zeros for an empty sequence)."""
    # int64: h * sx_h passes 2**31 for a view of [heads, tokens, D] memory (sx_h = tokens * D), and
    # (b * heads + h) * HEAD_DIM for as many (sequence, head) pairs. The loop runs over positions
    # within the sequence, in int64 like the loop counter: absolute int32 ones, start + i, wrapped
    # past 2**31 - 1 for a sequence ending near there (negative rows passed the `< end` mask).
    h = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    start = tl.load(X_CU + b).to(tl.int64)
    length = tl.load(X_CU + b + 1).to(tl.int64) - start
    offs_d = tl.arange(0, D)
    d_ok = offs_d < HEAD_DIM
    acc = tl.zeros((CHUNK, D), dtype=tl.float32)
    base = X + start.to(tl.int64) * sx_n + h * sx_h
    for rel in range(0, length, CHUNK):
        offs_n = rel + tl.arange(0, CHUNK)
        ptrs = base + offs_n[:, None] * sx_n + offs_d[None, :]
        acc += tl.load(ptrs, mask=(offs_n < length)[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    count = tl.maximum(length, 1).to(tl.float32)
    tl.store(MEAN + (b * heads + h) * HEAD_DIM + offs_d, tl.sum(acc, axis=0) / count, mask=d_ok)


def segment_mean(x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-sequence fp32 mean over tokens of packed ``[total, H, D]``: ``[B, H, D]``."""
    x = _check_last_dim_contiguous(x)
    _, h, d = x.shape
    batch = cu_seqlens.numel() - 1
    mean = torch.empty((batch, h, d), dtype=torch.float32, device=x.device)
    _segment_mean_kernel[(h, batch)](x, cu_seqlens, mean, x.stride(0), x.stride(1), h,
                                     HEAD_DIM=d, D=padded_head_dim(d), CHUNK=32)
    return mean
