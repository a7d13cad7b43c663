"""Calibration tables as a user meets them: SAGEATTENTION_CALIBRATION set to what gives no table
for the GPU (each logged once, saying why and what serves instead, never an exception in the call
path), malformed tables, the GPU model a table was measured on, the cache, and
`python -m sageattention.calibrate --from-benchmark` with a malformed benchmark."""

import copy
import json
import logging
import os
import re
import threading
import time

import pytest
from json_edit import with_value
import torch

from sageattention import calibrate, calibration, dispatch
from sageattention.calibration import CalibrationError
from sageattention.dispatch import Inventory, Request, choose

GOOD = {
    "_generated": "synthetic test table", "schema_version": 1, "capability": [9, 0],
    "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "triton": None, "date": "2026-12-03",
    "command": "test", "method": "synthetic",
    "entries": [{"dtype": "fp16", "batch": 1, "heads": 32, "seq_len": 16384, "head_dim": 128,
                 "causal": False, "ms": {"sdpa": 0.95, "cuda-sm80-fp16": 2.1}}],
}
H200 = "NVIDIA H200"


def with_(path, value):
    """GOOD with the key at `path` set to `value` (or deleted: ...)."""
    return with_value(GOOD, path, value)


@pytest.fixture
def package_dir(tmp_path_factory, monkeypatch):
    """The packaged tables: a good sm90.json measured on an H100, in a folder of the test's own."""
    folder = tmp_path_factory.mktemp("package")
    (folder / "sm90.json").write_text(json.dumps(GOOD))
    monkeypatch.setattr(calibration, "tables_folder", lambda: folder)
    calibration.clear_cache()
    yield folder
    calibration.clear_cache()


@pytest.fixture
def mine(tmp_path_factory):
    return tmp_path_factory.mktemp("mine")


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "sageattention" and r.levelno == logging.WARNING]


def table_for(path, gpu_name=H200, capability=(9, 0)):
    """What the default dispatch uses on this GPU with SAGEATTENTION_CALIBRATION=path."""
    return dispatch.calibration_for(capability, env={"SAGEATTENTION_CALIBRATION": str(path)},
                                    gpu_name=gpu_name)


# --- a path that gives no table for this GPU: logged once, why and what instead ----------------------

BROKEN = [
    ("", r"not valid JSON"),
    ("{not json", r"not valid JSON"),
    ("[]", r"top level: must be an object, got list"),
    ("null", r"top level: must be an object, got NoneType"),
    (json.dumps(with_(("entries",), [])), r"entries: must be a non-empty list"),
    (json.dumps(with_(("gpu_name",), ...)), r"missing key\(s\) gpu_name"),
    (json.dumps(with_(("capability",), "9.0")), r"capability: must be \[major, minor\]"),
    (json.dumps(with_(("entries", 0, "ms", "sdpa"), -1)), r"entries\[0\]\.ms\['sdpa'\]: must be a positive"),
    (json.dumps(with_(("entries", 0, "ms", "sdpa"), 0)), r"entries\[0\]\.ms\['sdpa'\]: must be a positive"),
    (json.dumps(with_(("entries", 0, "ms", "sdpa"), float("nan"))), r"entries\[0\]\.ms\['sdpa'\]"),
    (json.dumps(with_(("entries", 0, "ms", "cuda-sm100-fp16"), 1.0)),
     r"entries\[0\]\.ms\['cuda-sm100-fp16'\]: unknown backend; the backends are: cuda-sm90-fp16"),
    (json.dumps(with_(("entries",), GOOD["entries"] * 2)), r"shape\(s\) listed more than once"),
    (json.dumps(with_(("entries", 0, "dtype"), ["fp16"])), r"entries\[0\]\.dtype: \['fp16'\] is not one of"),
    (json.dumps(with_(("capability",), [8, 9])),
     r"it is the table of sm89 GPUs \(capability \[8, 9\]\), not of this one \(sm90\)"),
]


