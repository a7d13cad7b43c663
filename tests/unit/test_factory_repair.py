"""The libraries a repaired wheel must not vendor: one list (scripts/factory/repair.py), used by
the factory's builds and, through a checked copy, by cibuildwheel.toml's hosted builds."""

from __future__ import annotations

import shlex
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scripts.factory import repair  # noqa: E402


def _toml_repair_commands() -> dict[str, list[str]]:
    options = tomllib.loads((ROOT / "cibuildwheel.toml").read_text(encoding="utf-8"))
    tables = options["tool"]["cibuildwheel"]
    return {os_name: tables[os_name]["repair-wheel-command"] for os_name in ("linux", "windows")}


@pytest.mark.parametrize("os_name", ["linux", "windows"])
def test_cibuildwheel_toml_repairs_with_repair_py_exclusions(os_name):
    """The toml cannot import Python, so it holds a copy; this is the check that keeps it one rule.
    (Before: the toml excluded 7 Linux patterns, repair.py 16, and neither list held the other.)"""
    expected = repair.cibuildwheel_command(os_name)
    assert _toml_repair_commands()[os_name] == [expected], (
        f"cibuildwheel.toml's [tool.cibuildwheel.{os_name}] repair-wheel-command differs from "
        f"scripts/factory/repair.py; set it to:\n  {expected!r}")


def test_linux_command_excludes_exactly_repair_py_patterns_quoted_for_the_shell():
    (command,) = _toml_repair_commands()["linux"]
    words = shlex.split(command)  # what bash in the manylinux container passes to auditwheel
    assert words[:2] == ["auditwheel", "repair"]
    assert words[-3:] == ["-w", "{dest_dir}", "{wheel}"]
    excluded = [w.removeprefix("--exclude=") for w in words if w.startswith("--exclude=")]
    assert tuple(excluded) == repair.LINUX_EXCLUDES
    # unquoted, bash would expand a pattern that matches a file in the working directory
    assert all(f"'--exclude={p}'" in command for p in repair.LINUX_EXCLUDES)


def test_windows_command_excludes_exactly_repair_py_dlls():
    (command,) = _toml_repair_commands()["windows"]
    words = command.split()
    assert words[:2] == ["delvewheel", "repair"] and "--no-dll" not in words
    assert words[words.index("--exclude") + 1].split(";") == list(repair.WINDOWS_EXCLUDES)


def test_factory_repair_commands_use_the_same_exclusions(tmp_path):
    linux = repair.repair_command("linux", tmp_path / "w.whl", tmp_path / "out",
                                  prefix=["auditwheel"])
    assert [w for w in linux if w.startswith("--exclude")] == repair.exclude_options("linux")
    windows = repair.repair_command("windows", tmp_path / "w.whl", tmp_path / "out",
                                    prefix=["delvewheel"])
    at = windows.index("--exclude")
    assert windows[at:at + 2] == repair.exclude_options("windows")


def test_every_library_either_list_kept_out_is_still_kept_out():
    """The union of the two lists that were merged: nothing either one excluded is vendored now."""
    from fnmatch import fnmatch

    for soname in ("libtorch.so", "libtorch_cuda.so", "libc10.so", "libc10_cuda.so",
                   "libcudart.so.13", "libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13",
                   "libcusparse.so.12", "libnvrtc.so.13", "libnvJitLink.so.13",
                   "libnvshmem_host.so.3", "libnvToolsExt.so.1", "libcudnn.so.9", "libshm.so"):
        assert any(fnmatch(soname, p) for p in repair.LINUX_EXCLUDES), soname
    assert {"c10.dll", "torch_cuda.dll", "cudart64_13.dll", "cublas64_13.dll",
            "cublasLt64_13.dll", "cusparse64_12.dll", "nvrtc64_130_0.dll"} <= set(
                repair.WINDOWS_EXCLUDES)


def test_an_os_without_a_repair_tool_is_named_with_the_accepted_ones():
    with pytest.raises(ValueError, match="no repair tool for OS 'macos' \\(accepted: linux, windows\\)"):
        repair.cibuildwheel_command("macos")
