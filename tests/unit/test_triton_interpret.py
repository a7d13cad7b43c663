"""Triton backend on the CPU: kernels run in Triton's interpreter, plus argument checks.

Triton decides interpreter-or-compile when a kernel is decorated, i.e. when
``sageattention.triton.quant/attn`` is first imported, and another test may have imported them
already. So the kernel checks run in one subprocess (this file with ``--worker``) started with
``TRITON_INTERPRET=1``; it prints one JSON object of measurements and the tests below assert on it.
Shapes are tiny but cover tails (sizes off the 128/64 tile grid), GQA, cross-attention, both
layouts, fp16/bf16, every mask kind and ragged variable-length batches.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
from interpreter_worker import run_worker

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


# design.md accuracy bars for INT8 QK / FP16 PV against a high-precision SDPA.
COS_MIN = 0.9998
REL_L1_MAX = 0.02


# ----------------------------------------------------------------------------------------------
# Worker: runs inside the TRITON_INTERPRET=1 subprocess.
# ----------------------------------------------------------------------------------------------

def _metrics(out, ref):
    out, ref = out.double(), ref.double()
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
    l1 = ((out - ref).abs().sum() / ref.abs().sum()).item()
    return {"cos": cos, "rel_l1": l1, "finite": bool(torch.isfinite(out).all())}


def _sdpa64(q, k, v, **kw):
    """float64 SDPA on HND tensors with GQA expanded."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    mask = kw.pop("attn_mask", None)
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        mask = mask if mask.dtype == torch.bool else mask.double()
    return torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                            attn_mask=mask, **kw)


