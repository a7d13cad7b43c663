"""No-GPU tests of the native layer: family table, loader, routing, and the C++ source layout."""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

import sageattention.native as native
from bindings_source import defined_ops

ROOT = Path(__file__).resolve().parents[2]
MY_FAMILIES = ("sm80", "sm89", "sm90", "sm90_fp8")
KWARGS = dict(tensor_layout="HND", is_causal=False, sm_scale=0.125, qk_quant_gran="per_warp",
              smooth_k=True, smooth_v=False, return_lse=False)


@pytest.fixture
def fresh_status(monkeypatch):
    """Forget cached load results so each test sees its own environment."""
    monkeypatch.setattr(native, "_status", {})
    monkeypatch.setattr(native, "_modules", {})
    yield


@pytest.fixture
def no_extensions(monkeypatch, fresh_status):
    """Make every compiled extension unimportable (as in a CPU CI checkout)."""
    for spec in native.FAMILIES.values():
        monkeypatch.setitem(sys.modules, spec["extension"], None)  # None => ImportError on import
    for fam in MY_FAMILIES:
        mod = __import__(f"sageattention.native.{fam}", fromlist=["load"])
        monkeypatch.setattr(mod.load, "loaded", False)
    yield


def test_families_match_json_table():
    assert set(native.FAMILIES) == {"sm75", "sm80", "sm89", "sm90", "sm90_fp8"}
    assert native.FAMILIES["sm80"]["extension"] == "sageattention._kernels_sm80"
    assert native.FAMILIES["sm89"]["ops"] == ["qk_int8_pv_fp8"]
    assert native.FAMILIES["sm80"]["ops"] == ["qk_int8_pv_fp16"]


def test_sm90_family_entry():
    spec = native.FAMILIES["sm90"]
    assert spec == {
        "extension": "sageattention._kernels_sm90", "sources": "csrc/sm90", "serves": ["sm90"],
        "min_nvcc": "12.4", "embed_ptx": None, "arch_specific": True, "ops": ["qk_int8_pv_fp16"],
        "qk_quant_gran": ["per_warp", "per_thread"], "pv_accum_dtype": ["fp32"], "head_dims": [64, 128]}
    # only the wgmma families are arch-specific; the others omit the field (default false)
    assert [f for f, s in native.FAMILIES.items() if s.get("arch_specific", False)] == ["sm90", "sm90_fp8"]


def test_sm90_fp8_family_entry():
    spec = native.FAMILIES["sm90_fp8"]
    assert spec == {
        "extension": "sageattention._kernels_sm90_fp8", "sources": "csrc/sm90_fp8", "serves": ["sm90"],
        "min_nvcc": "12.4", "embed_ptx": None, "arch_specific": True, "ops": ["qk_int8_pv_fp8"],
        "qk_quant_gran": ["per_warp", "per_thread"], "pv_accum_dtype": ["fp32+fp32", "fp32"],
        "head_dims": [64, 128]}
    # the sm89 family's op, granularities and head dims; its accumulation modes but "fp32+fp16"
    sm89 = native.FAMILIES["sm89"]
    assert {k: spec[k] for k in ("ops", "qk_quant_gran", "head_dims")} == \
        {k: sm89[k] for k in ("ops", "qk_quant_gran", "head_dims")}
    assert set(sm89["pv_accum_dtype"]) - set(spec["pv_accum_dtype"]) == {"fp32+fp16"}


def test_missing_extensions_are_reported_with_a_reason(no_extensions):
    status = native.available_families()
    assert set(status) == set(native.FAMILIES)
    for fam in (*MY_FAMILIES, "sm75"):   # sm75's extension is hidden too
        reason = status[fam]
        assert reason.startswith(f"sageattention._kernels_{fam} is not in this installation"), reason
        assert f"without {fam}-family targets" in reason, reason


def test_calling_a_missing_family_raises_importerror(no_extensions):
    with pytest.raises(ImportError, match="_kernels_sm80"):
        native.qk_int8_pv_fp16(None, None, None, family="sm80", pv_accum_dtype="fp32", **KWARGS)
    with pytest.raises(ImportError, match="_kernels_sm89"):
        native.qk_int8_pv_fp8(None, None, None, family="sm89", pv_accum_dtype="fp32+fp32", **KWARGS)
    with pytest.raises(ImportError, match="_kernels_sm90"):
        native.qk_int8_pv_fp16(None, None, None, family="sm90", pv_accum_dtype="fp32", **KWARGS)
    with pytest.raises(ImportError, match="_kernels_sm90_fp8"):
        native.qk_int8_pv_fp8(None, None, None, family="sm90_fp8", pv_accum_dtype="fp32", **KWARGS)


@pytest.mark.parametrize(
    "call, family, accum, match",
    [
        (native.qk_int8_pv_fp16, "sm99", "fp32", "unknown kernel family 'sm99'"),
        (native.qk_int8_pv_fp8, "sm80", "fp32", "has no qk_int8_pv_fp8.*sm89"),
        (native.qk_int8_pv_fp16, "sm89", "fp32", "has no qk_int8_pv_fp16"),
        (native.qk_int8_pv_fp16, "sm80", "fp32+fp32", "pv_accum_dtype='fp32\\+fp32'.*accepted"),
        (native.qk_int8_pv_fp8, "sm89", "fp16", "pv_accum_dtype='fp16'.*accepted"),
        (native.qk_int8_pv_fp16, "sm90", "fp16+fp32", "pv_accum_dtype='fp16\\+fp32'.*sm90.*\\['fp32'\\]"),
        (native.qk_int8_pv_fp8, "sm90", "fp32", "has no qk_int8_pv_fp8.*sm89.*sm90_fp8"),
        (native.qk_int8_pv_fp8, "sm90_fp8", "fp32+fp16",
         "pv_accum_dtype='fp32\\+fp16'.*sm90_fp8.*\\['fp32\\+fp32', 'fp32'\\]"),
        (native.qk_int8_pv_fp16, "sm90_fp8", "fp32", "has no qk_int8_pv_fp16"),
    ],
)
def test_bad_family_or_option_is_a_valueerror(call, family, accum, match):
    with pytest.raises(ValueError, match=match):
        call(None, None, None, family=family, pv_accum_dtype=accum, **KWARGS)


