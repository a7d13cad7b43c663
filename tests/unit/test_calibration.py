"""Calibration tables: the format and its validation, the nearest-entry lookup, the packaged-table
loader (which never breaks a call), and `python -m sageattention.calibrate` without a GPU."""

import copy
import json
import logging
import re
import shlex
import zipfile
from pathlib import Path

import pytest
from json_edit import with_value
import torch

import sageattention as sa
from sageattention import benchmark, calibrate, calibration, dispatch
from sageattention.calibration import CalibrationError

REPO = Path(__file__).resolve().parents[2]

GOOD = {
    "_generated": "synthetic test table",
    "schema_version": 1,
    "capability": [9, 0],
    "gpu_name": "Test GPU",
    "torch": "2.11.0",
    "triton": None,
    "date": "2026-12-03",
    "command": "test",
    "method": "synthetic",
    "entries": [
        {"dtype": "fp16", "batch": 4, "heads": 32, "seq_len": 4096, "head_dim": 128, "causal": False,
         "ms": {"sdpa": 0.96, "cuda-sm80-fp16": 2.2}},
        {"dtype": "fp16", "batch": 1, "heads": 32, "seq_len": 16384, "head_dim": 128, "causal": False,
         "ms": {"sdpa": 3.5}},
        {"dtype": "fp16", "batch": 32, "heads": 32, "seq_len": 128, "head_dim": 64, "causal": False,
         "ms": {"cuda-sm89-fp8": 0.1}},
        {"dtype": "fp16", "batch": 16, "heads": 32, "seq_len": 512, "head_dim": 256, "causal": False,
         "ms": {"sdpa": 0.4}},
        {"dtype": "bf16", "batch": 4, "heads": 32, "seq_len": 4096, "head_dim": 128, "causal": True,
         "ms": {"sdpa": 0.5}},
    ],
}


def mutated(path, value):
    """GOOD with the key at `path` set to `value` (or deleted: ...)."""
    return with_value(GOOD, path, value)


# --- validation -----------------------------------------------------------------------------------

def test_a_good_table_parses():
    t = calibration.parse(GOOD, source="good.json")
    assert (t.label, t.capability, t.triton, len(t.entries)) == ("sm90", (9, 0), None, 5)
    e = t.entries[0]
    assert e.name == "fp16 4x32x4096x128 non-causal"
    assert e.ms == (("cuda-sm80-fp16", 2.2), ("sdpa", 0.96))  # BACKEND_NAMES order
    assert e.time("sdpa") == 0.96 and e.time("cuda-sm89-fp8") is None


@pytest.mark.parametrize("path,value,match", [
    (("schema_version",), 2, r"schema_version: 2 is not supported; this sageattention reads version 1"),
    (("schema_version",), ..., r"schema_version: None is not supported"),
    (("gpu_name",), ..., r"top level: missing key\(s\) gpu_name"),
    (("_generated",), ..., r"top level: missing key\(s\) _generated"),
    (("speed",), 1, r"top level: unknown key\(s\) speed"),
    (("capability",), "9.0", r"capability: must be \[major, minor\]"),
    (("date",), "", r"date: must be a non-empty string"),
    (("triton",), 3.6, r"triton: must be a version string or null"),
    (("entries",), [], r"entries: must be a non-empty list"),
    (("entries", 0, "dtype"), "fp8", r"entries\[0\]\.dtype: 'fp8' is not one of fp16, bf16"),
    (("entries", 1, "seq_len"), 0, r"entries\[1\]\.seq_len: must be a positive integer"),
    (("entries", 1, "batch"), 2.0, r"entries\[1\]\.batch: must be a positive integer"),
    (("entries", 0, "causal"), "no", r"entries\[0\]\.causal: must be true or false"),
    (("entries", 0, "heads"), ..., r"entries\[0\]: missing key\(s\) heads"),
    (("entries", 0, "ms"), {}, r"entries\[0\]\.ms: must be a non-empty object"),
    (("entries", 0, "ms", "flash"), 1.0, r"entries\[0\]\.ms\['flash'\]: unknown backend; the backends "
                                         r"are: cuda-sm90-fp16, cuda-sm90-fp8, cuda-sm89-fp8, .*sdpa"),
    (("entries", 0, "ms", "sdpa"), 0, r"entries\[0\]\.ms\['sdpa'\]: must be a positive finite number"),
    (("entries", 0, "ms", "sdpa"), float("nan"), r"entries\[0\]\.ms\['sdpa'\]: must be a positive finite"),
    (("entries", 0, "ms", "sdpa"), float("inf"), r"entries\[0\]\.ms\['sdpa'\]: must be a positive finite"),
    (("entries", 0, "ms", "sdpa"), True, r"entries\[0\]\.ms\['sdpa'\]: must be a positive finite"),
    (("entries", 1), dict(GOOD["entries"][0]), r"entries: shape\(s\) listed more than once: fp16 "
                                               r"4x32x4096x128 non-causal"),
])
def test_validation_names_the_file_and_the_field(path, value, match):
    with pytest.raises(CalibrationError, match=r"calibration table bad\.json: " + match):
        calibration.parse(mutated(path, value), source="bad.json")


def test_load_names_the_file(tmp_path):
    with pytest.raises(CalibrationError, match="nope.json: cannot be read"):
        calibration.load(tmp_path / "nope.json")
    broken = tmp_path / "sm90.json"
    broken.write_text("{not json")
    with pytest.raises(CalibrationError, match=r"sm90.json: not valid JSON"):
        calibration.load(broken)
    broken.write_text(json.dumps(GOOD))
    assert calibration.load(broken).source == str(broken)


# --- nearest entry ----------------------------------------------------------------------------------

def first(table, **shape):
    """The entry nearest to this shape (Table.neighbours' first), or None."""
    found = table.neighbours(**shape)
    return found[0][0] if found else None


def nearest(**kw):
    base = dict(dtype="fp16", head_dim=128, causal=False, seq_q=4096, seq_k=4096, batch_heads=128)
    base.update(kw)
    return first(calibration.parse(GOOD, source="t"), **base)


def test_nearest_by_log_distance_within_the_head_dim():
    assert nearest().name == "fp16 4x32x4096x128 non-causal"
    assert nearest(seq_q=12000, seq_k=12000, batch_heads=32).name == "fp16 1x32x16384x128 non-causal"
    # log2 space: 8192 is as far from 4096 as from 16384; batch*heads 64 decides (128 vs 32: a tie
    # too), so the first entry in the table's order wins
    assert nearest(seq_q=8192, seq_k=8192, batch_heads=64).name == "fp16 4x32x4096x128 non-causal"
    # cross-attention: seq_q and seq_k count separately
    assert nearest(seq_q=16384, seq_k=16384, batch_heads=128).name == "fp16 1x32x16384x128 non-causal"
    assert nearest(seq_q=4096, seq_k=16384, batch_heads=32).name == "fp16 1x32x16384x128 non-causal"
    assert nearest(seq_q=4096, seq_k=16384, batch_heads=128).name == "fp16 4x32x4096x128 non-causal"


