"""sageattn_varlen audit on a real GPU: what tests/unit/test_varlen_audit30.py checks under Triton's
interpreter, on the compiled kernels and through the public function (the dispatcher's own choice).

Every case compares with a float64 per-sequence softmax attention (GQA by repeating K/V, top-left
causal as SDPA's is_causal, zeros for a query without keys).
"""

from __future__ import annotations

import math

import pytest
import torch

import sageattention as sa

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

COS_MIN = 0.9998
MAX_ABS = 0.06   # INT8 Q.K and fp16/bf16 P against float64, |v| ~ N(0, 1)


def _triton():
    st = pytest.importorskip("sageattention.triton")
    ok, reason = st.is_available()
    if not ok:
        pytest.skip(f"Triton backend unavailable here: {reason}")
    return st


def _offsets(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _reference(q, k, v, cq, ck, causal, scale):
    q, k, v = (t.double().cpu() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for a, b, c, d in zip(cq, cq[1:], ck, ck[1:]):
        if b == a or d == c:
            continue
        qs = q[a:b].transpose(0, 1)
        ks, vs = (t[c:d].transpose(0, 1).repeat_interleave(group, 0) for t in (k, v))
        s = qs @ ks.transpose(-1, -2) * scale
        if causal:
            s = s.masked_fill(~torch.ones(b - a, d - c, dtype=torch.bool).tril(), -math.inf)
        out[a:b] = (s.softmax(-1) @ vs).transpose(0, 1)
    return out


def _in_nan_buffer(t):
    buf = torch.full((t.shape[0] + 4, t.shape[1], t.shape[2] + 24), float("nan"), dtype=t.dtype,
                     device=t.device)
    buf[2:-2, :, :t.shape[2]] = t
    return buf[2:-2, :, :t.shape[2]]


CASES = {
    # name: (lens_q, lens_k, hq, hkv, d, dtype, causal, extra keywords)
    "gqa_causal_q_shorter": ([5, 300, 64], [9, 650, 64], 8, 2, 128, torch.float16, True, {}),
    "gqa_causal_q_longer": ([200, 700], [30, 100], 6, 3, 64, torch.bfloat16, True, {}),
    "empty_sequences": ([0, 3, 0, 400, 2], [2, 0, 0, 500, 1], 4, 2, 64, torch.bfloat16, False, {}),
    "empty_sequences_causal": ([0, 3, 0, 400, 2], [2, 0, 0, 500, 1], 4, 2, 64, torch.float16, True, {}),
    "one_token_each": ([1, 1, 1], [1, 1, 1], 2, 1, 128, torch.float16, True, {}),
    "tile_edges": ([128, 129, 64, 65, 255], [129, 128, 65, 64, 257], 4, 1, 64, torch.float16, True, {}),
    "head_dim_40": ([70, 200], [70, 330], 2, 1, 40, torch.float16, False, {"scale": 0.3}),
    "head_dim_96_no_smoothing": ([70, 170], [90, 165], 2, 2, 96, torch.float16, True, {"smooth_k": False}),
    "head_dim_256": ([70, 300], [65, 140], 2, 1, 256, torch.bfloat16, True, {}),
    "negative_sm_scale": ([50, 400], [90, 650], 4, 2, 64, torch.bfloat16, False, {"sm_scale": -0.1}),
    "int64_cpu_offsets": ([50, 400], [90, 650], 4, 2, 128, torch.float16, True, {"offsets": "int64_cpu"}),
    "strided_gpu_offsets": ([50, 400], [90, 650], 4, 2, 128, torch.float16, True, {"offsets": "strided"}),
    "max_seqlen_upper_bound": ([50, 400], [90, 650], 2, 1, 64, torch.float16, True, {"extra_max": 10**9}),
    "nan_buffer_views_d40": ([70, 300], [90, 650], 2, 1, 40, torch.float16, True, {"nan_buffer": True}),
    "nan_buffer_views_d128": ([70, 300], [90, 650], 2, 1, 128, torch.bfloat16, False, {"nan_buffer": True}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_varlen_matches_float64_per_sequence(name):
    _triton()
    lens_q, lens_k, hq, hkv, d, dtype, causal, extra = CASES[name]
    extra = dict(extra)
    g = torch.Generator(device="cuda").manual_seed(30)
    cq, ck = _offsets(lens_q), _offsets(lens_k)
    q = torch.randn(cq[-1], hq, d, device="cuda", generator=g).to(dtype)
    k = torch.cat([torch.randn(n, hkv, d, device="cuda", generator=g) + 2.0 * i for i, n in enumerate(lens_k)])
    k = k.to(dtype)
    v = torch.randn(ck[-1], hkv, d, device="cuda", generator=g).to(dtype)
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cq, ck))
    kind = extra.pop("offsets", None)
    if kind == "int64_cpu":
        cu_q, cu_k = cu_q.long().cpu(), cu_k.long().cpu()
    elif kind == "strided":
        cu_q, cu_k = (torch.stack([c * 7, c], 1)[:, 1] for c in (cu_q, cu_k))
    if extra.pop("nan_buffer", False):
        q, k, v = (_in_nan_buffer(t) for t in (q, k, v))
    more = extra.pop("extra_max", 0)
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q) + more, max(lens_k) + more, is_causal=causal,
                             **extra)
    assert sa.last_backend() == "triton-fp16"
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device and out.is_contiguous()
    assert torch.isfinite(out).all()
    ref = _reference(q, k, v, cq, ck, causal, extra.get("sm_scale", extra.get("scale", d ** -0.5)))
    got = out.double().cpu()
    for i in range(len(lens_q)):
        if lens_q[i] and not lens_k[i]:
            assert (got[cq[i]:cq[i + 1]] == 0).all(), f"sequence {i}: queries without keys must give zeros"
    cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item()
    assert cos >= COS_MIN and (got - ref).abs().max().item() <= MAX_ABS, (cos, (got - ref).abs().max().item())


