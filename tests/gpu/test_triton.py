"""Triton backend on a real GPU: quantization, accuracy bars, masks, varlen, reference agreement.

Accuracy bars are design.md's for INT8 QK / FP16 PV against fp32 SDPA on normal inputs
(cosine >= 0.9998, relative L1 <= 0.02), and never a NaN or Inf.
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_helpers import triton_or_skip as _triton

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

COS_MIN = 0.9998
REL_L1_MAX = 0.02


def _metrics(out, ref):
    out, ref = out.float(), ref.float()
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
    return cos, ((out - ref).abs().sum() / ref.abs().sum()).item()


def _assert_bars(out, ref, what):
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    cos, l1 = _metrics(out, ref)
    assert cos >= COS_MIN and l1 <= REL_L1_MAX, f"{what}: cos={cos:.6f} rel_l1={l1:.5f}"


def _sdpa32(q, k, v, mask=None, **kw):
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            attn_mask=mask, **kw)


def _qkv(b, hq, hkv, nq, nk, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, nq, d, device="cuda", generator=g).to(dtype)
    k = (torch.randn(b, hkv, nk, d, device="cuda", generator=g) + 1.0).to(dtype)
    v = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(dtype)
    return q, k, v


def test_is_available_on_this_gpu():
    st = pytest.importorskip("sageattention.triton")
    ok, reason = st.is_available()
    cap = torch.cuda.get_device_capability()
    assert ok == (cap >= (8, 0)), reason


def test_quantization_is_exact_against_reference():
    _triton()
    from sageattention.reference import quantize_int8
    from sageattention.triton import quant
    x = torch.randn(2, 8, 1000, 128, device="cuda") * 2
    sm = 128 ** -0.5 * math.log2(math.e)
    q8, qs, _ = quant.quantize_dense(x.half(), block=128, pad_to=128, scale_mult=sm)
    xr = x.half().float()
    rv, _, rs = quantize_int8(xr * sm, granularity="per_block", is_query=True)
    assert torch.equal(q8[:, :, :1000].float(), rv)
    assert torch.allclose(qs, rs, rtol=1e-6, atol=0)
    assert (q8[:, :, 1000:] == 0).all()
    mean = xr.mean(dim=2)
    k8, ks, _ = quant.quantize_dense(x.half(), block=64, pad_to=64, mean=mean)
    kv, _, kgs = quantize_int8(xr - mean[:, :, None], granularity="per_block", is_query=False)
    assert torch.equal(k8[:, :, :1000].float(), kv)
    assert torch.allclose(ks, kgs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_accuracy_bars(dtype, causal, d):
    st = _triton()
    q, k, v = _qkv(2, 16, 16, 2048, 2048, d, dtype)
    out, _ = st.attention(q, k, v, tensor_layout="HND", is_causal=causal)
    _assert_bars(out, _sdpa32(q, k, v, is_causal=causal), f"{dtype} d={d} causal={causal}")


@pytest.mark.parametrize("nq, nk, causal", [(1000, 3000, False), (3001, 777, True), (1, 5000, False),
                                             (4999, 4999, True)])
def test_gqa_cross_attention_nhd_and_lse(nq, nk, causal):
    st = _triton()
    q, k, v = _qkv(2, 8, 2, nq, nk, 128, torch.float16, seed=nq)
    qn, kn, vn = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    out, lse = st.attention(qn, kn, vn, tensor_layout="NHD", is_causal=causal, return_lse=True)
    assert out.shape == qn.shape and out.dtype == qn.dtype
    _assert_bars(out.transpose(1, 2), _sdpa32(q, k, v, is_causal=causal), f"nq={nq} nk={nk}")
    scores = (q.float() @ k.float().repeat_interleave(4, 1).transpose(-1, -2)) * 128 ** -0.5
    if causal:
        scores = scores.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device="cuda").tril().logical_not(),
                                    -math.inf)
    exact = torch.logsumexp(scores, dim=-1)
    assert torch.isfinite(lse).all()
    assert (lse - exact).abs().max().item() < 0.05


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("nq, nk, d, causal", [(1000, 3000, 128, False), (777, 777, 80, True),
                                                (129, 4097, 64, False), (1, 31, 128, False)])
def test_tensor_descriptor_loads_match_pointer_loads(layout, nq, nk, d, causal):
    """use_tma (K and V through 4-D tensor descriptors) computes what pointer loads compute: ragged
    ends, a padded head dim (80 -> 128), GQA and NHD strides included."""
    _triton()
    from sageattention.triton import attn
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("tensor descriptors (TMA) need compute capability 9.0+")
    q, k, v = _qkv(2, 8, 2, nq, nk, d, torch.bfloat16, seed=nk)
    if layout == "NHD":  # HND views of NHD memory: heads interleaved with tokens
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    dp = 128 if d > 64 else 64
    outs = []
    for use_tma in (False, True):
        cfg = attn.KernelConfig(128, 64, 8 if dp > 64 else 4, 3, use_tma=use_tma)
        out, lse = attn.run_attention(q, k, v, is_causal=causal, attn_mask=None, sm_scale=d ** -0.5,
                                      smooth_k=True, return_lse=True, config=cfg)
        outs.append((out, lse))
    (ref, ref_lse), (out, lse) = outs
    assert torch.isfinite(out).all()
    cos, _ = _metrics(out, ref)
    assert cos >= 0.99999, f"TMA vs pointer loads: cos={cos:.7f}"
    assert (lse - ref_lse).abs().max().item() <= 1e-3


def test_agrees_with_reference_under_same_quantization():
    st = _triton()
    from sageattention.reference import sageattn_reference
    for causal in (False, True):
        q, k, v = _qkv(1, 4, 2, 1100, 900, 128, torch.float16, seed=7)
        out, lse = st.attention(q, k, v, tensor_layout="HND", is_causal=causal, return_lse=True)
        ref, ref_lse = sageattn_reference(q, k, v, is_causal=causal, qk_quant_gran="per_block",
                                          return_lse=True)
        _, l1 = _metrics(out, ref)
        assert l1 < 1e-3, f"causal={causal}: rel L1 to reference {l1}"
        assert (lse - ref_lse).abs().max().item() < 1e-3


def _masks(b, h, n, dtype_note):
    g = torch.Generator(device="cuda").manual_seed(3)
    lengths = torch.tensor([n, n // 3], device="cuda")
    pad = torch.arange(n, device="cuda")[None, None, None, :] < lengths[:, None, None, None]
    additive = torch.randn(1, h, n, n, device="cuda", generator=g)
    blocky = torch.rand(b, 1, n, n, device="cuda", generator=g) > 0.2
    blocky[:, :, :, 256:1024] = False  # whole tiles masked: skipped
    return {
        "bool_random": torch.rand(b, h, n, n, device="cuda", generator=g) > 0.5,
        "bool_padding": pad,
        "bool_block_sparse": blocky,
        "float32_additive": additive,
        "same_dtype_additive_neg_inf": torch.where(additive > -1.0, 0.0, -math.inf).to(dtype_note),
    }


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["bool_random", "bool_padding", "bool_block_sparse", "float32_additive",
                                  "same_dtype_additive_neg_inf"])
def test_masks_match_sdpa(dtype, name):
    st = _triton()
    q, k, v = _qkv(2, 4, 4, 1500, 1500, 128, dtype, seed=11)
    mask = _masks(2, 4, 1500, dtype)[name]
    out, _ = st.attention(q, k, v, tensor_layout="HND", attn_mask=mask)
    _assert_bars(out, _sdpa32(q, k, v, mask=mask), f"{name} {dtype}")


def test_fully_masked_rows_give_zero_and_neg_inf_lse():
    st = _triton()
    q, k, v = _qkv(1, 2, 2, 300, 400, 64, torch.float16)
    mask = torch.rand(1, 2, 300, 400, device="cuda") > 0.5
    mask[:, :, 17] = False
    out, lse = st.attention(q, k, v, tensor_layout="HND", attn_mask=mask, return_lse=True)
    assert (out[:, :, 17] == 0).all()
    assert (lse[:, :, 17] == -math.inf).all()
    keep = torch.ones(300, dtype=torch.bool, device="cuda")
    keep[17] = False
    _assert_bars(out[:, :, keep], _sdpa32(q, k, v, mask=mask)[:, :, keep], "other rows")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_varlen_ragged_against_per_sequence_sdpa(causal, dtype):
    st = _triton()
    lens_q = [1, 5000, 17, 128, 129, 2047, 64, 3333]
    lens_k = [1, 5000, 300, 128, 1, 2047, 65, 4000] if not causal else lens_q
    hq, hkv, d = 8, 2, 128
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(sum(lens_q), hq, d, device="cuda", generator=g).to(dtype)
    # Each sequence has its own K offset: smoothing must be per sequence.
    k = torch.cat([torch.randn(n, hkv, d, device="cuda", generator=g) + (i % 3) for i, n in enumerate(lens_k)])
    k = k.to(dtype)
    v = torch.randn(sum(lens_k), hkv, d, device="cuda", generator=g).to(dtype)
    out = st.varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal)
    assert torch.isfinite(out).all()
    for i in range(len(lens_q)):
        sl_q = slice(int(cu_q[i]), int(cu_q[i + 1]))
        sl_k = slice(int(cu_k[i]), int(cu_k[i + 1]))
        qi, ki, vi = (t[s].transpose(0, 1)[None] for t, s in ((q, sl_q), (k, sl_k), (v, sl_k)))
        ref = _sdpa32(qi, ki, vi, is_causal=causal)
        oi = out[sl_q].transpose(0, 1)[None]
        if lens_k[i] == 1:  # softmax over one key is exactly 1: the output is that key's value
            assert torch.allclose(oi.float(), ref, atol=1e-2)
        else:
            _assert_bars(oi, ref, f"sequence {i} (q {lens_q[i]}, k {lens_k[i]})")


def test_long_sequence_no_nan():
    st = _triton()
    q, k, v = _qkv(1, 4, 4, 32768, 32768, 64, torch.bfloat16, seed=9)
    for causal in (False, True):
        out, _ = st.attention(q, k, v, tensor_layout="HND", is_causal=causal)
        assert torch.isfinite(out).all()


def test_public_api_runs_these_kernels_with_a_mask_and_varlen():
    _triton()
    import sageattention
    from sageattention.dispatch import last_backend
    q, k, v = _qkv(2, 8, 4, 1000, 1200, 128, torch.bfloat16, seed=21)
    mask = torch.rand(2, 1, 1000, 1200, device="cuda") > 0.3
    out = sageattention.sageattn_qk_int8_pv_fp16_triton(q, k, v, tensor_layout="HND", attn_mask=mask)
    assert last_backend() == "triton-fp16"
    _assert_bars(out, _sdpa32(q, k, v, mask=mask), "public API with bool mask")
    cu = torch.tensor([0, 300, 1000], dtype=torch.int32, device="cuda")
    qp, kp, vp = (torch.randn(1000, h, 64, device="cuda").half() for h in (8, 2, 2))
    out = sageattention.sageattn_varlen(qp, kp, vp, cu, cu, 700, 700, is_causal=True)
    assert last_backend() == "triton-fp16"
    for a, b in ((0, 300), (300, 1000)):
        qi, ki, vi = (t[a:b].transpose(0, 1)[None] for t in (qp, kp, vp))
        _assert_bars(out[a:b].transpose(0, 1)[None], _sdpa32(qi, ki, vi, is_causal=True), f"varlen {a}:{b}")


def test_mask_rows_past_2_31_elements(gpu_memory):
    """A [256, 17.8M] bool mask: row 121 on of a 128-query tile lies past 2**31 elements from the
    tile's first row (int32 in-tile offsets wrapped there before 2026-12; such masks now take the
    kernel's int64 variant). Only the last 512 keys are kept (and nonzero), so every other K block
    is skipped and the output equals the kernel's on those 512 keys and their mask alone."""
    st = _triton()
    gpu_memory(20)
    n, hot, d = 2**24 + 2**20, 512, 64
    g = torch.Generator(device="cuda").manual_seed(12)
    q, k_hot, v_hot = _qkv(1, 1, 1, 256, hot, d, torch.float16, seed=12)
    keep_hot = torch.rand(1, 1, 256, hot, device="cuda", generator=g) < 0.5
    keep_hot[..., 0] = True
    want, _ = st.attention(q, k_hot, v_hot, attn_mask=keep_hot, smooth_k=False)
    k = torch.zeros(1, 1, n, d, dtype=torch.float16, device="cuda")
    v = torch.zeros_like(k)
    k[:, :, -hot:], v[:, :, -hot:] = k_hot, v_hot
    keep = torch.zeros(1, 1, 256, n, dtype=torch.bool, device="cuda")
    keep[..., -hot:] = keep_hot
    got, _ = st.attention(q, k, v, attn_mask=keep, smooth_k=False)
    del k, v, keep
    torch.cuda.empty_cache()
    diff = (got.float() - want.float()).abs().max().item()
    assert torch.allclose(got, want, rtol=1e-3, atol=1e-4), f"max |diff| = {diff}"


