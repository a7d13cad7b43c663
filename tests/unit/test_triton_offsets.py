"""Element offsets past 2**31 in the Triton kernels, run for real in Triton's CPU interpreter.

The interpreter computes int32 the way the GPU does (numpy int32 wraps; a negative offset is added
to the pointer as its 64-bit two's complement), so an offset product that overflows int32 makes a
kernel read or write the wrong address here too. Every case below puts a real element at an offset
>= 2**31 from its tensor's start without holding 2**31 elements: the tensors are views into large
``torch.empty`` buffers, of which Linux commits only the pages touched (a few MB), so a case costs
seconds. Each case asserts exact equality with the same computation on an ordinary layout; the
offsets that overflowed before the fix (2026-12) made these cases differ or crash.

Each case runs in its own ``TRITON_INTERPRET=1`` subprocess (a wrong address may kill it).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from interpreter_worker import run_worker

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

CASE_ENV = "SAGE_TEST_OFFSETS_CASE"
# A row stride whose 63rd multiple (the last row of a 64-token tile) passes 2**31, and whose 62nd
# already does: 62 * 34.6M = 2.15e9.
WIDE_ROW = 2**25 + 2**20


# ----------------------------------------------------------------------------------------------
# Worker cases: run inside the TRITON_INTERPRET=1 subprocess.
# ----------------------------------------------------------------------------------------------

def _randn(gen, *shape, dtype=torch.float16, shift=0.0):
    return (torch.randn(*shape, generator=gen) + shift).to(dtype)


def _spread(x: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``x`` copied into a view with ``strides`` over a lazily committed buffer."""
    extent = 1 + sum((n - 1) * s for n, s in zip(x.shape, strides))
    view = torch.empty(extent, dtype=x.dtype).as_strided(x.shape, strides)
    view.copy_(x)
    return view


def case_quant_v_fp8_lo_rows() -> dict:
    """_quant_v_fp8_kernel with a V^T row stride of 2**25 tokens: the lo term lies D rows below the
    hi term, at D * 2**25 = 2**32 elements (int32: 0, i.e. on top of the hi rows)."""
    from sageattention.triton import attn_fp8, quant

    gen = torch.Generator().manual_seed(7)
    v = _randn(gen, 1, 1, 200, 128)
    vt_ref, scale = attn_fp8.quantize_v_fp8(v, pad_to=128)  # [1, 1, V_TERMS * 128, 256]
    n_pad = 2**25
    vt = torch.empty((1, 1, vt_ref.shape[2], n_pad), dtype=vt_ref.dtype)
    vt.view(torch.uint8)[..., :256] = 0x7F  # e4m3 NaN: what the kernel fails to write stays NaN
    # The first two token blocks only (a full launch would write all 2**25 columns).
    attn_fp8._quant_v_fp8_kernel[(2, 1, 1)](
        v, scale, vt, v.stride(0), v.stride(1), v.stride(2), 1, 200, n_pad,
        HEAD_DIM=128, D=128, BLK=128, PREROUND=quant.interpreting(), V_TERMS=attn_fp8.V_TERMS,
        num_warps=8)
    got, want = vt[..., :256].view(torch.uint8), vt_ref.view(torch.uint8)
    return {"equal": bool(torch.equal(got, want)), "terms": attn_fp8.V_TERMS,
            "rows_differing": int((got != want).any(dim=-1).sum())}


def case_fp8_attention_wide_vt() -> dict:
    """The FP8-PV attention kernel reading a V^T whose rows are 2**25 tokens apart: hi row d at
    d * 2**25 (past 2**31 from d = 64), the lo rows from 2**32 on."""
    from sageattention import triton as st
    from sageattention.triton import attn_fp8

    gen = torch.Generator().manual_seed(8)
    q = _randn(gen, 1, 1, 130, 128)
    k = _randn(gen, 1, 1, 200, 128, shift=0.3)
    v = _randn(gen, 1, 1, 200, 128)
    want, _ = st.attention(q, k, v, pv_dtype="fp8")

    real = attn_fp8.quantize_v_fp8

    def wide(v, *, pad_to):
        vt, scale = real(v, pad_to=pad_to)
        big = torch.empty((*vt.shape[:3], 2**25), dtype=vt.dtype)
        big[..., :vt.shape[3]] = vt  # the kernel reads whole blocks up to the last key only
        return big, scale

    attn_fp8.quantize_v_fp8 = wide
    try:
        got, _ = st.attention(q, k, v, pv_dtype="fp8")
    finally:
        attn_fp8.quantize_v_fp8 = real
    return {"equal": bool(torch.equal(got, want)),
            "max_abs_diff": float((got.float() - want.float()).abs().max())}