def test_entries_with_their_own_key_count():
    data = copy.deepcopy(GOOD)
    data["entries"].append({"dtype": "fp16", "batch": 8, "heads": 32, "seq_len": 1, "kv_len": 8192,
                            "head_dim": 128, "causal": False, "ms": {"sdpa": 0.05}})
    table = calibration.parse(data, source="t")
    decode = first(table, dtype="fp16", head_dim=128, causal=False, seq_q=1, seq_k=4096, batch_heads=128)
    assert decode.name == "fp16 8x32x1/8192x128 non-causal" and decode.kv_len == 8192
    # queries and keys are separate coordinates: a square call at 4096 keeps its square entry
    assert first(table, dtype="fp16", head_dim=128, causal=False, seq_q=4096, seq_k=4096,
                 batch_heads=128).name == "fp16 4x32x4096x128 non-causal"
    text = calibration.dumps(data)
    line = next(ln for ln in text.splitlines() if '"kv_len"' in ln)
    assert line.index('"seq_len": 1, "kv_len": 8192, "head_dim"') > 0   # written after seq_len
    assert text.count('"kv_len"') == 1                                   # only where it differs
    same = copy.deepcopy(GOOD)
    same["entries"][0]["kv_len"] = same["entries"][0]["seq_len"]         # as seq_len: no new shape
    assert calibration.parse(same, source="t").entries == calibration.parse(GOOD, source="t").entries
    assert '"kv_len"' not in calibration.dumps(same)
    twice = copy.deepcopy(same)
    twice["entries"].append(copy.deepcopy(GOOD["entries"][0]))
    with pytest.raises(CalibrationError, match="more than once"):
        calibration.parse(twice, source="t")
    for bad in (0, "8192", 1.5, True):
        with pytest.raises(CalibrationError, match=r"entries\[0\]\.kv_len: must be a positive integer"):
            calibration.parse(mutated(("entries", 0, "kv_len"), bad), source="t")


def test_same_head_dim_first_then_the_nearest_head_dim():
    # 128 exists: the 128 entries win even though a d=64 entry is nearer in shape
    assert nearest(seq_q=128, seq_k=128, batch_heads=1024).head_dim == 128
    assert nearest(head_dim=80).head_dim == 64
    assert nearest(head_dim=192).head_dim == 128        # 64 from 128, 64 from 256: the smaller
    assert nearest(head_dim=200).head_dim == 256


def test_same_dtype_first_then_the_other_half_dtype_and_never_the_other_causal_flag():
    # no bf16 non-causal entries: the fp16 ones stand in (the entry's name says fp16)
    assert nearest(dtype="bf16").name == "fp16 4x32x4096x128 non-causal"
    # the only causal entry is bf16: fp16 causal calls use it; non-causal entries never stand in
    assert nearest(dtype="fp16", causal=True).name == "bf16 4x32x4096x128 causal"
    assert nearest(dtype="bf16", causal=True).name == "bf16 4x32x4096x128 causal"
    no_causal = calibration.parse({**GOOD, "entries": [e for e in GOOD["entries"] if not e["causal"]]},
                                  source="t")
    assert no_causal.neighbours(dtype="fp16", head_dim=128, causal=True, seq_q=1, seq_k=1,
                                batch_heads=1) == []
    assert nearest(seq_q=0, seq_k=0, batch_heads=0) is not None  # empty calls do not crash


def test_dtype_names():
    assert calibration.dtype_name(torch.float16) == "fp16"
    assert calibration.dtype_name(torch.bfloat16) == "bf16"
    assert calibration.dtype_name(torch.float32) is None


# --- the packaged tables: per GPU model or capability, never an exception ----------------------------

@pytest.fixture
def package_dir(tmp_path, monkeypatch):
    """for_gpu() reading its tables from tmp_path instead of the package folder."""
    monkeypatch.setattr(calibration, "tables_folder", lambda: tmp_path)
    calibration.clear_cache()
    yield tmp_path
    calibration.clear_cache()


def test_no_file_means_no_calibration(package_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        assert calibration.for_gpu((9, 0)) is None
        assert calibration.for_gpu((9, 0), "NVIDIA H200") is None
    assert caplog.records == []


def test_the_exact_capability_file_is_read(package_dir):
    (package_dir / "sm90.json").write_text(json.dumps(GOOD))
    table = calibration.for_gpu((9, 0))
    assert table.label == "sm90" and table.source.endswith("sm90.json")
    assert calibration.for_gpu((9, 0)) is table           # cached: one object, one cache key
    assert calibration.for_gpu((8, 9)) is None             # exact (major, minor) only
    # a GPU model without a table of its own gets its capability's, its label naming the GPU
    # model that measured it (tests/unit/test_calibration_user_tables.py)
    h200 = calibration.for_gpu((9, 0), "NVIDIA H200")
    assert h200.source == table.source and h200.entries is table.entries
    assert h200.label == "sm90 (measured on Test GPU)"
    assert calibration.for_gpu((9, 0), "NVIDIA H200") is h200


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "nvidia-h200"),
                                       ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
                                       ("  Tesla T4 ", "tesla-t4"), ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
                                       ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb")])
def test_model_file_names_round_trip(name, slug):
    assert calibration.model_slug(name) == slug
    assert calibration.file_name((9, 0), name) == f"sm90-{slug}.json"
    assert calibration.parse_file_name(f"sm90-{slug}.json") == ((9, 0), slug)
    assert calibration.parse_file_name("sm90.json") == ((9, 0), None)
    assert calibration.parse_file_name("sm120.json") == ((12, 0), None)
    for other in ("sm90-.json", "sm90-H200.json", "sm90_nvidia.json", "review.json", "sm9.json"):
        assert calibration.parse_file_name(other) is None, other
    with pytest.raises(ValueError, match="no letters or digits"):
        calibration.model_slug(" -- ")


def test_a_gpu_models_own_table_wins_over_its_capabilitys(package_dir):
    (package_dir / "sm90.json").write_text(json.dumps(GOOD))
    (package_dir / "sm90-nvidia-h200.json").write_text(json.dumps(mutated(("gpu_name",), "NVIDIA H200")))
    h200 = calibration.for_gpu((9, 0), "NVIDIA H200")
    assert h200.gpu_name == "NVIDIA H200" and h200.label == "sm90-nvidia-h200"
    assert h200.source.endswith("sm90-nvidia-h200.json")
    # other models of that capability, and calls that do not name the GPU, get the capability's
    for other in ("NVIDIA H100 80GB HBM3", "NVIDIA H200 NVL", " -- ", None):
        assert calibration.for_gpu((9, 0), other).source.endswith("sm90.json"), other
    # a model's table never serves a GPU of another capability
    assert calibration.for_gpu((8, 9), "NVIDIA H200") is None


