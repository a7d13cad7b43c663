"""Seeded random calls through the public API, on every backend this build and GPU can run.

The other GPU tests walk grids chosen by hand; these draw what a user might pass from a fixed
seed (fuzz_cases.py; a failure reruns exactly, its case id names the draw): batch, GQA/MQA
ratios, query and key lengths (1, odd, around the block sizes, a few thousand), head dims,
fp16/bf16, HND/NHD, causal, a custom scale (as `sm_scale` or as SDPA's `scale`), `return_lse`, and
input views (sliced head dim, a layout transposed by view, every other token, a batch-broadcast
K/V). Each call runs under `force_backend` for every backend `select_backend` accepts, and is
checked against float64 attention on the same inputs: shape, dtype, no NaN/Inf, design.md's
accuracy bar for its P.V type, the LSE, and which backend ran (`last_backend`). Masked calls
(Triton and SDPA take masks; the others must refuse them), varlen calls and the kernel-specific
functions with drawn options get the same checks. tests/unit/test_fuzz_bars.py checks that the
reference algorithm meets these bars on these draws.

The draw is fixed; SAGE_FUZZ_SEED and SAGE_FUZZ_CASES (fuzz_cases.py) draw other or more cases
for a development run, e.g. `SAGE_FUZZ_SEED=7 SAGE_FUZZ_CASES=200 pytest tests/gpu/test_fuzz_gpu.py`
(run tests/unit/test_fuzz_bars.py with the same two first: it says whether the bars hold for the
reference on that draw). Skipped with a reason where there is no GPU.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch
from fuzz_cases import (
    CASES,
    KERNEL_FUNCTIONS,
    LENGTHS,
    MASK_CASES,
    N_CASES,
    NATIVE_CASES,
    SCALE_CASES,
    SEED,
    Case,
    accuracy,
    bars_for,
    check_call,
    expected,
    kernel_function_options,
    make_inputs,
)

import sageattention as sa
from sageattention import backends

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def runnable_backends(q, k, v, case: Case, kwargs) -> list[str]:
    """The backends `select_backend` accepts for this call when forced (the others refuse it)."""
    names = []
    for name in backends.BACKEND_NAMES:
        with sa.force_backend(name):
            try:
                sa.select_backend(q, k, v, tensor_layout=case.layout, is_causal=case.causal,
                                  return_lse=case.return_lse, **kwargs)
            except sa.BackendUnavailableError:
                continue
        names.append(name)
    return names


@pytest.mark.parametrize("case", CASES, ids=str)
def test_sageattn_on_every_backend_matches_fp64_attention(case: Case):
    q, k, v = make_inputs(case)
    kwargs = {} if case.scale_factor is None else {case.scale_keyword: case.scale}
    ref_out, ref_lse = expected(q, k, v, case.layout, case.causal, case.scale)
    ran = []
    for name in runnable_backends(q, k, v, case, kwargs):
        with sa.force_backend(name):
            result = sa.sageattn(q, k, v, tensor_layout=case.layout, is_causal=case.causal,
                                 return_lse=case.return_lse, **kwargs)
        assert sa.last_backend() == name, (name, sa.last_backend())
        out, lse = result if case.return_lse else (result, None)
        check_call(f"{case} on {name}", out, lse, ref_out, ref_lse, q,
                   bars_for(backends.backend(name).op, case), case.scale, case.head_dim)
        ran.append(name)
    assert "sdpa" in ran, ran   # SDPA runs everything: an empty list would check nothing


@pytest.mark.parametrize("case", SCALE_CASES, ids=str)
def test_zero_and_negative_scales_on_every_backend_match_fp64_attention(case: Case):
    q, k, v = make_inputs(case)
    kwargs = {case.scale_keyword: case.scale}
    ref_out, ref_lse = expected(q, k, v, case.layout, case.causal, case.scale)
    ran = []
    for name in runnable_backends(q, k, v, case, kwargs):
        with sa.force_backend(name):
            out, lse = sa.sageattn(q, k, v, tensor_layout=case.layout, is_causal=case.causal,
                                   return_lse=True, **kwargs)
        assert sa.last_backend() == name, (name, sa.last_backend())
        check_call(f"{case} on {name}", out, lse, ref_out, ref_lse, q,
                   bars_for(backends.backend(name).op, case), case.scale, case.head_dim)
        ran.append(name)
    assert len(ran) > 1, ran   # SDPA and at least one quantized backend


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("mask_kind", ("bool", "additive"))
def test_masked_calls_match_fp64_attention(case: Case, mask_kind: str):
    q, k, v = make_inputs(case)
    g = torch.Generator(device="cuda").manual_seed(SEED + 1000 + case.index)
    shape = (case.batch, 1, case.q_len, case.kv_len)   # broadcast over heads
    if mask_kind == "bool":
        mask = torch.rand(shape, generator=g, device="cuda") < 0.7
        mask[..., 0] = True   # every query keeps a key: SDPA's fully-masked rows are undefined
    else:
        mask = (torch.randn(shape, generator=g, device="cuda") * 2).to(case.dtype)
    kwargs = {"attn_mask": mask} if case.scale_factor is None else {
        "attn_mask": mask, case.scale_keyword: case.scale}
    ref_out, _ = expected(q, k, v, case.layout, False, case.scale, mask)
    ran = []
    for name in runnable_backends(q, k, v, case, kwargs):
        with sa.force_backend(name):
            out = sa.sageattn(q, k, v, tensor_layout=case.layout, **kwargs)
        assert sa.last_backend() == name, (name, sa.last_backend())
        check_call(f"{case} {mask_kind} mask on {name}", out, None, ref_out, None, q,
                   bars_for(backends.backend(name).op, case), case.scale, case.head_dim)
        ran.append(name)
    # SDPA takes every mask; a backend that cannot apply one must refuse the call, not ignore it.
    takes_mask = {b.name for b in backends.capability_table() if b.takes_mask}
    assert "sdpa" in ran and set(ran) <= takes_mask, ran


@pytest.mark.parametrize("seed", range(max(6, N_CASES // 6)))
def test_varlen_matches_fp64_attention_per_sequence(seed: int):
    rng = random.Random(SEED + 2000 + seed)
    g = torch.Generator(device="cuda").manual_seed(SEED + 2000 + seed)
    count = rng.choice((1, 2, 3, 5))
    q_lens = [rng.choice((0,) + LENGTHS[:12]) for _ in range(count)]
    k_lens = [n if rng.random() < 0.5 else rng.choice((0,) + LENGTHS[:12]) for n in q_lens]
    kv_heads = rng.choice((1, 2))
    q_heads = kv_heads * rng.choice((1, 2, 4))
    d = rng.choice((64, 128, 96))
    dtype = rng.choice((torch.float16, torch.bfloat16))
    causal = rng.random() < 0.5
    q = torch.randn(sum(q_lens), q_heads, d, generator=g, device="cuda").to(dtype)
    k = torch.randn(sum(k_lens), kv_heads, d, generator=g, device="cuda").to(dtype)
    v = torch.randn(sum(k_lens), kv_heads, d, generator=g, device="cuda").to(dtype)
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
                  for lens in (q_lens, k_lens))
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), is_causal=causal)
    label = (f"varlen seed {seed}: q {q_lens} k {k_lens} heads {q_heads}/{kv_heads} d {d} {dtype} "
             f"causal {causal} on {sa.last_backend()}")
    assert out.shape == q.shape and out.dtype == dtype, label
    assert torch.isfinite(out).all(), f"{label}: non-finite output"
    pieces = []
    for i in range(count):
        qs = q[cu_q[i]:cu_q[i + 1]].transpose(0, 1)[None]
        ks, vs = (t[cu_k[i]:cu_k[i + 1]].transpose(0, 1)[None] for t in (k, v))
        if ks.shape[2] == 0:   # queries with no keys give zeros
            pieces.append(torch.zeros(qs.shape[2], q_heads, d, dtype=torch.float64, device="cuda"))
        elif qs.shape[2]:
            pieces.append(expected(qs, ks, vs, "HND", causal, d ** -0.5)[0][0].transpose(0, 1))
    ref_out = torch.cat(pieces) if pieces else torch.zeros(q.shape, dtype=torch.float64)
    if ref_out.abs().sum() == 0:
        assert out.abs().sum() == 0, f"{label}: queries with no keys must give zeros"
        return
    cos, rel = accuracy(out, ref_out)
    assert cos >= 0.9998 and rel <= 0.02, f"{label}: cosine {cos:.6f}, relative L1 {rel:.4f}"


@pytest.mark.parametrize("case", NATIVE_CASES, ids=str)
@pytest.mark.parametrize("function", KERNEL_FUNCTIONS)
def test_kernel_functions_with_drawn_options_match_fp64_attention(case: Case, function: str):
    options = kernel_function_options(case, function)
    q, k, v = make_inputs(case)
    ref_out, ref_lse = expected(q, k, v, case.layout, case.causal, case.scale)
    try:
        result = getattr(sa, function)(q, k, v, tensor_layout=case.layout, is_causal=case.causal,
                                       sm_scale=case.scale, return_lse=case.return_lse, **options)
    except sa.BackendUnavailableError as exc:
        pytest.skip(f"{function}: {exc}")
    ran = sa.last_backend()
    assert ran != "sdpa", f"{function} {options} fell back to SDPA on a native-sized call"
    out, lse = result if case.return_lse else (result, None)
    check_call(f"{case} {function} {options} on {ran}", out, lse, ref_out, ref_lse, q,
               bars_for(KERNEL_FUNCTIONS[function][0], case, options["smooth_k"]), case.scale,
               case.head_dim)
