"""Audit of the reference (sageattention.reference) and the SDPA drop-in (sageattention.sdpa_compat).

The reference is checked against float64 math written here from docs/architecture.md's text
("Quantization semantics"), not from the reference's code: the scale groups are spelled out per
token, the INT8 rounding is redone, and the softmax and LSE are exact float64 over the dequantized
scores. What remains between the two is the rounding of P to 16 bits and fp32 arithmetic, so the
bounds are tight enough that a wrong mask alignment, GQA head, scale group or LSE term fails them.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention.reference import (FAMILY_BLOCK_SIZES, FP8_V_SCALE_FLOOR, quantize_int8, sageattn_reference,
                                     scale_group_ids)

TORCH_SDPA = F.scaled_dot_product_attention
LOG2E = math.log2(math.e)
GRANS = ("per_block", "per_warp", "per_thread")


def group_keys(n, gran, is_query, blkq, blkk, warpq):
    """Each token's scale group, as architecture.md words it."""
    keys = []
    for t in range(n):
        if is_query:
            key = {"per_block": (t // blkq,), "per_warp": (t // warpq,),
                   # the rows g, g+8, ... of a WARPQ block: one mma thread's rows
                   "per_thread": (t // warpq, t % 8)}[gran]
        else:
            # per_thread: columns 2t, 2t+1 of each n8 tile of a BLKK block
            key = (t // blkk, (t % 8) // 2) if gran == "per_thread" else (t // blkk,)
        keys.append(key)
    return keys


def quantize_spec(x, gran, is_query, blkq, blkk, warpq):
    """(int8 values, per-token scales) of an fp32 [B, H, N, D] tensor: scale = max(amax / 127, 1e-8)
    over each group, values round(x / scale) half to even, clamped to [-127, 127]."""
    b, h, n, _ = x.shape
    keys = group_keys(n, gran, is_query, blkq, blkk, warpq)
    values, scales = torch.empty_like(x), torch.empty(b, h, n, dtype=x.dtype)
    for key in set(keys):
        idx = torch.tensor([i for i, k in enumerate(keys) if k == key])
        amax = x[:, :, idx].abs().amax(dim=(-1, -2))
        scale = torch.clamp_min(amax / torch.tensor(127.0), 1e-8)
        values[:, :, idx] = torch.round(x[:, :, idx] / scale[..., None, None]).clamp(-127, 127)
        scales[:, :, idx] = scale[..., None]
    return values, scales


def emulate(q, k, v, *, is_causal, sm_scale, gran, smooth_k, blkq, blkk, warpq):
    """float64 attention over the dequantized INT8 scores (HND), with the LSE of architecture.md."""
    d = q.shape[-1]
    scale = d ** -0.5 if sm_scale is None else sm_scale
    qf, kf = q.float(), k.float()
    km = kf.mean(dim=2, keepdim=True)
    qv, qs = quantize_spec(qf * (scale * LOG2E), gran, True, blkq, blkk, warpq)
    kv, ks = quantize_spec(kf - km if smooth_k else kf, gran, False, blkq, blkk, warpq)
    group = q.shape[1] // k.shape[1]
    kd = (kv.double() * ks.double()[..., None]).repeat_interleave(group, dim=1)
    s2 = (qv.double() * qs.double()[..., None]) @ kd.transpose(-1, -2)   # base-2 logits
    s = s2 / LOG2E
    if is_causal:   # SDPA's: query i sees keys j <= i (top left)
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1), -math.inf)
    lse = s.logsumexp(dim=-1)
    if smooth_k:
        lse = lse + (q.double() * km.double().repeat_interleave(group, dim=1)).sum(-1) * scale
    return s.softmax(dim=-1) @ v.double().repeat_interleave(group, dim=1), lse


def attention64(q, k, v, *, is_causal=False, scale=None, mask=None):
    """Exact float64 attention, HND, GQA by repeat_interleave, written out (no SDPA)."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    return s.softmax(-1) @ v, s.logsumexp(-1)


# (family, gran, hq, hkv, d, nq, nk, causal, sm_scale): the lengths 1, 17, 31, 33, 127, 129, 1000,
# causal with Nq < Nk and Nq > Nk, GQA and MQA, head dims besides 64/128, scales given, negative, zero
EMULATED = [
    ("sm80", "per_thread", 4, 2, 64, 129, 127, True, None),
    ("sm80", "per_warp", 4, 1, 40, 31, 1000, False, 0.25),
    ("sm80", "per_block", 2, 2, 96, 1000, 33, True, -0.1),
    ("sm75", "per_thread", 3, 1, 16, 17, 17, False, None),
    ("sm75", "per_warp", 2, 2, 72, 127, 129, True, 0.0),
    ("triton", "per_block", 2, 1, 64, 1, 1, True, None),
    ("triton", "per_thread", 4, 2, 32, 33, 200, True, 1.0),
    ("sm90", "per_thread", 2, 1, 128, 200, 31, True, None),
]


@pytest.mark.parametrize("smooth_k", [True, False])
@pytest.mark.parametrize("family,gran,hq,hkv,d,nq,nk,causal,sm_scale", EMULATED)
def test_reference_is_the_documented_algorithm(family, gran, hq, hkv, d, nq, nk, causal, sm_scale, smooth_k):
    q = torch.randn(2, hq, nq, d)
    k = torch.randn(2, hkv, nk, d) + 3 * torch.randn(d)   # a channel offset: the LSE term matters
    v = torch.randn(2, hkv, nk, d)
    sizes = FAMILY_BLOCK_SIZES[family]
    out, lse = sageattn_reference(q, k, v, is_causal=causal, sm_scale=sm_scale, qk_quant_gran=gran,
                                  smooth_k=smooth_k, return_lse=True, **sizes)
    expect, expect_lse = emulate(q, k, v, is_causal=causal, sm_scale=sm_scale, gran=gran, smooth_k=smooth_k,
                                 **{n: sizes[n] for n in ("blkq", "blkk", "warpq")})
    assert out.dtype == torch.float32 and lse.dtype == torch.float32 and lse.shape == (2, hq, nq)
    # P in fp16 (11 bits) is the only rounding the emulation leaves out
    assert (out.double() - expect).abs().max() <= 2e-3 * expect.abs().max()
    assert (lse.double() - expect_lse).abs().max() <= 1e-4 * max(1.0, expect_lse.abs().max().item())


@pytest.mark.parametrize("n", [1, 17, 31, 33, 127, 129, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_against_float64_sdpa_at_odd_lengths(attn_metrics, n, causal):
    q, k, v = torch.randn(1, 4, n, 64).half(), torch.randn(1, 2, n, 64).half(), torch.randn(1, 2, n, 64).half()
    out, lse = sageattn_reference(q, k, v, is_causal=causal, return_lse=True)
    ref = TORCH_SDPA(q.double(), k.double(), v.double(), is_causal=causal, enable_gqa=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert torch.equal(ref, attention64(q, k, v, is_causal=causal)[0]) or \
        (ref - attention64(q, k, v, is_causal=causal)[0]).abs().max() < 1e-12
    cos, rel_l1 = attn_metrics(out, ref)
    assert cos >= 0.9998 and rel_l1 <= 0.02, (cos, rel_l1)


@pytest.mark.parametrize("family", ["sm75", "sm80"])
@pytest.mark.parametrize("gran", GRANS)
@pytest.mark.parametrize("is_query", [True, False])
@pytest.mark.parametrize("n", [1, 17, 31, 33, 127, 129, 200])
def test_scale_groups_are_architecture_md_groups(family, gran, is_query, n):
    sizes = {name: FAMILY_BLOCK_SIZES[family][name] for name in ("blkq", "blkk", "warpq")}
    # every token its own amax, so a token in the wrong group takes the wrong scale
    x = torch.randn(2, 3, n, 32) * torch.linspace(0.5, 4.0, n)[:, None]
    values, token_scale, group_scale = quantize_int8(x, granularity=gran, is_query=is_query, **sizes)
    expect_values, expect_scale = quantize_spec(x, gran, is_query, **sizes)
    assert torch.equal(token_scale, expect_scale) and torch.equal(values, expect_values)
    # the kernels' scale tensor: one slot per group of every block, a partial block's empty ones floored
    per_block = {"per_block": 1, "per_warp": 1, "per_thread": 8 if is_query else 4}[gran]
    block = sizes["blkq"] if is_query and gran == "per_block" else sizes["warpq"] if is_query else sizes["blkk"]
    assert group_scale.shape == (2, 3, -(-n // block) * per_block)
    gid, count = scale_group_ids(n, granularity=gran, is_query=is_query, **sizes)
    assert count == group_scale.shape[-1] and torch.equal(group_scale[..., gid], token_scale)
    unused = torch.ones(count, dtype=torch.bool)
    unused[gid] = False
    assert torch.all(group_scale[..., unused] == 1e-8)


def test_int8_rounding_floor_and_clamp():
    # group amax 127: scale 1 exactly, so x / scale is x and the ties show
    x = torch.zeros(1, 1, 64, 8)
    x[0, 0, 0, :7] = torch.tensor([127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -1.5])
    values, _, group_scale = quantize_int8(x, granularity="per_block", is_query=False)
    assert group_scale.item() == 1.0
    assert values[0, 0, 0, :7].tolist() == [127.0, 2.0, 4.0, -2.0, -4.0, 0.0, -2.0]   # half to even
    # an all-zero (or vanishing) group: the 1e-8 floor, values 0, nothing NaN
    for tiny in (0.0, 1e-30):
        z = torch.full((1, 2, 70, 16), tiny)
        for gran in GRANS:
            for is_query in (True, False):
                values, token_scale, group_scale = quantize_int8(z, granularity=gran, is_query=is_query)
                assert torch.all(group_scale == 1e-8) and not values.any() and torch.isfinite(values).all()
    # the floor also keeps values in range: amax 1e-6 over a 1e-8 scale would be 100, inside 127
    x = torch.randn(1, 1, 64, 16) * 1e-9
    values, _, _ = quantize_int8(x, granularity="per_block", is_query=False)
    assert values.abs().max() <= 127
    out = sageattn_reference(torch.zeros(1, 2, 40, 64), torch.zeros(1, 2, 40, 64), torch.randn(1, 2, 40, 64),
                             is_causal=True, return_lse=True)
    assert all(torch.isfinite(t).all() for t in out)


@pytest.mark.parametrize("gran", GRANS)
def test_tokens_past_the_end_are_zeros(gran):
    # The kernels zero-fill a partial block: padding q with zero rows to the block changes no real row
    q, k, v = torch.randn(1, 2, 100, 64), torch.randn(1, 2, 90, 64), torch.randn(1, 2, 90, 64)
    padded = torch.cat([q, torch.zeros(1, 2, 28, 64)], dim=2)
    for causal in (False, True):
        a, la = sageattn_reference(q, k, v, qk_quant_gran=gran, is_causal=causal, return_lse=True)
        b, lb = sageattn_reference(padded, k, v, qk_quant_gran=gran, is_causal=causal, return_lse=True)
        assert torch.equal(a, b[:, :, :100]) and torch.equal(la, lb[:, :, :100])
    # and a partial K block's scales are those of the zero-filled block
    for gran_k in GRANS:
        part = quantize_int8(k, granularity=gran_k, is_query=False)
        full = quantize_int8(torch.cat([k, torch.zeros(1, 2, 38, 64)], dim=2), granularity=gran_k, is_query=False)
        assert torch.equal(part[2], full[2]) and torch.equal(part[0], full[0][:, :, :90])


def test_negative_and_zero_scales_are_the_kernels_inputs():
    # core hands the kernels -q with |scale| for a negative scale and a zero q with 1 for zero
    # (_positive_scale): the reference gives the very same output and LSE either way
    q, k, v = torch.randn(2, 4, 33, 64).half(), torch.randn(2, 2, 70, 64).half(), torch.randn(2, 2, 70, 64).half()
    a = sageattn_reference(q, k, v, sm_scale=-0.3, return_lse=True, is_causal=True)
    b = sageattn_reference(-q, k, v, sm_scale=0.3, return_lse=True, is_causal=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    a = sageattn_reference(q, k, v, sm_scale=0.0, return_lse=True)
    b = sageattn_reference(q * 0.0, k, v, sm_scale=1.0, return_lse=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    expect, expect_lse = attention64(q, k, v, scale=0.0)   # equal weights: the mean of V
    assert (a[0].double() - expect).abs().max() < 2e-3
    assert torch.allclose(a[1].double(), expect_lse) and torch.allclose(expect_lse, torch.full_like(expect_lse, math.log(70)))


@pytest.mark.parametrize("accum,terms", [("fp32", 2), ("fp32", 1), ("fp32+fp32", 2), ("fp32+fp16", 1)])
def test_fp8_v_is_per_channel_e4m3_in_one_or_two_terms(accum, terms):
    # Query 0 under is_causal sees key 0 alone: P = 1 (448 in e4m3, exact), so its output is the
    # dequantized V of key 0, scaled per (batch, kv head, channel) over all the tokens
    q, k = torch.randn(2, 4, 8, 64), torch.randn(2, 2, 8, 64)
    v = torch.randn(2, 2, 8, 64) * torch.logspace(-2, 2, 64)   # channels of very different sizes
    out = sageattn_reference(q, k, v, is_causal=True, pv_dtype="fp8", pv_accum_dtype=accum, fp8_v_terms=terms)
    v_max = 2.25 if accum == "fp32+fp16" else 448.0
    scale = torch.clamp_min(v.abs().amax(dim=2, keepdim=True) / v_max, FP8_V_SCALE_FLOOR)
    x = (v / scale).clamp(-448, 448)
    hi = x.to(torch.float8_e4m3fn).float()
    lo = (x - hi).to(torch.float8_e4m3fn).float()
    deq = (hi + lo if terms == 2 else hi) * scale
    assert torch.allclose(out[:, :, 0], deq[:, :, 0].repeat_interleave(2, dim=1), rtol=1e-6, atol=0)
    assert (deq - v).abs().max() <= (v.abs().amax(dim=2, keepdim=True) * (2 ** -8 if terms == 2 else 2 ** -4)).max()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("pv_dtype", ["fp16", "fp8"])
def test_output_keeps_the_input_dtype_lse_is_fp32(dtype, pv_dtype):
    q, k, v = (torch.randn(1, 2, 40, 64, dtype=dtype) for _ in range(3))
    out, lse = sageattn_reference(q, k, v, pv_dtype=pv_dtype, return_lse=True, tensor_layout="NHD")
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32 and lse.shape == (1, 40, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_a_v_beyond_fp16s_range_stays_finite_in_fp16_pv(attn_metrics, dtype):
    # FP16 P.V rounds V to fp16. A bfloat16 V was divided by a per-channel power of two first
    # (fp16_v_scale), but a float32 or float64 one went to fp16 unscaled: |V| past 65504 became
    # inf and the output inf/NaN, where the same values in bfloat16 gave the right attention
    q, k, v = (torch.randn(1, 2, 64, 64) for _ in range(3))
    v = (v * 1e5).to(dtype)
    out = sageattn_reference(q.to(dtype), k.to(dtype), v)
    assert torch.isfinite(out).all()
    cos, rel_l1 = attn_metrics(out, attention64(q, k, v)[0])
    assert cos >= 0.9998 and rel_l1 <= 0.02, (cos, rel_l1)
    # ordinary values (|V| <= 32768) are unchanged by the scaling: the unscaled conversion's result
    small = v.float() / 1e3
    assert torch.equal(sageattn_reference(q, k, small), sageattn_reference(q, k, small, pv16=torch.float16))


# --- the SDPA drop-in ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 4, 24, 16), (4, 24, 16)])   # sageattn's path, torch's path
def test_drop_in_takes_bools_for_dropout_p_and_scale_as_torch_does(shape):
    # torch's SDPA reads a bool given for a float argument as 0.0 / 1.0 (`dropout_p=self.training
    # and p` is False in eval); the drop-in raised TypeError for it
    np = pytest.importorskip("numpy")
    q = torch.randn(*shape, dtype=torch.float64)
    for off in (False, np.bool_(False), torch.tensor(False)):
        assert torch.equal(sa.scaled_dot_product_attention(q, q, q, dropout_p=off), TORCH_SDPA(q, q, q))
    for one in (True, np.bool_(True), torch.tensor(True)):
        assert torch.equal(sa.scaled_dot_product_attention(q, q, q, scale=one), TORCH_SDPA(q, q, q, scale=1.0))
    assert torch.equal(sa.scaled_dot_product_attention(q, q, q, dropout_p=True), torch.zeros_like(q))
    assert torch.equal(TORCH_SDPA(q, q, q, dropout_p=True), torch.zeros_like(q))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_drop_in_matches_float64_math_for_sdpa_keywords(dtype):
    # causal with Nq != Nk both ways (top left), GQA, masks of several broadcast shapes, scale
    tol = 1e-12 if dtype == torch.float64 else 1e-5 if dtype == torch.float32 else 3e-3
    for nq, nk in ((5, 9), (9, 5)):
        q, k, v = torch.randn(2, 4, nq, 16, dtype=dtype), torch.randn(2, 2, nk, 16, dtype=dtype), \
            torch.randn(2, 2, nk, 16, dtype=dtype)
        out = sa.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.3)
        assert out.dtype == dtype and (out.double() - attention64(q, k, v, is_causal=True, scale=0.3)[0]).abs().max() < tol
        for shape in ((1, nk), (nq, 1), (nq, nk), (4, nq, nk), (2, 1, 1, nk), (2, 4, nq, nk)):
            bool_mask = torch.rand(shape) > 0.3
            float_mask = torch.randn(shape, dtype=dtype)
            for mask in (bool_mask, float_mask):
                want = attention64(q, k, v, mask=mask.expand(2, 4, nq, nk))[0]
                want = torch.nan_to_num(want, nan=0.0)   # a row without a visible key: 0 (below)
                got = sa.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
                assert got.dtype == dtype and (got.double() - want).abs().max() < tol, (shape, mask.dtype)


def test_drop_in_float64_inputs_with_a_float32_mask():
    # torch 2.14's CPU SDPA gets float64 inputs with a float32 additive mask wrong (off by units);
    # the drop-in widens the mask and is right
    q, k, v = (torch.randn(2, 4, 17, 32, dtype=torch.float64) for _ in range(3))
    mask = torch.randn(17, 17)
    out = sa.scaled_dot_product_attention(q, k, v, mask)
    assert (out - attention64(q, k, v, mask=mask)[0]).abs().max() < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_drop_in_fully_masked_rows_are_zero_not_nan(dtype):
    # docs/api.md: a query whose keys are all masked (all False, or all -inf) gets 0 from the
    # fallback, whichever kernel torch picks (plain softmax gives NaN there; torch 2.14's CPU
    # kernels, math included, give 0 too, its CUDA ones have given NaN)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(2, 4, 6, 16, dtype=dtype) for _ in range(3))
    bool_mask = torch.rand(6, 6) > 0.4
    bool_mask[2] = False
    float_mask = torch.zeros(6, 6, dtype=dtype).masked_fill(~bool_mask, -math.inf)
    want = attention64(q, k, v, mask=bool_mask)[0]
    assert torch.isnan(want[:, :, 2]).all()
    want[:, :, 2] = 0
    for mask in (bool_mask, float_mask):
        with sdpa_kernel(SDPBackend.MATH):
            got = sa.scaled_dot_product_attention(q, k, v, mask)
        assert (got.double() - want).abs().max() < 1e-5
        assert (sa.scaled_dot_product_attention(q, k, v, mask).double() - want).abs().max() < 1e-5


def test_drop_in_refuses_a_mask_with_is_causal_as_sdpa_does():
    q = torch.randn(2, 4, 6, 16)
    mask = torch.ones(6, 6, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal=True"):
        TORCH_SDPA(q, q, q, mask, is_causal=True)
    for query in (q, q[0]):   # sageattn's path (its ValueError), torch's path (torch's error)
        with pytest.raises((ValueError, RuntimeError), match="is_causal=True"):
            sa.scaled_dot_product_attention(query, query, query, mask, is_causal=True)
