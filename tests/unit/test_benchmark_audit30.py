"""Audit of the benchmark's figures and speed-goal verdicts (sageattention.benchmark,
sageattention.speed_goals): non-finite figures, a NaN output, and a run whose headline figures were
forced to one backend. CPU only."""

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sageattention import benchmark, speed_goals
from sageattention.speed_goals import MET, NOT_EVALUATED, TOPS_CASE

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GOOD = {"cosine": 0.99995, "rel_l1": 0.01, "max_abs": 0.01, "finite": True}


def _row(case, *, speedup=2.0, sm80=1000.0):
    return {"name": case.name, "dtype": case.dtype, "batch": case.batch, "heads": case.heads,
            "seq_len": case.seq_len, "head_dim": case.head_dim, "causal": case.causal,
            "sdpa_tops": 500.0, "sageattn_tops": 500.0 * speedup, "speedup_vs_sdpa": speedup,
            "backend": "cuda-sm90-fp16", "accuracy": dict(GOOD),
            "backends": {"cuda-sm80-fp16": {"ran": "cuda-sm80-fp16", "tops": sm80}}}


def _rows():
    return [_row(c) for c in benchmark.standard_cases()]


def _goal(verdicts, start):
    [v] = [v for v in verdicts if v.goal.startswith(start)]
    return v


def _key(row):
    return speed_goals.case_key(row)


def test_all_met_baseline():
    assert [v.status for v in speed_goals.evaluate({"cases": _rows()})] == [MET] * 5


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_speedup_is_no_timing(bad):
    rows = _rows()
    rows[0]["speedup_vs_sdpa"] = bad
    verdicts = speed_goals.evaluate({"cases": rows})
    # a NaN passed every bar ("met (lowest nanx)") and the mean left it out
    assert _goal(verdicts, "`sageattn` >=").status == NOT_EVALUATED
    assert _goal(verdicts, "geometric mean").status == NOT_EVALUATED


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_tops_judges_no_tops_goal(bad):
    rows = _rows()
    [row] = [r for r in rows if _key(r) == TOPS_CASE]
    row["sageattn_tops"] = bad
    assert _goal(speed_goals.evaluate({"cases": rows}), ">= 900 TOPS").status == NOT_EVALUATED


def test_a_nan_sm80_figure_is_not_met_by_default():
    rows = _rows()
    row = next(r for r in rows if r["dtype"] == "fp16" and _key(r)[1:] in speed_goals.UPSTREAM_106_TRITON_TOPS)
    row["backends"]["cuda-sm80-fp16"]["tops"] = float("nan")
    assert _goal(speed_goals.evaluate({"cases": rows}), "`cuda-sm80-fp16`").status == NOT_EVALUATED


def test_a_forced_headline_judges_no_default_dispatch_goal():
    perf = {"cases": _rows(), "primary_backend": "cuda-sm90-fp8"}
    verdicts = speed_goals.evaluate(perf)
    hopper = verdicts[:4]
    assert [v.status for v in hopper] == [NOT_EVALUATED] * 4
    assert all("cuda-sm90-fp8" in v.detail for v in hopper)
    assert _goal(verdicts, "`cuda-sm80-fp16`").status == MET  # forced by name: judged as before
    for primary in ("default dispatch", None):
        assert [v.status for v in speed_goals.evaluate({**perf, "primary_backend": primary})] == [MET] * 5


def test_markdown_names_a_forced_headline():
    doc = {"cases": _rows(), "primary_backend": "cuda-sm90-fp8", "environment": {"gpu_name": "NVIDIA H200"}}
    text = benchmark.markdown(doc, source="x.json")
    assert "`sageattn` is forced to `cuda-sm90-fp8`" in text and "`sageattn` is the default dispatch" not in text
    text = benchmark.markdown({**doc, "primary_backend": "default dispatch"}, source="x.json")
    assert "`sageattn` is the default dispatch" in text


class NanApi:
    """sageattn as SDPA, NaN at seq_len 64."""

    def sageattn(self, q, k, v, tensor_layout="HND", is_causal=False, **kw):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return out * float("nan") if q.shape[2] == 64 else out

    def last_backend(self):
        return "cuda-sm90-fp16"

    def force_backend(self, name):
        return contextlib.nullcontext()


def test_a_nan_output_does_not_lose_the_run():
    cases = [benchmark.Case("fp16", 1, 2, n, 64, False) for n in (32, 64)]
    timer = lambda fn: 2.0 if fn.__name__ == "sdpa" else 1.0  # noqa: E731
    perf = benchmark.run(cases, api=NanApi(), device=torch.device("cpu"), timer=timer)
    assert perf["cases"][1]["accuracy"]["finite"] is False
    assert perf["accuracy"] == {"min_cosine": None, "max_rel_l1": None, "max_abs": None, "finite": False}
    json.loads(json.dumps(perf, allow_nan=False))  # strict JSON
    good = benchmark.run(cases[:1], api=NanApi(), device=torch.device("cpu"), timer=timer)
    assert good["accuracy"]["finite"] is True and good["accuracy"]["min_cosine"] > 0.999


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*-bench*.json")), ids=lambda p: p.name)
def test_every_stored_benchmark_renders(path, tmp_path):
    out = tmp_path / "t.md"
    assert benchmark.main(["--render", str(path), "--markdown", str(out)]) == 0
    assert "Speed goals" in out.read_text()
