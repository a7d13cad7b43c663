"""What a maintainer hits before a build starts: the plan's skip reasons, the matrix loader's
hints for values YAML mangled, and the nox sessions' handling of argparse exits."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="matrix tests need PyYAML")

from scripts.factory import arch, matrix, plan  # noqa: E402
from scripts.factory.errors import MatrixError  # noqa: E402
from noxfile_module import FakeSession, load_noxfile  # noqa: E402
from scripts.factory.host import BUILD_PYTHON_ENV, Host, Interpreter  # noqa: E402
from scripts.factory.model import Cell, Target  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = arch.load_families()

GROUP = {"name": "g", "os": "linux", "python": "3.11", "torch": "2.9.1", "cuda": "12.8",
         "sm": ["sm89"]}


def problems_of(**changes) -> list[str]:
    data = {"version": 1, "cells": [{**copy.deepcopy(GROUP), **changes}]}
    with pytest.raises(MatrixError) as info:
        matrix.parse_matrix(data, families=FAMILIES)
    return info.value.problems


# ---------------------------------------------------------------- the plan and the toolchain


def _cu128_host(nvcc: str) -> Host:
    interp = Interpreter("/usr/bin/python3.11", "3.11", "2.9.1+cu128", "12.8")
    return Host("linux", {"3.11": (interp,)}, nvcc, has_repair_tool=True)


def test_plan_skips_a_cell_the_hosts_nvcc_cannot_compile_with_the_same_major():
    # The matrix accepts this cell (torch 2.9 ships cu128; family sm89 needs CUDA >= 12.8)...
    (cell,) = matrix.parse_matrix({"version": 1, "cells": [GROUP]}, families=FAMILIES).cells
    # ...and with nvcc 12.1 the plan said BUILD (only the major was compared), so the build made
    # the venv, installed torch and only then failed in setup.py's toolchain check.
    p = plan.plan_cell(cell, _cu128_host("12.1.105"), families=FAMILIES)
    assert not p.build
    assert "family sm89 needs nvcc >= 12.8, found 12.1.105" in p.reason
    assert "CUDA_HOME" in p.reason and "12.8" in p.reason
    assert "SKIP  linux-cp311-torch2.9-cu128-sm89: family sm89 needs nvcc" in \
        plan.format_plan([p], "sm89")
    assert plan.plan_cell(cell, _cu128_host("12.8.93"), families=FAMILIES).build


def test_plan_skips_arch_specific_targets_the_hosts_nvcc_cannot_compile():
    fam = {"sm90": dataclasses.replace(FAMILIES["sm90"], min_nvcc="11.0")}
    cell = Cell(os="linux", python="3.11", torch="2.9.1", cuda="11.8", targets=(Target(90),))
    interp = Interpreter("/usr/bin/python3.11", "3.11", "2.9.1+cu118", "11.8")
    p = plan.plan_cell(cell, Host("linux", {"3.11": (interp,)}, "11.8.89"), families=fam)
    assert not p.build and "needs nvcc >= 12.0 for sm_90a" in p.reason


def test_no_python_reason_names_the_build_python_variable():
    cell = Cell(os="linux", python="3.12", torch="2.14.1", cuda="13.0", targets=(Target(80),),
                build_runner=("ubuntu-24.04",))
    p = plan.plan_cell(cell, Host("linux", {}, "13.0.88"), families=FAMILIES)
    assert not p.build and "no Python 3.12 interpreter" in p.reason
    assert BUILD_PYTHON_ENV in p.reason and "ubuntu-24.04" in p.reason


# ---------------------------------------------------------------- matrix values YAML mangled


def test_unquoted_version_hint_is_not_the_mangled_number():
    # `python: 3.10` reaches the loader as 3.1; the hint said: write python: "3.1"
    (problem,) = problems_of(python=3.1)
    assert "cells[0] (g): field 'python'" in problem and "quoted string" in problem
    assert '"3.1"' not in problem and 'python: "3.12"' in problem


def test_empty_field_says_it_has_no_value():
    # `torch:` with nothing after it is None; the hint said: write torch: "None"
    (problem,) = problems_of(torch=None)
    assert problem == "cells[0] (g): field 'torch' has no value; write e.g. torch: \"2.12.0\""


def test_loader_errors_name_the_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text('version: 1\ncells:\n  - {name: g, os: linux, python: 3.10, torch: "2.9.1",'
                    ' cuda: "12.8", sm: [sm89]}\n')
    with pytest.raises(MatrixError) as info:
        matrix.load_matrix(path)
    assert str(info.value).startswith(f"{path}: 1 problem(s)")


# ---------------------------------------------------------------- nox sessions and argparse


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--bogus"], 2)])
def test_nox_session_turns_argparse_exits_into_the_sessions_result(argv, code, capsys):
    # argparse's SystemExit went through nox: `nox -s build-sm75 -- --bogus` ended nox itself
    # (exit 2, no summary, later sessions never ran) and `-- --help` reported no session result.
    noxfile = load_noxfile()
    session = FakeSession(*argv)
    if code:
        with pytest.raises(SystemExit, match="exit status 2"):
            noxfile._build_session(75)(session)
        assert session.errors == ["exit status 2"]
    else:
        noxfile._build_session(75)(session)
        assert session.errors == []
    out, err = capsys.readouterr()
    assert "usage: python -m scripts.factory" in out + err
