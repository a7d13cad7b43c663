"""No-GPU tests of the sm90 family's Python side (sageattention/native/sm90.py) and C++ layout.

The op schemas are read from the C++ sources (csrc/common/op_schemas.h, where they are defined
once) and registered
in a test-only namespace with the module's fake implementations behind them, so the wrapper's
calls and the fakes' output shapes are checked on meta tensors, without the extension.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sageattention.native import sm90
from bindings_source import family_schemas

ROOT = Path(__file__).resolve().parents[2]
TEST_NAMESPACE = "sageattention_sm90_schema_test"
KWARGS = dict(is_causal=True, sm_scale=0.125, pv_accum_dtype="fp32", smooth_k=True, smooth_v=False)


def test_schemas_are_the_sm80_familys():
    # Same contract as the sm80 family (its "fp32" mode): the same two ops, the same arguments.
    schemas = family_schemas("sm90")
    assert [s.split("(")[0] for s in schemas] == ["quant_int8", "qk_int8_pv_fp16"]
    assert schemas == family_schemas("sm80")


@pytest.fixture
def ops_on_schema(monkeypatch):
    """sm90's wrapper and fakes on the bindings.cpp schemas under a test namespace."""
    lib = torch.library.Library(TEST_NAMESPACE, "DEF")
    for schema in family_schemas("sm90"):
        lib.define(schema)
    monkeypatch.setattr(sm90, "NAMESPACE", TEST_NAMESPACE)
    sm90._register_fakes()
    monkeypatch.setattr(sm90, "load", lambda: None)
    yield
    lib._destroy()


@pytest.mark.parametrize("gran", ["per_thread", "per_warp"])
@pytest.mark.parametrize("layout,return_lse", [("HND", False), ("NHD", True), ("HND", True)])
def test_wrapper_calls_the_schema_and_the_fake_gives_the_shapes(ops_on_schema, gran, layout,
                                                                 return_lse):
    b, hq, hkv, nq, nk, d = 2, 4, 2, 33, 70, 128
    shape = (lambda h, n: (b, h, n, d)) if layout == "HND" else (lambda h, n: (b, n, h, d))
    q = torch.empty(shape(hq, nq), dtype=torch.bfloat16, device="meta")
    k = torch.empty(shape(hkv, nk), dtype=torch.bfloat16, device="meta")
    out, lse = sm90.qk_int8_pv_fp16(q, k, k, tensor_layout=layout, qk_quant_gran=gran,
                                    return_lse=return_lse, **KWARGS)
    assert out.shape == q.shape and out.dtype == q.dtype
    if return_lse:
        assert lse.shape == (b, hq, nq) and lse.dtype == torch.float32
    else:
        assert lse is None


@pytest.mark.parametrize("is_key,gran,expected", [(False, "per_thread", (128, 32)),
                                                  (True, "per_warp", (128, 2))])
def test_quant_fake_gives_the_padded_shapes(ops_on_schema, is_key, gran, expected):
    x = torch.empty(1, 3, 70, 64, dtype=torch.float16, device="meta")
    xi8, scale = sm90.quant_int8(x, tensor_layout="HND", qk_quant_gran=gran, is_key=is_key)
    assert xi8.shape == (1, 3, expected[0], 64) and xi8.dtype == torch.int8
    assert scale.shape == (1, 3, expected[1]) and scale.dtype == torch.float32


def test_the_fakes_refuse_an_input_that_is_not_4d(ops_on_schema):
    # The sm80 and sm90 fakes read bhnd(...) of their input unchecked: an IndexError for a 3-D one.
    x3 = torch.empty(3, 70, 64, dtype=torch.float16, device="meta")
    words = (r"must be 4-D \(\[B, H, N, D\] for HND, \[B, N, H, D\] for NHD\), "
             r"got shape \(3, 70, 64\)")
    with pytest.raises(ValueError, match=f"^x {words}"):
        sm90.quant_int8(x3, tensor_layout="HND", qk_quant_gran="per_warp", is_key=False)
    with pytest.raises(ValueError, match=f"^q {words}"):
        sm90.qk_int8_pv_fp16(x3, x3, x3, tensor_layout="NHD", qk_quant_gran="per_warp",
                             return_lse=True, **KWARGS)


