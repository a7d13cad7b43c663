"""The GPU fuzz tests' bars are ones the algorithm meets: on the CPU, `sageattention.reference`
(which the kernels match to cosine >= 0.99999 on the GPU) is run on the same seeded draws
(tests/gpu/fuzz_cases.py) with each backend's quantization and checked exactly as
tests/gpu/test_fuzz_gpu.py checks the kernels. Also: the draws' input views are the views they
claim to be, holding the same values as a contiguous copy.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from fuzz_cases import (  # noqa: E402  (a helper of the GPU tier)
    CASES,
    DEFAULT_CASES,
    DEFAULT_SEED,
    KERNEL_FUNCTIONS,
    LSE_BARS,
    LSE_MEAN_MIN_ROWS,
    NATIVE_CASES,
    SCALE_CASES,
    VIEWS,
    bars_for,
    check_call,
    draw_cases,
    expected,
    kernel_function_options,
    make_inputs,
)

from sageattention import backends, reference  # noqa: E402

QUANTIZED = [b for b in backends.capability_table() if b.op is not None]
PV_DTYPE = {"qk_int8_pv_fp16": "fp16", "qk_int8_pv_fp8": "fp8"}


def reference_call(case, q, k, v, row, *, gran=None, accum=None, smooth_k=True, smooth_v=False):
    """The reference with `row`'s quantization (its block sizes, default granularity/accumulation)."""
    return reference.sageattn_reference(
        q, k, v, tensor_layout=case.layout, is_causal=case.causal, sm_scale=case.scale,
        qk_quant_gran=gran or row.qk_quant_grans[0], smooth_k=smooth_k, smooth_v=smooth_v,
        pv_dtype=PV_DTYPE[row.op], pv_accum_dtype=accum or row.default_pv_accum_dtype,
        return_lse=True, **reference.FAMILY_BLOCK_SIZES[row.family or "triton"],
        pv16=torch.float16 if row.family == "sm75" else None)   # Turing: no bf16 mma


@pytest.mark.parametrize("case", CASES + SCALE_CASES, ids=str)
def test_reference_meets_the_sageattn_fuzz_bars(case):
    q, k, v = make_inputs(case, device="cpu")
    ref_out, ref_lse = expected(q, k, v, case.layout, case.causal, case.scale)
    rows = [row for row in QUANTIZED if case.head_dim in row.head_dims]   # the capability table's rule
    for row in rows:
        out, lse = reference_call(case, q, k, v, row)
        check_call(f"{case} reference as {row.name}", out.to(q.dtype), lse, ref_out, ref_lse, q,
                   bars_for(row.op, case), case.scale, case.head_dim)


@pytest.mark.parametrize("case", NATIVE_CASES, ids=str)
@pytest.mark.parametrize("function", KERNEL_FUNCTIONS)
def test_reference_meets_the_kernel_function_fuzz_bars(case, function):
    options = kernel_function_options(case, function)
    op, accums = KERNEL_FUNCTIONS[function]
    q, k, v = make_inputs(case, device="cpu")
    ref_out, ref_lse = expected(q, k, v, case.layout, case.causal, case.scale)
    if accums is None:   # the Triton function: per-block scales, fp32 accumulation
        rows = [backends.backend("triton-fp16")]
    else:                # every native family that can run these options, whichever GPU runs it
        rows = [row for row in QUANTIZED if row.kind == "native" and row.op == op
                and options["pv_accum_dtype"] in row.pv_accum_dtypes
                and options["qk_quant_gran"] in row.qk_quant_grans]
        assert rows, (function, options)
    for row in rows:
        out, lse = reference_call(case, q, k, v, row, gran=options.get("qk_quant_gran"),
                                  accum=options.get("pv_accum_dtype"), smooth_k=options["smooth_k"],
                                  smooth_v=options.get("smooth_v", False))
        check_call(f"{case} {function} {options} reference as {row.name}", out.to(q.dtype), lse,
                   ref_out, ref_lse, q, bars_for(op, case, options["smooth_k"]), case.scale,
                   case.head_dim)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("layout", ("HND", "NHD"))
