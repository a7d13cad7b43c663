"""Release notes and charts generated from the stored (synthetic) reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path

import pytest

from scripts.factory import chart, notes
from scripts.factory import report as reports

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
STEM90 = "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64"
STEM75 = "sageattention-2.2.0+sm75.torch2.11cu130-cp312-cp312-linux_x86_64"
STEMWIN = "sageattention-2.2.0+sm75.torch2.12cu130-cp312-cp312-win_amd64"
SECTIONS = ["## What this build is", "## Verified environment", "## Verified validation",
            "## Performance", "## Numerical accuracy", "## Known SM", "compatibility",
            "## Wheel"]


def note_for(stem: str) -> str:
    path = FIXTURES / f"{stem}.report.json"
    return notes.render(reports.load_report(path), path.name)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("notes")
    assert notes.main([*map(str, sorted(FIXTURES.glob("*.report.json"))),
                       "--out-dir", str(out)]) == 0
    return out


def test_one_note_and_one_chart_per_report(written):
    names = sorted(p.name for p in written.iterdir())
    assert names == sorted([f"{s}{ext}" for s in (STEM90, STEM75, STEMWIN)
                            for ext in (".md", ".speedup.svg")])


@pytest.mark.parametrize("stem", [STEM90, STEM75, STEMWIN])
def test_note_follows_the_seed_structure(stem):
    text = note_for(stem)
    positions = [text.find(s) for s in SECTIONS]
    assert all(p >= 0 for p in positions), dict(zip(SECTIONS, positions))
    assert positions == sorted(positions)
    assert "This is NOT an unmodified upstream SageAttention 2.2 build" in text
    assert "should NOT be interpreted as equivalent end-to-end application speedups" in text
    assert f"pip install {stem}.whl" in text
    assert "nox -s notes" in text and "python -m scripts.factory.notes" in text
    assert f"]({stem}.speedup.svg)" in text  # the chart is linked from the note


def test_title_names_sm_architecture_torch_cuda_and_os():
    assert "# SageAttention 2.2.0 SM90/Hopper — Torch 2.11 + CUDA 13.0 — Linux" in note_for(STEM90)
    assert "# SageAttention 2.2.0 SM75/Turing — Torch 2.12 + CUDA 13.0 — Windows" in \
        note_for(STEMWIN)


def test_every_check_is_listed_with_its_result_and_backend():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    text = note_for(STEM90)
    for check in doc["checks"]:
        line = f"- {check['name']}: {check['status'].upper()}"
        assert line in text, line
    assert "- FP16: PASS (cuda-sm89-fp8)" in text
    assert "- Two-GPU alternating-device testing: SKIP: needs two GPUs" in text
    assert "| Boolean attention masks | PASS | sdpa | 0.999900 | 0.0100 | 0.002 |" in text


def test_ptx_jit_is_named_as_such_and_never_as_turing_hardware():
    text = note_for(STEM75)
    assert ("by running the compute_75 PTX through the driver's JIT; this checks the Turing "
            "code path, not Turing hardware") in text
    assert "NOT verified on SM75/Turing hardware" in text
    assert "say nothing about speed on the architecture the wheel targets" in text
    assert "Execution: native" not in text
    assert "Tesla T4" not in text and "validated on Turing hardware" not in text.lower()


def test_a_failed_check_is_stated_plainly():
    text = note_for(STEM75)
    assert "- CUDA graph capture: FAIL (cuda-sm75-fp16): FIXTURE: capture raised an error" in text
    assert "**Validation FAILED: 1 check(s) failed** (CUDA graph capture)." in text
    assert "All checks that ran passed" not in text
    assert "All checks that ran passed" in note_for(STEM90)


def test_limitations_come_from_the_family_table():
    sm75 = note_for(STEM75)
    assert "Native FP8 attention (INT8 QK + FP8 PV) is not supported on SM75" in sm75
    assert "per_thread" not in sm75.split("## Known SM75 limitations")[1].split("##")[0]
    # each Triton backend by name: two lines that differed only in the capability read as one
    # backend contradicting itself
    limits = sm75.split("## Known SM75 limitations")[1].split("##")[0]
    assert "The Triton backend `triton-fp16` needs compute capability 8.0 or newer; it does not run " \
        "on SM75" in limits
    assert limits.count("The Triton backend `") == len({line for line in limits.splitlines()
                                                         if "The Triton backend `" in line})
    # A build whose family table lacks per_thread (sm75 before it had it) says so.
    older = reports.load_report(FIXTURES / f"{STEM75}.report.json")
    older["families"]["sm75"]["qk_quant_gran"] = ["per_warp"]
    assert ('`qk_quant_gran="per_thread"` is not supported by the native SM75 path; it uses per_warp.'
            in notes.render(older, f"{STEM75}.report.json"))
    sm90 = note_for(STEM90)
    assert "FP8 attention" not in sm90.split("## Known SM90 limitations")[1].split("##")[0]
    assert "per_thread" not in sm90.split("## Known SM90 limitations")[1].split("##")[0]


def test_grid_limit_is_stated_when_the_report_carries_it():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    line = "The quantized kernels take at most 65535 batch entries and at most as many query heads"
    rows = [r for r in doc["backends_table"] if isinstance(r, dict)]
    for r in rows:
        r.pop("max_batch_and_heads", None)
    assert line not in notes.render(doc, f"{STEM90}.report.json")  # an older report: not claimed
    for r in rows:
        r["max_batch_and_heads"] = None if r.get("kind") == "sdpa" else 65535
    text = notes.render(doc, f"{STEM90}.report.json")
    assert line in text.split("## Known SM90 limitations")[1].split("##")[0]


def test_padded_head_dims_are_claimed_only_when_the_wheels_table_says_so():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    limits = notes.render(doc, f"{STEM90}.report.json").split("## Known SM90 limitations")[1]
    assert "Native head dimensions: 64, 128; other head dims use the Triton or SDPA path." in limits
    # a wheel whose dispatcher pads (its backends table: a span of head dims and the kernels' widths)
    doc["backends_table"] += [{"name": f"cuda-{family}", "kind": "native", "family": family,
                               "head_dims": {"min": 1, "max": 128}, "kernel_head_dims": [64, 128]}
                              for family in doc["families"]]
    limits = notes.render(doc, f"{STEM90}.report.json").split("## Known SM90 limitations")[1]
    assert ("Native head dimensions: kernels for 64, 128; head dims 1 to 128 run on the next of "
            "them with zero-padded Q, K and V; larger head dims use the Triton or SDPA path."
            in limits.split("##")[0])


def test_a_report_with_the_sm90_fp8_family_names_its_backend_and_modes():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    table = json.loads(notes.FAMILIES_JSON.read_text())["families"]
    doc["families"] = dict(doc["families"], sm90_fp8=table["sm90_fp8"])
    text = notes.render(doc, f"{STEM90}.report.json")
    assert ("- native kernel family `sm90_fp8`: `cuda-sm90-fp8` (INT8 QK, FP8 PV); head dims 64, 128; "
            "qk_quant_gran per_warp, per_thread; pv_accum_dtype fp32+fp32, fp32") in text


def test_windows_note_states_only_its_own_windows_run():
    text = note_for(STEMWIN)
    assert "## Verified environment (Windows)" in text and "## Windows compatibility" in text
    assert "these results come from its own run on Windows. Linux results do not apply" in text
    assert "Verified environment (Linux)" not in text and "Linux x86" not in text
    linux = json.loads((FIXTURES / f"{STEM90}.report.json").read_text())
    # the Linux run's GPU and driver never appear in the Windows note
    assert linux["environment"]["gpu_name"] not in text
    assert "Do NOT install this wheel on Windows" in note_for(STEM90)


def test_a_windows_wheel_with_a_linux_run_gets_no_note(tmp_path, capsys):
    doc = json.loads((FIXTURES / f"{STEMWIN}.report.json").read_text())
    doc["environment"]["os"] = "Linux"
    path = tmp_path / f"{STEMWIN}.report.json"
    path.write_text(json.dumps(doc))
    assert notes.main([str(path)]) == 2
    assert "is for Windows, but the run was on Linux" in capsys.readouterr().err
    assert not (tmp_path / f"{STEMWIN}.md").exists()


def test_a_report_under_another_wheels_name_is_refused(tmp_path, capsys):
    path = tmp_path / f"{STEM75}.report.json"
    path.write_text((FIXTURES / f"{STEM90}.report.json").read_text())
    assert notes.main([str(path)]) == 2
    assert "must be named" in capsys.readouterr().err


def test_performance_figures_come_from_the_report():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    text = note_for(STEM90)
    geo = doc["performance"]["geomean_speedup_vs_sdpa"]
    assert f"geometric-mean speed-up: {geo:.2f}x" in text
    speeds = [c["speedup_vs_sdpa"] for c in doc["performance"]["cases"]]
    assert f"{min(speeds):.2f}x to {max(speeds):.2f}x speed-up over SDPA across 20 cases" in text
    rows = [line for line in text.splitlines() if line.startswith("| fp16 ") or
            line.startswith("| bf16 ")]
    assert len(rows) == 20


def test_the_number_of_timing_rounds_is_stated_when_there_were_several():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    doc["performance"]["rounds"] = 1
    assert "interleaved rounds" not in notes.render(doc, f"{STEM90}.report.json")
    doc["performance"]["rounds"] = 3
    assert ("median of `triton.testing.do_bench`, then the median of 3 interleaved rounds; TOPS"
            in notes.render(doc, f"{STEM90}.report.json"))


def test_the_timings_warm_up_is_stated_when_the_report_records_it():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    doc["performance"].pop("timer", None)
    assert "of warm-up" not in notes.render(doc, f"{STEM90}.report.json")  # older reports say nothing
    doc["performance"]["timer"] = {"warmup_ms": 100.0, "rep_ms": 40.0}
    doc["performance"]["rounds"] = 3
    assert ("median of `triton.testing.do_bench` (each timing after 100 ms of warm-up, over 40 ms), "
            "then the median of 3 interleaved rounds" in notes.render(doc, f"{STEM90}.report.json"))


def test_cases_where_sageattn_ran_sdpa_are_said_so():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    assert "ran PyTorch SDPA itself" not in note_for(STEM90)  # the fixture's cases ran kernels
    for case in doc["performance"]["cases"][:3]:
        case["backend"] = "sdpa"
    text = notes.render(doc, f"{STEM90}.report.json")
    assert ("in 3 of 20 cases `sageattn` ran PyTorch SDPA itself (the GPU's calibration table "
            "measured it faster there)") in text


def test_cases_where_sageattn_ran_a_triton_kernel_are_said_so():
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    assert "ran the Triton kernel" not in note_for(STEM90)
    for case in doc["performance"]["cases"][:2]:
        case["backend"] = "triton-fp16"
    text = notes.render(doc, f"{STEM90}.report.json")
    assert ("in 2 of 20 cases `sageattn` ran the Triton kernel `triton-fp16` (the GPU's "
            "calibration table measured it fastest there)") in text


def test_chart_is_valid_svg_with_one_bar_per_case(written):
    svg = (written / f"{STEM90}.speedup.svg").read_text()
    dom = xml.dom.minidom.parseString(svg)
    bars = [r for r in dom.getElementsByTagName("rect") if r.getAttribute("fill") != "white"]
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    assert len(bars) == len(doc["performance"]["cases"]) == 20
    widths = [float(b.getAttribute("width")) for b in bars]
    speeds = [c["speedup_vs_sdpa"] for c in doc["performance"]["cases"]]
    # bar length is proportional to the speed-up
    ratios = {round(w / s, 3) for w, s in zip(widths, speeds)}
    assert max(ratios) - min(ratios) < 0.2
    assert "regenerate with 'nox -s notes'" in svg
    assert f"{STEM90}.report.json" in svg


def test_chart_marks_cases_that_did_not_run():
    doc = reports.load_report(FIXTURES / f"{STEM75}.report.json")
    doc["performance"]["cases"][0]["speedup_vs_sdpa"] = None
    doc["performance"]["cases"][0]["error"] = "forced cuda-sm75-fp16 but sdpa ran"
    svg = chart.speedup_svg(doc, "x.report.json")
    assert "not measured: forced cuda-sm75-fp16 but sdpa ran" in svg
    assert "(PTX JIT)" in svg


def test_check_mode_detects_stale_notes(tmp_path):
    src = FIXTURES / f"{STEM90}.report.json"
    report = tmp_path / src.name
    report.write_text(src.read_text())
    assert notes.main([str(report), "--check"]) == 1  # nothing generated yet
    assert notes.main([str(report)]) == 0
    assert notes.main([str(report), "--check"]) == 0
    note = tmp_path / f"{STEM90}.md"
    note.write_text(note.read_text() + "hand edit\n")
    assert notes.main([str(report), "--check"]) == 1


def test_no_reports_is_nothing_to_do(tmp_path, capsys):
    assert notes.main(["--dir", str(tmp_path)]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_a_missing_reports_folder_is_an_error_not_nothing_to_do(tmp_path, capsys):
    for extra in ([], ["--check"]):
        assert notes.main(["--dir", str(tmp_path / "relase_notes"), *extra]) == 2
        err = capsys.readouterr().err
        assert "relase_notes is not a folder" in err and "nothing to do" not in err


def test_a_folder_or_a_binary_file_given_as_a_report_is_an_error(tmp_path, capsys):
    binary = tmp_path / f"{STEM90}.report.json"
    binary.write_bytes(b"PK\x03\x04\xc2\x00")
    assert notes.main([str(tmp_path)]) == 2
    assert "is a folder; name a .report.json file" in capsys.readouterr().err
    assert notes.main([str(binary)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_report_files_and_dir_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        notes.main([str(tmp_path / f"{STEM90}.report.json"), "--dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "name the report files or --dir, not both" in capsys.readouterr().err


def test_stored_fixtures_match_their_generator():
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_report_fixtures as gen
    finally:
        sys.path.remove(str(FIXTURES))
    for name, text in gen.render_all().items():
        assert (FIXTURES / name).read_text() == text, f"{name}: rerun make_report_fixtures.py"
    stored = {p.name for p in FIXTURES.glob("*.report.json")}
    assert stored == set(gen.render_all())


def test_notes_cli_help():
    res = subprocess.run([sys.executable, "-m", "scripts.factory.notes", "--help"],
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert res.returncode == 0 and "--check" in res.stdout
    assert re.search(r"<stem>\.md", res.stdout)


@pytest.mark.parametrize("command", [notes.main, chart.main], ids=["notes", "chart"])
def test_a_bad_report_after_a_good_one_stops_before_anything_is_written(tmp_path, capsys,
                                                                        command):
    good = FIXTURES / f"{STEM90}.report.json"
    assert command([str(good), str(tmp_path / "missing.report.json"),
                    "--out-dir", str(tmp_path / "out")]) == 2
    assert "no such report" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_chart_out_dir_is_created_and_a_file_is_refused(tmp_path, capsys):
    good = FIXTURES / f"{STEM90}.report.json"
    assert chart.main([str(good), "--out-dir", str(tmp_path / "new" / "dir")]) == 0
    assert (tmp_path / "new" / "dir" / f"{STEM90}.speedup.svg").is_file()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as exc:
        chart.main([str(good), "--out-dir", str(tmp_path / "afile")])
    assert exc.value.code == 2
    assert "argument --out-dir: " in capsys.readouterr().err


def test_two_reports_of_one_wheel_into_one_out_dir_are_refused(tmp_path, capsys):
    copy = tmp_path / "copy" / f"{STEM90}.report.json"
    copy.parent.mkdir()
    copy.write_bytes((FIXTURES / copy.name).read_bytes())
    out = tmp_path / "out"
    assert notes.main([str(FIXTURES / copy.name), str(copy), "--out-dir", str(out)]) == 2
    assert "two reports would write" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("module", ["notes", "chart"])
def test_help_states_the_exit_codes(module):
    res = subprocess.run([sys.executable, "-m", f"scripts.factory.{module}", "--help"],
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert res.returncode == 0 and "exit codes: 0" in res.stdout


@pytest.mark.parametrize("check", [True, False], ids=["check", "write"])
@pytest.mark.parametrize("which", [".md", ".speedup.svg"])
def test_a_folder_where_a_note_or_chart_goes_is_an_error_before_anything_is_written(
        tmp_path, capsys, check, which):
    # --check read the folder (IsADirectoryError traceback); writing failed after other files.
    out = tmp_path / "out"
    (out / f"{STEM90}{which}").mkdir(parents=True)
    argv = [str(FIXTURES / f"{STEM75}.report.json"), str(FIXTURES / f"{STEM90}.report.json"),
            "--out-dir", str(out)]
    assert notes.main(argv + ["--check"] * check) == 2
    err = capsys.readouterr().err
    assert f"error: {out / (STEM90 + which)} is a folder where a file is written; " in err, err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == [STEM90 + which]


def test_check_counts_a_note_that_is_not_utf8_as_out_of_date(tmp_path, capsys):
    out = tmp_path / "out"
    report = str(FIXTURES / f"{STEM90}.report.json")
    assert notes.main([report, "--out-dir", str(out)]) == 0
    (out / f"{STEM90}.md").write_bytes(b"\xff\xfe not utf-8\n")
    assert notes.main([report, "--out-dir", str(out), "--check"]) == 1
    assert f"out of date (run nox -s notes): {out / STEM90}.md" in capsys.readouterr().err


def test_chart_refuses_a_folder_where_a_chart_goes_before_writing_any(tmp_path, capsys):
    # It wrote the first chart, then os.replace onto the folder raised IsADirectoryError.
    out = tmp_path / "out"
    (out / f"{STEM90}.speedup.svg").mkdir(parents=True)
    assert chart.main([str(FIXTURES / f"{STEM75}.report.json"),
                       str(FIXTURES / f"{STEM90}.report.json"), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {out / STEM90}.speedup.svg is a folder where a file is written; " in err, err
    assert sorted(p.name for p in out.iterdir()) == [f"{STEM90}.speedup.svg"]


def test_chart_refuses_a_misnamed_report_and_two_reports_of_one_wheel(tmp_path, capsys):
    # notes refused both; chart drew a report under another wheel's name, and wrote one chart
    # twice, the second run's over the first
    misnamed = tmp_path / f"{STEM75}.report.json"
    misnamed.write_text((FIXTURES / f"{STEM90}.report.json").read_text())
    assert chart.main([str(misnamed), "--out-dir", str(tmp_path / "a")]) == 2
    assert "must be named" in capsys.readouterr().err
    copy = tmp_path / "b" / f"{STEM90}.report.json"
    copy.parent.mkdir()
    copy.write_text((FIXTURES / f"{STEM90}.report.json").read_text())
    out = tmp_path / "out"
    assert chart.main([str(FIXTURES / f"{STEM90}.report.json"), str(copy), "--out-dir", str(out)]) == 2
    assert "two reports would write" in capsys.readouterr().err
    assert not out.exists()


def test_a_failed_report_is_verified_for_nothing():
    # The note of a failed run said "Treat this Linux wheel as verified only for: ..." and "Do not
    # rely on this wheel for those features", as if the rest were verified and the wheel released.
    text = note_for(STEM75)
    verdict = ("**Validation FAILED: 1 check(s) failed** (CUDA graph capture). This wheel is not "
               "verified for any configuration and is not published")
    assert text.count(verdict) == 3  # at the top, under the checks and under compatibility
    assert "verified only for" not in text and "Do not rely on this wheel for those" not in text
    assert "The failed run was made on:" in text
    assert "Validation FAILED" not in note_for(STEM90)
    assert "Treat this Linux wheel as verified only for:" in note_for(STEM90)


def _only_masks(doc: dict) -> None:
    """The run `validate --only bool-masks` makes: one check, passed on the SDPA fallback."""
    doc["checks"] = [dict(c, backend="sdpa", backends=["sdpa"]) for c in doc["checks"]
                     if c["name"] == "Boolean attention masks"]


def _all_skipped(doc: dict) -> None:
    """The run `validate --only two-gpu` makes on one GPU: nothing ran."""
    doc["checks"] = [c for c in doc["checks"] if c["status"] == "skip"]


@pytest.mark.parametrize("mutate, why", [
    (_only_masks, "no passed check ran a CUDA kernel of this wheel (only sdpa)"),
    (_all_skipped, "no check passed"),
], ids=["sdpa-only", "all-skipped"])
def test_a_run_that_proves_nothing_is_verified_for_nothing(mutate, why):
    # Such a note said "Treat this Linux wheel as verified only for: ... NVIDIA H200" and "The
    # kernels ran as compiled machine code: the wheel's sm_90 SASS", though no kernel of the wheel
    # ran; the release refuses the same report (reports.unproven, one rule for both).
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    mutate(doc)
    assert why in " ".join(reports.unproven(doc["checks"]))
    text = notes.render(doc, f"{STEM90}.report.json")
    verdict = f"**Not validated: {why}"
    assert text.count(verdict) == 3, text  # at the top, under the checks and under compatibility
    assert "verified only for" not in text and "All checks that ran passed" not in text
    assert "The run was made on:" in text
    assert "ran as compiled machine code" not in text
    assert "**Execution: none of the wheel's CUDA kernels ran.**" in text


@pytest.mark.parametrize("field", ["os", "python", "torch", "cuda_runtime", "driver"])
def test_a_report_without_its_runs_environment_gets_no_note(tmp_path, capsys, field):
    # The note said "verified only for: CPython ? ... PyTorch ?"; without the OS the rule that a
    # Windows wheel never carries a Linux run did not apply.
    doc = json.loads((FIXTURES / f"{STEMWIN}.report.json").read_text())
    doc["environment"].pop(field)
    path = tmp_path / f"{STEMWIN}.report.json"
    path.write_text(json.dumps(doc))
    assert notes.main([str(path)]) == 2
    assert f"environment lacks {field}" in capsys.readouterr().err
    assert not (tmp_path / f"{STEMWIN}.md").exists()


def test_a_pass_on_a_backend_that_does_not_run_on_the_wheels_sm_says_so():
    # The sm75 wheel's mask checks ran triton-fp16 on the sm_90 GPU: the note listed them as PASS
    # with nothing to say that Triton (compute capability 8.0+) never runs on SM75.
    doc = reports.load_report(FIXTURES / f"{STEM75}.report.json")
    for c in doc["checks"]:
        if c["name"] == "Boolean attention masks":
            c["backend"], c["backends"] = "triton-fp16", ["triton-fp16"]
    text = notes.render(doc, f"{STEM75}.report.json")
    assert ("- Boolean attention masks: PASS (triton-fp16); `triton-fp16` does not run on SM75: "
            "its part of this result says nothing about SM75") in text
    assert "- Additive floating-point attention masks: PASS (sdpa)\n" in text
    assert "does not run on" not in note_for(STEM90).split("## Performance")[0]


def test_notes_and_release_run_without_torch(tmp_path):
    # The publish job (.github/workflows/wheels.yml) installs nox, pyyaml and packaging only, then
    # runs `nox -s notes` and `nox -s release`; the notes imported sageattention (and so torch) for
    # two small rules. Here torch cannot be imported at all.
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is not installed here')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from scripts.factory import notes, release\n"
        f"rc = notes.main(['--dir', {str(root / 'release_notes')!r}, '--check'])\n"
        f"fx = {str(root / 'tests/unit/fixtures/release')!r}\n"
        "rc2 = release.main(['--wheels', fx + '/wheels', '--reports', fx + '/release_notes',\n"
        f"                    '--out', {str(tmp_path / 'out')!r}, '--allow-partial'])\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(rc or rc2)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert (tmp_path / "out" / "manifest.json").is_file()


# -- audit items 6-9: the note states what the report shows, and a malformed report is exit 2 ----

def _as_sm80_wheel_on(doc: dict, *, targets: list[str], capability: str, gpu: str) -> dict:
    """The sm90 fixture as a native run of an sm80 wheel (``targets``) on another GPU."""
    name = "sageattention-2.2.0+sm80.torch2.11cu130-cp312-cp312-linux_x86_64.whl"
    doc["wheel"].update(filename=name, version="2.2.0+sm80.torch2.11cu130")
    doc["build_info"]["sm_targets"] = targets
    doc["environment"].update(gpu_name=gpu, compute_capability=capability,
                              gpu_sm="sm" + capability.replace(".", ""))
    assert reports.validate_report(doc) == [], reports.validate_report(doc)
    return doc


@pytest.mark.parametrize("targets,capability,gpu,ran", [
    (["sm80"], "8.6", "NVIDIA A10", "sm_80 SASS on the NVIDIA A10 (compute capability 8.6)"),
    # of two targets whose SASS runs there, the loader takes the newest
    (["sm80", "sm86"], "8.6", "NVIDIA A10", "sm_86 SASS on the NVIDIA A10"),
    (["sm80", "sm90"], "8.0", "NVIDIA A100", "sm_80 SASS on the NVIDIA A100 (compute capability "
                                             "8.0)"),
])
def test_a_native_note_names_the_wheels_sass_target_that_ran(targets, capability, gpu, ran):
    # An sm80 wheel validated on an A10 (8.6) was said to run "machine code (SASS) for SM86": the
    # GPU's SM, a SASS the wheel does not carry.
    doc = _as_sm80_wheel_on(reports.load_report(FIXTURES / f"{STEM90}.report.json"),
                            targets=targets, capability=capability, gpu=gpu)
    text = notes.render(doc, f"{STEM90}.report.json")
    assert f"**Execution: native.** The kernels ran as compiled machine code: the wheel's {ran}" \
        in text
    assert "(SASS) for SM" not in text


def test_the_timer_named_is_the_one_the_run_had():
    # With Triton not installed the note still said the timings came from triton.testing.do_bench
    # (and, a few lines up, "Triton: not installed").
    doc = reports.load_report(FIXTURES / f"{STEM90}.report.json")
    assert "median of `triton.testing.do_bench`" in notes.render(doc, f"{STEM90}.report.json")
    doc["environment"]["triton"] = None
    text = notes.render(doc, f"{STEM90}.report.json")
    assert "- Triton: not installed" in text
    assert "median of CUDA-event timings without Triton; TOPS" in text
    assert "do_bench" not in text


def test_a_ptx_note_of_a_multi_sm_wheel_names_every_architecture():
    # "SM75/Turing / SM80/Ampere".split('/')[-1] kept only "Ampere": the note of an sm75+sm80 PTX
    # wheel said its run checked the Ampere code path, though compute_75 is Turing code.
    # On an sm_90 GPU such a wheel (families sm75 and sm80) runs compute_75 and compute_80 PTX.
    doc = reports.load_report(FIXTURES / f"{STEM75}.report.json")
    doc["build_info"]["sm_targets"] = ["sm75+PTX", "sm80+PTX"]
    doc["expectation"]["native_backends"].append(
        {"name": "cuda-sm80-fp16", "family": "sm80", "via": "ptx", "ptx_arch": "compute_80"})
    doc["checks"][0].update(backends=["cuda-sm75-fp16", "cuda-sm80-fp16"],
                            backend="cuda-sm75-fp16, cuda-sm80-fp16")
    text = notes.render(doc, f"{STEM75}.report.json")
    assert ("by running the compute_75, compute_80 PTX through the driver's JIT; this checks the "
            "Turing and Ampere code paths, not Turing or Ampere hardware. No "
            "result below was measured on an SM75 or SM80 GPU.") in text
    doc["build_info"]["sm_targets"] = ["sm80+PTX", "sm86+PTX"]  # one architecture, named once
    doc["expectation"]["native_backends"].pop(0)
    doc["checks"][0].update(backends=["cuda-sm80-fp16"], backend="cuda-sm80-fp16")
    assert "this checks the Ampere code path, not Ampere hardware" in \
        notes.render(doc, f"{STEM75}.report.json")


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["accuracy"]["cuda-sm80-fp16"].pop("min_cosine"),
     "accuracy['cuda-sm80-fp16'] lacks the figure(s) min_cosine"),
    (lambda d: d["build_info"].update(torch="nightly"), "build_info.torch must be a version"),
    (lambda d: d["build_info"].update(sm_targets=["8.9"]),
     "build_info.sm_targets[0]: unrecognised SM target '8.9'"),
    (lambda d: d.update(build_info=[d["build_info"]]), "build_info must be an object or null"),
    (lambda d: d["checks"][0].update(errors="bad"), "checks[0].errors must be an object"),
    (lambda d: d["checks"][0].update(backends="cuda-sm89-fp8"),
     "checks[0].backends must be a list of strings"),
    (lambda d: d["environment"].update(gpu_sm=90), "environment.gpu_sm must look like 'sm90'"),
    (lambda d: d["performance"].update(geomean_speedup_vs_sdpa_by_backend=[1]),
     "performance.geomean_speedup_vs_sdpa_by_backend must be an object"),
], ids=["accuracy", "torch", "sm_targets", "build_info", "errors", "backends", "gpu_sm",
        "by_backend"])
def test_a_report_with_a_malformed_field_is_exit_2_with_one_line(tmp_path, capsys, mutate, field):
    # These reports passed load_report and then raised KeyError, InvalidVersion, ValueError or
    # AttributeError in render: a traceback with exit 1, which --check means "a note is stale".
    doc = json.loads((FIXTURES / f"{STEM90}.report.json").read_text())
    mutate(doc)
    path = tmp_path / f"{STEM90}.report.json"
    path.write_text(json.dumps(doc))
    assert notes.main([str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path} is not a valid report: {err.split(': ', 2)[2]}"
    assert field in err and err.count("\n") == 1, err
    assert not (tmp_path / f"{STEM90}.md").exists()


@pytest.mark.parametrize("why", ["y" * 74 + "& more", "y" * 75 + "<class 'RuntimeError'>"])
def test_chart_stays_valid_svg_where_a_long_error_is_cut_at_a_markup_character(why):
    doc = reports.load_report(FIXTURES / f"{STEM75}.report.json")
    doc["performance"]["cases"][0]["speedup_vs_sdpa"] = None
    doc["performance"]["cases"][0]["error"] = why
    svg = chart.speedup_svg(doc, "x.report.json")
    xml.dom.minidom.parseString(svg)  # the cut must not split an entity such as '&amp;'
    text = [t for t in xml.dom.minidom.parseString(svg).getElementsByTagName("text")
            if t.firstChild and t.firstChild.data.startswith("not measured: ")]
    assert text[0].firstChild.data == ("not measured: " + why)[:90]