@pytest.mark.parametrize("data,match", [
    (mutated(("gpu_name",), "NVIDIA H100 80GB HBM3"), r"gpu_name: 'NVIDIA H100 80GB HBM3' does not match "
                                                      r"the file name sm90-nvidia-h200\.json"),
    (mutated(("capability",), [8, 9]), r"capability: \[8, 9\] does not match the file name sm90-nvidia-h200"),
])
def test_a_model_table_that_is_not_that_models_is_ignored_for_the_capabilitys(package_dir, caplog, data, match):
    (package_dir / "sm90.json").write_text(json.dumps(GOOD))
    (package_dir / "sm90-nvidia-h200.json").write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        table = calibration.for_gpu((9, 0), "NVIDIA H200")
    assert table.source.endswith("sm90.json")
    assert any(re.search(match, r.getMessage()) for r in caplog.records)


@pytest.mark.parametrize("text,match", [
    ("{not json", "not valid JSON"),
    (json.dumps(mutated(("entries", 0, "ms", "sdpa"), -1)), r"entries\[0\]\.ms\['sdpa'\]"),
    (json.dumps(mutated(("capability",), [8, 9])), r"capability: \[8, 9\] does not match the file name "
                                                   r"sm90.json"),
])
def test_a_broken_file_is_logged_once_and_ignored(package_dir, caplog, text, match):
    (package_dir / "sm90.json").write_text(text)
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        assert calibration.for_gpu((9, 0)) is None
        assert calibration.for_gpu((9, 0)) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "sageattention"]
    assert len(warnings) == 1
    assert re.search(r"ignoring calibration table \S*sm90\.json", warnings[0])
    assert "static preference order" in warnings[0]
    assert re.search(match, warnings[0])


# --- your own tables: SAGEATTENTION_CALIBRATION=PATH ----------------------------------------------

def test_a_folder_of_your_tables_wins_over_the_package(package_dir, tmp_path_factory):
    (package_dir / "sm90.json").write_text(json.dumps(GOOD))
    mine = tmp_path_factory.mktemp("mine")
    (mine / "sm90.json").write_text(json.dumps(mutated(("gpu_name",), "NVIDIA H100 (mine)")))
    table = dispatch.calibration_for((9, 0), env={"SAGEATTENTION_CALIBRATION": str(mine)})
    assert table.gpu_name == "NVIDIA H100 (mine)"
    assert table.label == f"sm90 from {mine / 'sm90.json'}"
    # a GPU the folder has no table for: the packaged one, if any
    assert dispatch.calibration_for((8, 9), env={"SAGEATTENTION_CALIBRATION": str(mine)}) is None


def test_a_folder_of_your_tables_can_hold_a_models_table(package_dir, tmp_path_factory):
    (package_dir / "sm90-nvidia-h200.json").write_text(json.dumps(mutated(("gpu_name",), "NVIDIA H200")))
    mine = tmp_path_factory.mktemp("mine")
    (mine / "sm90.json").write_text(json.dumps(mutated(("gpu_name",), "NVIDIA H100 (mine)")))
    env = {"SAGEATTENTION_CALIBRATION": str(mine)}
    # your folder wins over the package, even over the package's table of that very model
    assert dispatch.calibration_for((9, 0), env=env, gpu_name="NVIDIA H200").gpu_name == "NVIDIA H100 (mine)"
    (mine / "sm90-nvidia-h200.json").write_text(json.dumps(mutated(("gpu_name",), "NVIDIA H200")))
    calibration.clear_cache()
    table = dispatch.calibration_for((9, 0), env=env, gpu_name="NVIDIA H200")
    assert table.label == f"sm90-nvidia-h200 from {mine / 'sm90-nvidia-h200.json'}"
    assert dispatch.calibration_for((9, 0), env=env, gpu_name="NVIDIA H100 80GB HBM3").gpu_name == \
        "NVIDIA H100 (mine)"


def test_a_table_file_serves_the_gpus_of_its_own_capability(package_dir, tmp_path_factory):
    (package_dir / "sm90.json").write_text(json.dumps(GOOD))
    ada = tmp_path_factory.mktemp("mine") / "my-4090.json"
    ada.write_text(json.dumps(mutated(("capability",), [8, 9])))
    env = {"SAGEATTENTION_CALIBRATION": str(ada)}
    assert dispatch.calibration_for((8, 9), env=env).capability == (8, 9)
    assert dispatch.calibration_for((9, 0), env=env).source.endswith("sm90.json")  # the package's


def test_a_broken_table_of_yours_falls_back_to_the_package(package_dir, tmp_path_factory, caplog):
    (package_dir / "sm90.json").write_text(json.dumps(GOOD))
    mine = tmp_path_factory.mktemp("mine")
    (mine / "sm90.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        table = dispatch.calibration_for((9, 0), env={"SAGEATTENTION_CALIBRATION": str(mine)})
    assert table is not None and table.label == "sm90"
    assert any("not valid JSON" in r.getMessage() for r in caplog.records)


def test_a_path_that_does_not_exist_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ValueError, match="neither|does not exist"):
        dispatch.calibration_enabled(env={"SAGEATTENTION_CALIBRATION": str(missing)})


def test_a_broken_file_never_breaks_sageattn(package_dir, monkeypatch):
    (package_dir / "sm90.json").write_text("{not json")
    monkeypatch.delenv("SAGEATTENTION_BACKEND", raising=False)
    monkeypatch.delenv("SAGEATTENTION_CALIBRATION", raising=False)
    assert dispatch.calibration_for((9, 0)) is None
    q = torch.randn(1, 2, 8, 64)
    torch.testing.assert_close(sa.sageattn(q, q, q), torch.nn.functional.scaled_dot_product_attention(q, q, q))


def test_the_package_ships_no_placeholder_table():
    """Only measured tables belong in sageattention/calibration/ (written by sageattention.calibrate)."""
    folder = Path(calibration.__file__).parent
    for path in folder.glob("*.json"):
        table = calibration.load(path)
        assert path.name in (calibration.file_name(table.capability),
                             calibration.file_name(table.capability, table.gpu_name))
        assert "sageattention.calibrate" in table.generated


# --- writing ---------------------------------------------------------------------------------------

