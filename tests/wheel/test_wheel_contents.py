"""A built wheel's name, metadata, build info and files agree with its matrix cell."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from scripts.factory import matrix, wheelcheck
from scripts.factory.labels import cell_for_wheel, parse_wheel_name

ROOT = Path(__file__).resolve().parents[2]


def test_name_parses_back_to_a_matrix_cell(wheel):
    cell = cell_for_wheel(wheel.name, matrix.load_matrix(ROOT / "build_matrix.yaml"))
    _name, version, _build, tags = parse_wheel_filename(wheel.name)
    assert version == cell.version()
    assert {t.interpreter for t in tags} == {cell.python_tag}


def test_metadata_and_build_info_agree(wheel):
    assert wheelcheck.agreement_problems(wheel) == []
    _names, metadata, info = wheelcheck.read_wheel(wheel)
    ident = parse_wheel_name(wheel.name)
    assert metadata["Version"] == str(ident.version)
    torch_mm = f"{ident.label.torch[0]}.{ident.label.torch[1]}"
    assert f"torch=={torch_mm}.*" in metadata.get_all("Requires-Dist")
    for field in ("sm_targets", "families", "torch", "cuda", "python_tag", "compilers",
                  "git_commit", "build_date", "cell_id"):
        assert info.get(field), f"build info field {field} is empty"


def test_exact_file_set(wheel):
    with zipfile.ZipFile(wheel) as zf:
        actual = {n for n in zf.namelist() if not n.endswith("/")}
    expected = wheelcheck.expected_files(wheel, ROOT)
    assert sorted(actual - expected) == [] and sorted(expected - actual) == []


def test_calibration_tables_ship(wheel):
    """The dispatcher's loader and every measured table of the source tree are in the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    tables = {p.relative_to(ROOT).as_posix() for p in (ROOT / "sageattention" / "calibration").glob("*.json")}
    assert {"sageattention/calibration/__init__.py", "sageattention/calibrate.py"} | tables <= names


def test_no_torch_or_cuda_library_vendored(wheel):
    with zipfile.ZipFile(wheel) as zf:
        vendored = [n for n in zf.namelist() if ".libs/" in n]
    assert vendored == []


@pytest.mark.skipif(sys.platform != "linux", reason="ELF checks run on Linux")
def test_extensions_carry_no_debug_info(wheel, tmp_path):
    elftools = pytest.importorskip("elftools.elf.elffile", reason="needs pyelftools")
    with zipfile.ZipFile(wheel) as zf:
        libs = [n for n in zf.namelist() if n.endswith(".so")]
        assert libs
        for name in libs:
            path = tmp_path / Path(name).name
            path.write_bytes(zf.read(name))
            with path.open("rb") as fh:
                sections = [s.name for s in elftools.ELFFile(fh).iter_sections()]
            assert not [s for s in sections if s.startswith(".debug")], name


@pytest.mark.skipif(sys.platform != "linux", reason="auditwheel runs on Linux")
def test_auditwheel_show_derives_the_same_manylinux_tag(wheel):
    # torch's libraries are excluded, not whitelisted, so `show` also says linux_x86_64;
    # the glibc constraint it derives must still be the tag repair wrote.
    pytest.importorskip("auditwheel", reason="needs auditwheel")
    if "manylinux" not in wheel.name:
        pytest.skip("wheel was not repaired (--no-repair)")
    result = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    tag = next(t.platform for t in parse_wheel_name(wheel.name).tags)
    assert f'"{tag}"' in result.stdout
