"""INT8-QK / FP16-PV attention kernel (dense batches), with causal and SDPA-style masks.

Scores come out of the int8 dot already in the base-2 domain (the Q scale carries
``sm_scale * log2(e)``); softmax is online over K blocks in fp32; P is cast to V's dtype and
multiplied by V (fp16 or bf16, as given) with fp32 accumulation. ``mask.py`` turns an SDPA ``attn_mask`` into the strided view and
block map read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import quant
from .quant import _exact_float
from .mask import MASK_NONE, MASK_BOOL, MASK_ADD, prepare_mask

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
FLT_MAX = tl.constexpr(3.4028234663852886e38)


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of the attention kernels."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # True: K and V tiles come through host-made 4-D tensor descriptors (Hopper's bulk tensor copy
    # engine; out-of-range rows read as zeros). Unmasked dense calls only; see run_attention.
    use_tma: bool = False

    def __post_init__(self):
        if quant.BLKQ % self.block_m or self.block_m < 16:
            raise ValueError(f"block_m must divide {quant.BLKQ} and be >= 16, got {self.block_m}")
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 16, got {self.block_n}")


def tma_available(device: torch.device) -> bool:
    """Whether tiles can come through tensor descriptors: a GPU of compute capability 9.0+ and a
    Triton with host-side descriptors (3.4+); never under the interpreter."""
    if (device.type != "cuda" or quant.interpreting()
            or torch.cuda.get_device_capability(device) < (9, 0)):
        return False
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def pick_config(head_dim_padded: int, is_causal: bool, has_mask: bool,
                varlen: bool = False, use_tma: bool = False) -> KernelConfig:
    """Default tiles per padded head dim.

    Unmasked dense calls with ``use_tma`` (Hopper): 128x64 tiles, 4 warps, 3 stages, K and V
    through tensor descriptors, the fastest of ``benchmarks/gpu_dev_triton.py --sweep`` on the
    H200 at both head dims, causal and not (2026-12-03; d=128: 549 TOPS against 435 for the
    pointer-load default). Otherwise chosen from ptxas's register/spill report for sm_90.
    """
    del is_causal  # same tiles so far; kept so tuning can split them without an API change
    if use_tma and not (has_mask or varlen) and head_dim_padded <= 128:
        return KernelConfig(128, 64, 4, 3, use_tma=True)
    if (has_mask or varlen) and head_dim_padded <= 64:
        # Mask tiles / per-sequence offsets take registers: with 4 warps these variants reach
        # ptxas's 255-register cap for sm_90 (24 bytes spilled with a float mask); 8 warps: ~170.
        return KernelConfig(128, 64, 8, 3)
    if head_dim_padded <= 64:
        return KernelConfig(128, 64, 4, 3)
    if head_dim_padded <= 128:
        return KernelConfig(128, 64, 8, 3)
    return KernelConfig(64, 32, 4, 2)


# Triton's CPU interpreter (TRITON_INTERPRET=1: the CPU tests) truncates fp32 -> bf16 and computes a
# bf16 dot on raw bits; there P.V on a bfloat16 V runs in fp32 on P rounded to bf16 (nearest even),
# which is what the GPU computes. Read at import, as Triton's own choice of interpreter is.
_EMULATE_BF16_DOT = tl.constexpr(quant.interpreting())


@triton.jit
def _pv_dot(p, v, acc):
    """acc + P @ V with P (fp32, in [0, 1]) rounded to V's 16-bit type (fp16 or bf16)."""
    if _EMULATE_BF16_DOT and v.dtype == tl.bfloat16:
        bits = p.to(tl.int32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return tl.dot(bits.to(tl.float32, bitcast=True), v.to(tl.float32), acc)
    return tl.dot(p.to(v.dtype), v, acc)


@triton.jit
def _attn_step(acc, l_i, m_i, q, q_scale, K_base, V_base, KS_base, stride_kn, stride_vn, start_n,
               n_keys, offs_m, offs_n, offs_d, M_base, m_rows, m_cols, sm_m, sm_n, n_queries,
               K_DESC, V_DESC, bi, kvhi,
               HEAD_DIM: tl.constexpr, D: tl.constexpr, KBLK: tl.constexpr, BLOCK_N: tl.constexpr,
               EDGE: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
               USE_TMA: tl.constexpr):
    """One K block of online softmax. EDGE masks keys past ``n_keys`` (and the causal diagonal).

    ``offs_m``: the tile's query positions (causal, and the mask's row check). Tile starts enter
    addresses as int64 scalars, in-tile offsets as int32, so no product overflows (the host keeps a
    tile of K8 or V within int32 offsets: quant.tile_addressable). ``m_rows``, ``m_cols``: the
    mask tile's row and column indices from 0, int64 where its strides need it (MASK_I64).
    """
    cols = start_n + offs_n
    col_ok = cols < n_keys
    start64 = tl.cast(start_n, tl.int64)  # tl.cast: the interpreter hands plain ints here
    k_ptrs = K_base + start64 * stride_kn + offs_n[None, :] * stride_kn + offs_d[:, None]
    if USE_TMA:
        k = tl.trans(K_DESC.load([bi, kvhi, start_n, 0]).reshape(BLOCK_N, D))
    elif EDGE:
        k = tl.load(k_ptrs, mask=col_ok[None, :], other=0)
    else:
        k = tl.load(k_ptrs)
    qk = _exact_float(tl.dot(q, k))
    if BLOCK_N <= KBLK:
        # The tile lies inside one K scale block: one scalar (a per-column vector costs registers).
        scale = tl.load(KS_base + start_n // KBLK) * q_scale
    else:
        # Columns past the end read a positive dummy scale: their scores are -inf on the edge
        # tiles, and -inf * 0 would be NaN (block_n > KBLK: a KernelConfig with block_n = 128).
        scale = (tl.load(KS_base + cols // KBLK, mask=col_ok, other=1.0) * q_scale)[None, :]
    if EDGE:
        keep = col_ok[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        qk = tl.where(keep, qk, float("-inf"))
    if MASK_KIND == 0 and BLOCK_N <= KBLK:
        # Scale folded into the exponent (one FMA per score); it is positive, so the row max
        # commutes with it. Every row sees at least one key here, so m stays finite.
        m_new = tl.maximum(m_i, tl.max(qk, axis=1) * scale)
        p = tl.exp2(qk * scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
    else:
        s = qk * scale
        if MASK_KIND != 0:
            m_ptrs = M_base + start64 * sm_n + m_rows[:, None] * sm_m + m_cols[None, :] * sm_n
            m_ok = (offs_m < n_queries)[:, None] & col_ok[None, :]
            if MASK_KIND == 1:
                mk = tl.load(m_ptrs, mask=m_ok, other=0)
                s = tl.where(mk != 0, s, float("-inf"))
            else:
                add = tl.load(m_ptrs, mask=m_ok, other=float("-inf")).to(tl.float32)
                # Natural-log units to base 2; a huge finite value stays finite (SDPA then weighs
                # such keys equally) while -inf stays a hard mask.
                add = tl.where(add == float("-inf"), add, tl.maximum(add * 1.4426950408889634, -FLT_MAX))
                s = s + add
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if MASK_KIND != 0:
            # A row with no visible key so far keeps m = -inf; subtract 0 instead of inf - inf.
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    v_ptrs = V_base + start64 * stride_vn + offs_n[:, None] * stride_vn + offs_d[None, :]
    if USE_TMA:
        v = V_DESC.load([bi, kvhi, start_n, 0]).reshape(BLOCK_N, D)
    elif HEAD_DIM == D:
        if EDGE:
            v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=col_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    acc = _pv_dot(p, v, acc)
    return acc, l_i, m_new


@triton.jit
def _key_bounds(start_m, n_keys, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                IS_CAUSAL: tl.constexpr):
    """(mid, hi): K blocks below ``mid`` need no key or causal masking; ``mid..hi`` are the edge."""
    if IS_CAUSAL:
        hi = tl.minimum(n_keys, start_m + BLOCK_M)
        mid = (tl.minimum(start_m, n_keys) // BLOCK_N) * BLOCK_N
    else:
        hi = n_keys
        mid = (n_keys // BLOCK_N) * BLOCK_N
    return mid, hi


@triton.jit
def _attn_rows(q, q_scale, K_base, V_base, KS_base, stride_kn, stride_vn, start_m, n_keys,
               offs_m, offs_n, offs_d, K_DESC, V_DESC, bi, kvhi,
               HEAD_DIM: tl.constexpr, D: tl.constexpr, KBLK: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
               USE_TMA: tl.constexpr):
    """Unmasked (or causal) attention of one Q tile: full K blocks first, then the edge blocks."""
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    mid, hi = _key_bounds(start_m, n_keys, BLOCK_M, BLOCK_N, IS_CAUSAL)
    for start_n in range(0, mid, BLOCK_N):
        acc, l_i, m_i = _attn_step(acc, l_i, m_i, q, q_scale, K_base, V_base, KS_base, stride_kn,
                                   stride_vn, start_n, n_keys, offs_m, offs_n, offs_d, K_base,
                                   0, 0, 0, 0, 0, K_DESC, V_DESC, bi, kvhi,
                                   HEAD_DIM, D, KBLK, BLOCK_N, False, IS_CAUSAL, 0, USE_TMA)
    for start_n in range(mid, hi, BLOCK_N):
        acc, l_i, m_i = _attn_step(acc, l_i, m_i, q, q_scale, K_base, V_base, KS_base, stride_kn,
                                   stride_vn, start_n, n_keys, offs_m, offs_n, offs_d, K_base,
                                   0, 0, 0, 0, 0, K_DESC, V_DESC, bi, kvhi,
                                   HEAD_DIM, D, KBLK, BLOCK_N, True, IS_CAUSAL, 0, USE_TMA)
    return acc, l_i, m_i


# Sizes change with every shape: not specializing them on divisibility keeps one compiled kernel
# per (tile config, dtype, flags) instead of one per shape. Data strides stay specialized
# (alignment); the block map's do not matter.
@triton.jit(do_not_specialize=["n_heads", "group", "n_queries", "n_keys", "n_q_scales", "n_k_scales",
                               "sb_b", "sb_h", "sb_m", "sb_n"])
def _attn_fwd_kernel(
    Q8, K8, V, QS, KS, Out, LSE, MASK, BMAP, K_DESC, V_DESC,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
    sm_b, sm_h, sm_m, sm_n, sb_b, sb_h, sb_m, sb_n,
    n_heads, group, n_queries, n_keys, n_q_scales, n_k_scales,
    HEAD_DIM: tl.constexpr, D: tl.constexpr, QBLK: tl.constexpr, KBLK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr, MASK_I64: tl.constexpr, RETURN_LSE: tl.constexpr, USE_TMA: tl.constexpr,
):
    # Causal tiles near the end do the most work: launch them first.
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    kvh = h // group
    start_m = pid_m * BLOCK_M
    start_m64 = start_m.to(tl.int64)
    offs_ml = tl.arange(0, BLOCK_M)
    offs_m = start_m + offs_ml
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)

    # The int8 Q buffer is padded to whole 128-token blocks and D columns: no load mask needed.
    q = tl.load(Q8 + b * sq_b + h * sq_h + start_m64 * sq_n + offs_ml[:, None] * sq_n + offs_d[None, :])
    q_scale = tl.load(QS + (b * n_heads + h) * n_q_scales + start_m // QBLK)
    K_base = K8 + b * sk_b + kvh * sk_h
    V_base = V + b * sv_b + kvh * sv_h
    KS_base = KS + (b * (n_heads // group) + kvh) * n_k_scales

    if MASK_KIND != 0:
        acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        M_base = MASK + b * sm_b + h * sm_h + start_m64 * sm_m
        if MASK_I64:
            # The mask's strides are the caller's: row 127 of a contiguous mask of 17M keys already
            # lies past 2**31 elements. The host says so (a second compiled variant, rarely used);
            # int64 indices everywhere would cost the common case registers (ptxas: 2x the spills).
            m_rows, m_cols = offs_ml.to(tl.int64), offs_n.to(tl.int64)
        else:
            m_rows, m_cols = offs_ml, offs_n
        B_base = BMAP + b * sb_b + h * sb_h + pid_m * sb_m
        for start_n in range(0, n_keys, BLOCK_N):
            # Blocks whose every (query, key) pair is masked are skipped without loading K or V.
            if tl.load(B_base + (start_n // BLOCK_N) * sb_n) != 0:
                acc, l_i, m_i = _attn_step(acc, l_i, m_i, q, q_scale, K_base, V_base, KS_base, sk_n,
                                           sv_n, start_n, n_keys, offs_m, offs_n, offs_d,
                                           M_base, m_rows, m_cols, sm_m, sm_n, n_queries, K_base,
                                           V_base, 0, 0,
                                           HEAD_DIM, D, KBLK, BLOCK_N, True, False, MASK_KIND,
                                           False)
        # Rows with every key masked: output 0 (as SDPA's math path in recent torch), LSE -inf.
        inv_l = tl.where(l_i > 0, 1.0 / l_i, 0.0)
    else:
        acc, l_i, m_i = _attn_rows(q, q_scale, K_base, V_base, KS_base, sk_n, sv_n, start_m, n_keys,
                                   offs_m, offs_n, offs_d, K_DESC, V_DESC, b.to(tl.int32),
                                   kvh.to(tl.int32), HEAD_DIM, D, KBLK, BLOCK_M, BLOCK_N, IS_CAUSAL,
                                   USE_TMA)
        inv_l = 1.0 / l_i

    out = acc * inv_l[:, None]
    row_ok = offs_m < n_queries
    o_ptrs = Out + b * so_b + h * so_h + start_m64 * so_n + offs_ml[:, None] * so_n + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :])
    if RETURN_LSE:
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + (b * n_heads + h) * n_queries + offs_m, lse, mask=row_ok)


def _descriptor_ok(t: torch.Tensor) -> bool:
    """TMA needs a 16-byte aligned base and 16-byte multiples for every stride but the last (1)."""
    size = t.element_size()
    return (t.data_ptr() % 16 == 0 and t.stride(-1) == 1
            and all((st * size) % 16 == 0 for st in t.stride()[:-1]))


def run_attention(q, k, v, *, is_causal: bool, attn_mask, sm_scale: float, smooth_k: bool,
                  return_lse: bool, config: KernelConfig | None = None,
                  out: torch.Tensor | None = None):
    """Runs the kernel on HND views ``q [B, Hq, Nq, D]``, ``k, v [B, Hkv, Nk, D]`` (validated).

    Writes ``out`` (an HND view, any strides with unit last stride; allocated when None) and returns
    ``(out, lse [B, Hq, Nq] fp32 or None)``.
    """
    batch, n_heads, n_queries, head_dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[2]
    dp = quant.padded_head_dim(head_dim)
    # The descriptor tiles only where descriptors can be used (see use_tma below): a padded head
    # dim, a mask or a misaligned V runs the pointer-load kernel, with that kernel's tiles (the
    # descriptor config's 4 warps spill 4x more there: 716 against 184 bytes at d=80, sm_90).
    tma_ok = (tma_available(q.device) and attn_mask is None and head_dim == dp
              and (v.stride(-1) != 1 or _descriptor_ok(v)))  # a copied V is contiguous
    cfg = config or pick_config(dp, is_causal, attn_mask is not None, use_tma=tma_ok)

    # The mask first: it may refuse the call (NaN / +inf), before any kernel is launched.
    mask_kind, mask_view, block_map = prepare_mask(attn_mask, batch, n_heads, n_queries, n_keys,
                                                   cfg.block_m, cfg.block_n)
    q8, q_scale, k8, k_scale, corr = quant.quantize_qk(q, k, sm_scale=sm_scale, smooth_k=smooth_k,
                                                       want_lse=return_lse)
    # P.V runs in V's own 16-bit type (fp32 accumulation): a bfloat16 V keeps its range.
    v16 = quant.tile_addressable(v, 2, cfg.block_n)

    if out is None:
        out = torch.empty((batch, n_heads, n_queries, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, n_heads, n_queries), dtype=torch.float32, device=q.device) if return_lse else q_scale

    if mask_kind == MASK_NONE:
        mask_view = block_map = q_scale
        m_strides = b_strides = (0, 0, 0, 0)
        mask_i64 = False
    else:
        m_strides, b_strides = mask_view.stride(), block_map.stride()
        mask_i64 = quant.tile_span(mask_view, {2: cfg.block_m, 3: cfg.block_n}) > quant.INT32_MAX

    # Descriptors only where the tile matches the tensor (no padded head dim) and TMA's alignment holds.
    use_tma = cfg.use_tma and mask_kind == MASK_NONE and head_dim == dp and _descriptor_ok(v16)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        # 4-D descriptors over the real shapes: rows past a head's last token read as zeros.
        k_desc = TensorDescriptor(k8, list(k8.shape), list(k8.stride()), [1, 1, cfg.block_n, dp])
        v_desc = TensorDescriptor(v16, list(v16.shape), list(v16.stride()), [1, 1, cfg.block_n, dp])
    else:
        k_desc, v_desc = k8, v16  # unused
    grid = (triton.cdiv(n_queries, cfg.block_m), n_heads, batch)
    _attn_fwd_kernel[grid](
        q8, k8, v16, q_scale, k_scale, out, lse, mask_view, block_map, k_desc, v_desc,
        q8.stride(0), q8.stride(1), q8.stride(2), k8.stride(0), k8.stride(1), k8.stride(2),
        v16.stride(0), v16.stride(1), v16.stride(2), out.stride(0), out.stride(1), out.stride(2),
        *m_strides, *b_strides,
        n_heads, n_heads // kv_heads, n_queries, n_keys, q_scale.shape[2], k_scale.shape[2],
        HEAD_DIM=head_dim, D=dp, QBLK=quant.BLKQ, KBLK=quant.BLKK,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=is_causal,
        MASK_KIND=mask_kind, MASK_I64=mask_i64, RETURN_LSE=return_lse, USE_TMA=use_tma,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not return_lse:
        return out, None
    if corr is not None:
        lse += corr
    return out, lse


__all__ = ["KernelConfig", "pick_config", "run_attention", "MASK_NONE", "MASK_BOOL", "MASK_ADD"]
