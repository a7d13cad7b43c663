"""INT8-QK / FP8-PV attention kernel (dense, no mask) for GPUs with FP8 tensor cores (sm89+).

The SageAttention 2 recipe in Triton: Q and K are INT8 per block (K smoothed by its mean, Q's
scale carrying ``sm_scale * log2(e)``), so the int8 dot gives base-2 scores; P is scaled by 448
(e4m3's largest finite value, P <= 1 after the online-softmax shift) and cast to FP8 e4m3; V is two
FP8 e4m3 terms with one scale per channel (hi = e4m3(x), lo = e4m3(x - hi), x = V / scale: the lo
term takes V's own rounding error out, see ``reference.FP8_V_TERMS``), stored transposed (tokens
contiguous) so that they are the K-major B operand that Hopper's FP8 ``wgmma`` wants. Each K block's
P@V product (P@hi, then P@lo) starts from zero and is added to the fp32 running output on the CUDA
cores (two-level accumulation), so the tensor cores' reduced FP8 accumulation precision only ever
spans one block.

On sm_90 Triton lowers both dots to ``wgmma`` (INT8 and FP8); on sm89 to ``mma.sync``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import quant
from .quant import _exact_float, _round_half_even
from .attn import _key_bounds, tma_available
from ..reference import FP8_V_SCALE_FLOOR, FP8_V_TERMS

FP8_MAX = 448.0  # largest finite float8 e4m3 (fn) value
# e4m3 terms of V (hi, lo): the reference's rule, one place; the kernels take 1 or 2.
V_TERMS = FP8_V_TERMS
if V_TERMS not in (1, 2):
    raise ImportError(f"reference.FP8_V_TERMS={V_TERMS} is not supported by the Triton FP8 kernel (1 or 2)")
V_SCALE_FLOOR = FP8_V_SCALE_FLOOR  # 2^-100: a tiny V (1e-10 and below) keeps its e4m3 bits
MIN_CAPABILITY = (8, 9)
LOG2_P_SCALE = tl.constexpr(math.log2(FP8_MAX))  # P comes out of exp2 already scaled by 448


@triton.jit
def _to_e4m3(x, PREROUND: tl.constexpr):
    """fp32 (|x| <= 448) -> float8 e4m3. PREROUND first rounds to the e4m3 grid in fp32: Triton's
    interpreter (CPU tests) misrounds the cast at binade edges (31.9 -> 16); the GPU cast is exact,
    so compiled kernels skip it."""
    if PREROUND:
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(tl.abs(x), 1e-30))), -6.0)
        step = tl.exp2(e - 3.0)
        x = _round_half_even(x / step) * step
    return x.to(tl.float8e4nv)


@dataclass(frozen=True)
class Fp8Config:
    """Tile shape and launch parameters; block_n is also K's quantization block."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # True: each K block's P@V starts from zero and is added in fp32 on the CUDA cores (the FP8
    # tensor cores' accumulation is reduced-precision); False: one tensor-core accumulator for the
    # whole row (fewer registers, less accurate on long sequences). A knob for the GPU sweep.
    two_level: bool = True
    # True: K and V^T tiles come through host-made tensor descriptors (Hopper's bulk tensor copy
    # engine, TMA) instead of pointer loads: 1.2-1.6x faster on the H200 (2026-12-03 sweep).
    use_tma: bool = False

    def __post_init__(self):
        if quant.BLKQ % self.block_m or self.block_m < 64:
            raise ValueError(f"block_m must divide {quant.BLKQ} and be >= 64, got {self.block_m}")
        if self.block_n not in (32, 64, 128):
            raise ValueError(f"block_n must be 32, 64 or 128 (FP8 dot needs K >= 32), got {self.block_n}")


def pick_config(head_dim_padded: int, is_causal: bool, use_tma: bool = False) -> Fp8Config:
    """Default tiles per padded head dim: the fastest in benchmarks/gpu_dev_hopper.py's H200 sweep
    (2026-12-03, 10 fp16 cases: 128x128 tiles won with TMA at both head dims)."""
    del is_causal
    if head_dim_padded <= 64:
        return Fp8Config(128, 128, 4, 4, use_tma=use_tma)
    return Fp8Config(128, 128, 8, 3, use_tma=use_tma)


@triton.jit(do_not_specialize=["n_tokens", "n_pad"])
def _quant_v_fp8_kernel(V, SCALE, VT, sv_b, sv_h, sv_n, n_heads, n_tokens, n_pad,
                        HEAD_DIM: tl.constexpr, D: tl.constexpr, BLK: tl.constexpr,
                        PREROUND: tl.constexpr, V_TERMS: tl.constexpr):
    """x = clamp(V[b, h, n, :] / scale[b, h, :], +-448); VT[b, h, :D, n] = hi = e4m3(x) and, with
    two terms, VT[b, h, D:2D, n] = e4m3(x - hi) (residual in fp32: P@lo takes out V's rounding
    error); zeros past ``n_tokens`` and HEAD_DIM."""
    blk = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_n = blk * BLK + tl.arange(0, BLK)
    offs_d = tl.arange(0, D)
    d_ok = offs_d < HEAD_DIM
    ok = (offs_n < n_tokens)[:, None] & d_ok[None, :]
    v = tl.load(V + b * sv_b + h * sv_h + offs_n[:, None].to(tl.int64) * sv_n + offs_d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    scale = tl.load(SCALE + (b * n_heads + h) * D + offs_d)
    x = tl.div_rn(v, scale[None, :])
    x = tl.trans(tl.minimum(tl.maximum(x, -448.0), 448.0))  # [D, BLK]: rows of tokens, stored whole
    # V^T's row stride in int64: D rows (the lo term's offset) pass 2**31 from 2**24 tokens at D = 128
    row = tl.cast(n_pad, tl.int64)
    out = VT + (b * n_heads + h) * V_TERMS * D * row + offs_d[:, None] * row + offs_n[None, :]
    hi = _to_e4m3(x, PREROUND)
    tl.store(out, hi, mask=(offs_n < n_pad)[None, :])
    if V_TERMS == 2:
        tl.store(out + D * row, _to_e4m3(x - hi.to(tl.float32), PREROUND), mask=(offs_n < n_pad)[None, :])


def quantize_v_fp8(v: torch.Tensor, *, pad_to: int):
    """``v [B, H, N, D]`` (HND view, unit last stride) -> ``(vt fp8 [B, H, V_TERMS * Dp, Npad],
    scale [B, H, Dp])``.

    ``scale = max(amax over tokens / 448, 2^-100)`` per channel (padded channels get the floor), so
    every value maps into e4m3's finite range. ``vt`` holds V^T's hi rows (``e4m3(x)``), then its lo
    rows (``e4m3(x - hi)``): one buffer, so one launch writes both and one TMA descriptor reads both.
    """
    if v.stride(-1) != 1:
        v = v.contiguous()
    b, h, n, d = v.shape
    dp = quant.padded_head_dim(d)
    n_pad = triton.cdiv(n, pad_to) * pad_to
    vmin, vmax = torch.aminmax(v, dim=2)  # one pass, no |v| temporary
    amax = torch.maximum(vmax.float(), -vmin.float())
    if dp != d:
        amax = torch.nn.functional.pad(amax, (0, dp - d))  # padded channels: the floor
    # One IEEE division (a tensor divisor: PyTorch multiplies by the reciprocal of a Python number).
    scale = torch.clamp_min(amax / torch.full((), FP8_MAX, device=v.device), V_SCALE_FLOOR)
    vt = torch.empty((b, h, V_TERMS * dp, n_pad), dtype=torch.float8_e4m3fn, device=v.device)
    blk = 128
    _quant_v_fp8_kernel[(triton.cdiv(n_pad, blk), h, b)](
        v, scale, vt, v.stride(0), v.stride(1), v.stride(2), h, n, n_pad,
        HEAD_DIM=d, D=dp, BLK=blk, PREROUND=quant.interpreting(), V_TERMS=V_TERMS, num_warps=8)
    return vt, scale


@triton.jit
def _load_vt_tile(VT_base, VT_DESC, stride_vd, start_n, start64, offs_n, offs_d, kv_d0,
                  ROW: tl.constexpr, USE_TMA: tl.constexpr):
    """[BLOCK_N, D] tile of V^T's term that starts ROW rows into the head's [hi D rows, lo D rows][N]
    memory (ROW = 0: hi, ROW = D: lo): tokens contiguous, the K-major B operand. The buffer is
    zero-padded to whole blocks: no load mask. ``stride_vd`` (tokens per row) is int64 and so are
    the row offsets: D rows of V^T pass 2**31 elements from 2**24 keys at D = 128 (ptxas for sm_89
    and sm_90: no more spills than int32 rows, which would need a second compiled variant)."""
    if USE_TMA:
        tile = tl.trans(VT_DESC.load([kv_d0 + ROW, start_n]))
    else:
        tile = tl.load(VT_base + ROW * stride_vd + start64 + offs_n[:, None]
                       + offs_d.to(tl.int64)[None, :] * stride_vd)
    return tile


@triton.jit
def _fp8_step(acc, l_i, m_i, q, q_scale, K_base, VT_base, KS_base, stride_kn, stride_vd, start_n,
              n_keys, offs_m, offs_n, offs_d, K_DESC, VT_DESC, kv_row0, kv_d0,
              D: tl.constexpr, BLOCK_N: tl.constexpr, EDGE: tl.constexpr, IS_CAUSAL: tl.constexpr,
              PREROUND: tl.constexpr, TWO_LEVEL: tl.constexpr, USE_TMA: tl.constexpr,
              V_TERMS: tl.constexpr):
    """One K block of the online softmax; P@V is P@hi, then P@lo (V_TERMS == 2) into the same
    accumulator: the same e4m3 P, V's e4m3 rounding error taken out by the lo term."""
    start64 = tl.cast(start_n, tl.int64)
    # K and V^T buffers are zero-padded to whole blocks: no load masks.
    if USE_TMA:
        k = tl.trans(K_DESC.load([kv_row0 + start_n, 0]))
    else:
        k = tl.load(K_base + start64 * stride_kn + offs_n[None, :] * stride_kn + offs_d[:, None])
    qk = _exact_float(tl.dot(q, k))
    # One positive scalar per tile (Q and K blocks): the row max commutes with it, and each score
    # costs one FMA; the 448 of P's FP8 scaling rides in the exponent.
    scale = tl.load(KS_base + start_n // BLOCK_N) * q_scale
    if EDGE:
        cols = start_n + offs_n
        keep = (cols < n_keys)[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1) * scale)  # every row sees a key: m stays finite
    p = tl.exp2(qk * scale - (m_new - LOG2_P_SCALE)[:, None])  # 448 * exp2(s - m), <= 448
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)  # 448 times the softmax denominator
    vt = _load_vt_tile(VT_base, VT_DESC, stride_vd, start_n, start64, offs_n, offs_d, kv_d0, 0,
                       USE_TMA)
    p8 = _to_e4m3(p, PREROUND)
    if TWO_LEVEL:
        pv = tl.dot(p8, vt)
    else:
        pv = tl.dot(p8, vt, acc * alpha[:, None])
    if V_TERMS == 2:  # the lo term, D rows below hi, into the same accumulator
        vt_lo = _load_vt_tile(VT_base, VT_DESC, stride_vd, start_n, start64, offs_n, offs_d, kv_d0, D,
                              USE_TMA)
        pv = tl.dot(p8, vt_lo, pv)
    if TWO_LEVEL:
        acc = acc * alpha[:, None] + pv
    else:
        acc = pv
    return acc, l_i, m_new


@triton.jit(do_not_specialize=["n_heads", "group", "n_queries", "n_keys", "n_q_scales", "n_k_scales",
                               "n_kpad"])
def _attn_fp8_kernel(
    Q8, K8, VT, QS, KS, VS, Out, LSE, K_DESC, VT_DESC,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, so_b, so_h, so_n,
    n_heads, group, n_queries, n_keys, n_q_scales, n_k_scales, n_kpad,
    HEAD_DIM: tl.constexpr, D: tl.constexpr, QBLK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, RETURN_LSE: tl.constexpr,
    PREROUND: tl.constexpr, TWO_LEVEL: tl.constexpr, USE_TMA: tl.constexpr, V_TERMS: tl.constexpr,
):
    if IS_CAUSAL:  # tiles near the end do the most work: launch them first
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    kv_heads = n_heads // group
    kvh = h // group
    start_m = pid_m * BLOCK_M
    offs_ml = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_ml
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)

    q = tl.load(Q8 + b * sq_b + h * sq_h + start_m.to(tl.int64) * sq_n + offs_ml[:, None] * sq_n
                + offs_d[None, :])
    q_scale = tl.load(QS + (b * n_heads + h) * n_q_scales + start_m // QBLK)
    K_base = K8 + b * sk_b + kvh * sk_h
    vt_row = tl.cast(n_kpad, tl.int64)  # V^T's row stride (see _load_vt_tile)
    VT_base = VT + (b * kv_heads + kvh) * V_TERMS * D * vt_row
    KS_base = KS + (b * kv_heads + kvh) * n_k_scales
    # Descriptor coordinates: rows of K8 viewed as [B*Hkv*n_kpad, D], of V^T as
    # [B*Hkv*V_TERMS*D, n_kpad] (a head's hi rows at kv_d0, its lo rows at kv_d0 + D).
    kv_row0 = ((b * kv_heads + kvh) * n_kpad).to(tl.int32)
    kv_d0 = ((b * kv_heads + kvh) * V_TERMS * D).to(tl.int32)

    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    mid, hi = _key_bounds(start_m, n_keys, BLOCK_M, BLOCK_N, IS_CAUSAL)
    for start_n in range(0, mid, BLOCK_N):
        acc, l_i, m_i = _fp8_step(acc, l_i, m_i, q, q_scale, K_base, VT_base, KS_base, sk_n, vt_row,
                                  start_n, n_keys, offs_m, offs_n, offs_d, K_DESC, VT_DESC, kv_row0,
                                  kv_d0, D, BLOCK_N, False, IS_CAUSAL, PREROUND, TWO_LEVEL, USE_TMA,
                                  V_TERMS)
    for start_n in range(mid, hi, BLOCK_N):
        acc, l_i, m_i = _fp8_step(acc, l_i, m_i, q, q_scale, K_base, VT_base, KS_base, sk_n, vt_row,
                                  start_n, n_keys, offs_m, offs_n, offs_d, K_DESC, VT_DESC, kv_row0,
                                  kv_d0, D, BLOCK_N, True, IS_CAUSAL, PREROUND, TWO_LEVEL, USE_TMA,
                                  V_TERMS)

    v_scale = tl.load(VS + (b * kv_heads + kvh) * D + offs_d)
    out = acc * v_scale[None, :] / l_i[:, None]  # the 448s of P and of l cancel
    row_ok = offs_m < n_queries
    o_ptrs = Out + b * so_b + h * so_h + start_m.to(tl.int64) * so_n + offs_ml[:, None] * so_n + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :])
    if RETURN_LSE:
        lse = (m_i + tl.log2(l_i) - LOG2_P_SCALE) * 0.6931471805599453
        tl.store(LSE + (b * n_heads + h) * n_queries + offs_m, lse, mask=row_ok)


