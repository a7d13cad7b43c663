"""No-GPU tests of the ops' fakes against the ops' argument checks: each family's schemas (read from
its bindings.cpp) under a test namespace with the module's fakes behind them, called with meta
tensors and a bad argument, refuse it in the op's words (csrc/common/op_checks.h and the families'
parse_accum; test_native_checks_host.py compiles the former and compares)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from bindings_source import bindings_text, family_schemas
from sageattention.native import checks

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("sm75", "sm80", "sm89", "sm90", "sm90_fp8")


@pytest.fixture(params=FAMILIES)
def ops(request, monkeypatch):
    """(family, torch.ops.<test namespace>) with the family's fakes behind its schemas."""
    family = request.param
    module = importlib.import_module(f"sageattention.native.{family}")
    namespace = f"sageattention_{family}_checks_test"
    lib = torch.library.Library(namespace, "DEF")
    for schema in family_schemas(family):
        lib.define(schema)
    if family == "sm75":
        monkeypatch.setattr(module, "OP_NAMESPACE", namespace)
        torch.library.register_fake(f"{namespace}::qk_int8_pv_fp16")(module._qk_int8_pv_fp16_fake)
    else:
        monkeypatch.setattr(module, "NAMESPACE", namespace)
        module._register_fakes()
    yield family, getattr(torch.ops, namespace)
    lib._destroy()


def meta(*shape, dtype=torch.float16, device="meta"):
    return torch.empty(shape, dtype=dtype, device=device)


def attention(family, op, q, k, v, *, layout="HND", sm_scale=0.125, gran="per_warp", accum=None):
    if family == "sm75":
        return op.qk_int8_pv_fp16(q, k, v, layout, False, sm_scale, gran, True, True)
    if family in ("sm80", "sm90"):
        return op.qk_int8_pv_fp16(q, k, v, layout, False, sm_scale, gran, accum or "fp32", True, True)
    return op.qk_int8_pv_fp8(q, k, v, layout, False, sm_scale, gran, accum or "fp32", True, False, True)


Q, KV = (1, 2, 70, 64), (1, 1, 33, 64)
BAD_QKV = [
    ((meta(*Q), meta(*KV, device="cpu"), meta(*KV)), "k must be a CUDA tensor, got one on cpu"),
    ((meta(*Q), meta(*KV), meta(*KV, dtype=torch.float32)), "v must be float16 or bfloat16, got torch.float32"),
    ((meta(1, 2, 70, 96), meta(1, 1, 33, 96), meta(1, 1, 33, 96)), "head dim must be 64 or 128, got 96"),
    ((meta(*Q), meta(2, 1, 33, 64), meta(2, 1, 33, 64)), "q, k and v must share the batch size, got 1, 2, 2"),
    ((meta(*Q), meta(*KV), meta(1, 1, 34, 64)), "k and v must have the same heads and tokens"),
    ((meta(0, 2, 70, 64), meta(0, 1, 33, 64), meta(0, 1, 33, 64)), r"need a batch, heads and tokens .*batch 0"),
    ((meta(1, 0, 70, 64), meta(*KV), meta(*KV)), r"need a batch, heads and tokens .*q 0 heads"),
    ((meta(1, 3, 70, 64), meta(1, 2, 33, 64), meta(1, 2, 33, 64)), r"q heads \(3\) must be a multiple of kv heads \(2\)"),
    ((torch.empty_strided((1, 1, (1 << 30) + 1, 64), (0, 0, 0, 1), dtype=torch.float16, device="meta"),
      meta(*KV), meta(*KV)), "q has 1073741825 tokens; the kernels take at most 1073741824"),
]


@pytest.mark.parametrize("qkv,error", BAD_QKV)
def test_the_attention_fakes_refuse_what_the_ops_refuse(ops, qkv, error):
    family, op = ops
    with pytest.raises(RuntimeError, match=error):
        attention(family, op, *qkv)


@pytest.mark.parametrize("sm_scale", [float("nan"), float("inf"), float("-inf")])
def test_the_attention_fakes_refuse_a_scale_that_is_not_finite(ops, sm_scale):
    family, op = ops
    with pytest.raises(RuntimeError, match="sm_scale must be finite, got (nan|inf|-inf)"):
        attention(family, op, meta(*Q), meta(*KV), meta(*KV), sm_scale=sm_scale)
    out, lse = attention(family, op, meta(*Q), meta(*KV), meta(*KV), sm_scale=-0.125)  # negative: fine
    assert out.shape == Q and lse.shape == (1, 2, 70)


def test_the_attention_fakes_refuse_options_in_the_ops_words(ops):
    family, op = ops
    q, kv = meta(*Q), meta(*KV)
    with pytest.raises(ValueError, match="tensor_layout must be 'HND' or 'NHD', got 'BHND'"):
        attention(family, op, q, kv, kv, layout="BHND")
    gran = ("sageattention_sm75: qk_quant_gran must be 'per_thread' or 'per_warp'" if family == "sm75"
            else "qk_quant_gran must be 'per_block', 'per_warp' or 'per_thread'")
    with pytest.raises(RuntimeError, match=f"^{gran}, got 'per_token'$"):
        attention(family, op, q, kv, kv, gran="per_token")
    if family != "sm75":
        with pytest.raises(RuntimeError, match=f"^pv_accum_dtype for the {family} family must be .*got 'fp64'"):
            attention(family, op, q, kv, kv, accum="fp64")
    else:
        strided = meta(1, 2, 70, 128)[..., ::2]
        with pytest.raises(RuntimeError, match="head dim of q must be contiguous .stride 1., got stride 2"):
            attention(family, op, strided, kv, kv)