@pytest.mark.parametrize("text,why", BROKEN)
def test_a_table_file_of_yours_that_gives_none_is_said_once_with_why_and_what_serves(package_dir, mine,
                                                                                      caplog, text, why):
    path = mine / "my-table.json"
    path.write_text(text)
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        for _ in range(3):
            table = table_for(path)
            assert table.source == str(package_dir / "sm90.json")
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"sageattention: SAGEATTENTION_CALIBRATION={path} gives no calibration "
                              f"table for this GPU (sm90, NVIDIA H200): calibration table {path}: ")
    assert re.search(why, warning), warning
    assert warning.endswith("; using the packaged table sm90 (measured on NVIDIA H100 80GB HBM3) instead")


def test_without_a_packaged_table_the_warning_says_the_static_order_serves(package_dir, mine, caplog):
    (package_dir / "sm90.json").unlink()
    path = mine / "sm89.json"
    path.write_text(json.dumps(with_(("capability",), [8, 9])))
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        assert table_for(path) is None
        assert table_for(path, capability=(8, 9)).capability == (8, 9)   # the GPUs it is for
    [warning] = warnings_of(caplog)
    assert "it is the table of sm89 GPUs" in warning
    assert warning.endswith("using the static preference order instead")


def test_a_folder_of_yours_without_a_table_for_this_gpu_is_said_once(package_dir, mine, caplog):
    (mine / "my-table.json").write_text(json.dumps(GOOD))   # not named as the package's
    (mine / "sm89.json").write_text(json.dumps(with_(("capability",), [8, 9])))
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        assert table_for(mine).source == str(package_dir / "sm90.json")
        assert table_for(mine).source == str(package_dir / "sm90.json")
        assert table_for(mine, capability=(8, 9)).source == str(mine / "sm89.json")
    [warning] = warnings_of(caplog)
    assert (f"the folder {mine} holds no sm90-nvidia-h200.json or sm90.json; using the packaged table "
            "sm90") in warning


