"""SDPA ``attn_mask`` -> what the Triton kernel reads: a strided 4-D view and a block map.

Semantics follow ``torch.nn.functional.scaled_dot_product_attention``: a bool mask keeps the
positions that are True; a float mask is added to the scores (natural-log units). Either is
broadcastable to ``[B, H, Nq, Nk]``; broadcasting is done with zero strides, never by copying.
The block map says, per (Q tile, K tile), whether any position is kept, so that fully masked tiles
are skipped.
"""

from __future__ import annotations

import torch

from sageattention.inputs import ADDITIVE_MASK_NAN

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
FLOAT_MASK_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _as_4d(mask: torch.Tensor, target: tuple[int, int, int, int]) -> torch.Tensor:
    if mask.dim() > 4:
        raise ValueError(f"attn_mask must have at most 4 dims (broadcastable to [B, H, Nq, Nk] = "
                         f"{list(target)}), got shape {list(mask.shape)}")
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    for size, want, name in zip(mask.shape, target, ("B", "H", "Nq", "Nk")):
        if size not in (1, want):
            raise ValueError(f"attn_mask of shape {list(mask.shape)} is not broadcastable to "
                             f"[B, H, Nq, Nk] = {list(target)} (dim {name}: {size} vs {want})")
    return mask


def _block_any(keep: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """``[b, h, m, n]`` bool -> ``[b, h, ceil(m/BM) or 1, ceil(n/BN) or 1]`` uint8 (1: any kept)."""
    b, h, m, n = keep.shape
    if m > 1 and m % block_m:
        keep = torch.nn.functional.pad(keep, (0, 0, 0, block_m - m % block_m), value=False)
    if n > 1 and n % block_n:
        keep = torch.nn.functional.pad(keep, (0, block_n - n % block_n), value=False)
    bm = block_m if m > 1 else 1
    bn = block_n if n > 1 else 1
    m_blocks, n_blocks = keep.shape[2] // bm, keep.shape[3] // bn
    tiles = keep.reshape(b, h, m_blocks, bm, n_blocks, bn)
    return tiles.any(dim=5).any(dim=3).to(torch.uint8)


def _collapse_expanded(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` with every dim the caller expanded (stride 0, size > 1) narrowed to size 1.

    It is the same mask under broadcasting, and the block map, the NaN check and any clamped copy
    then work at the mask's real size: a ``[Nk]`` padding mask passed as ``mask.expand(B, H, Nq,
    Nk)`` was otherwise turned into ``B * H * Nq * Nk`` bytes (more for a float mask's copies).
    """
    for dim in range(mask.dim()):
        if mask.shape[dim] > 1 and mask.stride(dim) == 0:
            mask = mask.narrow(dim, 0, 1)
    return mask


def check_mask(attn_mask, target: tuple[int, int, int, int]) -> torch.Tensor:
    """Validates an SDPA mask against ``target = (B, H, Nq, Nk)``; returns its 4-D (unexpanded) view."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in FLOAT_MASK_DTYPES:
        raise TypeError(f"attn_mask must be bool or a float tensor "
                        f"({', '.join(map(str, FLOAT_MASK_DTYPES))}), got {attn_mask.dtype}")
    return _as_4d(attn_mask, target)


# The kernel adds ``mask * log2(e)`` in fp32: finite values above this overflow to +inf there
# (NaN output where SDPA is finite), so the host clamps them to it. Below, the kernel itself clamps
# a finite value to -FLT_MAX (base 2), keeping -inf as the hard mask.
FLT_MAX = torch.finfo(torch.float32).max
ADD_MAX = FLT_MAX / 1.4426950408889634 * (1 - 2**-20)  # margin for fp32 rounding of the product


def _capturing(mask: torch.Tensor) -> bool:
    return mask.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _check_additive(mask: torch.Tensor) -> torch.Tensor:
    """Refuses NaN / +inf in an additive mask; returns the mask, or an fp32 copy clamped to the
    range the kernel represents (float64, or values past ``ADD_MAX`` / below -FLT_MAX).

    One device-to-host read of two flags. While a CUDA graph is being captured no value can be
    read: the clamped copy is then always made (for bf16/fp32/fp64) and NaN is not looked for.
    """
    if mask.numel() == 0:
        return mask
    needs_range = mask.dtype != torch.float16  # fp16's 65504 * log2(e) is far inside fp32
    if _capturing(mask):
        bad, out_of_range = False, needs_range
    else:
        flags = [(torch.isnan(mask) | (mask == float("inf"))).any()]
        if needs_range:
            flags.append(((mask > ADD_MAX) | ((mask < -FLT_MAX) & (mask != float("-inf")))).any())
        got = torch.stack(flags).tolist()
        bad, out_of_range = got[0], (got[1] if needs_range else False)
    if bad:
        raise ValueError(ADDITIVE_MASK_NAN)
    if out_of_range or mask.dtype == torch.float64:
        neg_inf = mask == float("-inf")
        wide = mask if mask.dtype == torch.float64 else mask.to(torch.float32)
        mask = wide.clamp(-FLT_MAX, ADD_MAX).to(torch.float32).masked_fill(neg_inf, float("-inf"))
    return mask


def prepare_mask(attn_mask: torch.Tensor | None, batch: int, heads: int, n_queries: int,
                 n_keys: int, block_m: int, block_n: int):
    """Returns ``(kind, mask_view [B, H, Nq, Nk], block_map [B, H, Mtiles, Ntiles])``.

    ``kind`` is MASK_NONE (views are None), MASK_BOOL (uint8 view, nonzero = keep) or MASK_ADD
    (the float mask itself, converted to fp32 in the kernel; a float64 mask, or one with finite
    values beyond what the kernel's fp32 base-2 scores hold, as a clamped fp32 copy). An additive
    mask with NaN or +inf is refused (ValueError).
    """
    if attn_mask is None:
        return MASK_NONE, None, None
    target = (batch, heads, n_queries, n_keys)
    mask = _collapse_expanded(check_mask(attn_mask, target))
    if mask.dtype == torch.bool:
        kind = MASK_BOOL
        keep = mask
        data = mask.view(torch.uint8)
    else:
        kind = MASK_ADD
        mask = _check_additive(mask)
        keep = mask != float("-inf")
        data = mask
    n_tiles_m = -(-n_queries // block_m)
    n_tiles_n = -(-n_keys // block_n)
    block_map = _block_any(keep, block_m, block_n).expand(batch, heads, n_tiles_m, n_tiles_n)
    return kind, data.expand(target), block_map