def test_bad_granularity_names_accepted_values():
    kw = dict(KWARGS, qk_quant_gran="per_tensor")
    with pytest.raises(ValueError, match="per_tensor.*per_warp"):
        native.qk_int8_pv_fp16(None, None, None, family="sm80", pv_accum_dtype="fp32", **kw)


def test_sm75_routes_to_its_module_with_the_published_signature(monkeypatch, fresh_status):
    calls = []
    fake = types.ModuleType("sageattention.native.sm75")
    fake.load = lambda: None

    def qk_int8_pv_fp16(q, k, v, **kwargs):
        calls.append((q, k, v, kwargs))
        return "out", None

    fake.qk_int8_pv_fp16 = qk_int8_pv_fp16
    monkeypatch.setitem(sys.modules, "sageattention.native.sm75", fake)
    result = native.qk_int8_pv_fp16(1, 2, 3, family="sm75", pv_accum_dtype="fp32", **KWARGS)
    assert result == ("out", None)
    assert calls == [(1, 2, 3, dict(KWARGS, pv_accum_dtype="fp32"))]
    assert native.available_families()["sm75"] is None


def test_broken_family_module_is_reported(monkeypatch, fresh_status):
    fake = types.ModuleType("sageattention.native.sm75")

    def load():
        raise ImportError("sageattention._kernels_sm75 is not in this installation: test")

    fake.load = load
    monkeypatch.setitem(sys.modules, "sageattention.native.sm75", fake)
    assert native.available_families()["sm75"] == (
        "sageattention._kernels_sm75 is not in this installation: test")


@pytest.mark.parametrize(
    "n, is_key, gran, expected",
    [
        (1, False, "per_warp", (128, 4)),
        (129, False, "per_thread", (256, 64)),
        (129, False, "per_block", (256, 2)),
        (1, True, "per_warp", (64, 1)),
        (65, True, "per_thread", (128, 8)),
        (4096, True, "per_block", (4096, 64)),
    ],
)
def test_int8_quant_shapes(n, is_key, gran, expected):
    assert native.int8_quant_shapes(n, is_key=is_key, qk_quant_gran=gran) == expected


def test_shape_helpers_reject_bad_arguments():
    with pytest.raises(ValueError, match="qk_quant_gran"):
        native.int8_quant_shapes(10, is_key=True, qk_quant_gran="per_tensor")

    class T:
        shape = (2, 3, 4, 5)

    assert native.bhnd(T, "HND") == (2, 3, 4, 5)
    assert native.bhnd(T, "NHD") == (2, 4, 3, 5)
    with pytest.raises(ValueError, match="tensor_layout"):
        native.bhnd(T, "BHND")


@pytest.mark.parametrize("family", MY_FAMILIES)
def test_cuda_sources_include_no_torch_headers(family):
    """Kernel objects are cached per (CUDA, SM) across torch versions: .cu/.cuh stay torch-free."""
    files = [*(ROOT / "csrc" / family).glob("*.cu"), *(ROOT / "csrc" / family).glob("*.cuh"),
             *(ROOT / "csrc" / "common").glob("*.cuh")]
    assert files
    for f in files:
        includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', f.read_text())
        bad = [i for i in includes if i.startswith(("torch/", "ATen/", "c10/")) or "torch_glue" in i]
        assert not bad, f"{f.name} includes torch headers {bad}"


@pytest.mark.parametrize("family", sorted(native.FAMILIES))
def test_bindings_skip_pybind11(family):
    """torch/extension.h drags in pybind11 and doubles a binding file's compile time (sm75: 79 s ->
    33 s warm rebuild on 2 cores); the ops need only ATen, the op registry and a plain PyInit."""
    text = (ROOT / "csrc" / family / "bindings.cpp").read_text()
    text += (ROOT / "csrc" / "common" / "torch_glue.h").read_text()
    includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', text)
    assert not [i for i in includes if i.startswith(("torch/extension.h", "pybind11", "torch/python.h"))]
    assert "PYBIND11_MODULE" not in text and f"PyInit__kernels_{family}" in text


@pytest.mark.parametrize("family", MY_FAMILIES)
def test_bindings_define_the_ops_of_the_family_table(family):
    text = (ROOT / "csrc" / family / "bindings.cpp").read_text()
    assert f"TORCH_LIBRARY(sageattention_{family}, m)" in text
    assert f"TORCH_LIBRARY_IMPL(sageattention_{family}, CUDA, m)" in text
    assert f"PyInit__kernels_{family}" in text
    defined = set(defined_ops(family))
    for op in native.FAMILIES[family]["ops"]:
        assert op in defined
        # the Python wrapper passes the same arguments the schema declares
        mod = __import__(f"sageattention.native.{family}", fromlist=[op])
        assert callable(getattr(mod, op))


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_attention_fake_outputs_have_the_ops_shapes(layout):
    import torch

    from sageattention.native import attention_fake_outputs

    shape = (2, 3, 5, 64) if layout == "HND" else (2, 5, 3, 64)
    q = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    out, lse = attention_fake_outputs(q, layout, True)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (2, 3, 5) and lse.dtype == torch.float32
    assert attention_fake_outputs(q, layout, False)[1].shape == (0, 3, 5)
