"""No-GPU tests of the Python side of the FP8 families (sm89, sm90_fp8): one schema set, one set of
fakes and call helpers in sageattention.native, used by both family modules.

The op schemas are read from the C++ sources (csrc/common/op_schemas.h, where they are defined once) and
registered in a test-only namespace with the shared fakes behind them, so each family module's
calls and the fakes' output shapes are checked on meta tensors, without the extensions.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import sageattention.native as native
from bindings_source import bindings_text, family_schemas
from sageattention.native import sm89, sm90_fp8
from sageattention.reference import FP8_V_TERMS

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"sm89": sm89, "sm90_fp8": sm90_fp8}


def test_the_fp8_families_define_one_schema_set():
    schemas = family_schemas("sm89")
    assert [s.split("(")[0] for s in schemas] == ["quant_int8", "quant_v_fp8", "qk_int8_pv_fp8"]
    assert family_schemas("sm90_fp8") == schemas
    for family, module in MODULES.items():
        assert module.NAMESPACE == f"sageattention_{family}"
        assert module.EXTENSION == native.FAMILIES[family]["extension"]
        assert module.load.family == family and module.load.extension == module.EXTENSION


def test_the_kernels_take_as_many_v_terms_as_the_reference_and_the_fakes():
    # The quantized V's row count (the fakes, the Triton kernel: reference.FP8_V_TERMS) must be what
    # the CUDA kernels index with (kFp8VTerms, csrc/common/attn_params.h), or they read the wrong rows.
    header = (ROOT / "csrc" / "common" / "attn_params.h").read_text()
    default = re.search(r"#ifndef SAGE_FP8_V_TERMS\n#define SAGE_FP8_V_TERMS (\d+)\n#endif", header)
    assert default and int(default.group(1)) == FP8_V_TERMS
    assert "constexpr int kFp8VTerms = SAGE_FP8_V_TERMS;" in header


@pytest.mark.parametrize("family", MODULES)
def test_bindings_accept_the_accumulations_of_the_family_table(family):
    # parse_accum's accepted strings are families.json's pv_accum_dtype for that family
    body = re.search(r"PvAccum parse_accum\(const std::string& a\) \{(.*?)\n\}", bindings_text(family), re.S)
    accepted = re.findall(r'if \(a == "([^"]+)"\) return', body.group(1))
    assert sorted(accepted) == sorted(native.FAMILIES[family]["pv_accum_dtype"])


def test_sm90_fp8_ops_all_check_for_compute_capability_9_0():
    text = bindings_text("sm90_fp8")
    ops = re.findall(r"\n(?:std::tuple<[^\n]*>) (\w+_op)\(", text)
    assert sorted(ops) == ["qk_int8_pv_fp8_op", "quant_int8_op", "quant_v_fp8_op"]
    for op in ops:
        body = text[text.index(f" {op}("):]
        body = body[:body.index("\n}\n")]
        assert "glue::check_sm90a_device(" in body, op


@pytest.fixture(params=list(MODULES))
def family_on_schema(request, monkeypatch):
    """One FP8 family's module and the shared fakes on its bindings.cpp schemas under a test
    namespace (a fresh one per family: fakes register once per op)."""
    family = request.param
    module = MODULES[family]
    namespace = f"sageattention_{family}_schema_test"
    lib = torch.library.Library(namespace, "DEF")
    for schema in family_schemas(family):
        lib.define(schema)
    monkeypatch.setattr(module, "NAMESPACE", namespace)
    module._register_fakes()
    monkeypatch.setattr(module, "load", lambda: None)
    yield module
    lib._destroy()


ATTN_KWARGS = dict(is_causal=True, sm_scale=0.125, smooth_k=True, smooth_v=True)


@pytest.mark.parametrize("gran", ["per_thread", "per_warp"])
@pytest.mark.parametrize("layout,return_lse", [("HND", False), ("NHD", True), ("HND", True)])
def test_attention_wrapper_calls_the_schema_and_the_fake_gives_the_shapes(family_on_schema, gran,
                                                                          layout, return_lse):
    module = family_on_schema
    b, hq, hkv, nq, nk, d = 2, 4, 2, 33, 70, 128
    shape = (lambda h, n: (b, h, n, d)) if layout == "HND" else (lambda h, n: (b, n, h, d))
    q = torch.empty(shape(hq, nq), dtype=torch.float16, device="meta")
    k = torch.empty(shape(hkv, nk), dtype=torch.float16, device="meta")
    out, lse = module.qk_int8_pv_fp8(q, k, k, tensor_layout=layout, qk_quant_gran=gran,
                                     pv_accum_dtype="fp32+fp32", return_lse=return_lse, **ATTN_KWARGS)
    assert out.shape == q.shape and out.dtype == q.dtype
    if return_lse:
        assert lse.shape == (b, hq, nq) and lse.dtype == torch.float32
    else:
        assert lse is None


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_quant_v_fake_gives_the_padded_transposed_shapes(family_on_schema, layout, smooth_v):
    b, h, n, d = 2, 3, 70, 64
    v = torch.empty((b, h, n, d) if layout == "HND" else (b, n, h, d), dtype=torch.bfloat16,
                    device="meta")
    v8, scale, mean = family_on_schema.quant_v_fp8(v, tensor_layout=layout, smooth_v=smooth_v)
    # hi rows then lo rows; tokens padded to 64
    assert v8.shape == (b, h, FP8_V_TERMS * d, 128) and v8.dtype == torch.float8_e4m3fn
    assert scale.shape == (b, h, d) and scale.dtype == torch.float32
    assert mean.shape == ((b, h, d) if smooth_v else (0,)) and mean.dtype == torch.float32


@pytest.mark.parametrize("is_key,gran,expected", [(False, "per_thread", (128, 32)),
                                                  (True, "per_warp", (128, 2))])
def test_quant_int8_fake_gives_the_padded_shapes(family_on_schema, is_key, gran, expected):
    x = torch.empty(1, 3, 70, 64, dtype=torch.float16, device="meta")
    xi8, scale = family_on_schema.quant_int8(x, tensor_layout="HND", qk_quant_gran=gran, is_key=is_key)
    assert xi8.shape == (1, 3, expected[0], 64) and xi8.dtype == torch.int8
    assert scale.shape == (1, 3, expected[1]) and scale.dtype == torch.float32


def test_the_attention_wrapper_traces_whole_under_torch_compile(family_on_schema, monkeypatch):
    # the wrapper -> shared helper -> op path must not break a fullgraph trace (a CPU kernel stands
    # in for the extension's CUDA one, so the fake's device check takes CPU tensors here)
    from sageattention.native import checks

    monkeypatch.setattr(checks, "_DEVICE_TYPES", ("cuda", "meta", "cpu"))
    module = family_on_schema
    impl = torch.library.Library(module.NAMESPACE, "IMPL")
    impl.impl("qk_int8_pv_fp8", lambda q, k, v, *args: (q * 2 + v, q.new_zeros((0,))), "CPU")
    try:
        torch._dynamo.reset()

        def attention(q, k, v):
            out, lse = module.qk_int8_pv_fp8(q, k, v, tensor_layout="HND", qk_quant_gran="per_warp",
                                             pv_accum_dtype="fp32", return_lse=False, **ATTN_KWARGS)
            assert lse is None
            return out + 1

        q, k, v = (torch.randn(1, 2, 8, 64, dtype=torch.float16) for _ in range(3))
        compiled = torch.compile(attention, fullgraph=True, backend="eager")
        assert torch.equal(compiled(q, k, v), q * 2 + v + 1)
    finally:
        impl._destroy()
        torch._dynamo.reset()


RANK_ERROR = (r"must be 4-D \(\[B, H, N, D\] for HND, \[B, N, H, D\] for NHD\), "
              r"got shape \(3, 70, 64\)")


def test_the_fakes_refuse_an_input_that_is_not_4d(family_on_schema):
    # Each fake read bhnd(...) of its input unchecked: a 3-D input was an IndexError ("tuple index
    # out of range"), also under torch.compile, instead of what the op says.
    module = family_on_schema
    x3 = torch.empty(3, 70, 64, dtype=torch.float16, device="meta")
    x4 = torch.empty(1, 3, 70, 64, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match=f"^x {RANK_ERROR}"):
        module.quant_int8(x3, tensor_layout="HND", qk_quant_gran="per_warp", is_key=True)
    with pytest.raises(ValueError, match=f"^v {RANK_ERROR}"):
        module.quant_v_fp8(x3, tensor_layout="NHD", smooth_v=False)
    with pytest.raises(ValueError, match=f"^k {RANK_ERROR}"):
        module.qk_int8_pv_fp8(x4, x3, x4, tensor_layout="HND", qk_quant_gran="per_warp",
                              pv_accum_dtype="fp32", return_lse=False, **ATTN_KWARGS)
    impl = torch.library.Library(module.NAMESPACE, "IMPL")
    impl.impl("qk_int8_pv_fp8", lambda q, k, v, *args: (q * 2, q.new_zeros((0,))), "CPU")
    try:
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda q: module.qk_int8_pv_fp8(q, q, q, tensor_layout="HND", qk_quant_gran="per_warp",
                                            pv_accum_dtype="fp32", return_lse=False,
                                            **ATTN_KWARGS)[0],
            fullgraph=True, backend="eager")
        with pytest.raises(Exception) as exc:
            compiled(torch.randn(3, 70, 64))
        chain, e = [], exc.value
        while e is not None:
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        assert "OpArgumentError: q must be 4-D" in " <- ".join(chain)   # a ValueError and a RuntimeError
        assert "IndexError" not in " <- ".join(chain)
    finally:
        impl._destroy()
        torch._dynamo.reset()


@pytest.mark.parametrize("mean,error", [
    (torch.zeros(1, 3, 64), "mean is on cpu but x is on meta"),          # a host pointer for the kernel
    (torch.zeros(1, 64, 3, device="meta"), r"\[B, H, D\] = \[1, 3, 64\]"),  # same count, wrong order
    (torch.zeros(1, 3, 1, 64, device="meta"), r"got shape \(1, 3, 1, 64\)")])
def test_quant_int8_refuses_a_mean_the_op_would_misread(family_on_schema, mean, error):
    # the op reads mean's data pointer as fp32 [B, H, D] on x's device and checks only its numel
    x = torch.empty(1, 70, 3, 64, dtype=torch.float16, device="meta")   # NHD
    with pytest.raises(ValueError, match=error):
        family_on_schema.quant_int8(x, tensor_layout="NHD", qk_quant_gran="per_warp", is_key=True, mean=mean)
    xi8, _ = family_on_schema.quant_int8(x, tensor_layout="NHD", qk_quant_gran="per_warp", is_key=True,
                                         mean=torch.zeros(1, 3, 64, device="meta"))
    assert xi8.shape == (1, 3, 128, 64)