def case_dense_wide_rows() -> dict:
    """q, k, v (HND views) whose token stride is WIDE_ROW elements: rows 62+ of a 64/128-token tile
    lie past 2**31 from the tile's start (the quantization and P.V tiles' int32 offsets)."""
    from sageattention import triton as st

    gen = torch.Generator().manual_seed(9)
    q = _randn(gen, 1, 1, 130, 32)
    k = _randn(gen, 1, 1, 70, 32, shift=0.3)
    v = _randn(gen, 1, 1, 70, 32)
    want, want_lse = st.attention(q, k, v, return_lse=True)
    strides = (WIDE_ROW * 130, WIDE_ROW * 130, WIDE_ROW, 1)
    wq, wk, wv = (_spread(t, strides) for t in (q, k, v))
    got, got_lse = st.attention(wq, wk, wv, return_lse=True)
    return {"equal": bool(torch.equal(got, want) and torch.equal(got_lse, want_lse))}


def case_mask_wide_rows() -> dict:
    """A bool and a float mask whose query rows are 2**25 elements apart: row 64+ of a 128-query
    tile lies past 2**31 from the tile's first row."""
    from sageattention import triton as st

    gen = torch.Generator().manual_seed(10)
    q = _randn(gen, 1, 2, 130, 32)
    k = _randn(gen, 1, 2, 64, 32, shift=0.3)
    v = _randn(gen, 1, 2, 64, 32)
    keep = torch.rand(1, 1, 130, 64, generator=gen) < 0.6
    keep[..., 0] = True
    out = {}
    for name, mask in (("bool", keep), ("float", torch.where(keep, 0.5, float("-inf")))):
        want, _ = st.attention(q, k, v, attn_mask=mask)
        wide = _spread(mask, (130 * 2**25, 130 * 2**25, 2**25, 1))
        got, _ = st.attention(q, k, v, attn_mask=wide)
        out[name] = bool(torch.equal(got, want))
    return out


def case_varlen_wide_heads() -> dict:
    """Packed k, v as views of [heads, tokens, D] memory whose head stride is 2**30 + 2**20
    elements: head 2 starts past 2**31 (K smoothing's per-sequence mean, the quantization and
    P.V all address it)."""
    from sageattention import triton as st
    from sageattention.triton import quant

    gen = torch.Generator().manual_seed(11)
    cu = torch.tensor([0, 37, 37, 100], dtype=torch.int32)
    q = _randn(gen, 100, 6, 32)
    k = _randn(gen, 100, 3, 32, shift=0.3)
    v = _randn(gen, 100, 3, 32)
    want = st.varlen_attention(q, k, v, cu, cu, 63, 63, is_causal=True)
    head = 2**30 + 2**20
    wk, wv = (_spread(t, (32, head, 1)) for t in (k, v))
    got = st.varlen_attention(q, wk, wv, cu, cu, 63, 63, is_causal=True)
    mean = quant.segment_mean(wk, cu)
    ref_mean = torch.stack([k[a:b].float().mean(dim=0) if b > a else torch.zeros(3, 32)
                            for a, b in zip(cu.tolist(), cu.tolist()[1:])])
    return {"equal": bool(torch.equal(got, want)),
            "mean_close": bool(torch.allclose(mean, ref_mean, rtol=1e-5, atol=1e-6))}


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


# ----------------------------------------------------------------------------------------------
# Tests (parent process).
# ----------------------------------------------------------------------------------------------

def _run(case: str, monkeypatch) -> dict:
    monkeypatch.setenv(CASE_ENV, case)
    return run_worker(__file__, timeout=300)


def test_fp8_v_quantization_writes_the_lo_rows_past_2_31(monkeypatch):
    res = _run("quant_v_fp8_lo_rows", monkeypatch)
    assert res["equal"], res


def test_fp8_attention_reads_v_t_rows_past_2_31(monkeypatch):
    res = _run("fp8_attention_wide_vt", monkeypatch)
    assert res["equal"], res