def _worker() -> dict:
    from sageattention import triton as st
    from sageattention.reference import quantize_int8, sageattn_reference
    from sageattention.triton import quant

    gen = torch.Generator().manual_seed(1234)

    def randn(*shape, dtype=torch.float16, shift=0.0):
        return (torch.randn(*shape, generator=gen) + shift).to(dtype)

    res: dict = {}

    # Quantization: identical integers and scales to the reference's per_block quantizer.
    x = randn(2, 3, 150, 64, dtype=torch.float32) * 3
    x[0, 0, :64] = 0  # an all-zero K block: the scale floor, no division by zero
    sm = 0.125 * math.log2(math.e)
    q8, qs, _ = quant.quantize_dense(x, block=128, pad_to=128, scale_mult=sm)
    rv, _, rs = quantize_int8(x * sm, granularity="per_block", is_query=True)
    mean = x.mean(dim=2)
    k8, ks, _ = quant.quantize_dense(x, block=64, pad_to=64, mean=mean)
    kv_, _, kgs = quantize_int8(x - mean[:, :, None], granularity="per_block", is_query=False)
    res["quant"] = {
        "q_int_equal": bool(torch.equal(q8[:, :, :150].float(), rv)),
        "q_scale_close": bool(torch.allclose(qs, rs, rtol=1e-6, atol=0)),
        "q_tail_zero": bool((q8[:, :, 150:] == 0).all()),
        "k_int_equal": bool(torch.equal(k8[:, :, :150].float(), kv_)),
        "k_scale_close": bool(torch.allclose(ks, kgs, rtol=1e-6, atol=0)),
        "k_tail_zero": bool((k8[:, :, 150:] == 0).all()),
        "q_pad_rows": q8.shape[2], "k_pad_rows": k8.shape[2],
    }
    z = torch.zeros(1, 1, 64, 32)
    z8, zs, _ = quant.quantize_dense(z, block=64, pad_to=64)
    res["quant"]["zero_block_scale"] = float(zs[0, 0, 0])
    res["quant"]["zero_block_ints_zero"] = bool((z8 == 0).all())

    # Dense attention against the reference (same quantization) and float64 SDPA.
    cases = {
        "fp16_d64_gqa_cross": dict(b=1, hq=4, hkv=2, nq=130, nk=70, d=64, causal=False, dtype=torch.float16),
        "fp16_d32_causal_square": dict(b=2, hq=2, hkv=2, nq=200, nk=200, d=32, causal=True, dtype=torch.float16),
        "fp16_d128_causal_mqa_long_k": dict(b=1, hq=2, hkv=1, nq=100, nk=260, d=128, causal=True,
                                            dtype=torch.float16),
        "fp16_d64_causal_long_q": dict(b=1, hq=2, hkv=2, nq=300, nk=90, d=64, causal=True, dtype=torch.float16),
        "bf16_d64": dict(b=1, hq=2, hkv=1, nq=129, nk=129, d=64, causal=False, dtype=torch.bfloat16),
        # |V| up to ~4e5: beyond fp16's 65504, so P.V must stay in bf16 to be finite
        "bf16_d128_v_beyond_fp16": dict(b=1, hq=2, hkv=2, nq=70, nk=100, d=128, causal=True,
                                        dtype=torch.bfloat16, v_mult=1e5),
        "fp16_d40_odd_head_dim": dict(b=1, hq=1, hkv=1, nq=70, nk=90, d=40, causal=False, dtype=torch.float16),
        "fp16_d256_causal": dict(b=1, hq=1, hkv=1, nq=70, nk=90, d=256, causal=True, dtype=torch.float16),
    }
    res["dense"] = {}
    for name, c in cases.items():
        q = randn(c["b"], c["hq"], c["nq"], c["d"], dtype=c["dtype"])
        k = randn(c["b"], c["hkv"], c["nk"], c["d"], dtype=c["dtype"], shift=1.5)  # offset: smoothing matters
        v = (randn(c["b"], c["hkv"], c["nk"], c["d"], dtype=torch.float32) * c.get("v_mult", 1)).to(c["dtype"])
        out, lse = st.attention(q, k, v, tensor_layout="HND", is_causal=c["causal"], return_lse=True)
        ref_o, ref_lse = sageattn_reference(q, k, v, is_causal=c["causal"], qk_quant_gran="per_block",
                                            return_lse=True)
        sd = _sdpa64(q, k, v, is_causal=c["causal"])
        group = c["hq"] // c["hkv"]
        scores = (q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2)) * c["d"] ** -0.5
        if c["causal"]:
            keep = torch.ones(c["nq"], c["nk"], dtype=torch.bool).tril()
            scores = scores.masked_fill(~keep, -math.inf)
        res["dense"][name] = {
            "vs_sdpa": _metrics(out, sd),
            "vs_ref_max_abs": (out.float() - ref_o.float()).abs().max().item(),
            "v_mult": c.get("v_mult", 1),
            "vs_ref": _metrics(out, ref_o),
            "lse_vs_ref_max_abs": (lse - ref_lse).abs().max().item(),
            "lse_vs_exact_max_abs": (lse.double() - torch.logsumexp(scores, -1)).abs().max().item(),
            "shape_ok": list(out.shape) == list(q.shape) and out.dtype == q.dtype,
            "lse_shape_ok": list(lse.shape) == [c["b"], c["hq"], c["nq"]] and lse.dtype == torch.float32,
        }

    # NHD gives the very same numbers as HND.
    q, k, v = randn(2, 3, 100, 64), randn(2, 1, 80, 64, shift=1.0), randn(2, 1, 80, 64)
    o_hnd, l_hnd = st.attention(q, k, v, tensor_layout="HND", return_lse=True)
    o_nhd, l_nhd = st.attention(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
                                v.transpose(1, 2).contiguous(), tensor_layout="NHD", return_lse=True)
    res["nhd_equal"] = bool(torch.equal(o_nhd.transpose(1, 2), o_hnd)) and bool(torch.equal(l_hnd, l_nhd))
    res["nhd_shape"] = list(o_nhd.shape)
    # smooth_k changes the int8 values but not the function; sm_scale is honoured.
    o_raw, l_raw = st.attention(q, k, v, tensor_layout="HND", smooth_k=False, return_lse=True)
    res["smooth_k_off"] = {"vs_sdpa": _metrics(o_raw, _sdpa64(q, k, v)),
                           "lse_diff": (l_raw - l_hnd).abs().max().item()}
    o_sc, _ = st.attention(q, k, v, tensor_layout="HND", sm_scale=0.2)
    res["sm_scale"] = _metrics(o_sc, _sdpa64(q, k, v, scale=0.2))

    # Masks: SDPA semantics, broadcast by strides, fully masked tiles skipped, empty rows -> 0.
    b, h, nq, nk, d = 2, 2, 130, 140, 32
    q, k, v = randn(b, h, nq, d), randn(b, h, nk, d, shift=1.0), randn(b, h, nk, d)
    lengths = torch.tensor([100, 140])
    pad = torch.arange(nk)[None, None, None, :] < lengths[:, None, None, None]
    rows = torch.rand(b, h, nq, nk, generator=gen) > 0.5
    rows[:, :, 5] = False  # a query row with no key at all
    rows[:, :, :, 64:128] = False  # a whole key tile masked for every query: skipped
    add = torch.randn(nq, nk, generator=gen)
    add_inf = torch.where(torch.rand(h, nq, nk, generator=gen) > 0.4, 0.0, -math.inf)
    add_inf[:, 7] = -math.inf
    masks = {
        "bool_random_bcast_heads": (torch.rand(b, 1, nq, nk, generator=gen) > 0.3, torch.float16),
        "bool_padding": (pad, torch.float16),
        "bool_empty_rows_and_tiles": (rows, torch.float16),
        "float32_additive_fp16_inputs": (add, torch.float16),
        "float32_additive_bf16_inputs": (add, torch.bfloat16),
        "float16_additive_with_neg_inf": (add_inf.half(), torch.float16),
        "bool_1d_key_mask": (pad[1, 0, 0].clone(), torch.float16),
    }
    res["mask"] = {}
    huge = torch.zeros(nq, nk)
    huge[9] = torch.finfo(torch.float32).min  # finite: SDPA then weighs the row's keys equally
    masks["float32_additive_finfo_min_row"] = (huge, torch.float16)
    for name, (mask, dtype) in masks.items():
        qq, kk, vv = q.to(dtype), k.to(dtype), v.to(dtype)
        v_kernel = vv
        if name == "bool_empty_rows_and_tiles":
            # Keys 64..127 are masked for every query: that key tile must be skipped, never loaded,
            # so NaN values there cannot reach the output (0 * NaN would).
            v_kernel = vv.clone()
            v_kernel[:, :, 64:128] = float("nan")
        out, lse = st.attention(qq, kk, v_kernel, tensor_layout="HND", attn_mask=mask, return_lse=True)
        sd = _sdpa64(qq, kk, vv, attn_mask=mask)
        entry = {"vs_sdpa": _metrics(out, sd)}
        if name == "bool_empty_rows_and_tiles":
            entry["empty_row_out_zero"] = bool((out[:, :, 5] == 0).all())
            entry["empty_row_lse_neg_inf"] = bool((lse[:, :, 5] == -math.inf).all())
            entry["sdpa_empty_row_zero"] = bool((sd[:, :, 5] == 0).all())
        if name == "float16_additive_with_neg_inf":
            entry["empty_row_out_zero"] = bool((out[:, :, 7] == 0).all())
        if name == "float32_additive_finfo_min_row":
            entry["finfo_min_row"] = _metrics(out[:, :, 9], sd[:, :, 9])
        res["mask"][name] = entry
    # NHD with a mask: the mask stays [B, H, Nq, Nk] as in SDPA.
    o_nhd, _ = st.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), tensor_layout="NHD",
                            attn_mask=pad)
    o_hnd, _ = st.attention(q, k, v, tensor_layout="HND", attn_mask=pad)
    res["mask_nhd_equal"] = bool(torch.equal(o_nhd.transpose(1, 2), o_hnd))

    # Variable length: each sequence equals the dense kernel on that sequence alone (same tiles,
    # same per-sequence smoothing), and matches per-sequence SDPA.
    lens_q, lens_k = [1, 130, 7, 70], [1, 70, 150, 65]
    hq, hkv, d = 2, 1, 32
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    res["varlen"] = {}
    for dtype in (torch.float16, torch.bfloat16):
        if dtype == torch.bfloat16:
            modes = (True,)  # bf16 only changes the casts, checked once
        else:
            modes = (False, True)
        q = randn(sum(lens_q), hq, d, dtype=dtype)
        # A different offset per sequence: smoothing across sequences would not cancel.
        k = torch.cat([randn(n, hkv, d, dtype=torch.float32, shift=3.0 * i) for i, n in enumerate(lens_k)])
        k = k.to(dtype)
        v = randn(sum(lens_k), hkv, d, dtype=dtype)
        for causal in modes:
            out = st.varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal)
            worst_cos, worst_l1, same = 1.0, 0.0, True
            for i in range(len(lens_q)):
                qi = q[cu_q[i]:cu_q[i + 1]].transpose(0, 1)[None]
                ki = k[cu_k[i]:cu_k[i + 1]].transpose(0, 1)[None]
                vi = v[cu_k[i]:cu_k[i + 1]].transpose(0, 1)[None]
                oi = out[cu_q[i]:cu_q[i + 1]].transpose(0, 1)[None]
                dense, _ = st.attention(qi, ki, vi, tensor_layout="HND", is_causal=causal)
                same = same and bool(torch.equal(oi, dense))
                m = _metrics(oi, _sdpa64(qi, ki, vi, is_causal=causal))
                worst_cos, worst_l1 = min(worst_cos, m["cos"]), max(worst_l1, m["rel_l1"])
            key = f"{str(dtype).split('.')[-1]}_{'causal' if causal else 'full'}"
            res["varlen"][key] = {"equals_dense": same, "worst_cos": worst_cos, "worst_rel_l1": worst_l1,
                                  "finite": bool(torch.isfinite(out).all())}
    return res


