"""One answer to "which OS is this host" (host.host_os) for the plan and for setup.py's cell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.factory import arch, host, model, source_build  # noqa: E402


@pytest.mark.parametrize("platform, expected", [("win32", "windows"), ("linux", "linux")])
def test_host_os_names_the_os_as_the_matrix_does(platform, expected):
    assert host.host_os(platform) == expected
    assert expected in model.OSES


def test_source_build_has_no_second_answer():
    # the copy it had (source_build.host_os) could drift from the plan's
    assert not hasattr(source_build, "host_os")


def test_setup_py_cell_and_the_plan_read_the_same_answer(monkeypatch):
    """Both consult host.host_os: a Windows answer makes setup.py's cell a windows- cell and the
    plan's host a Windows host (before, source_build kept its own copy of the rule)."""
    monkeypatch.setattr(host, "host_os", lambda platform=sys.platform: "windows")
    monkeypatch.setattr(arch, "nvcc_version", lambda p: arch.Version("13.0.88"))
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    cell_id = f"windows-{py}-torch2.14-cu130-sm80"
    config = source_build.resolve(
        {"SAGEATTENTION_SM_TARGETS": "sm80", "SAGEATTENTION_CELL": cell_id},
        torch_facts=lambda need_gpus: source_build.TorchFacts("2.14.1+cu130", "13.0", ()),
        find_nvcc=lambda env: Path("/fake/nvcc"),
        nvcc_identity=lambda path: "release 13.0, V13.0.88")
    assert config.cell_id == cell_id
    monkeypatch.setattr(host, "probe_interpreter", lambda path: None)
    monkeypatch.setattr(host.kernels, "find_nvcc", lambda env: None)
    assert host.detect_host([], env={}).os == "windows"
    assert host.venv_python(Path("v")) == Path("v") / "Scripts/python.exe"
