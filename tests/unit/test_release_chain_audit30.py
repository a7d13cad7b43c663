"""Audit round 30 of the release chain (report -> notes -> release): what earlier rounds missed."""

from __future__ import annotations

import shutil
from pathlib import Path

from scripts.factory import notes
from scripts.factory import report as reports

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
STEM90 = "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64"
STEM75 = "sageattention-2.2.0+sm75.torch2.11cu130-cp312-cp312-linux_x86_64"


def _notes_folder(tmp_path: Path, *stems: str) -> Path:
    folder = tmp_path / "release_notes"
    folder.mkdir()
    for stem in stems:
        shutil.copy(FIXTURES / f"{stem}.report.json", folder)
    assert notes.main(["--dir", str(folder)]) == 0
    return folder


# -- notes --check: a note whose report is gone ------------------------------------------------

def test_check_finds_a_note_and_chart_whose_report_was_removed(tmp_path, capsys):
    # The sm75 report was removed (refused, or replaced): its note still says what that run
    # verified, and --check said every note was up to date.
    folder = _notes_folder(tmp_path, STEM90, STEM75)
    assert notes.main(["--dir", str(folder), "--check"]) == 0
    (folder / f"{STEM75}.report.json").unlink()
    capsys.readouterr()
    assert notes.main(["--dir", str(folder), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{STEM75}.md" in err and f"{STEM75}.speedup.svg" in err and "report is gone" in err
    assert f"{STEM90}.md" not in err


def test_check_finds_orphans_where_no_report_is_left(tmp_path, capsys):
    folder = _notes_folder(tmp_path, STEM90)
    (folder / f"{STEM90}.report.json").unlink()
    capsys.readouterr()
    assert notes.main(["--dir", str(folder), "--check"]) == 1
    assert f"{STEM90}.md" in capsys.readouterr().err
    # without --check nothing changes: no reports is nothing to do
    assert notes.main(["--dir", str(folder)]) == 0


def test_check_ignores_hand_written_markdown_beside_the_notes(tmp_path):
    folder = _notes_folder(tmp_path, STEM90)
    (folder / "README.md").write_text("# Release notes\n\nGenerated notes live here.\n")
    assert notes.main(["--dir", str(folder), "--check"]) == 0


# -- a PTX-JIT note says "validated" only of what passed ----------------------------------------

def _ptx75() -> dict:
    """The sm75 wheel's PTX-JIT run on an sm_90 GPU, with its one failed check passing."""
    doc = reports.load_report(FIXTURES / f"{STEM75}.report.json")
    for check in doc["checks"]:
        if check["status"] == "fail":
            check.update(status="pass", reason=None, failures=[], cases=[])
    doc["summary"].update(all_passed=True, fail=0, failed=[])
    assert reports.validate_report(doc) == []
    assert "Validated on the FIXTURE GPU" in notes.render(doc, f"{STEM75}.report.json")
    return doc


def _own_kernel_checks(doc: dict) -> list[dict]:
    own = {b["name"] for b in doc["expectation"]["native_backends"]}
    return [c for c in doc["checks"] if set(reports.ran_backends(c)) & own]


def test_a_ptx_run_whose_kernel_checks_were_skipped_is_not_called_validated():
    # Every check that ran the compute_75 PTX was skipped part-way (its backends recorded); the
    # note said "Not validated" at the top and "Validated on the ... GPU by running the compute_75
    # PTX ...; this checks the Turing code path" under Execution.
    doc = _ptx75()
    for check in _own_kernel_checks(doc):
        check.update(status="skip", reason="skipped part-way")
    assert reports.validate_report(doc) == []
    text = notes.render(doc, f"{STEM75}.report.json")
    assert "**Not validated:" in text
    assert "Validated on the" not in text
    assert "**Execution: PTX JIT.** Run on the FIXTURE GPU" in text


def test_a_failed_ptx_run_is_not_called_validated():
    doc = _ptx75()
    _own_kernel_checks(doc)[0].update(status="fail", reason="cosine 0.5")
    doc["summary"]["all_passed"] = False
    assert reports.validate_report(doc) == []
    text = notes.render(doc, f"{STEM75}.report.json")
    assert "**Validation FAILED" in text and "Validated on the" not in text


def test_a_ptx_code_path_that_ran_only_in_a_skipped_check_is_not_verified():
    # An sm75+sm80 wheel on an sm_90 GPU: compute_75 passed every check, compute_80 ran only in a
    # check that was skipped part-way. The note said the run checked "the Turing and Ampere code
    # paths" and listed the Ampere code path under "verified only for".
    doc = _ptx75()
    doc["build_info"]["sm_targets"] = ["sm75+PTX", "sm80+PTX"]
    doc["expectation"]["native_backends"].append(
        {"name": "cuda-sm80-fp16", "family": "sm80", "via": "ptx", "ptx_arch": "compute_80"})
    skipped = next(c for c in doc["checks"] if c["status"] == "skip")
    skipped.update(backends=["cuda-sm80-fp16"], backend="cuda-sm80-fp16")
    assert reports.validate_report(doc) == []
    text = notes.render(doc, f"{STEM75}.report.json")
    assert "**Not validated" not in text and "Validation FAILED" not in text
    assert ("Validated on the FIXTURE GPU sm_90 (synthetic, not a real run) (sm_90) by running the "
            "compute_75 PTX through the driver's JIT; this checks the Turing code path, not "
            "Turing hardware.") in text
    assert "Turing and Ampere code paths" not in text and "compute_75, compute_80" not in text
    assert ("The wheel's Ampere code ran only in checks that did not pass (skipped or failed) and "
            "is not verified.") in text
    assert "- the SM75/Turing code path as PTX JIT-compiled" in text
    assert "SM80/Ampere code path as PTX" not in text
    assert "- NOT verified: the SM80/Ampere code (it ran only in checks that did not pass)" in text
    # once it passes somewhere, both code paths are checked
    doc["checks"][0].update(backends=["cuda-sm75-fp16", "cuda-sm80-fp16"],
                            backend="cuda-sm75-fp16, cuda-sm80-fp16")
    text = notes.render(doc, f"{STEM75}.report.json")
    assert "this checks the Turing and Ampere code paths" in text
    assert "ran only in checks that did not pass" not in text