# ----------------------------------------------------------------------------------------------
# Tests (parent process).
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def interp():
    return run_worker(__file__, timeout=600)


def _bars(m, cos_min=COS_MIN, l1_max=REL_L1_MAX):
    assert m["finite"], m
    assert m["cos"] >= cos_min, m
    assert m["rel_l1"] <= l1_max, m


def test_quantization_matches_reference_exactly(interp):
    qz = interp["quant"]
    for key in ("q_int_equal", "q_scale_close", "q_tail_zero", "k_int_equal", "k_scale_close",
                "k_tail_zero", "zero_block_ints_zero"):
        assert qz[key], (key, qz)
    assert qz["q_pad_rows"] == 256 and qz["k_pad_rows"] == 192
    assert qz["zero_block_scale"] == pytest.approx(1e-8)


@pytest.mark.parametrize("case", ["fp16_d64_gqa_cross", "fp16_d32_causal_square",
                                  "fp16_d128_causal_mqa_long_k", "fp16_d64_causal_long_q", "bf16_d64",
                                  "bf16_d128_v_beyond_fp16",
                                  "fp16_d40_odd_head_dim", "fp16_d256_causal"])
def test_dense_accuracy(interp, case):
    r = interp["dense"][case]
    assert r["shape_ok"] and r["lse_shape_ok"]
    _bars(r["vs_sdpa"])
    # Same quantization as the reference: only fp32 summation order and output rounding differ.
    # (bf16: the interpreter truncates fp32->bf16 where the GPU rounds to nearest: one bf16 ulp.)
    tight = not case.startswith("bf16")
    assert r["vs_ref"]["rel_l1"] <= (2e-4 if tight else 6e-3), r
    assert r["vs_ref_max_abs"] <= (2e-3 if tight else 3e-2) * r["v_mult"], r  # outputs scale with V
    assert r["lse_vs_ref_max_abs"] <= 1e-4, r
    assert r["lse_vs_exact_max_abs"] <= 0.05, r


