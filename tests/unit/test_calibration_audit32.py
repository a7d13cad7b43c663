"""Audit 32 of the calibration commands: `calibrate --from-benchmark` with a zero time or a case
without an SDPA time, JSON nested too deeply to parse (a table, a benchmark, a rendered result), and
`python -m sageattention --explain` for a shape whose inputs cannot be allocated."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from sageattention import __main__ as diagnostics
from sageattention import benchmark, calibrate, calibration

ROW = {"name": "fp16 4x32x4096x128 non-causal", "dtype": "fp16", "batch": 4, "heads": 32, "seq_len": 4096,
       "head_dim": 128, "causal": False, "sdpa_ms": 1.0,
       "backends": {"sdpa": {"ran": "sdpa", "ms": 1.0},
                    "cuda-sm90-fp16": {"ran": "cuda-sm90-fp16", "ms": 0.8}}}
BENCH = {"environment": {"compute_capability": "9.0", "gpu_name": "NVIDIA H100 80GB HBM3",
                         "torch": "2.11.0", "date": "2026-12-03", "command": "bench"},
         "method": "synthetic", "cases": [ROW]}


def from_benchmark(tmp_path, doc) -> int:
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(doc))
    return calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / "sm90.json")])


@pytest.mark.parametrize("where", ["sdpa_ms and backends.sdpa", "a quantized backend"])
def test_from_benchmark_refuses_a_zero_time_rather_than_dropping_it(tmp_path, capsys, where):
    # a 0 was read as "not measured": with SDPA's dropped, the entry sent the shape to the quantized
    # backend unmeasured against SDPA; -1 was refused, 0 written silently
    doc = copy.deepcopy(BENCH)
    row = doc["cases"][0]
    if where == "a quantized backend":
        row["backends"]["cuda-sm90-fp16"]["ms"] = 0
        bad = "cuda-sm90-fp16"
    else:
        row["sdpa_ms"] = 0
        row["backends"]["sdpa"]["ms"] = 0
        bad = "sdpa"
    assert from_benchmark(tmp_path, doc) == 2
    err = capsys.readouterr().err
    assert f"entries[0].ms['{bad}']: must be a positive finite number of milliseconds, got 0" in err, err
    assert not (tmp_path / "sm90.json").exists()


def test_from_benchmark_refuses_a_case_without_an_sdpa_time(tmp_path, capsys):
    doc = copy.deepcopy(BENCH)
    doc["cases"].append({**copy.deepcopy(ROW), "name": "fp16 4x32x8192x128 non-causal", "seq_len": 8192})
    del doc["cases"][1]["sdpa_ms"]
    del doc["cases"][1]["backends"]["sdpa"]
    assert from_benchmark(tmp_path, doc) == 2
    err = capsys.readouterr().err
    assert "cases[1] (fp16 4x32x8192x128 non-causal) has no SDPA time" in err, err
    assert not (tmp_path / "sm90.json").exists()


def test_from_benchmark_still_builds_a_table_from_forced_sdpa_or_the_baseline_alone(tmp_path):
    doc = copy.deepcopy(BENCH)
    del doc["cases"][0]["sdpa_ms"]   # forced SDPA alone
    assert from_benchmark(tmp_path, doc) == 0
    doc = copy.deepcopy(BENCH)
    del doc["cases"][0]["backends"]["sdpa"]   # the baseline alone
    assert from_benchmark(tmp_path, doc) == 0
    table = calibration.load(tmp_path / "sm90.json")
    assert table.entries[0].time("sdpa") == 1.0


DEEP = "[" * 100_000 + "]" * 100_000


def test_a_table_nested_too_deeply_is_a_calibration_error(tmp_path):
    path = tmp_path / "sm90.json"
    path.write_text(DEEP)
    with pytest.raises(calibration.CalibrationError, match="nested too deeply"):
        calibration.load(path)


def test_from_benchmark_of_json_nested_too_deeply_exits_2(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(DEEP)
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / "sm90.json")]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot read the benchmark JSON {bench}")


def test_render_of_json_nested_too_deeply_exits_2(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(DEEP)
    assert benchmark.main(["--render", str(bench)]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot render {bench}")


def test_explain_says_a_shape_whose_inputs_cannot_be_allocated_and_goes_on(capsys, monkeypatch):
    empty = torch.empty

    def out_of_memory(size, *args, **kwargs):
        if size[0] >= 1000:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return empty(size, *args, **kwargs)

    monkeypatch.setattr(torch, "empty", out_of_memory)
    assert diagnostics.main(["--explain", "1000x32x8192x128", "--explain", "1x1x1x64"]) == 0
    big, small = capsys.readouterr().out.splitlines()
    assert big.startswith("1000x32x8192x128 fp16 on cpu: not asked: its inputs cannot be allocated on cpu "
                          "(OutOfMemoryError: CUDA out of memory"), big
    assert small.startswith("1x1x1x64 fp16 on cpu: sageattn")


def test_explain_of_a_dimension_past_int64_is_said_not_a_traceback(capsys):
    assert diagnostics.main(["--explain", "99999999999999999999x1x1x64"]) == 0
    line, = capsys.readouterr().out.splitlines()
    assert line.startswith("99999999999999999999x1x1x64 fp16 on cpu: not asked: its inputs cannot be "
                           "allocated"), line
