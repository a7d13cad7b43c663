"""The validation suite on a real GPU: the two-GPU check body on two streams of one GPU (the
stand-in for issue 9's two-device run), a few checks end to end, and one benchmark case."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


@pytest.fixture(scope="module")
def ctx():
    from sageattention.validation.api import Api
    from sageattention.validation.expectation import NoNativeCode, expect
    from sageattention.validation.profile import FULL
    from sageattention.validation.runner import Context

    api = Api.from_package()
    device = torch.device("cuda", 0)
    major, minor = torch.cuda.get_device_capability(device)
    try:
        expectation = expect(gpu_sm=major * 10 + minor, families_table=api.families_table(),
                             build_info=api.build_info(), available=api.available_families())
    except NoNativeCode as exc:
        pytest.skip(f"no native kernel to validate here: {exc}")
    return Context(api=api, device=device, profile=FULL, expectation=expectation)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_alternating_lanes_on_two_streams_of_one_gpu(ctx, dtype):
    from sageattention.validation.lanes import alternate, two_streams_one_device
    from sageattention.validation.runner import Recorder

    for backend in ctx.native_names:
        rec = Recorder()
        alternate(ctx, rec, backend, two_streams_one_device(ctx.device), calls=200, dtype=dtype,
                  label=f"{backend} two streams")
        assert rec.failures == []
        assert rec.backends == [backend]
        assert len(rec.cases) == 2 and all(c.ok for c in rec.cases)


def test_two_gpu_check_skips_with_reason_on_one_gpu(ctx):
    from sageattention.validation.catalog import CHECKS
    from sageattention.validation.runner import run_check

    check = next(c for c in CHECKS if c.slug == "two-gpu")
    rec = run_check(check, ctx)
    if torch.cuda.device_count() < 2:
        assert rec["status"] == "skip"
        assert rec["reason"].startswith("needs two GPUs; this machine has 1")
    else:
        assert rec["status"] == "pass", rec["reason"]


# The FP8-PV recipe sits at design.md's FP8 cosine bar (0.9993) on random inputs, not below it:
# sageattention.reference itself lands at 0.99924-0.99929 (docs/kernels.md, Known limits), so an
# FP8 case may miss the cosine bar by this much while every other measure holds.
FP8_RECIPE_COSINE_FLOOR = 0.9992


def _known_fp8_shortfall(case: dict) -> bool:
    from sageattention.validation.accuracy import FP8_PV_BAR, bar_for

    return (bar_for(case["backend"]) is FP8_PV_BAR and case["finite"]
            and case["rel_l1"] <= FP8_PV_BAR.max_rel_l1
            and FP8_RECIPE_COSINE_FLOOR <= case["cosine"] < FP8_PV_BAR.min_cosine)


@pytest.mark.parametrize("slug", ["native-runtime", "fp16", "bf16", "seq-boundaries",
                                  "two-streams", "cuda-graph", "bool-masks"])
def test_checks_pass_on_this_gpu(ctx, slug):
    from sageattention.validation.catalog import CHECKS
    from sageattention.validation.runner import run_check

    rec = run_check(next(c for c in CHECKS if c.slug == slug), ctx)
    if rec["status"] == "fail":  # only the FP8 recipe's known cosine shortfall may fail a case
        failed = [c for c in rec["cases"] if not c["ok"]]
        assert failed and all(_known_fp8_shortfall(c) for c in failed), rec["reason"]
    else:
        assert rec["status"] == "pass", rec["reason"]
    if next(c for c in CHECKS if c.slug == slug).native:
        assert set(rec["backends"]) == set(ctx.native_names)


def test_one_benchmark_case(ctx):
    from sageattention import benchmark

    case = benchmark.Case("fp16", 1, 8, 2048, 128, False)
    perf = benchmark.run([case], api=ctx.api, device=ctx.device,
                         timer=benchmark.cuda_timer(5, 20))
    row = perf["cases"][0]
    assert row["error"] is None, row["error"]
    assert row["sdpa_ms"] > 0 and row["sageattn_ms"] > 0
    assert perf["geomean_speedup_vs_sdpa"] == pytest.approx(row["speedup_vs_sdpa"])
    assert row["accuracy"]["cosine"] > 0.999
