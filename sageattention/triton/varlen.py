"""Variable-length INT8-QK / FP16-PV attention over packed ``[total_tokens, heads, head_dim]``.

Sequence ``i`` owns tokens ``cu_seqlens[i] .. cu_seqlens[i+1]`` of the packed tensors. Quantization
blocks start at each sequence's first token, K smoothing uses each sequence's own mean, and causal
masking is top-left within each sequence. The per-tile work is the dense kernel's (``attn.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import quant
from .attn import LOG2E, KernelConfig, _attn_rows, pick_config


@triton.jit(do_not_specialize=["n_heads", "group", "n_q_scales", "n_k_scales"])
def _varlen_fwd_kernel(
    Q8, K8, V, QS, KS, Out, CU_Q, CU_K,
    sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, so_n, so_h,
    n_heads, group, n_q_scales, n_k_scales,
    HEAD_DIM: tl.constexpr, D: tl.constexpr, QBLK: tl.constexpr, KBLK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    # int64: b * n_heads (the scale indices) passes 2**31 - 1 from sequence 32769 on at 65535 heads
    b = tl.program_id(2).to(tl.int64)
    q_start = tl.load(CU_Q + b).to(tl.int64)
    q_len = (tl.load(CU_Q + b + 1) - tl.load(CU_Q + b))
    start_m = pid_m * BLOCK_M
    if start_m >= q_len:
        return
    k_start = tl.load(CU_K + b).to(tl.int64)
    k_len = tl.load(CU_K + b + 1) - tl.load(CU_K + b)
    kvh = h // group
    offs_ml = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_ml
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < q_len
    row0 = q_start + start_m  # int64: tile starts in addresses, int32 offsets inside the tile

    q = tl.load(Q8 + row0 * sq_n + h * sq_h + offs_ml[:, None] * sq_n + offs_d[None, :],
                mask=row_ok[:, None], other=0)
    q_scale = tl.load(QS + (b * n_heads + h) * n_q_scales + start_m // QBLK)
    K_base = K8 + k_start * sk_n + kvh * sk_h
    V_base = V + k_start * sv_n + kvh * sv_h
    KS_base = KS + (b * (n_heads // group) + kvh) * n_k_scales
    acc, l_i, m_i = _attn_rows(q, q_scale, K_base, V_base, KS_base, sk_n, sv_n, start_m, k_len,
                               offs_m, offs_n, offs_d, K_base, V_base, 0, 0, HEAD_DIM, D,
                               KBLK, BLOCK_M, BLOCK_N, IS_CAUSAL, False)
    # A sequence with queries but no keys gives zeros rather than 0/0.
    out = acc * tl.where(l_i > 0, 1.0 / l_i, 0.0)[:, None]
    o_ptrs = Out + row0 * so_n + h * so_h + offs_ml[:, None] * so_n + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :])


def run_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
               is_causal: bool, sm_scale: float, smooth_k: bool,
               config: KernelConfig | None = None) -> torch.Tensor:
    """Runs the kernel on validated packed tensors; ``cu_seqlens_*`` int32 on q's device."""
    total_q, n_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    dp = quant.padded_head_dim(head_dim)
    cfg = config or pick_config(dp, is_causal, False, varlen=True)
    if total_q == 0 or batch == 0:
        return torch.empty((total_q, n_heads, head_dim), dtype=q.dtype, device=q.device)
    if k.shape[0] == 0:
        # No keys anywhere: every query sees nothing (same rule as an empty key sequence below).
        return torch.zeros((total_q, n_heads, head_dim), dtype=q.dtype, device=q.device)

    k_mean = quant.segment_mean(k, cu_seqlens_k) if smooth_k else None
    k8, k_scale = quant.quantize_varlen(k, cu_seqlens_k, max_seqlen_k, block=quant.BLKK,
                                        pad_to=max(quant.BLKK, cfg.block_n), mean=k_mean)
    q8, q_scale = quant.quantize_varlen(q, cu_seqlens_q, max_seqlen_q, block=quant.BLKQ,
                                        pad_to=quant.BLKQ, scale_mult=sm_scale * LOG2E)
    # P.V runs in V's own 16-bit type (fp32 accumulation): a bfloat16 V keeps its range.
    v16 = quant.tile_addressable(v, 0, cfg.block_n)
    out = torch.empty((total_q, n_heads, head_dim), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(max(max_seqlen_q, 1), cfg.block_m), n_heads, batch)
    _varlen_fwd_kernel[grid](
        q8, k8, v16, q_scale, k_scale, out, cu_seqlens_q, cu_seqlens_k,
        q8.stride(0), q8.stride(1), k8.stride(0), k8.stride(1), v16.stride(0), v16.stride(1),
        out.stride(0), out.stride(1),
        n_heads, n_heads // kv_heads, q_scale.shape[2], k_scale.shape[2],
        HEAD_DIM=head_dim, D=dp, QBLK=quant.BLKQ, KBLK=quant.BLKK,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=is_causal,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
