"""Inputs for the checks, and the fp32 SDPA reference every check compares against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LAYOUTS = ("HND", "NHD")


def to_hnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A view of ``x`` as ``[batch, heads, tokens, head_dim]``."""
    if layout not in LAYOUTS:
        raise ValueError(f"tensor_layout must be one of {LAYOUTS}, got {layout!r}")
    return x if layout == "HND" else x.transpose(1, 2)


def from_hnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return to_hnd(x, layout)  # the transpose is its own inverse


def randn(shape, *, dtype, device, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (x * scale).to(dtype)


def make_qkv(batch: int, heads: int, seq_q: int, head_dim: int, *, dtype, device,
             layout: str = "HND", kv_heads: int | None = None, seq_k: int | None = None,
             seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normal(0, 1) q, k, v in ``layout``; k and v may have fewer heads and another length."""
    kv_heads = heads if kv_heads is None else kv_heads
    seq_k = seq_q if seq_k is None else seq_k

    def shape(h, n):
        return (batch, h, n, head_dim) if layout == "HND" else (batch, n, h, head_dim)

    q = randn(shape(heads, seq_q), dtype=dtype, device=device, seed=seed)
    k = randn(shape(kv_heads, seq_k), dtype=dtype, device=device, seed=seed + 1)
    v = randn(shape(kv_heads, seq_k), dtype=dtype, device=device, seed=seed + 2)
    return q, k, v


def _expand_kv(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # GQA/MQA: query head h reads kv head h // (Hq // Hkv) (docs/architecture.md).
    group = q.shape[1] // x.shape[1]
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def reference(q, k, v, *, layout: str = "HND", is_causal: bool = False,
              scale: float | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 SDPA on the same inputs (and the same mask), returned in ``layout``."""
    qh, kh, vh = (to_hnd(t, layout).float() for t in (q, k, v))
    kh, vh = _expand_kv(qh, kh), _expand_kv(qh, vh)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.float()
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, is_causal=is_causal,
                                         scale=scale)
    return from_hnd(out, layout)


def reference_lse(q, k, *, layout: str = "HND", is_causal: bool = False,
                  scale: float | None = None) -> torch.Tensor:
    """Natural-log log-sum-exp of the scaled scores, ``[batch, q_heads, q_tokens]`` fp32."""
    qh, kh = to_hnd(q, layout).float(), to_hnd(k, layout).float()
    kh = _expand_kv(qh, kh)
    scale = qh.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if is_causal:
        nq, nk = scores.shape[-2:]
        keep = torch.ones(nq, nk, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.logsumexp(scores, dim=-1)


def random_bool_mask(batch: int, heads: int, seq_q: int, seq_k: int, *, device, seed: int,
                     keep: float = 0.5) -> torch.Tensor:
    """SDPA-convention boolean mask (True = attend); every query row keeps at least one key."""
    gen = torch.Generator(device=device).manual_seed(seed)
    mask = torch.rand((batch, heads, seq_q, seq_k), generator=gen, device=device) < keep
    mask[..., 0] = True  # a fully masked row has no defined output in SDPA
    return mask


def random_additive_mask(batch: int, heads: int, seq_q: int, seq_k: int, *, dtype, device,
                         seed: int) -> torch.Tensor:
    """Additive float mask: a bias in [-4, 0] plus large negatives that block about half the keys."""
    gen = torch.Generator(device=device).manual_seed(seed)
    bias = -4.0 * torch.rand((batch, heads, seq_q, seq_k), generator=gen, device=device)
    blocked = random_bool_mask(batch, heads, seq_q, seq_k, device=device, seed=seed + 1)
    bias = bias.masked_fill(~blocked, -1e4)  # finite, representable in fp16 and bf16
    return bias.to(dtype)