def test_views_are_views_of_the_same_values(view, layout):
    case = dataclasses.replace(CASES[0], batch=2, q_heads=4, kv_heads=2, q_len=5, kv_len=7,
                               head_dim=64, layout=layout, view=view, dtype=torch.float16)
    plain = make_inputs(dataclasses.replace(case, view="contiguous"), device="cpu")
    viewed = make_inputs(case, device="cpu")
    token_dim = 2 if layout == "HND" else 1
    for name, a, b in zip("qkv", plain, viewed):
        assert a.shape == b.shape and a.is_contiguous(), (view, name)
        if view == "broadcast_batch":   # K/V drawn for one batch entry and expanded
            assert torch.equal(a, b) if name == "q" else (b.stride(0) == 0 and torch.equal(b[0], b[1]))
            continue
        assert torch.equal(a, b), (view, name)
        if view == "contiguous":
            assert b.is_contiguous()
        elif view == "sliced_head_dim":   # rows of a 64 + 16 wide tensor
            assert b.stride(-1) == 1 and b.stride(-2) == 64 + 16
        elif view == "transposed_layout":
            assert not b.is_contiguous() and b.transpose(1, 2).is_contiguous()
        elif view == "every_other_token":
            assert b.stride(token_dim) == 2 * a.stride(token_dim)


def _draw_in_child(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Import fuzz_cases in a child with `env` added (it reads the draw at import)."""
    code = ("import fuzz_cases as f; print(f.SEED, f.N_CASES, len(f.CASES), len(f.MASK_CASES), "
            "len(f.NATIVE_CASES), f.CASES[0])")
    gpu_dir = str(Path(__file__).resolve().parents[1] / "gpu")
    root = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([gpu_dir, root]), **env})


def test_the_environment_draws_other_and_more_cases_and_the_default_stays_fixed():
    default = _draw_in_child({"SAGE_FUZZ_SEED": "", "SAGE_FUZZ_CASES": ""})
    assert default.returncode == 0, default.stderr
    seed, count, cases, masks, natives, first = default.stdout.split(maxsplit=5)
    assert (int(seed), int(count), int(cases)) == (20261205, 36, 36) and (masks, natives) == ("12", "14")
    assert first.strip() == str(draw_cases(DEFAULT_SEED, DEFAULT_CASES)[0])
    wide = _draw_in_child({"SAGE_FUZZ_SEED": "7", "SAGE_FUZZ_CASES": "90"})
    assert wide.returncode == 0, wide.stderr
    seed, count, cases, masks, natives, first = wide.stdout.split(maxsplit=5)
    assert (int(seed), int(count), int(cases)) == (7, 90, 90)
    assert int(masks) >= 12 and int(natives) >= 14
    assert first.strip() == str(draw_cases(7, 90)[0]) != str(draw_cases(DEFAULT_SEED, DEFAULT_CASES)[0])


@pytest.mark.parametrize("name, value", [("SAGE_FUZZ_CASES", "0"), ("SAGE_FUZZ_CASES", "many"),
                                         ("SAGE_FUZZ_SEED", "-1")])
def test_a_bad_draw_in_the_environment_is_refused_by_name(name, value):
    proc = _draw_in_child({name: value})
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError") and name in last and "expected an integer >= " in last, proc.stderr


@pytest.mark.parametrize("rows, passes", [(3, True), (LSE_MEAN_MIN_ROWS, False)])
def test_the_lse_mean_bar_applies_from_enough_rows(rows, passes):
    # every row's LSE off by 0.05 score units: above the mean bar (0.02), below the max bar (0.15)
    q = torch.zeros(1, 1, rows, 64)
    out = torch.ones_like(q)
    ref_lse = torch.zeros(1, 1, rows, dtype=torch.float64)
    lse = (ref_lse + 0.05).float()
    args = ("lse", out, lse, out.double(), ref_lse, q, ((0.9, 0.1), LSE_BARS), 64 ** -0.5, 64)
    if passes:
        check_call(*args)
    else:
        with pytest.raises(AssertionError, match="LSE error mean"):
            check_call(*args)