def test_varlen_under_cuda_graph_capture_is_refused_in_words():
    # The offsets are read on the host; a capturing stream refused that with a CUDA error that
    # named neither the function nor what to do instead.
    import sageattention as sa

    q = torch.randn(96, 4, 64, device="cuda", dtype=torch.float16)
    cu = torch.tensor([0, 40, 96], dtype=torch.int32, device="cuda")
    sa.sageattn_varlen(q, q, q, cu, cu, 56, 56)   # warm-up outside the graph runs
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"sageattn_varlen\(\) cannot be captured in a CUDA graph"):
        with torch.cuda.graph(graph):
            sa.sageattn_varlen(q, q, q, cu, cu, 56, 56)
    torch.cuda.synchronize()
    out = sa.sageattn_varlen(q, q, q, cu, cu, 56, 56)   # the stream is usable afterwards
    assert torch.isfinite(out).all()


def test_varlen_heads_past_2_31_elements(gpu_memory):
    """Packed k, v as [tokens, heads, D] views of [heads, tokens, D] memory, 6M tokens at D = 128:
    heads 2 and 3 start past 2**31 elements (K smoothing's per-sequence mean computed head *
    stride in int32 before 2026-12). The same call on contiguous copies is the reference."""
    st = _triton()
    gpu_memory(36)
    total, heads, d = 6 * 2**20, 4, 128
    g = torch.Generator(device="cuda").manual_seed(13)
    k = (torch.randn(heads, total, d, device="cuda", generator=g, dtype=torch.float16) + 0.3
         ).transpose(0, 1)
    v = torch.randn(heads, total, d, device="cuda", generator=g, dtype=torch.float16).transpose(0, 1)
    assert 3 * k.stride(1) > 2**31  # the premise
    q = torch.randn(512, 8, d, device="cuda", generator=g, dtype=torch.float16)
    cu_q = torch.tensor([0, 200, 512], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 2 * 2**20, total], dtype=torch.int32, device="cuda")
    got = st.varlen_attention(q, k, v, cu_q, cu_k, 312, total - 2 * 2**20)
    want = st.varlen_attention(q, k.contiguous(), v.contiguous(), cu_q, cu_k, 312,
                               total - 2 * 2**20)
    assert torch.isfinite(got).all()
    assert torch.equal(got, want), f"max |diff| = {(got.float() - want.float()).abs().max().item()}"