def run_attention_fp8(q, k, v, *, is_causal: bool, sm_scale: float, smooth_k: bool, return_lse: bool,
                      config: Fp8Config | None = None, out: torch.Tensor | None = None):
    """Runs the kernel on HND views ``q [B, Hq, Nq, D]``, ``k, v [B, Hkv, Nk, D]`` (validated by
    the caller). Returns ``(out [B, Hq, Nq, D] in q's dtype, lse [B, Hq, Nq] fp32 or None)``."""
    batch, n_heads, n_queries, head_dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[2]
    dp = quant.padded_head_dim(head_dim)
    cfg = config or pick_config(dp, is_causal, use_tma=tma_available(q.device))

    q8, q_scale, k8, k_scale, corr = quant.quantize_qk(q, k, sm_scale=sm_scale, smooth_k=smooth_k,
                                                       want_lse=return_lse, k_block=cfg.block_n)
    vt, v_scale = quantize_v_fp8(v, pad_to=cfg.block_n)

    if out is None:
        out = torch.empty((batch, n_heads, n_queries, head_dim), dtype=q.dtype, device=q.device)
    lse = (torch.empty((batch, n_heads, n_queries), dtype=torch.float32, device=q.device)
           if return_lse else q_scale)
    # Descriptor coordinates are int32 (TMA's): the kernel's row of K8 as [B*Hkv*n_kpad, Dp] and of
    # V^T as [B*Hkv*V_TERMS*Dp, n_kpad] must stay below 2**31; beyond, pointer loads (int64 bases).
    use_tma = (cfg.use_tma and k8.numel() // dp <= quant.INT32_MAX
               and vt.numel() // vt.shape[3] <= quant.INT32_MAX)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k2, vt2 = k8.view(-1, dp), vt.view(-1, vt.shape[3])  # both fresh and contiguous
        k_desc = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [cfg.block_n, dp])
        # one [dp, block_n] box: a head's hi tile and its lo tile dp rows below
        vt_desc = TensorDescriptor(vt2, list(vt2.shape), list(vt2.stride()), [dp, cfg.block_n])
    else:
        k_desc, vt_desc = k8, vt  # unused
    grid = (triton.cdiv(n_queries, cfg.block_m), n_heads, batch)
    _attn_fp8_kernel[grid](
        q8, k8, vt, q_scale, k_scale, v_scale, out, lse, k_desc, vt_desc,
        q8.stride(0), q8.stride(1), q8.stride(2), k8.stride(0), k8.stride(1), k8.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        n_heads, n_heads // kv_heads, n_queries, n_keys, q_scale.shape[2], k_scale.shape[2],
        vt.shape[3],
        HEAD_DIM=head_dim, D=dp, QBLK=quant.BLKQ, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        IS_CAUSAL=is_causal, RETURN_LSE=return_lse, PREROUND=quant.interpreting(), TWO_LEVEL=cfg.two_level,
        USE_TMA=use_tma, V_TERMS=V_TERMS,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not return_lse:
        return out, None
    if corr is not None:
        lse += corr
    return out, lse


__all__ = ["Fp8Config", "pick_config", "quantize_v_fp8", "run_attention_fp8"]