def test_the_sm80_fake_takes_a_float16_v_beside_bfloat16_only_where_the_op_does(ops):
    family, op = ops
    q, k, v = meta(*Q, dtype=torch.bfloat16), meta(*KV, dtype=torch.bfloat16), meta(*KV)
    if family == "sm80":
        attention(family, op, q, k, v, accum="fp16")
    with pytest.raises(RuntimeError, match="must have one dtype"):
        attention(family, op, q, k, v, accum="fp32")


@pytest.mark.parametrize("x,mean,scale_mult,error", [
    (meta(1, 3, 70, 0), None, 1.0, "head dim must be a multiple of 8 from 8 to 256, got 0"),
    (meta(1, 3, 70, 64, dtype=torch.float32), None, 1.0, "x must be float16 or bfloat16"),
    (meta(1, 3, 70, 64), None, float("nan"), "scale_mult must be finite, got nan"),
    (meta(1, 3, 70, 64), meta(1, 3, 64, device="cpu"), 1.0, "mean is on cpu but x is on meta"),
    (meta(1, 3, 70, 64), meta(1, 3, 64, dtype=torch.int32), 1.0, r"floating-point \[B, H, D\] = \[1, 3, 64\]"),
    (meta(1, 3, 70, 64), meta(192), 1.0, r"got shape \(192,\)"),
])
@pytest.mark.parametrize("ops", [f for f in FAMILIES if f != "sm75"], indirect=True)
def test_the_quant_int8_fakes_refuse_what_the_op_refuses(ops, x, mean, scale_mult, error):
    family, op = ops
    with pytest.raises(RuntimeError, match=error):
        op.quant_int8(x, mean, "HND", "per_warp", True, scale_mult)
    xi8, scale = op.quant_int8(meta(0, 3, 70, 64), None, "HND", "per_warp", True, 1.0)  # empty: empty out
    assert xi8.shape == (0, 3, 128, 64) and scale.shape == (0, 3, 2)


@pytest.mark.parametrize("v,error", [
    (meta(1, 2, 70, 0), "head dim must be a multiple of 8 from 8 to 128, got 0"),
    (meta(1, 2, 70, 256), "head dim must be a multiple of 8 from 8 to 128, got 256"),
    (meta(1, 2, 0, 64), r"v needs at least one token .*got shape \(1, 2, 0, 64\)"),
    (meta(2, 70, 64), r"v must be 4-D"),
])
@pytest.mark.parametrize("ops", ["sm89", "sm90_fp8"], indirect=True)
def test_the_quant_v_fp8_fakes_refuse_what_the_op_refuses(ops, v, error):
    family, op = ops
    with pytest.raises(RuntimeError, match=error):
        op.quant_v_fp8(v, "HND", False)


def test_the_quantization_ops_are_where_the_two_tests_above_look_for_them():
    # the quant tests run on the families that define each op: a family gaining or losing one
    # must be added to or taken from their lists
    has = {f: {op for op in ("quant_int8", "quant_v_fp8")
               if any(re.match(rf"{op}\(", s) for s in family_schemas(f))} for f in FAMILIES}
    assert {f for f in FAMILIES if "quant_int8" in has[f]} == set(FAMILIES) - {"sm75"}
    assert {f for f in FAMILIES if "quant_v_fp8" in has[f]} == {"sm89", "sm90_fp8"}


@pytest.mark.parametrize("family", ["sm80", "sm89", "sm90", "sm90_fp8"])
def test_the_accumulation_refusals_are_the_bindings_words(family):
    # checks.parse_accum's table against the family's parse_accum / check_accum in bindings.cpp
    text = bindings_text(family)
    body = re.search(r"(?:PvAccum parse_accum|void check_accum)\(const std::string& a\) \{(.*?)\n\}", text, re.S)
    accepted = re.findall(r'a == "([^"]+)"', body.group(1))
    message = re.search(r"TORCH_CHECK\((?:false|a == \"fp32\"),\s*(.*?)\);", body.group(1), re.S).group(1)
    words = "".join('{}' if part.strip() == "a" else "".join(re.findall(r'"([^"]*)"', part))
                    for part in re.split(r",\s*(?=a\s*,)|(?<=\ba)\s*,", message))
    assert set(accepted) == set(checks._ACCUM[family][0])
    assert words == checks._ACCUM[family][1]
    for ok in accepted:
        checks.parse_accum(family, ok)
    with pytest.raises(checks.OpArgumentError, match=re.escape(words.format("fp64"))):
        checks.parse_accum(family, "fp64")


def test_the_glue_checks_before_it_launches():
    glue = (ROOT / "csrc" / "common" / "torch_glue.h").read_text()
    for fn, check in [("quant_int8", "check_quant_int8_args(x_in, mean, hnd, scale_mult);"),
                      ("quant_v_fp8", "check_quant_v_fp8_args(v_in, hnd);")]:
        body = glue.split(f"> {fn}(")[1]
        assert body.index(check) < body.index("launch(")
    for family in FAMILIES:
        text = bindings_text(family)
        assert 'check_finite(sm_scale, "sm_scale")' in text and "check_qkv(q, k, v" in text
