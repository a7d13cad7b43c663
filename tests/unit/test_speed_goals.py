"""The speed goals judged from a benchmark result (sageattention.speed_goals), on synthetic rows and
on a stored GPU run."""

import json
from pathlib import Path

import pytest

from sageattention import benchmark, speed_goals
from sageattention.speed_goals import MET, NOT_EVALUATED, NOT_MET

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GOOD = {"cosine": 0.99995, "rel_l1": 0.01, "max_abs": 0.01, "finite": True}


def _row(case, *, speedup=1.4, backend="cuda-sm90-fp16", accuracy=GOOD, sm80=None):
    sdpa_tops = 500.0
    row = {"name": case.name, "dtype": case.dtype, "batch": case.batch, "heads": case.heads,
           "seq_len": case.seq_len, "head_dim": case.head_dim, "causal": case.causal,
           "sdpa_tops": sdpa_tops, "sageattn_tops": sdpa_tops * speedup, "speedup_vs_sdpa": speedup,
           "backend": backend, "accuracy": accuracy, "backends": {}}
    if sm80 is not None:
        row["backends"]["cuda-sm80-fp16"] = {"ran": "cuda-sm80-fp16", "tops": sm80}
    return row


def _perf(rows):
    return {"cases": rows}


def _by_goal(verdicts, start):
    [v] = [v for v in verdicts if v.goal.startswith(start)]
    return v


def test_every_goal_met_when_the_figures_clear_them():
    rows = [_row(c, speedup=2.0, sm80=1000.0) for c in benchmark.standard_cases()]
    verdicts = speed_goals.evaluate(_perf(rows))
    assert [v.status for v in verdicts] == [MET] * 5, [v.line() for v in verdicts]
    assert "2.000x" in _by_goal(verdicts, "geometric mean").detail
    assert "1000 TOPS" in _by_goal(verdicts, ">= 900 TOPS").detail


def test_a_case_below_the_floor_is_named_and_the_mean_still_judged():
    rows = [_row(c) for c in benchmark.standard_cases()]
    rows[3]["speedup_vs_sdpa"] = 0.95
    verdicts = speed_goals.evaluate(_perf(rows))
    floor = _by_goal(verdicts, "`sageattn` >= 0.97x")
    assert floor.status == NOT_MET and rows[3]["name"] in floor.detail and "0.95x" in floor.detail
    mean = _by_goal(verdicts, "geometric mean")
    assert mean.status == MET  # 1.4 ** 19 * 0.95 over 20 cases: about 1.37x
    assert mean.detail == f"{benchmark.geomean([1.4] * 19 + [0.95]):.3f}x"
    assert "ran SDPA itself" not in floor.detail


def test_a_case_below_the_floor_where_sageattn_ran_sdpa_says_so_and_stays_not_met():
    # SDPA against SDPA (the default dispatch chose SDPA): the verdict stands, the detail says why
    rows = [_row(c) for c in benchmark.standard_cases()]
    rows[2].update(speedup_vs_sdpa=0.95, backend="sdpa")
    rows[5]["speedup_vs_sdpa"] = 0.96
    floor = _by_goal(speed_goals.evaluate(_perf(rows)), "`sageattn` >= 0.97x")
    assert floor.status == NOT_MET
    assert floor.detail.startswith(f"2 below: {rows[2]['name']} 0.95x [sdpa], {rows[5]['name']} 0.96x;")
    assert floor.detail.endswith("; 1 of them ran SDPA itself ([sdpa]): SDPA timed against SDPA")
    rows[5]["backend"] = "sdpa"
    floor = _by_goal(speed_goals.evaluate(_perf(rows)), "`sageattn` >= 0.97x")
    assert floor.detail.endswith("; each of them ran SDPA itself ([sdpa]): SDPA timed against SDPA")


def test_a_slow_mean_and_a_slow_long_case_are_not_met():
    rows = [_row(c, speedup=1.1) for c in benchmark.standard_cases()]
    verdicts = speed_goals.evaluate(_perf(rows))
    assert _by_goal(verdicts, "geometric mean").status == NOT_MET
    tops = _by_goal(verdicts, ">= 900 TOPS")
    assert tops.status == NOT_MET and "550 TOPS [cuda-sm90-fp16]" in tops.detail


def test_missing_cases_leave_the_case_set_goals_not_evaluated():
    rows = [_row(c) for c in benchmark.standard_cases(("fp16",))]  # no bf16 rows
    verdicts = speed_goals.evaluate(_perf(rows))
    for start in ("`sageattn` >= 0.97x", "geometric mean", "every standard case's output"):
        v = _by_goal(verdicts, start)
        assert v.status == NOT_EVALUATED and "10 of its 20 cases" in v.detail, v.line()
    assert _by_goal(verdicts, ">= 900 TOPS").status == NOT_MET  # fp16 1x32x16384x128 is there: 700


