"""Audit 32 of the wheel factory: inputs that were silently taken or ended in a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="matrix tests need PyYAML")

from scripts.factory import build, cli, matrix  # noqa: E402
from scripts.factory.errors import BuildError, MatrixError  # noqa: E402
from scripts.factory.host import Interpreter  # noqa: E402
from scripts.factory.model import Cell, Target  # noqa: E402
from scripts.factory.plan import CellPlan  # noqa: E402

GROUP = ('cells:\n  - os: linux\n    python: "3.12"\n    torch: "2.12.0"\n    cuda: "13.0"\n'
         '    sm: sm75\n')


def test_a_matrix_that_is_not_utf8_is_a_matrix_error_not_a_traceback(tmp_path, capsys):
    # It raised UnicodeDecodeError out of `matrix --check`, `plan` and `check` (exit 1).
    path = tmp_path / "m.yaml"
    path.write_bytes(b"\xff\xfe" + ("version: 1\n" + GROUP).encode("utf-16-le"))
    with pytest.raises(MatrixError, match="not UTF-8 text"):
        matrix.load_matrix(path)
    assert cli.main(["matrix", "--check", str(path)]) == MatrixError.exit_code
    assert cli.main(["plan", "--sm", "sm75", "--matrix", str(path)]) == MatrixError.exit_code
    err = capsys.readouterr().err
    assert err.count(f"error: {path}: 1 problem(s):") == 2 and "Traceback" not in err


@pytest.mark.parametrize("written, shown", [("true", "True"), ("1.0", "1.0")])
def test_a_schema_version_that_only_compares_equal_to_1_is_refused(tmp_path, written, shown):
    # `version: true` and `version: 1.0` passed as schema version 1 (True == 1.0 == 1 in Python).
    path = tmp_path / "m.yaml"
    path.write_text(f"version: {written}\n" + GROUP)
    with pytest.raises(MatrixError) as info:
        matrix.load_matrix(path)
    assert info.value.problems == [f"top level: 'version' must be 1, got {shown}"]
    path.write_text("version: 1\n" + GROUP)
    assert [c.id for c in matrix.load_matrix(path).cells] == ["linux-cp312-torch2.12-cu130-sm75"]


def test_a_venv_torch_for_another_cuda_minor_is_refused_before_the_build(tmp_path, monkeypatch):
    # prepare_python compared the CUDA major only: a cu126 torch passed for a cu128 cell, whose
    # plan (torch_fits) and id compare major.minor, and setup.py refused it minutes later.
    cell = Cell(os="linux", python="3.11", torch="2.9.1", cuda="12.8", targets=(Target(89),))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    plan = CellPlan(cell, True, "buildable here",
                    Interpreter("/usr/bin/python3.11", "3.11", None, None), venv)
    monkeypatch.setattr(build, "_run", lambda *a, **k: None)

    def torch_cuda(version):
        monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
            a, 0, stdout=f"{version}\n", stderr=""))

    torch_cuda("12.6")
    with pytest.raises(BuildError, match="has CUDA 12.6, cell .* needs CUDA 12.8"):
        build.prepare_python(plan, log=lambda _line: None)
    torch_cuda("12.8")
    assert build.prepare_python(plan, log=lambda _line: None) == Path(venv / "bin" / "python")


def _build_with_a_repair_that_writes(tmp_path, monkeypatch, repaired_names):
    """build_cell with stand-ins: pip writes the raw wheel; the repair tool writes repaired_names
    into the output folder (none: it leaves nothing). Returns the output folder and the call."""
    from scripts.factory import build, plan, wheelcheck
    from test_plan import cell, host

    the_cell = cell()
    raw = f"sageattention-{the_cell.version()}-cp311-cp311-linux_x86_64.whl"
    out = tmp_path / "wheelhouse"

    def fake_run(command, what, env=None, log=print):
        command = [str(c) for c in command]
        target = Path(command[command.index("-w") + 1])
        target.mkdir(parents=True, exist_ok=True)
        for name in ([raw] if "repair" not in command else repaired_names):
            (target / name).write_bytes(b"w")

    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build, "prepare_python", lambda p, log=print: Path(sys.executable))
    monkeypatch.setattr(build.repair, "repair_prefix", lambda os_name: ["auditwheel"])
    monkeypatch.setattr(wheelcheck, "check_wheel", lambda wheel, matrix=None: None)
    planned = plan.plan_cell(the_cell, host())
    return out, the_cell, lambda: build.build_cell(planned, jobs=1, out_dir=out, log=lambda s: None)


def test_a_repair_that_leaves_no_wheel_is_a_build_error(tmp_path, monkeypatch):
    out, the_cell, call = _build_with_a_repair_that_writes(tmp_path, monkeypatch, [])
    out.mkdir()
    # an older build's wheel of another cell and a stray file are not this cell's wheel
    (out / "sageattention-2.2.0+sm75.torch2.12cu130-cp312-cp312-linux_x86_64.whl").write_bytes(b"o")
    (out / "notes.whl").write_bytes(b"x")
    with pytest.raises(BuildError, match=f"left no wheel of {the_cell.id}"):
        call()


def test_a_repaired_wheel_that_overwrote_an_earlier_one_is_found_by_its_parsed_name(tmp_path, monkeypatch):
    from test_plan import cell
    repaired = f"sageattention-{cell().version()}-cp311-cp311-manylinux_2_28_x86_64.whl"
    out, _, call = _build_with_a_repair_that_writes(tmp_path, monkeypatch, [repaired])
    out.mkdir()
    (out / repaired).write_bytes(b"earlier")   # same name: the repair's output is not "fresh"
    assert call() == out / repaired


def test_release_json_names_the_out_folder_only_once_the_release_is_written(tmp_path, monkeypatch, capsys):
    # --json printed "out": <folder> before writing; a write that then failed (exit 2) left JSON
    # naming a release that was never written
    import json as _json

    from scripts.factory import release
    from test_release import run_release

    rc, out = run_release(tmp_path, "--json", "--allow-partial")
    assert rc == 0 and _json.loads(capsys.readouterr().out)["out"] == str(out)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(release, "write_release", full_disk)
    rc, out = run_release(tmp_path / "again", "--json", "--allow-partial")
    captured = capsys.readouterr()
    assert rc == 2 and "cannot write the release" in captured.err
    answer = _json.loads(captured.out)
    assert answer["out"] is None and answer["accepted"]
