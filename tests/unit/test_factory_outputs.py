"""Outputs the factory's commands cannot write: refused before the work where that can be known,
else a one-line error and exit status 2, never a traceback (and never after a build it could
have refused before)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "unit" / "fixtures"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(FIXTURES / "release"))

from scripts.factory import build, chart, notes, plan, release  # noqa: E402
from scripts.factory import report as reports  # noqa: E402
from scripts.factory.errors import BuildError  # noqa: E402

REPORT = FIXTURES / "reports" / "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.report.json"


def _read_only(monkeypatch, folder: Path) -> None:
    """Make os.access say ``folder`` is not writable, as it does for another user's folder or a
    read-only mount (these tests may run as root, whom a chmod does not stop)."""
    real = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == folder and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def _fail_writes(*_args, **_kwargs):
    raise OSError(errno.EROFS, "Read-only file system")


@pytest.mark.parametrize("check", [reports.output_dir, reports.output_file])
def test_an_output_in_a_folder_that_cannot_be_written_is_refused_up_front(tmp_path, monkeypatch, check):
    locked = tmp_path / "locked"
    locked.mkdir()
    assert check(str(locked / "a" / "b")) == locked / "a" / "b"  # writable: admitted
    _read_only(monkeypatch, locked)
    with pytest.raises(argparse.ArgumentTypeError, match=f"cannot write in {locked}"):
        check(str(locked / "a" / "b"))


def test_an_existing_output_file_needs_its_folder_writable(tmp_path, monkeypatch):
    target = tmp_path / "kernels.json"
    target.write_text("{}")
    _read_only(monkeypatch, tmp_path)  # the file is replaced through a temporary beside it
    with pytest.raises(argparse.ArgumentTypeError, match="cannot write in"):
        reports.output_file(str(target))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes in a folder without write permission")
def test_a_folder_without_write_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        with pytest.raises(argparse.ArgumentTypeError, match="cannot write in"):
            reports.output_dir(str(locked / "notes"))
    finally:
        locked.chmod(0o755)


def test_notes_that_cannot_be_written_are_an_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reports, "atomic_write_text", _fail_writes)
    assert notes.main([str(REPORT), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: cannot write" in err and "Read-only file system" in err


def test_charts_that_cannot_be_written_are_an_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reports, "atomic_write_text", _fail_writes)
    assert chart.main([str(REPORT), "--out-dir", str(tmp_path)]) == 2
    assert "error: cannot write a chart in" in capsys.readouterr().err


def test_a_release_that_cannot_be_written_is_exit_2_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(release.shutil, "copy2", _fail_writes)
    out = tmp_path / "release"
    rc = release.main(["--wheels", str(FIXTURES / "release" / "wheels"),
                       "--reports", str(FIXTURES / "release" / "release_notes"), "--out", str(out)])
    assert rc == release.EXIT_USAGE
    assert "error: cannot write the release to" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no staging folder left


def test_build_creates_its_output_folder_before_the_first_compile(tmp_path, monkeypatch):
    """`build --out X` with X impossible to create used to fail with a traceback after the whole
    wheel build (pip wheel, minutes to half an hour)."""
    from scripts.factory.host import Host, Interpreter
    from scripts.factory.model import Cell, Target

    built = []
    monkeypatch.setattr(build, "build_cell", lambda p, **kw: built.append(p) or kw["out_dir"])
    cell = Cell("linux", "3.11", "2.14.1", "13.0", (Target(80),))
    interp = Interpreter(sys.executable, "3.11", "2.14.1+cu130", "13.0")
    host = Host("linux", {"3.11": (interp,)}, "13.0.88", True)
    (planned,) = plan.plan_cells([cell], host)
    assert planned.build
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(BuildError, match=f"cannot create the output folder {blocker / 'wheels'}"):
        build.run_plans([planned], jobs=1, out_dir=blocker / "wheels")
    assert built == []
    assert build.run_plans([planned], jobs=1, out_dir=tmp_path / "wheels") == [tmp_path / "wheels"]
    assert (tmp_path / "wheels").is_dir() and len(built) == 1