def test_layouts_scale_and_smoothing(interp):
    assert interp["nhd_equal"]
    assert interp["nhd_shape"] == [2, 100, 3, 64]
    _bars(interp["smooth_k_off"]["vs_sdpa"])
    assert interp["smooth_k_off"]["lse_diff"] <= 0.05  # LSE corrected for smoothing: same function
    _bars(interp["sm_scale"])


@pytest.mark.parametrize("name", ["bool_random_bcast_heads", "bool_padding", "bool_empty_rows_and_tiles",
                                  "float32_additive_fp16_inputs", "float32_additive_bf16_inputs",
                                  "float16_additive_with_neg_inf", "bool_1d_key_mask",
                                  "float32_additive_finfo_min_row"])
def test_masks_match_sdpa(interp, name):
    r = interp["mask"][name]
    _bars(r["vs_sdpa"])  # for "bool_empty_rows_and_tiles": with NaN in the skipped tile's V
    if "finfo_min_row" in r:
        _bars(r["finfo_min_row"])
    if "empty_row_out_zero" in r:
        assert r["empty_row_out_zero"]
    if "empty_row_lse_neg_inf" in r:
        assert r["empty_row_lse_neg_inf"]
        assert r["sdpa_empty_row_zero"]  # what we match: SDPA's zeros for a row with no key