def test_a_folder_whose_table_is_broken_or_a_folder_says_each_file_tried(package_dir, mine, caplog):
    (mine / "sm90-nvidia-h200.json").mkdir()
    (mine / "sm90.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        assert table_for(mine).source == str(package_dir / "sm90.json")
    [warning] = warnings_of(caplog)
    assert f"{mine / 'sm90-nvidia-h200.json'} is not a file; calibration table {mine / 'sm90.json'}: " \
           "not valid JSON" in warning


def test_a_path_that_is_neither_file_nor_folder_is_said(package_dir, mine, caplog):
    fifo = mine / "pipe"
    os.mkfifo(fifo)   # reading it would block every sageattn call
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        assert table_for(fifo).source == str(package_dir / "sm90.json")
    [warning] = warnings_of(caplog)
    assert f"{fifo} is neither a table file nor a folder of tables" in warning


def test_a_path_gone_since_it_was_checked_is_said(package_dir, mine, caplog):
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        assert calibration.for_gpu((9, 0), H200, str(mine / "gone")).source == str(package_dir / "sm90.json")
    assert "gone no longer exists" in warnings_of(caplog)[0]


def test_a_good_table_of_yours_is_used_silently(package_dir, mine, caplog):
    path = mine / "h200.json"
    path.write_text(json.dumps(with_(("gpu_name",), H200)))
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        table = table_for(path)
    assert table.source == str(path) and table.label == f"sm90 from {path}"
    assert warnings_of(caplog) == []


# --- malformed tables are CalibrationErrors, whatever the malformation -----------------------------

def test_a_file_that_is_not_utf8_is_a_calibration_error(mine):
    path = mine / "sm90.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(CalibrationError, match=r"sm90\.json: not UTF-8 text"):
        calibration.load(path)


@pytest.mark.parametrize("path,value,match", [
    pytest.param(("entries", 0, "ms", "sdpa"), 10 ** 400, r"entries\[0\]\.ms\['sdpa'\]: must be a positive "
                 r"finite", id="an-integer-past-float"),
    pytest.param(("entries", 0, "dtype"), {"fp16": 1}, r"entries\[0\]\.dtype: .* is not one of fp16, bf16",
                 id="an-unhashable-dtype"),
])
def test_values_python_cannot_compare_or_convert_are_calibration_errors(path, value, match):
    with pytest.raises(CalibrationError, match=match):
        calibration.parse(with_(path, value), source="bad.json")


# --- the variable's values -------------------------------------------------------------------------

@pytest.mark.parametrize("value,hint", [("0", "for off, write off"), ("false", "for off, write off"),
                                        ("No", "for off, write off"), ("1", "for on, write on"),
                                        ("TRUE", "for on, write on"), ("maybe", "that path does not exist")])
def test_words_for_on_and_off_are_refused_with_the_accepted_one(value, hint):
    with pytest.raises(ValueError) as raised:
        dispatch.calibration_enabled(env={"SAGEATTENTION_CALIBRATION": value})
    assert str(raised.value).startswith(f"SAGEATTENTION_CALIBRATION={value!r} is not accepted; use one "
                                        "of: on, off (default on), or the path of a calibration table")
    assert str(raised.value).endswith(f"({hint})")


@pytest.mark.parametrize("value,enabled", [("ON", True), (" on ", True), ("Off", False), (" OFF\n", False)])
def test_on_and_off_in_any_case_and_spacing(value, enabled):
    assert dispatch.calibration_enabled(env={"SAGEATTENTION_CALIBRATION": value}) is enabled


def test_a_leading_tilde_is_the_home_folder(package_dir, mine, monkeypatch):
    # export SAGEATTENTION_CALIBRATION="~/.config/sageattention" (quoted: the shell leaves ~ alone)
    monkeypatch.setenv("HOME", str(mine))
    folder = mine / ".config" / "sageattention"
    folder.mkdir(parents=True)
    (folder / "sm90.json").write_text(json.dumps(with_(("gpu_name",), H200)))
    table = table_for("~/.config/sageattention")
    assert table.source == str(folder / "sm90.json")


@pytest.mark.parametrize("value", ["off", "/some/table.json", 1, None])
def test_use_calibration_takes_true_or_false_only(value):
    with pytest.raises(TypeError, match=r"use_calibration\(enabled\) takes True or False, got"):
        with dispatch.use_calibration(value):
            pass


# --- which GPU model measured the table: said where it is not this one -------------------------------

def inv():
    native = {f: None for f in ("sm75", "sm80", "sm89")} | {"sm90": "not in this build",
                                                           "sm90_fp8": "not in this build"}
    return Inventory(native=native, triton=(True, "ok"))


def request():
    return Request(device_type="cuda", capability=(9, 0), dtype=torch.float16, head_dim=128,
                   batch_heads=32, batch=1, q_heads=32, seq_q=16384, seq_k=16384)


def test_a_table_of_another_gpu_model_is_used_and_the_reason_says_whose(package_dir):
    on_h200 = dispatch.calibration_for((9, 0), env={}, gpu_name=H200)
    assert on_h200.source == str(package_dir / "sm90.json")
    choice = choose(request(), inv(), calibration=on_h200)
    assert choice.calibrated and choice.name == "sdpa"
    assert "(calibration sm90 (measured on NVIDIA H100 80GB HBM3), nearest measured: " in choice.reason
    # on the GPU model that measured it, nothing to say
    on_h100 = dispatch.calibration_for((9, 0), env={}, gpu_name="NVIDIA H100 80GB HBM3")
    assert on_h100.label == "sm90"
    assert "(calibration sm90, nearest measured: " in choice_reason(on_h100)
    # one object per GPU model: choices cached by the table stay cached
    assert dispatch.calibration_for((9, 0), env={}, gpu_name=H200) is on_h200


def choice_reason(table):
    return choose(request(), inv(), calibration=table).reason


def test_a_model_table_of_that_model_says_nothing_more(package_dir):
    (package_dir / "sm90-nvidia-h200.json").write_text(json.dumps(with_(("gpu_name",), H200)))
    calibration.clear_cache()
    assert dispatch.calibration_for((9, 0), env={}, gpu_name=H200).label == "sm90-nvidia-h200"


# --- the cache: read once, by one thread, until clear_cache() ----------------------------------------

def test_a_table_is_read_once_and_a_changed_one_after_clear_cache(package_dir, mine):
    path = mine / "sm90.json"
    path.write_text(json.dumps(with_(("date",), "first")))
    assert table_for(path).date == "first"
    path.write_text(json.dumps(with_(("date",), "second")))
    assert table_for(path).date == "first"       # not read again on every call
    calibration.clear_cache()
    assert table_for(path).date == "second"


def test_threads_looking_up_a_table_at_once_read_it_once_and_warn_once(package_dir, mine, monkeypatch,
                                                                       caplog):
    path = mine / "broken.json"
    path.write_text("{not json")
    real_load, reads = calibration.load, []

    def slow_load(resource, **kw):   # widens the window two threads could both read in
        reads.append(str(resource))
        time.sleep(0.05)
        return real_load(resource, **kw)

    monkeypatch.setattr(calibration, "load", slow_load)
    env = {"SAGEATTENTION_CALIBRATION": str(path)}
    results = []
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        threads = [threading.Thread(target=lambda: results.append(
            dispatch.calibration_for((9, 0), env=env, gpu_name=H200))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert reads.count(str(path)) == 1
    assert len(warnings_of(caplog)) == 1


# --- calibrate --from-benchmark with a malformed benchmark ---------------------------------------

ROW = {"name": "fp16 4x32x4096x128 non-causal", "dtype": "fp16", "batch": 4, "heads": 32, "seq_len": 4096,
       "head_dim": 128, "causal": False, "sdpa_ms": 1.0,
       "backends": {"sdpa": {"ran": "sdpa", "ms": 1.0}, "cuda-sm80-fp16": {"ran": "cuda-sm80-fp16", "ms": 0.5}}}
BENCH = {"environment": {"compute_capability": "9.0", "gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0",
                         "date": "2026-12-03", "command": "bench"},
         "method": "synthetic", "cases": [ROW]}


def bench_with(path, value):
    doc = copy.deepcopy(BENCH)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("out", ["table.json", "sm90-nvidia-h100-80gb-hbm3.json"])
@pytest.mark.parametrize("path,value,says", [
    (("environment", "gpu_name"), 123, r"environment\.gpu_name must be a non-empty string, got 123"),
    (("environment", "gpu_name"), "  ", r"environment\.gpu_name must be a non-empty string, got '  '"),
    (("environment", "torch"), 2.11, r"environment\.torch must be a non-empty string, got 2\.11"),
    pytest.param(("cases", 0, "backends", "cuda-sm80-fp16", "ms"), 10 ** 400,
                 r"cases of \S+bench\.json: entries\[0\]\.ms\['cuda-sm80-fp16'\]: must be a positive finite",
                 id="an-integer-past-float"),
    (("cases", 0, "dtype"), "fp8", r"calibration table built from the cases of \S+bench\.json: "
                                   r"entries\[0\]\.dtype: 'fp8' is not one of fp16, bf16"),
])
def test_from_benchmark_refuses_a_malformed_benchmark_by_name_not_a_traceback(tmp_path, capsys, out, path,
                                                                              value, says):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_with(path, value)))
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(says, err), err
    assert not (tmp_path / out).exists()


def test_from_benchmark_of_a_gpu_name_without_letters_refuses_a_model_table(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_with(("environment", "gpu_name"), "--")))
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / "sm90-x.json")]) == 2
    assert "environment.gpu_name: GPU name '--' has no letters or digits" in capsys.readouterr().err