def test_dumps_is_sorted_stable_and_valid():
    shuffled = copy.deepcopy(GOOD)
    shuffled["entries"].reverse()
    shuffled["entries"][0]["ms"] = dict(reversed(list(shuffled["entries"][0]["ms"].items())))
    text = calibration.dumps(shuffled)
    assert text == calibration.dumps(GOOD)
    assert text.startswith('{\n  "_generated": "synthetic test table",\n  "schema_version": 1,')
    assert json.loads(text)["entries"][0]["dtype"] == "bf16"  # sorted by dtype first
    assert calibration.parse(json.loads(text), source="t").entries
    with pytest.raises(CalibrationError, match="table being written"):
        calibration.dumps(mutated(("entries", 0, "ms", "sdpa"), 0))


# --- python -m sageattention.calibrate ---------------------------------------------------------------

def test_calibration_grid():
    cases = calibrate.calibration_cases()
    names = [c.name for c in cases]
    assert len(cases) == 20 + 2 * 2 * 3 * 2 + 2 * 2 * 3 + 2 * 2 * 3 * 2 and len(set(names)) == len(names)
    assert {c.name for c in benchmark.standard_cases()} <= set(names)
    assert "bf16 32x32x128x64 causal" in names and "fp16 2x32x8192x128 non-causal" in names
    # keys other than queries: decoding, cross-attention, a prompt chunk (non-causal only)
    assert {"fp16 8x32x1/8192x128 non-causal", "bf16 4x32x4096/256x64 non-causal",
            "fp16 1x32x512/16384x128 non-causal"} <= set(names)
    assert not any(c.causal and c.kv_len for c in cases)
    # few heads at moderate lengths (a part-empty last wave of tiles), causal and not
    assert {"fp16 1x16x4096x64 non-causal", "bf16 1x16x2048x128 causal"} <= set(names)
    assert {c.heads for c in cases} == {32, 16}


def test_case_keys_other_than_queries():
    square = benchmark.Case("fp16", 2, 8, 1024, 64, False)
    assert benchmark.Case("fp16", 2, 8, 1024, 64, False, 1024) == square   # one shape, one name
    assert square.kv_len is None and square.keys == 1024 and square.name == "fp16 2x8x1024x64 non-causal"
    cross = benchmark.Case("fp16", 2, 8, 1024, 64, False, 77)
    assert cross.keys == 77 and cross.name == "fp16 2x8x1024/77x64 non-causal"
    assert cross.flops == 4 * 2 * 8 * 1024 * 77 * 64
    # causal: design.md's n*n/2 for self-attention; otherwise the pairs SDPA's top-left mask keeps
    assert benchmark.Case("fp16", 1, 1, 8, 2, True).flops == 4 * 8 * 8 / 2 * 2
    assert benchmark.Case("fp16", 1, 1, 8, 2, True, 3).flops == 4 * (1 + 2 + 3 + 5 * 3) * 2
    assert benchmark.Case("fp16", 1, 1, 3, 2, True, 8).flops == 4 * (1 + 2 + 3) * 2
    with pytest.raises(ValueError, match="kv_len must be at least 1"):
        benchmark.Case("fp16", 1, 1, 8, 64, False, 0)


def test_benchmark_grid_and_inputs_with_a_kv_len(capsys):
    args = benchmark.build_parser().parse_args(["--seq-len", "1", "--kv-len", "8192", "77",
                                                "--causal", "no", "--dtype", "fp16"])
    cases = benchmark.cases_from_args(args)
    assert [c.name for c in cases] == ["fp16 4x32x1/8192x128 non-causal", "fp16 4x32x1/77x128 non-causal"]
    assert benchmark.main(["--seq-len", "1", "--kv-len", "0"]) == 2   # refused before any GPU is sought
    assert "kv_len must be at least 1" in capsys.readouterr().err
    q, k, v = benchmark._inputs(benchmark.Case("fp16", 2, 3, 5, 64, False, 7), torch.device("cpu"))
    assert q.shape == (2, 3, 5, 64) and k.shape == v.shape == (2, 3, 7, 64)
    # a square case draws what it always drew (q, k, v of one shape from one generator)
    sq = benchmark._inputs(benchmark.Case("fp16", 1, 2, 5, 64, False), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    assert all(torch.equal(t, torch.randn(1, 2, 5, 64, generator=gen, dtype=torch.float16)) for t in sq)


def bench_doc(primary="default dispatch"):
    """A small benchmark document as `python -m sageattention.benchmark --json` writes it."""
    def row(dtype, b, n, d, causal, sdpa_ms, headline, backends):
        return {"name": benchmark.Case(dtype, b, 32, n, d, causal).name, "dtype": dtype, "batch": b,
                "heads": 32, "seq_len": n, "head_dim": d, "causal": causal, "sdpa_ms": sdpa_ms,
                "backend": headline[0], "sageattn_ms": headline[1], "backends": backends}

    return {
        "method": "synthetic timings",
        "primary_backend": primary,
        "cases": [
            row("fp16", 4, 4096, 128, False, 0.9612345, ("cuda-sm89-fp8", 2.0), {
                "cuda-sm89-fp8": {"ran": "cuda-sm89-fp8", "ms": 2.0},
                "cuda-sm80-fp16": {"ran": "cuda-sm80-fp16", "ms": 2.2},
                "cuda-sm75-fp16": {"ran": None, "error": "BackendUnavailableError: not in this build"},
                "triton-fp16": {"ran": "sdpa", "error": "forced triton-fp16 but sdpa ran"},
                "sdpa": {"ran": "sdpa", "ms": 1.0}}),
            row("bf16", 32, 128, 64, True, 0.05, ("cuda-sm89-fp8", 0.04), {}),
        ],
        "gpu_name": "Test GPU",
        "torch": "2.11.0",
        "environment": {"gpu_name": "Test GPU", "compute_capability": "9.0", "torch": "2.11.0",
                        "triton": "3.6.0", "date": "2026-12-03T00:00:00+00:00",
                        "command": "python -m sageattention.calibrate --out sm90.json"},
    }


def test_from_benchmark_builds_the_table_without_a_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_doc()))
    out = tmp_path / "sm90.json"
    argv = ["--from-benchmark", str(bench), "--out", str(out)]
    assert calibrate.main(argv) == 0
    assert f"wrote {out}: 2 entries from Test GPU" in capsys.readouterr().out
    table = calibration.load(out)
    assert table.capability == (9, 0) and table.triton == "3.6.0" and table.method == "synthetic timings"
    assert table.command == "python -m sageattention.calibrate --out sm90.json"
    assert f"python -m sageattention.calibrate --from-benchmark {bench} --out {out}" in table.generated
    assert "--out sageattention/calibration/sm90.json" in table.generated
    fp16 = next(e for e in table.entries if e.dtype == "fp16")
    # sageattn forced to SDPA (same call overhead as the others) beats torch's raw figure; failed or
    # fallen-back backends are not measured; a default-dispatch headline is not a backend's time
    assert dict(fp16.ms) == {"cuda-sm89-fp8": 2.0, "cuda-sm80-fp16": 2.2, "sdpa": 1.0}
    bf16 = next(e for e in table.entries if e.dtype == "bf16")
    assert dict(bf16.ms) == {"sdpa": 0.05}
    # the same input and command give the same bytes
    first = out.read_bytes()
    assert calibrate.main(argv) == 0 and out.read_bytes() == first


