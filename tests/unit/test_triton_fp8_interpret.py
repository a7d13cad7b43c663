"""The INT8-QK / FP8-PV Triton kernel (sageattention/triton/attn_fp8.py) on the CPU, in Triton's
interpreter, against sageattention.reference (same quantization) and float64 SDPA.

As in test_triton_interpret.py, the kernels run in one ``TRITON_INTERPRET=1`` subprocess (this
file with ``--worker``) that prints one JSON object; the tests assert on it. What this proves: the
kernel's logic (tiling, tails, causal, GQA, cross-attention, scales, LSE) reproduces the algorithm.
What it cannot prove: speed, or the GPU's FP8 conversion (the interpreter's cast is replaced by an
exact rounding in fp32, see attn_fp8._to_e4m3); those need the GPU runner.
"""

from __future__ import annotations

import json
import sys

import pytest
from interpreter_worker import run_worker

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

# design.md's bar for INT8 QK / FP8 PV against a high-precision SDPA: relative L1 <= 0.04 (the
# figure #8's acceptance names) and cosine >= 0.9993. With V as one e4m3 term this recipe landed on
# the cosine bar (0.99930 here; upstream's sm90 kernel: 0.99926); V's second term (lo = e4m3(x - hi),
# reference.FP8_V_TERMS) takes V's rounding error out: these CPU cases measure ~0.99965, so the
# floor below sits above what a one-term kernel reaches.
FP8_COS_FLOOR, FP8_REL_L1_MAX = 0.9995, 0.04
CASES = [  # (name, batch, q heads, kv heads, Nq, Nk, head dim, causal, dtype)
    ("d64 cross 200x300 GQA", 1, 2, 1, 200, 300, 64, False, "float16"),
    ("d128 causal 130", 1, 2, 2, 130, 130, 128, True, "float16"),
    ("d64 causal Nq>Nk 33x17", 2, 1, 1, 33, 17, 64, True, "bfloat16"),
    ("d128 one token", 1, 1, 1, 1, 1, 128, False, "float16"),
    ("d80 padded head dim", 1, 2, 1, 70, 140, 80, False, "bfloat16"),
    ("d128 512 MQA", 1, 4, 1, 512, 512, 128, False, "float16"),
]
LARGE = {"d128 512 MQA", "d64 cross 200x300 GQA"}


def _metrics(out, ref):
    o, r = out.double().flatten(), ref.double().flatten()
    return {"cos": torch.nn.functional.cosine_similarity(o, r, dim=0).item(),
            "rel_l1": ((o - r).abs().sum() / r.abs().sum()).item(),
            "finite": bool(torch.isfinite(out).all())}


def _worker() -> dict:
    from sageattention.reference import sageattn_reference
    from sageattention.triton import attn_fp8

    gen = torch.Generator().manual_seed(7)
    res: dict = {"cases": {}}

    # V to FP8: the same bits as torch's own e4m3 casts of x = v / scale (hi) and of x - hi (lo);
    # zero tails; scale floors.
    v = torch.randn(1, 2, 100, 64, generator=gen).half() * 3
    v[0, 1, :, 5] = 0  # an all-zero channel: the scale floor, no division by zero
    vt, scale = attn_fp8.quantize_v_fp8(v, pad_to=128)
    x = (v.float() / scale[:, :, None, :]).clamp(-448, 448)
    hi = x.to(torch.float8_e4m3fn)
    lo = (x - hi.float()).to(torch.float8_e4m3fn)
    got = vt.transpose(2, 3)[:, :, :100].view(torch.uint8)  # [B, H, N, 2 * Dp]: hi cols, lo cols
    res["v_quant"] = {
        "bits_equal": bool(torch.equal(got[..., :64], hi.view(torch.uint8))),
        "lo_values_equal": bool(torch.equal(got[..., 64:].view(torch.float8_e4m3fn).float(), lo.float())),
        "lo_nonzero": int((lo.float() != 0).sum()),
        "tail_zero": bool((vt[..., 100:].float() == 0).all()),
        "zero_channel_scale": float(scale[0, 1, 5]),
        "layout": list(vt.shape),
    }

    for name, b, hq, hkv, nq, nk, d, causal, dt in CASES:
        dtype = getattr(torch, dt)
        q = torch.randn(b, hq, nq, d, generator=gen).to(dtype)
        k = (torch.randn(b, hkv, nk, d, generator=gen) + 0.5).to(dtype)  # a K bias: smoothing matters
        v = torch.randn(b, hkv, nk, d, generator=gen).to(dtype)
        out, lse = attn_fp8.run_attention_fp8(q, k, v, is_causal=causal, sm_scale=d ** -0.5,
                                              smooth_k=True, return_lse=True)
        ref_out, ref_lse = sageattn_reference(q, k, v, is_causal=causal, qk_quant_gran="per_block",
                                              pv_dtype="fp8", pv_accum_dtype="fp32", blkk=128,
                                              return_lse=True)
        one_term = sageattn_reference(q, k, v, is_causal=causal, qk_quant_gran="per_block",
                                      pv_dtype="fp8", pv_accum_dtype="fp32", blkk=128, fp8_v_terms=1)
        group = hq // hkv
        kk, vv = (t.repeat_interleave(group, dim=1).double() for t in (k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention(q.double(), kk, vv, is_causal=causal)
        res["cases"][name] = {
            "dtype_ok": out.dtype == dtype and list(out.shape) == [b, hq, nq, d],
            "vs_reference": _metrics(out, ref_out),
            "vs_one_term_reference": _metrics(out, one_term),
            "vs_sdpa": _metrics(out, sdpa),
            "lse_vs_reference_max": (lse - ref_lse).abs().max().item(),
        }
    # One tensor-core accumulator per row (the sweep's other variant): same result in exact fp32.
    q, k, v = (torch.randn(1, 2, 300, 64, generator=gen).half() for _ in range(3))
    two, _ = attn_fp8.run_attention_fp8(q, k, v, is_causal=False, sm_scale=0.125, smooth_k=True,
                                        return_lse=False)
    one, _ = attn_fp8.run_attention_fp8(q, k, v, is_causal=False, sm_scale=0.125, smooth_k=True,
                                        return_lse=False, config=attn_fp8.Fp8Config(128, 128, 4, 3, False))
    res["one_accumulator_cos"] = _metrics(one, two)["cos"]
    # K and V^T through tensor descriptors (TMA on Hopper): the same tiles, the same bits.
    for causal in (False, True):
        ref, _ = attn_fp8.run_attention_fp8(q, k, v, is_causal=causal, sm_scale=0.125, smooth_k=True,
                                            return_lse=False, config=attn_fp8.Fp8Config(128, 64, 4, 3))
        tma, _ = attn_fp8.run_attention_fp8(q, k, v, is_causal=causal, sm_scale=0.125, smooth_k=True,
                                            return_lse=False,
                                            config=attn_fp8.Fp8Config(128, 64, 4, 3, use_tma=True))
        res[f"tma_equal_{causal}"] = bool(torch.equal(tma, ref))

    # The public entry point: NHD layout, the same numbers as the HND kernel call; clear errors.
    import sageattention.triton as st
    q, k, v = (torch.randn(1, 2, 90, 64, generator=gen).half() for _ in range(3))
    hnd, _ = st.attention(q, k, v, is_causal=True, pv_dtype="fp8")
    nhd, _ = st.attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), tensor_layout="NHD",
                          is_causal=True, pv_dtype="fp8")
    res["entry"] = {"nhd_equals_hnd": bool(torch.equal(nhd.transpose(1, 2), hnd))}
    errors = {}
    for label, kwargs in (("mask", dict(attn_mask=torch.ones(90, 90, dtype=torch.bool))),
                          ("pv_dtype", dict(pv_dtype="fp4")),
                          ("head_dim", dict(q_dim=192))):
        kw = {"pv_dtype": "fp8", **kwargs}
        d = kw.pop("q_dim", 64)
        qq, kk, vv = (torch.randn(1, 2, 90, d).half() for _ in range(3))
        try:
            st.attention(qq, kk, vv, **kw)
            errors[label] = None
        except ValueError as exc:
            errors[label] = str(exc)
    res["errors"] = errors
    return res