# --- the C++ side: what the family compiles, read from its sources ---------------------------

def _source(name: str) -> str:
    return (ROOT / "csrc" / "sm90" / name).read_text()


def test_attention_uses_the_warp_specialized_wgmma_kernel_directly():
    files = {p.name: p.read_text() for p in (ROOT / "csrc" / "sm90").iterdir()}
    assert {"launchers.h", "tiles.cuh", "attn_hd64.cu", "attn_hd128.cu", "quant.cu",
            "bindings.cpp"} <= set(files)
    # the shipped kernel, not attn_dispatch.cuh's SAGE_WGMMA tuning path
    assert not [n for n, t in files.items() if "attn_dispatch.cuh" in t or "SAGE_WGMMA" in t]
    tiles = _source("tiles.cuh")
    assert '#include "../common/attn_wgmma.cuh"' in tiles
    # each head dim's tile: warpgroups and key block from their overridable defaults
    defaults = {}   # the first #define of each: the shipped build's (the copy engine on)
    for name, value in re.findall(r"#define (SAGE_SM90_\w+) (\d+)", tiles):
        defaults.setdefault(name, int(value))
    tiles_found = re.findall(
        r"struct Tile<(\d+)> \{\s*static constexpr int kConsumerWarpgroups = SAGE_SM90_NWG_(\d+), "
        r"kBlockN = SAGE_SM90_BLOCK_N_(\d+);\s*static constexpr int kStages = SAGE_SM90_STAGES_(\d+), "
        r"kPingPong = (\w+);", tiles)
    assert all(d == d_nwg == d_n == d_st for d, d_nwg, d_n, d_st, _ in tiles_found)
    # kPingPong: a literal 0, or a macro whose first #define is the shipped value
    shapes = {int(d): (defaults[f"SAGE_SM90_NWG_{d}"], defaults[f"SAGE_SM90_BLOCK_N_{d}"],
                       defaults[f"SAGE_SM90_STAGES_{d}"], int(pp) if pp.isdigit() else defaults.get(pp))
              for d, _, _, _, pp in tiles_found}
    # the tuning choice may change; the shapes must be ones the kernel's traits accept
    assert set(shapes) == {64, 128}
    for nwg, block_n, stages, pingpong in shapes.values():
        assert nwg in (1, 2, 3, 4) and block_n in (64, 128) and stages >= 2
        assert pingpong in (0, 1, 2) and (pingpong == 0 or nwg == 2)
    assert "PvKind::kBf16, __nv_bfloat16" in tiles and "PvKind::kFp16, __half" in tiles
    assert "pv_in_bf16(dtype, PvAccum::kF32)" in tiles
    assert "launch_attention<64>" in _source("attn_hd64.cu")
    assert "launch_attention<128>" in _source("attn_hd128.cu")
    assert "launch_quant_int8" in _source("quant.cu")


def test_bindings_accept_only_fp32_accumulation_and_only_compute_capability_9_0():
    text = _source("bindings.cpp")
    check = re.search(r"void check_accum\(const std::string& a\) \{(.*?)\n\}", text, re.S).group(1)
    assert 'a == "fp32"' in check and "must be 'fp32'" in check
    # the device check may live in the shared glue (glue::check_sm90a_device), which sm90_fp8 uses too
    text += (ROOT / "csrc" / "common" / "torch_glue.h").read_text()
    assert "prop->major == 9 && prop->minor == 0" in text and "sm_90a" in text


@pytest.mark.parametrize("mean,error", [
    (torch.zeros(1, 3, 64), "mean is on cpu but x is on meta"),
    (torch.zeros(3, 1, 64, device="meta"), r"\[B, H, D\] = \[1, 3, 64\]")])
def test_quant_refuses_a_mean_the_op_would_misread(ops_on_schema, mean, error):
    x = torch.empty(1, 3, 70, 64, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match=error):
        sm90.quant_int8(x, tensor_layout="HND", qk_quant_gran="per_warp", is_key=True, mean=mean)