def test_from_benchmark_keeps_a_cases_key_count():
    doc = bench_doc()
    cross = dict(doc["cases"][0], name=benchmark.Case("fp16", 4, 32, 4096, 128, False, 256).name,
                 kv_len=256)
    doc["cases"].append(cross)
    table = calibration.parse(calibrate.table_from_benchmark(doc, argv=["--out", "sm90.json"]),
                              source="t")
    assert sorted(e.name for e in table.entries if e.dtype == "fp16") == [
        "fp16 4x32x4096/256x128 non-causal", "fp16 4x32x4096x128 non-causal"]


def test_from_benchmark_uses_a_forced_headline_and_rounds(tmp_path):
    doc = bench_doc(primary="cuda-sm89-fp8")
    doc["cases"][0]["backends"] = {}
    table = calibrate.table_from_benchmark(doc, argv=["--out", "x.json"])
    assert table["entries"][0]["ms"] == {"sdpa": 0.9612, "cuda-sm89-fp8": 2.0}


def test_from_benchmark_reads_a_validation_report(tmp_path):
    doc = bench_doc()
    report = {"schema_version": 1, "environment": doc.pop("environment"), "performance": doc}
    table = calibrate.table_from_benchmark(report, argv=[])
    assert len(table["entries"]) == 2 and table["capability"] == [9, 0]


@pytest.mark.parametrize("change,match", [
    (lambda d: d.pop("environment"), "no 'environment'"),
    (lambda d: d["environment"].pop("date"), "environment.date is missing"),
    (lambda d: d["environment"].update(compute_capability="sm90"), "compute_capability must look like"),
    (lambda d: d.update(cases=[]), "no benchmark 'cases'"),
    (lambda d: d["cases"][0].pop("head_dim"), r"cases\[0\] lacks 'head_dim'"),
    # these two were tracebacks (ValueError from a format code, from int())
    (lambda d: d["cases"][0]["backends"]["sdpa"].update(ms="1.0"),
     r"entries\[0\]\.ms\['sdpa'\]: must be a positive finite number of milliseconds, got '1.0'"),
    (lambda d: d["environment"].update(compute_capability=["nine", "0"]), "compute_capability must look like"),
    # and these (AttributeError, and a garbled message)
    (lambda d: d["cases"][0].update(backends={"sdpa": 5}), r"cases\[0\]\.backends must map backend names"),
    (lambda d: d["cases"].insert(0, "fp16 4x32x4096x128"), r"cases\[0\] must be an object"),
])
def test_from_benchmark_rejects_what_the_table_cannot_be_built_from(tmp_path, capsys, change, match):
    doc = bench_doc()
    change(doc)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(doc))
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / "sm90.json")]) == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "sm90.json").exists()


def test_from_benchmark_refuses_a_benchmark_that_timed_no_quantized_backend(tmp_path, capsys):
    # `benchmark --also` with no names times SDPA and the default dispatch only: its table sent
    # every call to SDPA "as faster", though nothing else was measured
    doc = bench_doc()
    for row in doc["cases"]:
        row["backends"] = {"sdpa": row["backends"].get("sdpa", {"ran": "sdpa", "ms": 1.0})}
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(doc))
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / "sm90.json")]) == 2
    assert "no case timed a quantized backend (only SDPA)" in capsys.readouterr().err
    assert not (tmp_path / "sm90.json").exists()


def test_an_unwritable_out_is_exit_2_not_a_traceback(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_doc()))
    out = Path("/proc/sm90.json")   # no file can be made there, even as root
    if not Path("/proc").is_dir():
        pytest.skip("needs Linux's /proc")
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(out)]) == 2
    assert f"error: cannot write {out}" in capsys.readouterr().err


@pytest.mark.parametrize("var,value,words", [
    ("SAGEATTENTION_BACKEND", "bogus", "SAGEATTENTION_BACKEND='bogus' is not a backend"),
    ("SAGEATTENTION_CALIBRATION", "/nonexistent/sm90.json", "that path does not exist"),
])
def test_a_bad_dispatch_variable_stops_a_gpu_run_before_it_starts(monkeypatch, capsys, tmp_path,
                                                                   var, value, words):
    # every sageattn call would raise, and the whole run was lost at its end (a traceback)
    monkeypatch.setenv(var, value)
    assert dispatch.environment_problems() and words in " ".join(dispatch.environment_problems())
    assert calibrate.main(["--out", str(tmp_path / "sm90.json")]) == 2
    assert words in capsys.readouterr().err
    assert benchmark.main(["--seq-len", "1024"]) == 2
    assert words in capsys.readouterr().err
    monkeypatch.delenv(var)
    assert dispatch.environment_problems() == []


def test_benchmark_refuses_a_grid_value_named_twice(capsys):
    # each case was timed twice and counted twice in the geometric mean
    for argv, words in ((["--dtype", "fp16", "fp16"], "--dtype names fp16 more than once"),
                        (["--seq-len", "1024", "--seq-len", "1024"], "--seq-len names 1024")):
        with pytest.raises(SystemExit) as exc:
            benchmark.main(argv)
        assert exc.value.code == 2 and words in capsys.readouterr().err


def test_out_name_must_match_the_measured_gpu(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_doc()))
    for wrong in ("sm89.json", "sm90-nvidia-h200.json", "sm89-test-gpu.json"):
        assert calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / wrong)]) == 2
        err = capsys.readouterr().err
        assert f"--out {wrong} names another GPU than the one measured, Test GPU (sm90)" in err
        assert "use sm90.json (every GPU of that capability) or sm90-test-gpu.json (that model alone)" in err
        assert not (tmp_path / wrong).exists()
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / "review.json")]) == 0


def test_a_model_table_from_a_benchmark_says_how_to_measure_that_model_again(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_doc()))
    out = tmp_path / "sm90-test-gpu.json"
    assert calibrate.main(["--from-benchmark", str(bench), "--out", str(out)]) == 0
    table = calibration.load(out)
    assert "To measure again on that GPU model (Test GPU)" in table.generated
    assert "--out sageattention/calibration/sm90-test-gpu.json" in table.generated
    assert calibration.parse_file_name(out.name) == ((9, 0), calibration.model_slug(table.gpu_name))