@pytest.fixture(scope="module")
def measured() -> dict:
    return run_worker(__file__, timeout=900)


def test_v_quantization_is_torchs_e4m3_cast_transposed(measured):
    vq = measured["v_quant"]
    assert vq["bits_equal"]
    assert vq["tail_zero"]
    assert vq["zero_channel_scale"] == 2.0 ** -100  # V's FP8 floor (reference.FP8_V_SCALE_FLOOR), not 1e-8
    assert vq["layout"] == [1, 2, 128, 128]  # [B, H, hi D rows + lo D rows, tokens padded to the K block]


def test_v_lo_term_is_torchs_e4m3_cast_of_the_residual(measured):
    # e4m3(x - float(hi)) value for value (the interpreter's pre-rounding gives +0 where torch's cast
    # gives -0 for a tiny negative residual; the same number in the dot)
    vq = measured["v_quant"]
    assert vq["lo_values_equal"]
    assert vq["lo_nonzero"] > 10000  # of 12800: the lo term is really there


def test_one_accumulator_variant_computes_the_same(measured):
    assert measured["one_accumulator_cos"] >= 0.99999


def test_tensor_descriptor_variant_loads_the_same_tiles(measured):
    assert measured["tma_equal_False"] and measured["tma_equal_True"]


def test_public_entry_point_layouts_and_errors(measured):
    assert measured["entry"]["nhd_equals_hnd"]
    errors = measured["errors"]
    assert "takes no attn_mask" in errors["mask"]
    assert "pv_dtype must be one of ('fp16', 'fp8'), got 'fp4'" in errors["pv_dtype"]
    assert "head dim 192 is not supported by the FP8-PV Triton kernel (1..128)" in errors["head_dim"]


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_matches_reference_under_same_quantization(measured, name):
    case = measured["cases"][name]
    assert case["dtype_ok"]
    assert case["vs_reference"]["finite"]
    assert case["vs_reference"]["cos"] >= 0.99999, case
    # LSE: same INT8 scores; a one-step rounding difference of one element moves a row ~5e-3.
    assert case["lse_vs_reference_max"] <= 1e-2, case


@pytest.mark.parametrize("name", [c[0] for c in CASES if c[0] != "d128 one token"])
def test_kernel_takes_v_as_two_e4m3_terms(measured, name):
    # One key per channel makes x = +-448 exactly (lo = 0): no difference to see in "one token".
    case = measured["cases"][name]
    assert case["vs_reference"]["cos"] >= 0.99999, case
    assert case["vs_one_term_reference"]["cos"] <= 0.9999, case  # ~0.9997: a one-term kernel fails


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_fp8_bars_against_float64_sdpa(measured, name):
    m = measured["cases"][name]["vs_sdpa"]
    assert m["finite"]
    assert m["rel_l1"] <= FP8_REL_L1_MAX, m
    if name in LARGE:  # tiny cases have a few keys per row: their cosine is noisier
        assert m["cos"] >= FP8_COS_FLOOR, m


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(_worker()))
