"""Validation reports: schema, sha256 binding, atomic write, and the validate command's refusals."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from scripts.factory import report as reports
from scripts.factory import validate

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
SM90 = FIXTURES / "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.report.json"
WIN = FIXTURES / "sageattention-2.2.0+sm75.torch2.12cu130-cp312-cp312-win_amd64.report.json"
WHEEL = "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.whl"


def stored(path=SM90) -> dict:
    return json.loads(path.read_text())


def suite_doc() -> dict:
    """A suite result document as `python -m sageattention.validation --json` writes it."""
    doc = stored()
    keep = ("environment", "execution", "expectation", "build_info", "package", "families",
            "backends_table", "checks", "summary", "accuracy", "performance")
    return {"suite_version": 1, "profile": "full", "duration_s": 1.0,
            **{k: copy.deepcopy(doc[k]) for k in keep}}


@pytest.fixture
def wheel(tmp_path) -> Path:
    path = tmp_path / WHEEL
    path.write_bytes(b"PK fake wheel bytes")
    return path


# -- schema ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.report.json")), ids=lambda p: p.name[:40])
def test_stored_fixtures_are_valid_reports(path):
    doc = reports.load_report(path)
    assert doc["schema_version"] == reports.SCHEMA_VERSION
    assert path.name == reports.report_filename(doc["wheel"]["filename"])
    assert "synthetic" in doc["fixture"] and "FIXTURE" in doc["environment"]["gpu_name"]


def test_minimal_fields_other_code_relies_on():
    doc = stored()
    assert doc["wheel"]["filename"] == WHEEL and len(doc["wheel"]["sha256"]) == 64
    assert doc["environment"]["compute_capability"] == "9.0"
    assert doc["execution"] in ("native", "ptx-jit")
    assert {"name", "status", "backend"} <= set(doc["checks"][0])
    assert "speedup_vs_sdpa" in doc["performance"]["cases"][0]
    assert doc["performance"]["geomean_speedup_vs_sdpa"] > 0


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.pop("schema_version"), "schema_version must be an integer"),
    (lambda d: d.update(schema_version=2), "schema_version 2 is not supported"),
    (lambda d: d["wheel"].update(filename="sageattention.zip"), "is not a wheel file name"),
    (lambda d: d["wheel"].update(sha256="ABC"), "wheel.sha256 must be 64 lower-case hex"),
    (lambda d: d["environment"].pop("gpu_name"), "environment.gpu_name must be"),
    (lambda d: d["environment"].update(compute_capability="sm90"),
     "compute_capability must look like '9.0'"),
    (lambda d: d.update(execution="emulated"), "execution must be one of"),
    (lambda d: d.update(checks=[]), "checks must be a non-empty list"),
    (lambda d: d["checks"][0].update(status="ok"), "checks[0].status must be one of"),
    (lambda d: d["checks"][0].update(status="fail", reason=None), "is fail without a reason"),
    (lambda d: d["checks"][1].update(name=d["checks"][0]["name"]), "appears twice"),
    (lambda d: d["checks"][0].pop("backend"), "checks[0].backend must be"),
    (lambda d: d["performance"]["cases"][0].update(speedup_vs_sdpa="fast"),
     "performance.cases[0].speedup_vs_sdpa"),
    (lambda d: d["performance"].pop("geomean_speedup_vs_sdpa"), "geomean_speedup_vs_sdpa"),
    (lambda d: d["environment"].update(os="Windows"), "is for Linux, but the run was on Windows"),
])
def test_invalid_reports_are_refused_with_the_reason(tmp_path, mutate, message):
    doc = stored()
    mutate(doc)
    problems = reports.validate_report(doc)
    assert any(message in p for p in problems), problems
    path = tmp_path / SM90.name
    path.write_text(json.dumps(doc))
    with pytest.raises(reports.ReportError, match="is not a valid report"):
        reports.load_report(path)


def test_a_windows_wheel_cannot_carry_a_linux_run():
    doc = stored(WIN)
    assert reports.validate_report(doc) == []
    doc["environment"]["os"] = "Linux"
    assert any("is for Windows, but the run was on Linux" in p
               for p in reports.validate_report(doc))


def test_load_report_errors_name_the_file(tmp_path):
    with pytest.raises(reports.ReportError, match="no such report"):
        reports.load_report(tmp_path / "missing.report.json")
    bad = tmp_path / "bad.report.json"
    bad.write_text("{not json")
    with pytest.raises(reports.ReportError, match="bad.report.json: not valid JSON"):
        reports.load_report(bad)


# -- sha256 binding, build, write ----------------------------------------------------------------

def test_report_is_bound_to_the_wheel_bytes(tmp_path, wheel):
    identity = reports.wheel_identity(wheel)
    assert identity["filename"] == WHEEL
    assert identity["sha256"] == hashlib.sha256(b"PK fake wheel bytes").hexdigest()
    assert identity["version"] == "2.2.0+sm90.torch2.11cu130"
    assert identity["tags"] == ["cp312-cp312-linux_x86_64"]
    doc = reports.build_report(suite_doc(), wheel=identity, command="python -m x", mode="system")
    path = reports.write_report(doc, tmp_path / "out")
    assert path.name == WHEEL[:-4] + ".report.json"
    loaded = reports.load_report(path)
    reports.verify_wheel(loaded, wheel)  # same bytes: fine
    wheel.write_bytes(b"PK rebuilt wheel")
    with pytest.raises(reports.ReportError, match="the wheel changed after validation"):
        reports.verify_wheel(loaded, wheel)
    other = tmp_path / WHEEL.replace("sm90", "sm89")
    other.write_bytes(b"PK fake wheel bytes")
    with pytest.raises(reports.ReportError, match="the report is for"):
        reports.verify_wheel(loaded, other)


def test_build_report_refuses_a_shadowed_installation(wheel):
    suite = suite_doc()
    suite["build_info"]["version"] = "2.2.0+sm80.torch2.11cu130"
    with pytest.raises(reports.ReportError, match="another installation shadowed the wheel"):
        reports.build_report(suite, wheel=reports.wheel_identity(wheel), command="c", mode="m")


def test_build_report_refuses_an_incomplete_suite_result(wheel):
    suite = suite_doc()
    suite["checks"] = []
    with pytest.raises(reports.ReportError, match="checks must be a non-empty list"):
        reports.build_report(suite, wheel=reports.wheel_identity(wheel), command="c", mode="m")


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path, wheel, monkeypatch):
    doc = reports.build_report(suite_doc(), wheel=reports.wheel_identity(wheel), command="c",
                               mode="m")
    out = tmp_path / "out"
    first = reports.write_report(doc, out)
    before = first.read_text()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(reports.os, "replace", boom)
    doc["run"]["command"] = "another command"  # any change to the valid report
    with pytest.raises(OSError, match="disk full"):
        reports.write_report(doc, out)
    assert first.read_text() == before  # the old report is intact
    assert [p.name for p in out.iterdir()] == [first.name]


def test_write_refuses_an_invalid_report(tmp_path):
    doc = stored()
    doc["execution"] = "maybe"
    with pytest.raises(reports.ReportError, match="refusing to write an invalid report"):
        reports.write_report(doc, tmp_path)
    assert not list(tmp_path.iterdir())


def test_report_filename_needs_a_wheel_name():
    assert reports.report_filename(WHEEL) == WHEEL[:-4] + ".report.json"
    with pytest.raises(reports.ReportError, match="expected '<name>-<version>"):
        reports.report_filename("sageattention.tar.gz")


# -- the validate command ------------------------------------------------------------------------

def _args(wheel, **kw):
    return SimpleNamespace(python="/py", system=kw.get("system", False), timeout=60.0,
                           quick=kw.get("quick", False), no_performance=False, only=None,
                           skip=None)


def test_plan_system_mode_installs_without_deps_or_network(tmp_path, wheel):
    steps = validate.plan(_args(wheel, system=True, quick=True), wheel, tmp_path)
    install, suite = steps
    assert install.argv[:4] == ["/py", "-m", "pip", "install"]
    assert {"--no-deps", "--no-index"} <= set(install.argv)
    assert install.argv[install.argv.index("--target") + 1] == str(tmp_path / "site")
    assert suite.argv[:3] == ["/py", "-m", "sageattention.validation"]
    assert "--quick" in suite.argv and suite.argv[suite.argv.index("--json") + 1] == \
        str(tmp_path / "suite.json")
    assert suite.env["PYTHONPATH"] == str(tmp_path / "site")
    assert suite.cwd == str(tmp_path / "run")  # not the checkout: no shadowing


def test_plan_system_mode_without_pip_unpacks_with_zipfile(tmp_path, wheel):
    install, _ = validate.plan(_args(wheel, system=True), wheel, tmp_path, has_pip=False)
    assert install.argv == ["/py", "-m", "zipfile", "-e", str(wheel.resolve()),
                            str(tmp_path / "site")]


def test_plan_default_mode_reinstalls_this_exact_file(tmp_path, wheel):
    steps = validate.plan(_args(wheel), wheel, tmp_path)
    assert [s.what for s in steps] == ["install", "reinstall this exact file", "suite"]
    assert {"--force-reinstall", "--no-deps"} <= set(steps[1].argv)
    assert "PYTHONPATH" not in steps[2].env


def test_validate_refuses_without_a_gpu_before_installing(wheel, capsys):
    calls = []

    def runner(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
            {"torch": "2.14.1", "cuda_available": False, "devices": 0}), stderr="")

    assert validate.main(["--wheel", str(wheel), "--system"], runner=runner) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err
    assert len(calls) == 1 and calls[0][1] == "-c"  # only the probe ran: nothing installed


def test_validate_system_mode_needs_a_preinstalled_torch(wheel, capsys):
    def runner(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
            {"torch": None, "error": "ModuleNotFoundError('torch')"}), stderr="")

    assert validate.main(["--wheel", str(wheel), "--system"], runner=runner) == 2
    assert "--system reuses a preinstalled torch" in capsys.readouterr().err


@pytest.mark.parametrize("system", [True, False])
def test_validate_says_a_wheel_for_another_interpreter_is_not_for_here(wheel, capsys, system):
    # CI validated every cell on the one GPU runner's python3: a wheel for another Python, OS or
    # torch crashed in pip, or ran against the wrong torch; now it is exit 4 before any install
    calls = []
    label = validate.LocalLabel.parse(validate.reports.parse_wheel_name(wheel.name)[1].local)
    py = next(iter(validate.reports.parse_wheel_name(wheel.name)[3])).interpreter  # e.g. cp311
    same_py = f"{py[2]}.{py[3:]}"
    torch_other = f"{label.torch[0]}.{label.torch[1] + 1}.0+cu130"

    probed = {}   # what the stand-in interpreter says of itself, per case below

    def runner(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
            {**probed, "cuda_available": True, "devices": 1}), stderr="")

    for python, platform, torch, words in (
            ("3.99", "linux", f"{label.torch[0]}.{label.torch[1]}.0", "Python 3.99"),
            (same_py, "win32", f"{label.torch[0]}.{label.torch[1]}.0", "has windows"),
            (same_py, "linux", torch_other, f"torch {torch_other}")):
        probed.update(python=python, platform=platform, torch=torch)
        calls.clear()
        rc = validate.main(["--wheel", str(wheel), *(["--system"] if system else [])], runner=runner)
        err = capsys.readouterr().err
        if words.startswith("torch") and not system:
            assert "not validated here" not in err   # pip installs the wheel's own torch
            continue
        assert rc == validate.EXIT_NOT_HERE == 4, err
        assert "not validated here" in err and words in err and "nothing was installed" in err
        assert len(calls) == 1 and calls[0][1] == "-c"  # only the probe ran


def test_validate_refuses_a_file_that_is_not_a_wheel(tmp_path, capsys):
    assert validate.main(["--wheel", str(tmp_path / "notes.txt")]) == 2
    assert "is not a wheel file name" in capsys.readouterr().err
    assert validate.main(["--wheel", str(tmp_path / WHEEL)]) == 2
    assert "no such wheel file" in capsys.readouterr().err


def test_validate_runs_the_plan_and_writes_the_report(tmp_path, wheel):
    """The whole flow with a stand-in runner: probe, install, suite, report."""
    out = tmp_path / "release_notes"
    seen = []

    def runner(argv, **kwargs):
        seen.append(argv)
        if argv[1] == "-c":
            return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
                {"torch": "2.11.0", "cuda_available": True, "devices": 1}), stderr="")
        if argv[1:3] == ["-m", "sageattention.validation"]:
            target = Path(argv[argv.index("--json") + 1])
            doc = suite_doc()
            doc["package"]["path"] = str(target.parent / "site/sageattention/__init__.py")
            target.write_text(json.dumps(doc))
        return subprocess.CompletedProcess(argv, 0)

    rc = validate.main(["--wheel", str(wheel), "--system", "--out-dir", str(out)],
                       runner=runner)
    assert rc == 0
    report = reports.load_report(out / (WHEEL[:-4] + ".report.json"))
    reports.verify_wheel(report, wheel)
    assert report["run"]["mode"] == "system"
    assert report["run"]["command"].startswith("python -m scripts.factory.validate --wheel")
    assert [a[1:3] for a in seen] == [["-c", validate.PROBE], ["-m", "pip"],
                                      ["-m", "sageattention.validation"]]


def test_validate_refuses_when_the_suite_imported_something_else(tmp_path, wheel, capsys):
    def runner(argv, **kwargs):
        if argv[1] == "-c":
            return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
                {"torch": "2.11.0", "cuda_available": True, "devices": 1}), stderr="")
        if argv[1:3] == ["-m", "sageattention.validation"]:
            doc = suite_doc()
            doc["package"]["path"] = "/somewhere/else/sageattention/__init__.py"
            Path(argv[argv.index("--json") + 1]).write_text(json.dumps(doc))
        return subprocess.CompletedProcess(argv, 0)

    assert validate.main(["--wheel", str(wheel), "--system", "--out-dir", str(tmp_path)],
                         runner=runner) == 2
    assert "not from the wheel's directory" in capsys.readouterr().err


def _suite_runner(write):
    """A stand-in runner whose suite writes ``write(path of its --json)`` as its result."""
    def runner(argv, **kwargs):
        if argv[1] == "-c":
            return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
                {"torch": "2.11.0", "cuda_available": True, "devices": 1}), stderr="")
        if argv[1:3] == ["-m", "sageattention.validation"]:
            target = Path(argv[argv.index("--json") + 1])
            target.write_text(write(target))
        return subprocess.CompletedProcess(argv, 0)
    return runner


def test_validate_refuses_a_source_tree_that_shadowed_the_installed_wheel(tmp_path, wheel,
                                                                          capsys):
    # Without --system, a PYTHONPATH naming another checkout put its source tree (no build info,
    # version 2.2.0) before the installed wheel: the version check was skipped without build info,
    # and the checkout's results were written as the wheel's report.
    def source_tree(target):
        doc = suite_doc()
        doc["build_info"] = None
        doc["package"] = {"version": "2.2.0", "path": "/home/me/dev/sageattention/__init__.py"}
        return json.dumps(doc)

    runner = _suite_runner(source_tree)

    out = tmp_path / "out"
    assert validate.main(["--wheel", str(wheel), "--out-dir", str(out)], runner=runner) == 2
    err = capsys.readouterr().err
    assert "without build info (a source tree, at /home/me/dev/sageattention/__init__.py)" in err
    assert "another installation shadowed the wheel" in err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("text, words", [
    ("{not json", "the suite's result (--json) is not valid JSON (Expecting property name"),
    ("[1, 2]", "the suite's result (--json) is a JSON list, not an object"),
], ids=["not-json", "not-an-object"])
def test_validate_refuses_a_suite_result_that_is_not_a_json_object(tmp_path, wheel, capsys, text,
                                                                   words):
    # A JSONDecodeError or AttributeError traceback (exit 1, "a check failed"); no report can be
    # made from it: refused (2), nothing written.
    out = tmp_path / "out"
    rc = validate.main(["--wheel", str(wheel), "--system", "--out-dir", str(out)],
                       runner=_suite_runner(lambda _: text))
    err = capsys.readouterr().err
    assert rc == validate.EXIT_REFUSED == 2, err
    assert f"refused: {words}" in err and "no report can be made from it" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("status, all_passed, said", [
    ("fail", True, "summary.all_passed is true, but 1 check(s) failed ({name})"),
    ("pass", False, "summary.all_passed is false, but no check failed"),
], ids=["failed-but-all-passed", "passed-but-not-all-passed"])
def test_validate_refuses_a_summary_that_contradicts_the_checks(tmp_path, wheel, capsys, status,
                                                               all_passed, said):
    # The exit status came from summary.all_passed alone: a failed check under all_passed true
    # was written as a report and exited 0.
    def contradicting(target):
        doc = suite_doc()
        doc["package"]["path"] = str(target.parent / "site/sageattention/__init__.py")
        for check in doc["checks"]:
            check.update(status="pass", reason=None)
        doc["checks"][0].update(status=status, reason="differs" if status == "fail" else None)
        doc["summary"]["all_passed"] = all_passed
        return json.dumps(doc)

    out = tmp_path / "out"
    rc = validate.main(["--wheel", str(wheel), "--system", "--out-dir", str(out)],
                       runner=_suite_runner(contradicting))
    err = capsys.readouterr().err
    assert rc == validate.EXIT_REFUSED, err
    name = suite_doc()["checks"][0]["name"]
    assert f"{said.format(name=name)}: the report contradicts itself" in err, err
    assert not out.exists()
    doc = stored()
    doc["summary"]["all_passed"] = not doc["summary"]["all_passed"]
    assert any("the report contradicts itself" in p for p in reports.validate_report(doc))


def test_a_check_whose_backend_is_not_its_backends_is_refused():
    # The note prints `backend` and the release judges `backends`: a report saying cuda-sm90-fp16
    # in one and sdpa in the other was a note claiming the native kernel for a fallback's pass.
    doc = stored()
    doc["checks"][0].update(backend="cuda-sm90-fp16", backends=["sdpa"])
    assert "checks[0].backend 'cuda-sm90-fp16' is not its backends ['sdpa']: the report " \
           "contradicts itself" in reports.validate_report(doc)
    doc["checks"][0].update(backend="sdpa")
    assert reports.validate_report(doc) == []


def test_validate_takes_wheels_as_nox_passes_them(tmp_path, wheel, capsys):
    """noxfile.py passes bare wheel paths; each is validated and the worst status wins."""
    other = tmp_path / WHEEL.replace("sm90", "sm80")
    other.write_bytes(b"PK fake wheel bytes")
    seen = []

    def runner(argv, **kwargs):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
            {"torch": "2.14.1", "cuda_available": False, "devices": 0}), stderr="")

    assert validate.main([str(wheel), "--wheel", str(other)], runner=runner) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err and len(seen) == 2
    with pytest.raises(SystemExit):
        validate.main([])


@pytest.mark.parametrize("name, words", [
    ("x.whl", "'x.whl' is not a wheel file name"),
    ("numpy-2.0.0-cp312-cp312-linux_x86_64.whl",
     "numpy-2.0.0-cp312-cp312-linux_x86_64.whl is a numpy wheel, not a sageattention one"),
    (WHEEL.replace("sm90", "sm80"), "no such wheel file"),
    (WHEEL, "is named twice"),
])
def test_every_wheel_is_checked_before_the_first_is_installed(tmp_path, wheel, capsys, name,
                                                              words):
    # The first wheel was installed and its suite run before a bad second name was refused; a
    # wheel of another project was installed into the environment before being refused.
    if name.startswith("numpy"):
        (tmp_path / name).write_bytes(b"PK")
    runner = lambda *a, **k: pytest.fail("ran something before refusing")  # noqa: E731
    assert validate.main([str(wheel), str(tmp_path / name)], runner=runner) == 2
    assert words in capsys.readouterr().err


def test_without_torch_and_without_a_gpu_nothing_is_installed(wheel, capsys, monkeypatch):
    # torch may come with the wheel, so a --python without torch was installed into first
    # (torch included) and only then found to have no GPU; docs/validation.md says nothing is.
    calls = []

    def runner(argv, **kwargs):
        calls.append(argv)
        if argv[1] == "-c":
            return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
                {"torch": None, "error": "ModuleNotFoundError('torch')"}), stderr="")
        return subprocess.CompletedProcess(argv, 0, stdout="", stderr="")

    monkeypatch.setattr(validate.shutil, "which",
                        lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else name)
    assert validate.main(["--wheel", str(wheel), "--python", sys.executable],
                         runner=runner) == 2
    assert "nvidia-smi lists no NVIDIA GPU" in capsys.readouterr().err
    assert [c[1] for c in calls] == ["-c", "-L"]  # the probe and nvidia-smi, no pip


def test_a_report_that_cannot_be_written_is_exit_2_not_a_traceback(tmp_path, wheel, capsys,
                                                                   monkeypatch):
    # A read-only --out-dir ended the run in a PermissionError traceback, exit 1: what CI reads
    # as "a check failed, the report is written".
    def from_the_wheel(target):
        doc = suite_doc()
        doc["package"]["path"] = str(target.parent / "site/sageattention/__init__.py")
        return json.dumps(doc)

    runner = _suite_runner(from_the_wheel)

    def read_only(target, text):
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(reports, "atomic_write_text", read_only)
    rc = validate.main(["--wheel", str(wheel), "--system", "--out-dir", str(tmp_path / "ro")],
                       runner=runner)
    assert rc == validate.EXIT_REFUSED == 2
    assert "cannot write the report into" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--only", "fp16", "W"], ["--wheel", "W", "--skip", "fp16", "W2"]])
def test_a_wheel_read_as_a_check_id_is_named_before_any_work(wheel, capsys, argv):
    # `--only fp16 W.whl` said "name at least one wheel"; with --wheel given as well, the second
    # wheel went to the suite as a check id and was refused only after the first was installed.
    calls = []
    argv = [str(wheel) if a == "W" else str(wheel.with_name("b-" + wheel.name)) if a == "W2"
            else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        validate.main(argv, runner=lambda *a, **k: calls.append(a))
    assert exc.value.code == 2 and calls == []
    assert "--only/--skip take check ids, not wheels" in capsys.readouterr().err


def test_a_hung_suite_is_stopped_and_reported(tmp_path, wheel, capsys):
    def runner(argv, **kwargs):
        if argv[1] == "-c":
            return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(
                {"torch": "2.11.0", "cuda_available": True, "devices": 1}), stderr="")
        if argv[1:3] == ["-m", "sageattention.validation"]:
            assert kwargs["timeout"] == 5.0
            raise subprocess.TimeoutExpired(argv, kwargs["timeout"])
        return subprocess.CompletedProcess(argv, 0)

    rc = validate.main(["--wheel", str(wheel), "--system", "--timeout", "5",
                        "--out-dir", str(tmp_path)], runner=runner)
    assert rc == validate.EXIT_CRASHED
    assert "suite did not finish within 5 s" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.report.json"))


@pytest.mark.parametrize("option, value, message", [
    *[("--python", p, f"argument --python: {p!r} is not an executable interpreter")
      for p in ("/nonexistent/python", ".")],
    *[("--timeout", t, f"argument --timeout: must be a positive number of seconds, got {t!r}")
      for t in ("0", "-5", "nan", "inf", "soon")],
])
def test_a_bad_option_value_is_a_usage_error_before_anything_runs(wheel, capsys, option, value,
                                                                  message):
    runner = lambda *a, **k: pytest.fail(f"ran something despite a bad {option}")  # noqa: E731
    with pytest.raises(SystemExit) as exc:
        validate.main(["--wheel", str(wheel), option, value], runner=runner)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_validate_help_is_useful():
    res = subprocess.run([sys.executable, "-m", "scripts.factory.validate", "--help"],
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert res.returncode == 0 and "--system" in res.stdout and "Refuses without a GPU" in \
        res.stdout


@pytest.mark.parametrize("command", [
    ("scripts.factory.cli", ["build", "--sm", "sm75", "--out"]),
    ("scripts.factory.validate", ["w.whl", "--out-dir"]),
    ("scripts.factory.notes", ["--out-dir"]),
    ("scripts.factory.release", ["--out"]),
], ids=["build", "validate", "notes", "release"])
@pytest.mark.parametrize("below", ["", "sub"], ids=["the-file", "under-the-file"])
def test_an_output_folder_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, command,
                                                                    below):
    import importlib

    module, argv = command
    a_file = tmp_path / "wheels.whl"
    a_file.write_text("not a folder")
    out = a_file / below if below else a_file
    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main([*argv, str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{str(out)!r} " in err and "name a folder (it is created if missing)" in err
    assert "Traceback" not in err
    assert reports.output_dir(str(tmp_path / "new" / "folder")) == tmp_path / "new" / "folder"


def test_validate_refuses_before_any_work_where_the_report_cannot_be_written(tmp_path, wheel,
                                                                              capsys):
    # A folder at <out-dir>/<stem>.report.json: the suite ran, then os.replace raised
    # IsADirectoryError. Two wheels of one name in two folders: the second report replaced the
    # first's.
    runner = lambda *a, **k: pytest.fail("ran something before refusing")  # noqa: E731
    out = tmp_path / "out"
    target = out / reports.report_filename(WHEEL)
    target.mkdir(parents=True)
    assert validate.main([str(wheel), "--out-dir", str(out)], runner=runner) == 2
    assert f"refused: {target} is a folder where a file is written" in capsys.readouterr().err
    target.rmdir()
    twin = tmp_path / "repaired" / WHEEL
    twin.parent.mkdir()
    twin.write_bytes(b"PK other bytes")
    assert validate.main([str(wheel), str(twin), "--out-dir", str(out)], runner=runner) == 2
    assert (f"refused: {twin} and {wheel} would both write {target}"
            in capsys.readouterr().err)


def test_gpu_runner_script_without_cells_prints_its_whole_usage(tmp_path):
    # It printed a fixed line range of its header, which ended mid-sentence ("copy them to
    # release_notes/ and run") once the header grew by a line.
    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_runner_validate.sh"
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    header = []
    for line in script.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        header.append(line.removeprefix("#").removeprefix(" "))
    assert res.stdout.splitlines() == header
    assert res.stdout.rstrip().endswith("to regenerate the notes.")
    assert not list(tmp_path.iterdir())  # nothing built, no $OUT made
    helped = subprocess.run(["bash", str(script), "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout == res.stdout   # --help is no cell id
    assert not list(tmp_path.iterdir())


# -- honesty: a report states only what its own run shows -------------------------------------

@pytest.mark.parametrize("mutate,message", [
    # a headline speed-up with no measured case behind it
    (lambda d: d["performance"].update(cases=[]),
     "performance.geomean_speedup_vs_sdpa is 1.292605, but the cases' speed-ups give no figure"),
    # a headline speed-up that is not the cases' geometric mean
    (lambda d: d["performance"].update(geomean_speedup_vs_sdpa=1.87),
     "performance.geomean_speedup_vs_sdpa is 1.87, but the cases' speed-ups give 1.2926"),
    # a forced backend's figure that no case timed
    (lambda d: d["performance"].update(geomean_speedup_vs_sdpa_by_backend={"cuda-sm90-fp16": 1.5}),
     "geomean_speedup_vs_sdpa_by_backend['cuda-sm90-fp16'] is 1.5, but the cases' speed-ups give "
     "no figure"),
])
def test_a_speed_up_must_come_from_the_cases_measured(mutate, message):
    # Such reports were valid: the release's manifest and text, and the note, claimed the figure.
    doc = stored()
    mutate(doc)
    assert any(message in p for p in reports.validate_report(doc)), reports.validate_report(doc)


def test_by_backend_figures_that_match_their_cases_are_valid():
    doc = stored()
    for i, case in enumerate(doc["performance"]["cases"]):
        case["backends"] = {"cuda-sm90-fp16": {"speedup_vs_sdpa": 1.0 + i / 100}}
    speeds = [1.0 + i / 100 for i in range(len(doc["performance"]["cases"]))]
    doc["performance"]["geomean_speedup_vs_sdpa_by_backend"] = {
        "cuda-sm90-fp16": reports._geomean(speeds)}
    assert reports.validate_report(doc) == []


PTX75 = FIXTURES / "sageattention-2.2.0+sm75.torch2.11cu130-cp312-cp312-linux_x86_64.report.json"


@pytest.mark.parametrize("path,mutate,message", [
    # the sm75 wheel's compute_75 PTX run on an sm_90 GPU reported as native SASS
    (PTX75, lambda d: d.update(execution="native"),
     "execution is 'native', but the wheel's SMs (sm75) have no SASS for compute capability 9.0"),
    (PTX75, lambda d: d["expectation"].update(execution="native"),
     "execution is 'ptx-jit', but expectation.execution is 'native'"),
    # a run with another torch, CUDA or Python than the wheel is for
    (SM90, lambda d: d["environment"].update(torch="2.14.1+cu130"),
     "is for torch 2.11, but the run used torch 2.14.1+cu130"),
    (SM90, lambda d: d["environment"].update(cuda_runtime="12.8"),
     "is for CUDA 13.0, but the run used CUDA 12.8"),
    (SM90, lambda d: d["environment"].update(python="3.11.9"),
     "is for cp312, but the run used Python 3.11.9"),
])
def test_a_report_only_covers_a_run_its_wheel_admits(path, mutate, message):
    # These were valid reports: the note of the sm75 wheel then said "Execution: native ... SASS
    # for SM90" and "verified only for: NVIDIA ... (sm_90)", never that PTX ran.
    doc = stored(path)
    assert reports.validate_report(doc) == []
    mutate(doc)
    assert any(message in p for p in reports.validate_report(doc)), reports.validate_report(doc)


# -- the fields a note states are checked here, once (audit item 9) -----------------------------

@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["accuracy"]["cuda-sm80-fp16"].pop("min_cosine"),
     "accuracy['cuda-sm80-fp16'] lacks the figure(s) min_cosine (numbers)"),
    (lambda d: d["accuracy"].update({"cuda-sm80-fp16": [1]}),
     "accuracy['cuda-sm80-fp16'] must be an object"),
    (lambda d: d["build_info"].update(torch="nightly"),
     "build_info.torch must be a version such as '2.11.0+cu130', got 'nightly'"),
    (lambda d: d["build_info"].update(sm_targets=["sm90", "8.9"]),
     "build_info.sm_targets[1]: unrecognised SM target '8.9'"),
    (lambda d: d["build_info"].update(sm_targets="sm90"), "build_info.sm_targets must be a list"),
    (lambda d: d.update(build_info=[]), "build_info must be an object or null, got list"),
    (lambda d: d["build_info"].update(compilers=["nvcc"]), "build_info.compilers must be"),
    (lambda d: d["checks"][0].update(errors="bad"), "checks[0].errors must be an object"),
    (lambda d: d["checks"][0].update(errors={"cosine": "high"}), "checks[0].errors must be"),
    (lambda d: d["checks"][0].update(backends="cuda-sm89-fp8"),
     "checks[0].backends must be a list of strings"),
    (lambda d: d["environment"].update(gpu_sm=90), "environment.gpu_sm must look like 'sm90'"),
    (lambda d: d["environment"].update(gpu_sm="sm86"),
     "environment.gpu_sm 'sm86' is not compute capability 9.0"),
    (lambda d: d["environment"].update(python=3.12), "environment.python must be a string"),
    (lambda d: d["environment"].update(torch="latest"), "environment.torch must be a version"),
    (lambda d: d["performance"].update(geomean_speedup_vs_sdpa_by_backend=[1]),
     "performance.geomean_speedup_vs_sdpa_by_backend must be an object"),
    (lambda d: d["performance"].update(timer=[100, 40]), "performance.timer must be an object"),
    (lambda d: d["performance"].update(rounds="3"), "performance.rounds must be a positive"),
    (lambda d: d["performance"].update(accuracy={"min_cosine": 0.99, "max_rel_l1": None}),
     "performance.accuracy must be an object whose min_cosine and max_rel_l1"),
    (lambda d: d["performance"]["cases"][0].update(name=7),
     "performance.cases[0].name must be a string"),
    (lambda d: d.update(run=None), "run must be an object"),
    (lambda d: d.update(families={"sm80": "x"}), "families must be an object of family tables"),
    (lambda d: d["families"]["sm80"].update(head_dims="64"),
     "families['sm80'].head_dims must be a list of integers"),
    (lambda d: d.update(backends_table=["x"]), "backends_table[0] must be an object"),
    (lambda d: d["expectation"].update(native_backends={"a": 1}),
     "expectation must be an object whose native_backends is a list"),
    # 'native' needs SASS for the GPU among the targets the build info names (the note names it)
    (lambda d: d["build_info"].update(sm_targets=["sm80"]),
     "build_info.sm_targets (sm80) have no SASS for compute capability 9.0"),
])
def test_fields_a_note_states_are_checked(tmp_path, mutate, message):
    # Each of these passed load_report, then the note's render raised on it.
    doc = stored()
    assert reports.validate_report(doc) == []
    mutate(doc)
    problems = reports.validate_report(doc)
    assert any(message in p for p in problems), problems
    path = tmp_path / SM90.name
    path.write_text(json.dumps(doc))
    with pytest.raises(reports.ReportError) as caught:
        reports.load_report(path)
    if len(problems) == 1:  # one problem: one line, naming the file and the field
        assert str(caught.value) == f"{path} is not a valid report: {problems[0]}"


STORED = sorted((Path(__file__).parents[2] / "release_notes").glob("*.report.json")) + sorted(
    (FIXTURES.parent / "release" / "release_notes").glob("*.report.json"))


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.name[:40])
def test_the_stored_reports_pass_the_checks_of_the_fields_a_note_states(path):
    assert reports.validate_report(json.loads(path.read_text())) == []
