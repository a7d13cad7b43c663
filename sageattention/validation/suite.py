"""The whole validation run: environment, expected backends, every check, performance."""

from __future__ import annotations

import time
from typing import Callable

import torch

from .api import Api
from .catalog import CHECKS
from .environment import capture
from .expectation import expect
from .profile import FULL, Profile
from .runner import Check, Context, run_check

SUITE_VERSION = 1
TRITON_BACKENDS = ("triton-fp16", "triton-fp8")  # plain Python in every wheel, timed forced too


class NoGpu(RuntimeError):
    """The suite needs a CUDA GPU and none is visible."""


def require_gpu() -> torch.device:
    if not torch.cuda.is_available():
        raise NoGpu("no CUDA GPU is visible (torch.cuda.is_available() is False): the validation "
                    "suite runs the wheel's kernels and needs a GPU; run it on a GPU machine")
    return torch.device("cuda", torch.cuda.current_device())


def _sm_of(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def accuracy_summary(checks: list[dict], names: set[str]) -> dict:
    """Worst and median figures per backend over the checks that compare normal inputs.

    The figures are over the comparisons that have figures (``cases``); a NaN/Inf output has none,
    and is counted in ``non_finite`` rather than left out silently."""
    per: dict[str, list[dict]] = {}
    non_finite: dict[str, int] = {}
    for rec in checks:
        if rec["name"] not in names:
            continue
        for case in rec["cases"]:
            if not case.get("backend"):
                continue
            if case.get("finite") and case.get("cosine") is not None:
                per.setdefault(case["backend"], []).append(case)
            elif "finite" in case:  # compared, without figures (a shape mismatch has no "finite")
                non_finite[case["backend"]] = non_finite.get(case["backend"], 0) + 1
    out = {}
    for backend, cases in per.items():
        cos = sorted(c["cosine"] for c in cases)
        l1 = sorted(c["rel_l1"] for c in cases)
        out[backend] = {"cases": len(cases), "min_cosine": cos[0], "median_cosine": cos[len(cos) // 2],
                        "max_rel_l1": l1[-1], "median_rel_l1": l1[len(l1) // 2],
                        "max_abs": max(c["max_abs"] for c in cases),
                        "non_finite": non_finite.get(backend, 0)}
    return out


def run_suite(*, api: Api | None = None, device: torch.device | None = None,
              profile: Profile = FULL, checks: list[Check] | None = None,
              performance: bool = True, argv: list[str] | None = None,
              gpu_sm: int | None = None,
              progress: Callable[[dict], None] | None = None,
              announce: Callable[[str], None] | None = None) -> dict:
    """Run the checks (and the performance section) and return the suite's result document.

    ``device`` and ``gpu_sm`` are for the unit tests, which run the checks on the CPU with a fake
    API; a real run takes the current CUDA device.
    """
    started = time.perf_counter()
    device = device if device is not None else require_gpu()
    api = api if api is not None else Api.from_package()
    checks = CHECKS if checks is None else checks
    env = capture(device, argv)
    build_info = api.build_info()
    families = api.families_table() or {}
    available = api.available_families()
    sm = gpu_sm if gpu_sm is not None else _sm_of(device)
    expectation = expect(gpu_sm=sm, families_table=families, build_info=build_info,
                         available=available)
    ctx = Context(api=api, device=device, profile=profile, expectation=expectation)
    if announce:
        how = ", ".join(f"{b.name} ({b.ptx_arch + ' PTX JIT' if b.via == 'ptx' else 'SASS'})"
                        for b in expectation.backends)
        announce(f"{env.get('gpu_name')} ({env.get('gpu_sm')}), torch {env['torch']}, "
                 f"sageattention {getattr(api.module, '__version__', '?')}: execution "
                 f"{expectation.execution}; native backends: {how}")
    results = []
    for check in checks:
        rec = run_check(check, ctx)
        results.append(rec)
        if progress:
            progress(rec)
    perf = None
    if performance:
        perf = performance_section(ctx, progress=announce)
    counts = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skip")}
    native_failed = [r["name"] for r in results if r["status"] == "fail"]
    mod = api.module
    return {
        "suite_version": SUITE_VERSION,
        "environment": env,
        "package": {"version": getattr(mod, "__version__", None),
                    "path": getattr(mod, "__file__", None)},
        "build_info": build_info,
        "families": {f: families.get("families", {}).get(f) for f in
                     (build_info or {}).get("families", [b.family for b in expectation.backends])},
        "backends_table": api.backends_table(),
        "available_families": available,
        "execution": expectation.execution,
        "expectation": expectation.as_dict(),
        "profile": "quick" if profile.perf_quick else "full",
        "checks": results,
        "summary": {**counts, "failed": native_failed, "all_passed": counts["fail"] == 0},
        "accuracy": accuracy_summary(results, {c.name for c in checks if c.in_accuracy_summary}),
        "performance": perf,
        "duration_s": round(time.perf_counter() - started, 1),
    }


def performance_section(ctx: Context, progress: Callable[[str], None] | None = None) -> dict:
    """The benchmark case set, timed for this build's native backends against SDPA; ``progress``
    gets a line first, then one per case as it is timed."""
    from sageattention import benchmark

    try:
        if ctx.device.type != "cuda":
            return {"skipped": "needs a CUDA device", "cases": [],
                    "geomean_speedup_vs_sdpa": None}
        quick = ctx.profile.perf_quick
        cases = benchmark.standard_cases(("fp16",) if quick else ("fp16", "bf16"))
        # Natively the headline figure is what sageattn() picks; from PTX the dispatcher would
        # not pick the family, so it is forced.
        ptx = ctx.expectation.execution == "ptx-jit"
        primary = ctx.native_names[0] if ptx else None
        if ptx:
            others = ctx.native_names[1:]
        else:  # each native backend forced too: the default dispatch may pick SDPA or a Triton
            # kernel (calibration); the Triton kernels every wheel carries are timed forced as well
            others = list(ctx.native_names) + [b for b in TRITON_BACKENDS if b not in ctx.native_names]
        # The CLI's warm-up in both profiles (benchmark.TIMER_WARMUP_MS): with a short one the
        # entry timed right after SDPA ran slow in every round, even when it ran SDPA itself (10 ms:
        # 5-12% in the 2026-12-05 H100 reports; 25 ms: 4-6%, 2026-12-06).
        timer = benchmark.cuda_timer(benchmark.TIMER_WARMUP_MS, 40 if quick else 100)
        if progress:
            progress(f"performance: {len(cases)} benchmark cases against SDPA, "
                     f"{ctx.profile.perf_rounds} interleaved rounds each; sageattn "
                     f"{'forced to ' + primary if primary else 'as dispatched'}, also timed: "
                     f"{', '.join(others) or 'none'}")
        perf = benchmark.run(cases, api=ctx.api, device=ctx.device, timer=timer,
                             primary=primary, others=others, rounds=ctx.profile.perf_rounds,
                             progress=progress)
        perf["quick"] = quick
        return perf
    except Exception as exc:  # noqa: BLE001 - the checks' results must survive a benchmark crash
        return {"error": f"{type(exc).__name__}: {exc}", "cases": [],
                "geomean_speedup_vs_sdpa": None}