def test_varlen_ten_thousand_sequences():
    _triton()
    g = torch.Generator().manual_seed(31)
    lens_q = torch.randint(0, 40, (10000,), generator=g).tolist()
    lens_k = torch.randint(0, 40, (10000,), generator=g).tolist()
    lens_q[0], lens_k[0] = 300, 300   # one long sequence: several tiles
    cq, ck = _offsets(lens_q), _offsets(lens_k)
    hq, hkv, d = 4, 2, 64
    q = torch.randn(cq[-1], hq, d, generator=g).half().cuda()
    k = (torch.randn(ck[-1], hkv, d, generator=g) + 1.0).half().cuda()
    v = torch.randn(ck[-1], hkv, d, generator=g).half().cuda()
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cq, ck))
    for causal in (False, True):
        out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal)
        assert sa.last_backend() == "triton-fp16"
        got = out.double().cpu()
        ref = _reference(q, k, v, cq, ck, causal, d ** -0.5)
        assert torch.isfinite(got).all()
        cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item()
        assert cos >= COS_MIN and (got - ref).abs().max().item() <= MAX_ABS


def test_segment_mean_of_a_sequence_ending_at_the_int32_edge():
    # K is one token expanded (stride 0: no memory, and the wrapped reads stay in bounds), so the
    # mean is that token; lanes past 2**31 - 1 wrap negative, pass the "< end" mask and are summed.
    _triton()
    from sageattention.triton import quant

    n = 2**31 - 1
    token = torch.randn(1, 1, 8, device="cuda")
    x = token.expand(n, 1, 8)
    cu = torch.tensor([n - 41, n], dtype=torch.int32, device="cuda")
    mean = quant.segment_mean(x, cu)
    torch.cuda.synchronize()
    assert torch.allclose(mean[0, 0], token[0, 0], atol=1e-5)