def test_cli_help_and_refusals(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        calibrate.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for word in ("--out", "--from-benchmark", "--benchmark-json", "SAGEATTENTION_CALIBRATION", "(16, 512)"):
        assert word in text
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert calibrate.main(["--out", str(tmp_path / "sm90.json")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible" in err and "--from-benchmark" in err
    assert calibrate.main(["--from-benchmark", str(tmp_path / "missing.json"), "--out", "x.json"]) == 2
    assert "cannot read the benchmark JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        calibrate.main(["--from-benchmark", "a.json", "--benchmark-json", "b.json", "--out", "x.json"])
    assert done.value.code == 2


@pytest.mark.parametrize("extra", [["--rounds", "5"], ["--device", "cuda:1"], ["--rep-ms", "50"],
                                   ["--warmup-ms", "25"], ["--no-accuracy"], ["--refine-rounds", "0"]])
def test_from_benchmark_refuses_measuring_options_it_would_ignore(tmp_path, capsys, extra):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_doc()))
    with pytest.raises(SystemExit) as done:
        calibrate.main(["--from-benchmark", str(bench), "--out", str(tmp_path / "sm90.json"), *extra])
    assert done.value.code == 2
    assert f"{extra[0]} set how a GPU run measures" in capsys.readouterr().err
    assert not (tmp_path / "sm90.json").exists()


@pytest.mark.parametrize("option", ["--out", "--benchmark-json"])
def test_an_output_that_is_a_folder_is_refused_before_measuring(tmp_path, monkeypatch, capsys, option):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: pytest.fail("measured before refusing"))
    argv = {"--out": ["--out", str(tmp_path)],
            "--benchmark-json": ["--out", str(tmp_path / "sm90.json"), "--benchmark-json", str(tmp_path)]}
    with pytest.raises(SystemExit) as done:
        calibrate.main(argv[option])
    assert done.value.code == 2
    assert f"argument {option}: {str(tmp_path)!r} is a folder; name the file to write" in capsys.readouterr().err


@pytest.mark.parametrize("main", ["benchmark", "calibrate"])
@pytest.mark.parametrize("device, says", [("cpu", "'cpu' is a cpu device; the timings are of CUDA kernels"),
                                          ("gpu:0", "'gpu:0' is not a device"),
                                          ("cuda:x", "'cuda:x' is not a device")])
def test_a_device_that_is_not_a_cuda_one_is_refused_by_argparse(tmp_path, monkeypatch, capsys, main, device, says):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: pytest.fail("measured before refusing"))
    argv = ["--device", device] + (["--out", str(tmp_path / "sm90.json")] if main == "calibrate" else [])
    with pytest.raises(SystemExit) as done:
        {"benchmark": benchmark.main, "calibrate": calibrate.main}[main](argv)
    assert done.value.code == 2
    assert f"argument --device: {says}" in capsys.readouterr().err


@pytest.mark.parametrize("main", ["benchmark", "calibrate"])
def test_a_gpu_index_past_the_visible_ones_is_an_error_before_measuring(tmp_path, monkeypatch, capsys, main):
    # was a traceback from the first CUDA call on that device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: pytest.fail("measured before refusing"))
    argv = ["--device", "cuda:3"] + (["--out", str(tmp_path / "sm90.json")] if main == "calibrate" else [])
    assert {"benchmark": benchmark.main, "calibrate": calibrate.main}[main](argv) == 2
    assert "--device cuda:3: this machine has 1 visible CUDA GPU (cuda:0)" in capsys.readouterr().err
    assert not (tmp_path / "sm90.json").exists()


def test_measuring_path_with_the_gpu_faked(tmp_path, monkeypatch, capsys):
    """The GPU branch: grid, every backend plus forced SDPA, calibration off while timing, the raw
    benchmark JSON kept, the table written from it exactly as --from-benchmark would."""
    seen = {}

    def fake_run(cases, *, api, device, timer, primary, others, accuracy, progress, rounds):
        seen.update(cases=len(cases), others=others, primary=primary, rounds=rounds,
                    enabled=dispatch.calibration_enabled())
        return {"method": "synthetic timings", "primary_backend": "default dispatch",
                "cases": bench_doc()["cases"]}

    def fake_document(result, device):
        doc = bench_doc()
        return {**result, "environment": dict(doc["environment"], command="captured")}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(benchmark, "run", fake_run)
    monkeypatch.setattr(benchmark, "document", fake_document)
    assert calibrate.build_parser().parse_args(["--out", "x.json"]).rounds == calibrate.DEFAULT_ROUNDS == 2
    assert calibrate.main(["--out", str(tmp_path / "sm89.json")]) == 2  # refused before measuring
    assert "use sm90.json" in capsys.readouterr().err and not seen
    assert calibrate.main(["--out", str(tmp_path / "sm90-nvidia-h200.json")]) == 2  # another model
    assert "or sm90-test-gpu.json (that model alone)" in capsys.readouterr().err and not seen
    out, raw = tmp_path / "sm90.json", tmp_path / "bench.json"
    assert calibrate.main(["--out", str(out), "--benchmark-json", str(raw), "--rounds", "3"]) == 0
    assert seen == {"cases": 80, "others": benchmark.known_backends() + ["sdpa"], "primary": None,
                    "rounds": 3, "enabled": False}
    table = calibration.load(out)
    assert table.command == (f"python -m sageattention.calibrate --out {out} --benchmark-json {raw} "
                             "--rounds 3")
    rebuilt = tmp_path / "rebuilt" / "sm90.json"
    assert calibrate.main(["--from-benchmark", str(raw), "--out", str(rebuilt)]) == 0
    assert calibration.load(rebuilt).entries == table.entries


def close_row(sdpa_ms, backends, *, dtype="fp16", n=4096):
    """A grid row with forced SDPA at ``sdpa_ms`` and ``backends`` {name: ms or (ms, ran)}."""
    timed = {}
    for name, value in backends.items():
        ms, ran = value if isinstance(value, tuple) else (value, name)
        timed[name] = {"ran": ran, "ms": ms} if ran == name else {"ran": ran, "error": "fell back"}
    if sdpa_ms is not None:
        timed["sdpa"] = {"ran": "sdpa", "ms": sdpa_ms}
    return {"name": benchmark.Case(dtype, 4, 32, n, 128, False).name, "dtype": dtype, "batch": 4,
            "heads": 32, "seq_len": n, "head_dim": 128, "causal": False, "sdpa_ms": sdpa_ms or 1.0,
            "backend": "sdpa", "sageattn_ms": sdpa_ms or 1.0, "backends": timed}


