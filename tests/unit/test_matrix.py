"""build_matrix.yaml validation: the real file loads; broken files fail naming cell and field."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="matrix tests need PyYAML")

from scripts.factory import matrix  # noqa: E402
from scripts.factory.errors import MatrixError  # noqa: E402
from noxfile_module import FakeSession, load_noxfile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "version": 1,
    "runners": {"build": {"linux": ["ubuntu-24.04"]}, "validate": {"sm90": ["gpu"]}},
    "cells": [{"name": "g", "os": "linux", "python": "3.11", "torch": "2.14.1",
               "cuda": "13.0", "sm": ["sm80"]}],
}


def parse(**group_changes):
    data = copy.deepcopy(BASE)
    data["cells"][0].update(group_changes)
    return matrix.parse_matrix(data)


def problems_of(data) -> list[str]:
    with pytest.raises(MatrixError) as info:
        matrix.parse_matrix(data)
    return info.value.problems


def test_repository_matrix_has_the_promised_cells():
    m = matrix.load_matrix(ROOT / "build_matrix.yaml")
    ids = {c.id for c in m.cells}
    assert {"linux-cp312-torch2.12-cu130-sm75", "windows-cp312-torch2.12-cu130-sm75",
            "linux-cp311-torch2.14-cu130-sm80", "linux-cp312-torch2.11-cu130-sm90"} <= ids
    assert {80, 86, 89, 90, 75} <= set(m.sms())
    seed = m.cell("linux-cp312-torch2.12-cu130-sm75")
    assert seed.sm_targets == ["sm75+PTX"]
    assert str(seed.version()) == "2.2.0+sm75.torch2.12cu130"
    assert seed.build_runner and seed.validate_runners[75]


def test_group_expands_to_the_product_and_keeps_multi_sm_wheels():
    m = parse(os=["linux", "windows"], python=["3.11", "3.12"], sm=["sm80", ["sm90", "sm80"]])
    assert len(m.cells) == 8
    multi = [c for c in m.cells if len(c.targets) == 2]
    assert len(multi) == 4 and multi[0].id.endswith("-sm80.sm90")


def test_unknown_keys_get_a_did_you_mean():
    data = copy.deepcopy(BASE)
    data["cells"][0]["pyhton"] = "3.11"
    data["runers"] = {}
    found = problems_of(data)
    assert any("'pyhton'" in p and "did you mean 'python'" in p for p in found)
    assert any("'runers'" in p and "did you mean 'runners'" in p for p in found)
    data["cells"][0]["archs"] = ["sm80"]
    assert any("'archs'" in p and "did you mean 'sm'" in p for p in problems_of(data))


@pytest.mark.parametrize("change, field, words", [
    ({"cuda": "13.0", "sm": ["sm70"]}, "'sm'", "CUDA 13.0 dropped sm70"),
    ({"cuda": "12.1", "torch": "2.5.1", "sm": ["sm89"]}, "'cuda'", "needs CUDA >= 12.8"),
    ({"torch": "2.12.0", "cuda": "12.4"}, "'cuda'", "torch 2.12 has no CUDA 12.4 build"),
    ({"sm": ["sm100"], "cuda": "13.0"}, "'sm'", "no kernel family serves sm100"),
    ({"os": "macos"}, "'os'", "not supported"),
    ({"python": 3.1}, "'python'", "quoted string"),
    ({"sm": ["sm8O"]}, "'sm'", "not an SM target"),
])
def test_impossible_combinations_name_the_cell_and_field(change, field, words):
    data = copy.deepcopy(BASE)
    data["cells"][0].update(change)
    found = problems_of(data)
    assert any(field in p and words in p for p in found), found
    assert all(p.startswith("cells[0] (g)") or p.startswith("top level") for p in found)


def test_fp8_problem_names_the_family_and_the_cell_id():
    data = copy.deepcopy(BASE)
    data["cells"][0].update(torch="2.5.1", cuda="12.1", sm=["sm89"])
    (problem,) = [p for p in problems_of(data) if "sm89" in p and "family" in p]
    assert "linux-cp311-torch2.5-cu121-sm89" in problem and "sm89" in problem


def test_duplicate_cells_are_refused():
    data = copy.deepcopy(BASE)
    data["cells"].append(dict(data["cells"][0], name="again", torch="2.14.0", sm=["sm80+PTX"]))
    found = problems_of(data)
    assert any("duplicate cell" in p and "cells[1] (again)" in p and "cells[0]" in p
               for p in found)


def test_every_problem_is_reported_at_once():
    data = copy.deepcopy(BASE)
    data["version"] = 2
    data["cells"][0].update(os="macos", cuda="11.0", sm=["sm90"])
    assert problems_of(data) == [
        "top level: 'version' must be 1, got 2",
        "cells[0] (g): field 'os': 'macos' is not supported (accepted: linux, windows)",
    ]


def test_missing_fields_and_bad_top_level():
    assert any("missing field(s) sm" in p for p in problems_of(
        {"version": 1, "cells": [{"os": "linux", "python": "3.11", "torch": "2.14.1",
                                  "cuda": "13.0"}]}))
    with pytest.raises(MatrixError, match="must be a mapping"):
        matrix.parse_matrix(["not", "a", "mapping"])


def test_runners_that_are_not_mappings_are_problems_not_crashes():
    data = copy.deepcopy(BASE)
    data["runners"] = {"build": ["ubuntu-24.04"], "validate": ["gpu"]}
    found = problems_of(data)
    assert any("top level.runners.build: must be a mapping" in p for p in found), found
    assert any("top level.runners.validate: must be a mapping" in p for p in found), found


@pytest.mark.parametrize("field, value", [("cuda", "13"), ("python", "3"), ("torch", "2")])
def test_versions_without_a_minor_are_problems_not_crashes(field, value):
    data = copy.deepcopy(BASE)
    data["cells"][0][field] = value
    (problem,) = problems_of(data)
    assert f"field {field!r}: {value!r} needs a major and a minor version" in problem


@pytest.mark.parametrize("field, value, short", [("python", "3.12.3", "3.12"),
                                                   ("cuda", "13.0.2", "13.0"),
                                                   ("cuda", "13.0.0", "13.0")])
def test_a_patch_version_where_a_major_minor_is_meant_is_a_problem(field, value, short):
    # python "3.12.3" made a cell no host could build (the plan looked for python3.12.3), and
    # cuda "13.0.2" sent CI to the torch index .../whl/cu1302 and the package cuda-nvcc-13-0-2
    data = copy.deepcopy(BASE)
    data["cells"][0][field] = value
    (problem,) = problems_of(data)
    assert f"field {field!r}: {value!r} has a patch version" in problem
    assert f'write {field}: "{short}"' in problem


def test_torch_keeps_its_patch_version():
    data = copy.deepcopy(BASE)
    data["cells"][0]["torch"] = "2.12.1"
    (cell,) = matrix.parse_matrix(data).cells
    assert cell.torch == "2.12.1"


@pytest.mark.parametrize("field", ["os", "python", "torch", "cuda", "sm"])
def test_an_empty_list_is_a_problem_not_a_group_without_cells(field):
    data = copy.deepcopy(BASE)
    data["cells"][0][field] = []
    found = problems_of(data)
    assert any(f"field {field!r} is an empty list" in p for p in found), found


def test_check_cli_reports_a_broken_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ncells:\n  - os: linux\n    python: '3.11'\n    torch: '2.14.1'\n"
                   "    cuda: '13.0'\n    sm: [sm80]\n    tarch: x\n")
    assert matrix.main(["--check", str(bad)]) == MatrixError.exit_code
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "'tarch'" in err and "did you mean 'torch'" in err


def test_check_cli_on_invalid_yaml_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "broken.yaml"
    bad.write_text("version: [1\n")
    assert matrix.main(["--check", str(bad)]) == MatrixError.exit_code
    assert "not valid YAML" in capsys.readouterr().err
    assert matrix.main(["--check", str(tmp_path / "absent.yaml")]) == MatrixError.exit_code


def test_json_output_is_what_ci_consumes(capsys):
    assert matrix.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cell = next(c for c in out["cells"] if c["id"] == "linux-cp311-torch2.14-cu130-sm80")
    assert cell["version"] == "2.2.0+sm80.torch2.14cu130"
    assert cell["torch_requirement"] == "torch==2.14.*"
    assert cell["cxx_std"] == "c++20" and cell["python_tag"] == "cp311"


def test_factory_cli_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "scripts.factory", "matrix", "--check",
                             str(ROOT / "build_matrix.yaml")], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_nox_registers_sessions_from_the_matrix():
    pytest.importorskip("nox", reason="needs nox")
    result = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # "* name -> doc" (selected by default) or "- name -> doc"
    names = {line[2:].split(" ")[0] for line in result.stdout.splitlines()
             if line[:2] in ("* ", "- ")}
    sms = matrix.load_matrix(ROOT / "build_matrix.yaml").sms()
    assert {f"build-sm{sm}" for sm in sms} <= names
    assert {f"validate-sm{sm}" for sm in sms} <= names
    assert {"matrix", "tests", "lint", "notes", "release"} <= names


def test_nox_validate_skips_a_wheelhouse_wheel_without_a_local_label(tmp_path, monkeypatch):
    from scripts.factory import validate

    noxfile = load_noxfile()
    (tmp_path / "wheelhouse").mkdir()
    plain = "sageattention-2.2.0-cp312-cp312-linux_x86_64.whl"
    good = "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.whl"
    for name in (plain, good):
        (tmp_path / "wheelhouse" / name).write_bytes(b"")
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    seen = []
    monkeypatch.setattr(validate, "main", lambda argv: seen.append(argv) or 0)
    session = FakeSession()
    noxfile._validate_session(90)(session)
    assert seen == [[str(tmp_path / "wheelhouse" / good)]]
    assert any(plain in w and "has no local label" in w for w in session.warnings)


@pytest.mark.parametrize("posargs, wheel, rest", [
    (["--wheel", "w.whl", "-x"], "w.whl", ["-x"]),
    (["-x", "--wheel=w.whl"], "w.whl", ["-x"]),
    (["--wheel"], None, None),
    (["--wheel", "-x"], None, None),
    (["--wheel="], None, None),
])
def test_nox_tests_session_reads_its_wheel_argument(posargs, wheel, rest):
    noxfile = load_noxfile()
    session = FakeSession(*posargs)
    if wheel is None:
        with pytest.raises(SystemExit, match="--wheel needs a wheel file"):
            noxfile.tests(session)
        assert session.runs == []
        return
    noxfile.tests(session)
    assert session.runs == [("python", "-m", "pytest", "tests/unit", "-q", *rest),
                            ("python", "-m", "pytest", "tests/wheel", "-q", "--wheel", wheel)]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_nox_validate_passes_help_through_without_wheels(flag, tmp_path, monkeypatch):
    # `nox -s validate-sm90 -- --help` with an empty wheelhouse said "no sm90 wheel in wheelhouse/"
    from scripts.factory import validate

    noxfile = load_noxfile()
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    seen = []
    monkeypatch.setattr(validate, "main", lambda argv: seen.append(argv) or 0)
    noxfile._validate_session(90)(FakeSession(flag))
    assert seen == [[flag]]


# ---------------------------------------------------------------- values no wheel can have


def test_a_two_digit_cuda_minor_is_a_problem_naming_the_field_not_a_traceback(tmp_path, capsys):
    # cuda "13.10" reached LocalLabel.create through cell.id: ValueError traceback, exit 1.
    data = copy.deepcopy(BASE)
    data["cells"][0]["cuda"] = "13.10"
    (problem,) = problems_of(data)
    assert problem.startswith("cells[0] (g): field 'cuda': '13.10'"), problem
    assert "CUDA minor version must be one digit, got 10" in problem  # the label rule's words
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(data))
    assert matrix.main(["--check", str(path)]) == MatrixError.exit_code == 2
    assert "field 'cuda'" in capsys.readouterr().err


def test_nox_lists_no_sessions_but_names_the_problem_for_a_two_digit_cuda_minor(tmp_path):
    pytest.importorskip("nox", reason="needs nox")
    import shutil

    for name in ("scripts", "sageattention"):
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    for name in ("noxfile.py", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    data = copy.deepcopy(BASE)
    data["cells"][0]["cuda"] = "13.10"
    (tmp_path / "build_matrix.yaml").write_text(yaml.safe_dump(data))
    result = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert "noxfile.py cannot register sessions" in result.stderr
    assert "field 'cuda': '13.10'" in result.stderr


@pytest.mark.parametrize("python, torch, supported", [
    ("2.7", "2.14.1", "3.10, 3.11, 3.12, 3.13, 3.14"),
    ("3.8", "2.14.1", "3.10, 3.11, 3.12, 3.13, 3.14"),
    ("3.9", "2.11.0", "3.10, 3.11, 3.12, 3.13, 3.14"),
    ("3.14", "2.8.0", "3.9, 3.10, 3.11, 3.12, 3.13"),
])
def test_a_python_the_torch_release_ships_no_wheel_for_is_refused(python, torch, supported):
    data = copy.deepcopy(BASE)
    data["cells"][0].update(python=python, torch=torch,
                            cuda="12.8" if torch.startswith("2.8") else "13.0")
    (problem,) = problems_of(data)
    mm = ".".join(torch.split(".")[:2])
    assert "field 'python'" in problem and f"cell linux-cp{python.replace('.', '')}-" in problem
    assert f"torch {mm} ships no wheel for Python {python} (it supports Python {supported})" \
        in problem


def test_every_python_each_torch_ships_loads():
    from scripts.factory import arch

    # One table per dimension, the same torch releases in both.
    assert set(arch.TORCH_PYTHONS) == set(arch.TORCH_CUDA_BUILDS)
    for torch_mm, pythons in arch.TORCH_PYTHONS.items():
        m = parse(python=list(pythons), torch=f"{torch_mm}.0",
                  cuda=arch.TORCH_CUDA_BUILDS[torch_mm][-1], sm=["sm80"])
        assert sorted(c.python for c in m.cells) == sorted(pythons)


def test_torch_with_a_local_label_is_refused():
    # "2.14.1+cu128" in a cu130 cell was accepted and installed as pip install torch==2.14.1+cu128.
    data = copy.deepcopy(BASE)
    data["cells"][0]["torch"] = "2.14.1+cu128"
    (problem,) = problems_of(data)
    assert problem.startswith("cells[0] (g): field 'torch': '2.14.1+cu128' has a local label")
    assert "the cell's 'cuda' field names torch's CUDA build" in problem
    assert 'write torch: "2.14.1"' in problem


@pytest.mark.parametrize("field, value, kind", [
    ("torch", "2.14.0.dev20260101", "a development (nightly) build"),
    ("torch", "2.14.0rc1", "a pre-release"),
    ("python", "3.12rc1", "a pre-release"),
    ("python", "3.13.0a1", "a pre-release"),
    ("cuda", "13.0.dev1", "a development (nightly) build"),
])
def test_pre_releases_and_nightlies_are_refused(field, value, kind):
    data = copy.deepcopy(BASE)
    data["cells"][0][field] = value
    (problem,) = problems_of(data)
    assert problem.startswith(f"cells[0] (g): field {field!r}: {value!r} is {kind}"), problem
    assert "final releases only" in problem