def test_dense_inputs_with_rows_past_2_31_inside_a_tile(monkeypatch):
    res = _run("dense_wide_rows", monkeypatch)
    assert res["equal"], res


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_mask_rows_past_2_31_inside_a_tile(monkeypatch, kind):
    res = _run("mask_wide_rows", monkeypatch)
    assert res[kind], res


def test_varlen_heads_past_2_31(monkeypatch):
    res = _run("varlen_wide_heads", monkeypatch)
    assert res["mean_close"], res
    assert res["equal"], res


# --- the host's rule, no kernel runs ------------------------------------------------------------

@pytest.fixture
def quant():
    from sageattention.triton import quant
    return quant


def test_tile_span_is_the_largest_offset_inside_a_tile(quant):
    x = torch.empty((2, 3, 100, 64), device="meta")
    assert quant.tile_span(x, {2: 128, -1: 64}) == 127 * 64 + 63
    assert quant.tile_span(x.transpose(1, 2), {2: 64, 3: 64}) == 63 * 100 * 64 + 63
    assert quant.tile_span(x.expand(2, 3, 100, 64), {0: 2}) == 3 * 100 * 64


def test_our_own_layouts_never_copy(quant):
    """The widest layouts the API makes: NHD (token stride heads * D) and packed varlen at the
    launch grid's 65535 heads and the largest head dim; 128-token tiles still fit int32."""
    from sageattention.triton import MAX_HEAD_DIM
    from sageattention.backends import MAX_GRID_YZ

    nhd = torch.empty((1, 2, MAX_GRID_YZ, MAX_HEAD_DIM), device="meta").transpose(1, 2)
    packed = torch.empty((2, MAX_GRID_YZ, MAX_HEAD_DIM), device="meta")
    assert quant.tile_addressable(nhd, 2, 128) is nhd
    assert quant.tile_addressable(packed, 0, 128) is packed


def test_a_view_with_wide_rows_is_copied_and_a_hopeless_one_refused(quant):
    wide = torch.empty((1, 1, 70, 32), device="meta").as_strided((1, 1, 70, 32),
                                                                 (0, 0, WIDE_ROW, 1))
    assert quant.tile_span(wide, {2: 64, -1: 32}) > quant.INT32_MAX
    fixed = quant.tile_addressable(wide, 2, 64)
    assert fixed.is_contiguous() and fixed.shape == wide.shape
    assert quant.tile_addressable(wide, 2, 16) is wide  # 15 rows of it still fit
    too_wide = torch.empty((2, 70000, 256), device="meta")  # beyond the launch grid's heads
    with pytest.raises(ValueError, match=r"tile of 128 tokens of a tensor of shape \[2, 70000, 256\]"):
        quant.tile_addressable(too_wide, 0, 128)


def test_masks_take_the_int64_variant_only_when_their_tile_needs_it(quant):
    """run_attention's rule (MASK_I64): typical masks stay on the int32 kernel."""
    def needs_i64(mask):
        return quant.tile_span(mask, {2: 128, 3: 64}) > quant.INT32_MAX

    assert not needs_i64(torch.empty((8, 32, 4096, 4096), device="meta"))
    assert not needs_i64(torch.empty((1, 1, 1, 2**26), device="meta").expand(1, 1, 4096, 2**26))
    assert needs_i64(torch.empty((1, 1, 128, 2**24 + 2**20), device="meta"))


@pytest.fixture
def st(monkeypatch):
    import sageattention.triton as st
    monkeypatch.setattr(st, "_interpreting", lambda: True)  # let CPU tensors reach the checks
    return st


def test_sequences_past_max_tokens_are_refused(st):
    """Zero-stride views: 2**30 + 1 tokens without the memory."""
    n = st.MAX_TOKENS + 1
    one = torch.zeros(1, 1, 1, 16, dtype=torch.float16)
    big = one.expand(1, 1, n, 16)
    with pytest.raises(ValueError, match=r"q's sequence length = 1073741825 tokens .*\(2\*\*30\)"):
        st.attention(big, one, one)
    with pytest.raises(ValueError, match="k's sequence length"):
        st.attention(one, big, big)
    packed = one[0].expand(n, 1, 16)
    cu = torch.tensor([0, n], dtype=torch.int32)
    cu1 = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="the longest q sequence"):
        st.varlen_attention(packed, one[0], one[0], cu, cu1, n, 1)
    with pytest.raises(ValueError, match="the longest k sequence"):
        st.varlen_attention(one[0], packed, packed, cu1, cu, 1, n)


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(CASES[os.environ[CASE_ENV]]()))