def test_mask_with_nhd_layout(interp):
    assert interp["mask_nhd_equal"]


@pytest.mark.parametrize("key", ["float16_full", "float16_causal", "bfloat16_causal"])
def test_varlen_matches_dense_and_sdpa(interp, key):
    r = interp["varlen"][key]
    assert r["finite"]
    assert r["equals_dense"], "a packed sequence must give exactly the dense result of that sequence"
    assert r["worst_cos"] >= COS_MIN and r["worst_rel_l1"] <= REL_L1_MAX, r


# --- argument checks and mask preparation: no kernel runs, no interpreter needed ----------------

@pytest.fixture
def st(monkeypatch):
    import sageattention.triton as st
    monkeypatch.setattr(st, "_interpreting", lambda: True)  # let CPU tensors reach the checks
    return st


def _qkv(b=1, hq=2, hkv=2, nq=8, nk=8, d=16, dtype=torch.float16):
    return (torch.randn(b, hq, nq, d).to(dtype), torch.randn(b, hkv, nk, d).to(dtype),
            torch.randn(b, hkv, nk, d).to(dtype))


@pytest.mark.parametrize("change, exc, words", [
    (dict(tensor_layout="BHND"), ValueError, "tensor_layout"),
    (dict(q_dtype=torch.float32), TypeError, "float16"),
    (dict(hq=3, hkv=2), ValueError, "multiple"),
    (dict(nk_v=9), ValueError, "same shape"),
    (dict(sm_scale=-1.0), ValueError, "sm_scale"),
    (dict(sm_scale="0.1"), TypeError, "sm_scale"),
    (dict(causal_and_mask=True), ValueError, "not both"),
    (dict(mask_shape=(3, 8, 8)), ValueError, "broadcastable"),
    (dict(mask_dtype=torch.int32), TypeError, "bool or a float"),
    (dict(d=300), ValueError, "head dim"),
    (dict(nk=0), ValueError, "at least one token"),
    (dict(b=70000), ValueError, "launch grid"),
])
def test_attention_rejects_bad_arguments(st, change, exc, words):
    q, k, v = _qkv(b=change.get("b", 1), hq=change.get("hq", 2), hkv=change.get("hkv", 2),
                   d=change.get("d", 16), nk=change.get("nk", 8), nq=1 if "b" in change else 8)
    if "q_dtype" in change:
        q = q.to(change["q_dtype"])
    if "nk_v" in change:
        v = torch.randn(1, 2, change["nk_v"], 16).half()
    mask = None
    if "mask_shape" in change:
        mask = torch.ones(change["mask_shape"], dtype=torch.bool)
    if "mask_dtype" in change:
        mask = torch.ones(8, 8, dtype=change["mask_dtype"])
    if change.get("causal_and_mask"):
        mask = torch.ones(8, 8, dtype=torch.bool)
    with pytest.raises(exc, match=words):
        st.attention(q, k, v, tensor_layout=change.get("tensor_layout", "HND"),
                     is_causal=bool(change.get("causal_and_mask")), attn_mask=mask,
                     sm_scale=change.get("sm_scale"))