def test_accuracy_is_held_to_the_bar_of_the_path_that_ran():
    fp8_like = {"cosine": 0.9995, "rel_l1": 0.03, "max_abs": 0.05, "finite": True}
    rows = [_row(c, backend="cuda-sm90-fp8", accuracy=fp8_like) for c in benchmark.standard_cases()]
    assert _by_goal(speed_goals.evaluate(_perf(rows)), "every standard case's output").status == MET
    rows[0]["backend"] = "cuda-sm90-fp16"  # the FP16 PV bar: cosine 0.9998, relative L1 0.02
    rows[1]["accuracy"] = {"cosine": None, "rel_l1": None, "max_abs": None, "finite": False}  # NaN
    v = _by_goal(speed_goals.evaluate(_perf(rows)), "every standard case's output")
    assert v.status == NOT_MET and v.detail.startswith("2 outside")
    assert rows[0]["name"] in v.detail and "not finite" in v.detail
    # a stored result without the "finite" flag: judged from its figures
    rows = [_row(c, accuracy={k: GOOD[k] for k in ("cosine", "rel_l1", "max_abs")})
            for c in benchmark.standard_cases()]
    assert _by_goal(speed_goals.evaluate(_perf(rows)), "every standard case's output").status == MET
    rows[2]["accuracy"] = {"rel_l1": 0.01}  # no cosine: not within any bar
    v = _by_goal(speed_goals.evaluate(_perf(rows)), "every standard case's output")
    assert v.status == NOT_MET and "cosine not finite" in v.detail


def test_the_sm80_goal_per_mode_against_the_upstream_column():
    rows = []
    for c in benchmark.standard_cases():
        key = (c.batch, c.heads, c.seq_len, c.head_dim, c.causal)
        up = speed_goals.UPSTREAM_106_TRITON_TOPS.get(key, 100)
        row = _row(c, sm80=up * 1.05)
        row["backends"]["cuda-sm80-fp16@fp16"] = {"tops": up * (0.9 if c.head_dim == 64 else 1.2)}
        rows.append(row)
    verdicts = speed_goals.evaluate(_perf(rows))
    assert _by_goal(verdicts, "`cuda-sm80-fp16` >=").status == MET
    mode = _by_goal(verdicts, "`cuda-sm80-fp16@fp16` >=")
    assert mode.status == NOT_MET and mode.detail.startswith("2 below: fp16 4x32x4096x64 non-causal 322 < 358")
    rows = [r for r in rows if r["head_dim"] == 128]
    assert _by_goal(speed_goals.evaluate(_perf(rows)), "`cuda-sm80-fp16` >=").status == NOT_EVALUATED
    assert not [v for v in speed_goals.evaluate(_perf([_row(c) for c in benchmark.standard_cases()]))
                if "sm80" in v.goal]  # no sm80 timing, no sm80 verdict


def test_cross_attention_rows_count_for_no_goal():
    rows = [_row(c) for c in benchmark.standard_cases()]
    cross = dict(rows[0], kv_len=8192, speedup_vs_sdpa=0.5)
    verdicts = speed_goals.evaluate(_perf(rows + [cross]))
    assert _by_goal(verdicts, "`sageattn` >= 0.97x").status == MET


def test_the_section_says_which_gpu_measured():
    perf = _perf([_row(c) for c in benchmark.standard_cases()])
    assert "the goals' GPU" in speed_goals.section(perf, "NVIDIA H200")[0]
    head = speed_goals.section(perf, "NVIDIA H100 80GB HBM3")[0]
    assert "NVIDIA H100 80GB HBM3" in head and "indicative only" in head


@pytest.mark.parametrize("name", ["h200-2026-12-05-bench-301f696.json"])
def test_a_stored_h200_run_is_judged_from_its_own_figures(name):
    doc = json.loads((RESULTS / name).read_text())
    verdicts = speed_goals.evaluate(doc)
    mean = _by_goal(verdicts, "geometric mean")
    assert mean.status == NOT_MET and mean.detail == f"{doc['geomean_speedup_vs_sdpa']:.3f}x"
    long_case = next(r for r in doc["cases"] if r["name"] == "fp16 1x32x16384x128 non-causal")
    assert f"{long_case['sageattn_tops']:.0f} TOPS" in _by_goal(verdicts, ">= 900 TOPS").detail
    text = benchmark.markdown(doc, source=name)
    assert "Speed goals (judged from this run's figures; measured on NVIDIA H200" in text
    assert all(f"- {v.line()}" in text for v in verdicts)


def test_a_figure_just_below_a_bar_never_prints_as_the_bar():
    # "431 < 431" and "0.97x" under the 0.97x floor read as met
    rows = []
    for c in benchmark.standard_cases():
        key = (c.batch, c.heads, c.seq_len, c.head_dim, c.causal)
        up = speed_goals.UPSTREAM_106_TRITON_TOPS.get(key, 100)
        rows.append(_row(c, sm80=up - 0.27 if key == (1, 32, 16384, 128, False) else up * 1.1))
    rows[3]["speedup_vs_sdpa"] = 0.9695
    verdicts = speed_goals.evaluate(_perf(rows))
    assert "fp16 1x32x16384x128 non-causal 430.7 < 431" in _by_goal(verdicts, "`cuda-sm80-fp16` >=").detail
    assert f"{rows[3]['name']} 0.9695x" in _by_goal(verdicts, "`sageattn` >= 0.97x").detail