def test_close_calls_are_the_shapes_near_the_dispatch_threshold():
    t = dispatch.CALIBRATION_MIN_SPEEDUP
    rows = [close_row(1.0, {"cuda-sm90-fp16": 1.0 / 1.04, "triton-fp16": 1.3}),  # 1.04x: close
            close_row(1.0, {"cuda-sm90-fp16": 1.0 / 1.20}),          # clearly faster than SDPA
            close_row(1.0, {"cuda-sm90-fp16": 1.0 / 0.90}),          # clearly slower
            close_row(1.0, {"cuda-sm90-fp16": (0.5, "sdpa"), "triton-fp16": 1.0 / 0.99}),  # fell back
            close_row(None, {"cuda-sm90-fp16": 0.9}),                # forced SDPA not timed
            close_row(1.0, {}),                                      # no quantized backend timed
            close_row(1.0, {"cuda-sm90-fp16": 1.0 / (t * calibrate.REFINE_BAND * 0.999)})]
    assert calibrate.close_calls(rows, threshold=t) == [(0, "cuda-sm90-fp16"), (3, "triton-fp16"),
                                                        (6, "cuda-sm90-fp16")]
    assert calibrate.close_calls(rows, threshold=t, band=1.0001) == []


def test_merge_rounds_takes_the_median_of_every_round_and_says_what_it_added():
    row = close_row(1.0, {"cuda-sm90-fp16": 0.97, "triton-fp16": 1.5})
    row["sdpa_ms_rounds"] = [0.95, 1.05]
    row["backends"]["sdpa"]["ms_rounds"] = [1.0, 1.0]
    row["backends"]["cuda-sm90-fp16"]["ms_rounds"] = [0.96, 0.98]
    extra = {"sdpa_ms": 0.99, "sdpa_ms_rounds": [0.99, 0.99, 1.01, 1.01],
             "backend": "cuda-sm90-fp16", "sageattn_ms": 0.9, "sageattn_ms_rounds": [0.9, 0.9, 0.9, 0.9],
             "backends": {"sdpa": {"ran": "sdpa", "ms": 1.02, "ms_rounds": [1.02, 1.02, 1.02, 1.02]}}}
    calibrate.merge_rounds(row, extra, "cuda-sm90-fp16")
    assert row["backends"]["cuda-sm90-fp16"]["ms_rounds"] == [0.96, 0.98, 0.9, 0.9, 0.9, 0.9]
    assert row["backends"]["cuda-sm90-fp16"]["ms"] == pytest.approx(0.9)
    assert row["backends"]["sdpa"]["ms"] == pytest.approx(1.02)
    assert row["sdpa_ms"] == pytest.approx(1.0) and len(row["sdpa_ms_rounds"]) == 6
    assert row["backends"]["triton-fp16"]["ms"] == 1.5  # not re-timed, unchanged
    assert row["backends"]["cuda-sm90-fp16"]["speedup_vs_sdpa"] == pytest.approx(1.0 / 0.9)
    assert row["refined"] == {"rounds_added": {"cuda-sm90-fp16": 4, "sdpa": 4}, "sdpa_baseline_rounds_added": 4}
    # a refinement in which the backend fell back keeps the grid's figure for it
    row = close_row(1.0, {"cuda-sm90-fp16": 0.97})
    extra = {"sdpa_ms": 1.0, "backend": "sdpa", "sageattn_ms": 1.0,
             "backends": {"sdpa": {"ran": "sdpa", "ms": 1.1}}}
    calibrate.merge_rounds(row, extra, "cuda-sm90-fp16")
    assert row["backends"]["cuda-sm90-fp16"]["ms"] == 0.97
    assert row["refined"]["rounds_added"] == {"sdpa": 1}