def test_cpu_tensors_rejected_outside_interpreter():
    import sageattention.triton as st
    if st._interpreting():
        pytest.skip("TRITON_INTERPRET=1 is set for this whole test process")
    with pytest.raises(ValueError, match="CUDA"):
        st.attention(*_qkv(), tensor_layout="HND")


@pytest.mark.parametrize("cu_q, exc, words", [
    (torch.tensor([0, 4, 8], dtype=torch.int64), TypeError, "int32"),
    (torch.tensor([1, 4, 8], dtype=torch.int32), ValueError, "start at 0"),
    (torch.tensor([0, 5, 4, 8], dtype=torch.int32), ValueError, "non-decreasing"),
    (torch.tensor([0, 4, 7], dtype=torch.int32), ValueError, "number of packed tokens"),
    (torch.tensor([[0, 4, 8]], dtype=torch.int32), ValueError, "1-D"),
    (torch.tensor([0, 2, 4, 8], dtype=torch.int32), ValueError, "same number of sequences"),
])
def test_varlen_rejects_malformed_cu_seqlens(st, cu_q, exc, words):
    q, k, v = (torch.randn(8, 2, 16).half() for _ in range(3))
    cu_k = torch.tensor([0, 4, 8], dtype=torch.int32)
    with pytest.raises(exc, match=words):
        st.varlen_attention(q, k, v, cu_q, cu_k, 8, 8)


def test_varlen_rejects_too_small_max_seqlen(st):
    q, k, v = (torch.randn(8, 2, 16).half() for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_seqlen_k = 4 is smaller than the longest sequence"):
        st.varlen_attention(q, k, v, cu, cu, 5, 4)
    with pytest.raises(TypeError, match="max_seqlen_q"):
        st.varlen_attention(q, k, v, cu, cu, 5.0, 5)


def test_block_map_marks_live_tiles():
    from sageattention.triton.mask import MASK_ADD, MASK_BOOL, prepare_mask
    keep = torch.zeros(1, 1, 130, 70, dtype=torch.bool)
    keep[0, 0, 129, 69] = True  # only the last (partial) tile pair is live
    kind, view, bmap = prepare_mask(keep, 2, 3, 130, 70, 128, 64)
    assert kind == MASK_BOOL and view.dtype == torch.uint8 and list(view.shape) == [2, 3, 130, 70]
    assert view.stride()[:2] == (0, 0)  # broadcast by strides, not copied
    assert list(bmap.shape) == [2, 3, 2, 2]
    assert bmap[0, 0].tolist() == [[0, 0], [0, 1]]
    add = torch.full((70,), -math.inf)
    add[3] = 0.0
    kind, view, bmap = prepare_mask(add, 2, 2, 5, 70, 128, 64)
    assert kind == MASK_ADD and view.dtype == torch.float32 and view.stride() == (0, 0, 0, 1)
    assert bmap.tolist() == [[[[1, 0]]] * 2] * 2


@pytest.mark.parametrize("cap, ok", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_is_available_follows_compute_capability(monkeypatch, cap, ok):
    import sageattention.triton as st
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    got, reason = st.is_available()
    assert got is ok
    assert f"{cap[0]}.{cap[1]}" in reason
    if not ok:
        assert "8.0" in reason


def test_is_available_reports_a_reason():
    import sageattention.triton as st
    ok, reason = st.is_available()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason
    if not torch.cuda.is_available():
        assert not ok and "GPU" in reason


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(_worker()))
