"""Repair commands: auditwheel (Linux) and delvewheel (Windows), never vendoring torch's or
CUDA's own libraries (torch loads those; a second copy in our wheel would clash).

The exclusion lists below are the one copy of that rule: the factory's builds use
:func:`repair_command`, and cibuildwheel.toml's ``repair-wheel-command`` must be exactly
:func:`cibuildwheel_command` (tests/unit/test_factory_repair.py checks it, and prints the line
to paste when they differ).
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# Shared libraries that torch and its nvidia-* wheels (or the driver) provide at run time.
# libnv*: every NVIDIA library (nvrtc, nvJitLink, nvToolsExt, nvshmem, nvidia-ml, ...).
LINUX_EXCLUDES = (
    "libtorch*.so*", "libc10*.so*", "libshm*.so*",
    "libcuda.so*", "libcudart.so*", "libnv*.so*", "libcublas*.so*",
    "libcusparse*.so*", "libcufft*.so*", "libcufile*.so*", "libcurand*.so*", "libcusolver*.so*",
    "libcudnn*.so*", "libnccl*.so*", "libcupti*.so*",
)
WINDOWS_EXCLUDES = (
    "c10.dll", "c10_cuda.dll", "torch.dll", "torch_cpu.dll", "torch_cuda.dll",
    "torch_python.dll", "cudart64_13.dll", "cudart64_12.dll", "nvrtc64_130_0.dll",
    "cublas64_13.dll", "cublasLt64_13.dll", "cusparse64_12.dll",
)


def repair_prefix(os_name: str) -> list[str] | None:
    """How to run the OS's repair tool: as a module of this Python, else from PATH."""
    tool = repair_tool(os_name)
    if importlib.util.find_spec(tool) is not None:
        return [sys.executable, "-m", tool]
    found = shutil.which(tool)
    return [found] if found else None


def repair_command(os_name: str, wheel: Path, out_dir: Path, *,
                   torch_lib: Path | None = None, prefix: list[str] | None = None) -> list[str]:
    """The repair command for one wheel (pure but for finding patchelf; the caller runs it)."""
    prefix = prefix or [repair_tool(os_name)]
    if os_name == "linux":
        # With nothing left to graft no ELF needs patching; without patchelf on PATH use
        # the 'none' patcher, which fails loudly if something would need vendoring.
        patcher = [] if shutil.which("patchelf") else ["--patcher", "none"]
        return [*prefix, "repair", *patcher, *exclude_options(os_name), "-w", str(out_dir),
                str(wheel)]
    command = [*prefix, "repair", *exclude_options(os_name), "-w", str(out_dir)]
    if torch_lib is not None:
        command += ["--add-path", str(torch_lib)]
    return [*command, str(wheel)]


def exclude_options(os_name: str) -> list[str]:
    """The repair tool's options that keep torch's and CUDA's libraries out of the wheel."""
    if repair_tool(os_name) == "auditwheel":
        return [f"--exclude={pattern}" for pattern in LINUX_EXCLUDES]
    return ["--exclude", ";".join(WINDOWS_EXCLUDES)]


def cibuildwheel_command(os_name: str) -> str:
    """cibuildwheel.toml's ``repair-wheel-command`` for ``os_name``: the tool and exclusions of
    :func:`repair_command`, with cibuildwheel's ``{dest_dir}`` and ``{wheel}`` placeholders, quoted
    for the shell cibuildwheel runs it in (bash in the manylinux container, cmd.exe on Windows)."""
    words = [repair_tool(os_name), "repair", *exclude_options(os_name)]
    quoted = shlex.join(words) if os_name == "linux" else subprocess.list2cmdline(words)
    return f"{quoted} -w {{dest_dir}} {{wheel}}"


def repair_tool(os_name: str) -> str:
    tools = {"linux": "auditwheel", "windows": "delvewheel"}
    if os_name not in tools:
        raise ValueError(f"no repair tool for OS {os_name!r} (accepted: linux, windows)")
    return tools[os_name]
