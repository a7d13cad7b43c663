"""Repair commands: auditwheel (Linux) and delvewheel (Windows), never vendoring torch's or
CUDA's own libraries (torch loads those; a second copy in our wheel would clash)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

# Shared libraries that torch and its nvidia-* wheels provide at run time.
LINUX_EXCLUDES = (
    "libtorch*.so*", "libc10*.so*", "libshm*.so*",
    "libcuda.so*", "libcudart.so*", "libnvrtc*.so*", "libnvJitLink*.so*", "libcublas*.so*",
    "libcusparse*.so*", "libcufft*.so*", "libcurand*.so*", "libcusolver*.so*",
    "libcudnn*.so*", "libnccl*.so*", "libnvToolsExt*.so*", "libcupti*.so*",
)
WINDOWS_EXCLUDES = (
    "c10.dll", "c10_cuda.dll", "torch.dll", "torch_cpu.dll", "torch_cuda.dll",
    "torch_python.dll", "cudart64_13.dll", "cudart64_12.dll", "nvrtc64_130_0.dll",
    "cublas64_13.dll", "cublasLt64_13.dll",
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
        excludes = [f"--exclude={pattern}" for pattern in LINUX_EXCLUDES]
        return [*prefix, "repair", *patcher, *excludes, "-w", str(out_dir), str(wheel)]
    if os_name == "windows":
        command = [*prefix, "repair", "--exclude", ";".join(WINDOWS_EXCLUDES),
                   "-w", str(out_dir)]
        if torch_lib is not None:
            command += ["--add-path", str(torch_lib)]
        return [*command, str(wheel)]
    raise ValueError(f"no repair tool for OS {os_name!r} (accepted: linux, windows)")


def repair_tool(os_name: str) -> str:
    tools = {"linux": "auditwheel", "windows": "delvewheel"}
    if os_name not in tools:
        raise ValueError(f"no repair tool for OS {os_name!r} (accepted: linux, windows)")
    return tools[os_name]
