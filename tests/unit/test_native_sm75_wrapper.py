"""No-GPU tests of the sm75 family's Python side (sageattention/native/sm75.py) against its op schema.

The schema is read from csrc/sm75/bindings.cpp (where it is defined once) and registered in a
test-only namespace, with the module's fake implementation behind it: the wrapper's call and the
fake's signature and output shapes are then checked on meta tensors, without the extension.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sageattention.native import sm75
from bindings_source import family_schemas

ROOT = Path(__file__).resolve().parents[2]
TEST_NAMESPACE = "sageattention_sm75_schema_test"
KWARGS = dict(tensor_layout="HND", is_causal=True, sm_scale=0.125, pv_accum_dtype="fp32",
              smooth_k=True, smooth_v=False, return_lse=False)


def _schema() -> str:
    (schema,) = family_schemas("sm75")
    return schema


@pytest.fixture(scope="module")
def schema_op():
    """The bindings.cpp schema under a test namespace, its implementation the module's fake."""
    lib = torch.library.Library(TEST_NAMESPACE, "DEF")
    lib.define(_schema())
    torch.library.register_fake(f"{TEST_NAMESPACE}::qk_int8_pv_fp16", lib=lib)(
        sm75._qk_int8_pv_fp16_fake)
    yield getattr(torch.ops, TEST_NAMESPACE).qk_int8_pv_fp16
    lib._destroy()


@pytest.fixture
def wrapper_on_schema(schema_op, monkeypatch):
    """sm75.qk_int8_pv_fp16 calling the test-namespace op instead of the compiled one."""
    monkeypatch.setattr(sm75, "OP_NAMESPACE", TEST_NAMESPACE)
    monkeypatch.setattr(sm75, "load", lambda: None)
    return sm75.qk_int8_pv_fp16


def test_schema_takes_the_granularity_as_a_string_after_sm_scale():
    args = re.search(r"\((.*)\) ->", _schema()).group(1).split(", ")
    names = [a.split()[-1] for a in args]
    assert names[names.index("sm_scale") + 1] == "qk_quant_gran"
    assert "str qk_quant_gran" in args


def test_family_table_offers_both_granularities():
    assert set(sm75.SUPPORT["qk_quant_gran"]) == {"per_warp", "per_thread"}


@pytest.mark.parametrize("gran", ["per_thread", "per_warp"])
@pytest.mark.parametrize("layout,return_lse", [("HND", False), ("NHD", True), ("HND", True)])
def test_wrapper_calls_the_schema_and_the_fake_gives_the_shapes(wrapper_on_schema, gran, layout,
                                                                 return_lse):
    b, hq, hkv, nq, nk, d = 2, 4, 2, 33, 70, 64
    shape = (lambda h, n: (b, h, n, d)) if layout == "HND" else (lambda h, n: (b, n, h, d))
    q = torch.empty(shape(hq, nq), dtype=torch.float16, device="meta")
    k = torch.empty(shape(hkv, nk), dtype=torch.float16, device="meta")
    kw = dict(KWARGS, tensor_layout=layout, return_lse=return_lse)
    out, lse = wrapper_on_schema(q, k, k, qk_quant_gran=gran, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    if return_lse:
        assert lse.shape == (b, hq, nq) and lse.dtype == torch.float32
    else:
        assert lse is None


def test_the_fake_refuses_an_input_that_is_not_4d(schema_op):
    # The op called directly (as torch.compile traces it) skips the wrapper's checks: the fake
    # gave a 3-D q an LSE of the wrong shape, and a 2-D one an IndexError.
    q3 = torch.empty(2, 33, 64, dtype=torch.float16, device="meta")
    q4 = torch.empty(2, 4, 33, 64, dtype=torch.float16, device="meta")
    words = r"must be 4-D \(\[B, H, N, D\] for HND, \[B, N, H, D\] for NHD\), got shape"
    with pytest.raises(ValueError, match=rf"^q {words} \(2, 33, 64\)"):
        schema_op(q3, q4, q4, "HND", False, 0.125, "per_warp", False, True)
    with pytest.raises(ValueError, match=rf"^v {words} \(33, 64\)"):
        schema_op(q4, q4, q4[0, 0], "NHD", False, 0.125, "per_warp", False, False)


@pytest.mark.parametrize("gran", ["per_block", "per_tensor", None])
def test_wrapper_rejects_other_granularities_before_any_launch(gran):
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"qk_quant_gran=.*supported: \('per_warp', 'per_thread'\)"):
        sm75.qk_int8_pv_fp16(q, q, q, qk_quant_gran=gran, **KWARGS)