def test_measuring_refines_the_close_calls_into_the_table(tmp_path, monkeypatch, capsys):
    calls = []
    grid = [close_row(1.0, {"cuda-sm90-fp16": 1.0 / 1.03, "triton-fp16": 2.0}),
            close_row(1.0, {"cuda-sm90-fp16": 1.0 / 1.5}, dtype="bf16")]

    def fake_run(cases, *, api, device, timer, primary, others, accuracy, progress=None, rounds):
        calls.append(dict(cases=[c.name for c in cases], primary=primary, others=list(others),
                          accuracy=accuracy, rounds=rounds))
        if len(calls) == 1:
            return {"method": "synthetic timings", "primary_backend": "default dispatch",
                    "cases": copy.deepcopy(grid)}
        return {"cases": [{"sdpa_ms": 1.0, "sdpa_ms_rounds": [1.0] * rounds, "backend": primary,
                           "sageattn_ms": 0.9, "sageattn_ms_rounds": [0.9] * rounds,
                           "backends": {"sdpa": {"ran": "sdpa", "ms": 1.0, "ms_rounds": [1.0] * rounds}}}]}

    monkeypatch.setattr(calibrate, "calibration_cases",
                        lambda: [benchmark.Case("fp16", 4, 32, 4096, 128, False),
                                 benchmark.Case("bf16", 4, 32, 4096, 128, False)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(benchmark, "run", fake_run)
    monkeypatch.setattr(benchmark, "document",
                        lambda result, device: {**result, "environment": dict(bench_doc()["environment"])})
    out, raw = tmp_path / "sm90.json", tmp_path / "bench.json"
    assert calibrate.main(["--out", str(out), "--benchmark-json", str(raw)]) == 0
    assert calls[1] == {"cases": [grid[0]["name"]], "primary": "cuda-sm90-fp16", "others": ["sdpa"],
                        "accuracy": False, "rounds": calibrate.DEFAULT_REFINE_ROUNDS}
    assert len(calls) == 2  # the 1.5x shape is no close call
    printed = capsys.readouterr().out
    assert "refine: 1 shape(s)" in printed and "cuda-sm90-fp16 1.030x -> " in printed
    doc = json.loads(raw.read_text())
    assert doc["refine"]["cases"] == [grid[0]["name"]] and "more rounds" in doc["method"]
    fp16 = next(e for e in calibration.load(out).entries if e.dtype == "fp16")
    assert fp16.time("cuda-sm90-fp16") == pytest.approx(0.9)  # median of 1 grid + 4 refined rounds
    assert fp16.time("triton-fp16") == 2.0
    calls.clear()
    assert calibrate.main(["--out", str(out), "--refine-rounds", "0"]) == 0
    assert len(calls) == 1


@pytest.mark.parametrize("value, says", [("-1", "must be a whole number of at least 0, got '-1'"),
                                         ("two", "must be a whole number of at least 0, got 'two'")])
def test_refine_rounds_must_be_a_count(capsys, value, says):
    with pytest.raises(SystemExit) as done:
        calibrate.main(["--out", "sm90.json", "--refine-rounds", value])
    assert done.value.code == 2 and says in capsys.readouterr().err


def test_benchmark_json_carries_what_the_table_needs():
    doc = benchmark.document({"cases": []}, torch.device("cpu"))
    for key in ("torch", "triton", "date", "command", "compute_capability", "gpu_name"):
        assert key in doc["environment"]
    assert doc["dispatch_calibration"] is None


# --- the wheel's exact file set ----------------------------------------------------------------------

def test_wheel_file_set_includes_the_calibration_package_and_its_tables(tmp_path):
    from scripts.factory import wheelcheck

    root = tmp_path / "src"
    (root / "sageattention" / "calibration").mkdir(parents=True)
    (root / "sageattention" / "__init__.py").write_text("")
    (root / "sageattention" / "calibration" / "__init__.py").write_text("")
    (root / "sageattention" / "calibration" / "sm90.json").write_text("{}")
    wheel = tmp_path / "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sageattention/_build_info.json", json.dumps({"families": []}))
        zf.writestr("sageattention-2.2.0+sm90.torch2.11cu130.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: sageattention\nVersion: 2.2.0+sm90.torch2.11cu130\n")
    expected = wheelcheck.expected_files(wheel, root)
    assert {"sageattention/calibration/__init__.py", "sageattention/calibration/sm90.json"} <= expected
    # and the real tree's loader module is part of every wheel
    assert "sageattention/calibration/__init__.py" in wheelcheck.expected_files(wheel)


# --- the shipped tables ---------------------------------------------------------------------------

SHIPPED = sorted((REPO / "sageattention" / "calibration").glob("sm*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_table_is_exactly_what_its_generated_line_regenerates(path, tmp_path):
    """A shipped table comes from a committed measurement by the command its `_generated` line
    quotes (never edited by hand): running that command again gives the same bytes."""
    data = json.loads(path.read_text())
    quoted = re.search(r"Generated by `python -m sageattention\.calibrate ([^`]+)`", data["_generated"])
    assert quoted, data["_generated"]
    args = shlex.split(quoted[1])
    assert "--from-benchmark" in args, "a shipped table must be rebuildable from a committed file"
    source = REPO / args[args.index("--from-benchmark") + 1]
    assert source.is_file(), f"{source} (the measurement the table was built from) is not committed"
    out = tmp_path / path.name
    args[args.index("--out") + 1] = str(out)
    assert calibrate.main(args) == 0
    regenerated = json.loads(out.read_text())
    regenerated["_generated"] = data["_generated"]  # quotes its own --out path
    assert regenerated == data



def test_timings_name_their_warm_up_and_every_command_defaults_to_the_same_one():
    timer = benchmark.cuda_timer(100, 40)
    assert timer.description == "100 ms of warm-up and 40 ms of repetitions per timing"
    calls = []

    def fake_timer(fn):
        calls.append(fn)
        return 1.0

    fake_timer.description = timer.description
    fake_timer.warmup_ms, fake_timer.rep_ms = timer.warmup_ms, timer.rep_ms
    result = benchmark.run([], api=None, device=torch.device("cpu"), timer=fake_timer, rounds=2)
    assert "100 ms of warm-up and 40 ms of repetitions per timing" in result["method"]
    assert "median of 2 interleaved rounds" in result["method"]
    assert result["timer"] == {"warmup_ms": 100.0, "rep_ms": 40.0}
    plain = benchmark.run([], api=None, device=torch.device("cpu"), timer=lambda fn: 1.0)
    assert "warm-up" not in plain["method"] and "timer" not in plain  # a bare timer claims none
    assert benchmark.build_parser().parse_args([]).warmup_ms == benchmark.TIMER_WARMUP_MS == 100
    assert calibrate.build_parser().parse_args(["--out", "x.json"]).warmup_ms == benchmark.TIMER_WARMUP_MS


@pytest.mark.parametrize("main, argv, says", [
    ("calibrate", ["--from-benchmark", "{d}/bench.json", "--out", "{d}/bench.json"],
     "--out names the file --from-benchmark reads"),
    ("calibrate", ["--from-benchmark", "{d}/bench.json", "--out", "{d}/sub/../bench.json"],
     "--out names the file --from-benchmark reads"),
    ("calibrate", ["--out", "{d}/sm90.json", "--benchmark-json", "{d}/sm90.json"],
     "--out and --benchmark-json name one file"),
    ("benchmark", ["--render", "{d}/bench.json", "--markdown", "{d}/bench.json"],
     "--markdown names the file --render reads"),
    ("benchmark", ["--json", "{d}/out.json", "--markdown", "{d}/out.json"],
     "--json and --markdown name one file"),
])
def test_an_output_that_would_replace_another_file_of_the_command_is_refused(tmp_path, monkeypatch, capsys,
                                                                              main, argv, says):
    (tmp_path / "sub").mkdir()
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_doc()))
    before = bench.read_text()
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: pytest.fail("measured before refusing"))
    with pytest.raises(SystemExit) as done:
        {"benchmark": benchmark.main, "calibrate": calibrate.main}[main]([a.format(d=tmp_path) for a in argv])
    assert done.value.code == 2 and says in capsys.readouterr().err
    assert bench.read_text() == before
    assert not (tmp_path / "sm90.json").exists() and not (tmp_path / "out.json").exists()


def test_benchmark_refuses_a_backend_named_twice_in_also(capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: pytest.fail("measured before refusing"))
    with pytest.raises(SystemExit) as done:
        benchmark.main(["--also", "triton-fp16", "cuda-sm90-fp16", "triton-fp16"])
    assert done.value.code == 2
    assert "--also names triton-fp16 more than once" in capsys.readouterr().err


@pytest.mark.parametrize("headline_ms, status", [(0.9, 0), (None, 1)])
def test_benchmark_exit_status_says_whether_every_case_was_timed(tmp_path, monkeypatch, capsys, headline_ms, status):
    """The GPU path with the timing faked: exit 1 when sageattn could not be timed at a case,
    after the table and the JSON are still written."""
    row = dict(close_row(1.0, {"cuda-sm90-fp16": 0.9}), sageattn_ms=headline_ms,
               error=None if headline_ms else "RuntimeError: boom")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: {
        "method": "synthetic", "cases": [row], "geomean_speedup_vs_sdpa": None,
        "geomean_speedup_vs_sdpa_by_backend": {}})
    monkeypatch.setattr(benchmark, "document", lambda result, device: {**result, "environment": {}})
    out = tmp_path / "bench.json"
    assert benchmark.main(["--seq-len", "4096", "--json", str(out)]) == status
    assert out.is_file()
    assert ("sageattn was not timed at 1 of 1 cases" in capsys.readouterr().err) == bool(status)
