"""Facts about the machine a build runs on: OS, Python interpreters (and their torch), nvcc.

Detection runs commands; everything that decides what to do with these facts is in plan.py
and takes a Host, so tests build one by hand.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping

from . import arch, kernels, repair

# Reads torch/version.py instead of importing torch: a torch import costs seconds per probe.
_PROBE = """\
import importlib.util, platform, re
print(platform.python_version())
spec = importlib.util.find_spec("torch")
ns = {}
if spec and spec.submodule_search_locations:
    path = list(spec.submodule_search_locations)[0] + "/version.py"
    exec(open(path).read(), ns)
print(ns.get("__version__") or "none")
print(ns.get("cuda") or "none")
"""


@dataclasses.dataclass(frozen=True)
class Interpreter:
    path: str
    python: str            # "3.11"
    torch: str | None      # "2.14.1+cu130", None when torch is not installed
    torch_cuda: str | None  # "13.0", None for a CPU build or no torch


@dataclasses.dataclass(frozen=True)
class Host:
    os: str
    interpreters: Mapping[str, tuple[Interpreter, ...]]   # by "3.11", preferred first
    nvcc: str | None                                      # "13.0.88"
    has_repair_tool: bool = True


BUILD_PYTHON_ENV = "SAGEATTENTION_BUILD_PYTHON"


def host_os(platform: str = sys.platform) -> str:
    """This machine's OS as build_matrix.yaml names it (one of model.OSES). The one answer for
    the factory's plan (detect_host) and for the cell setup.py builds (source_build.resolve)."""
    return "windows" if platform == "win32" else "linux"


def probe_interpreter(path: str) -> Interpreter | None:
    try:
        out = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) < 3:
        return None
    full, torch, cuda = lines[0], lines[1], lines[2]
    mm = ".".join(full.split(".")[:2])
    return Interpreter(path, mm, None if torch == "none" else torch,
                       None if cuda == "none" else cuda)


def find_python(version: str) -> str | None:
    """``python3.X`` on PATH; on Windows also the ``py -3.X`` launcher."""
    exe = shutil.which(f"python{version}")
    if exe or host_os() != "windows" or not shutil.which("py"):
        return exe
    out = subprocess.run(["py", f"-{version}", "-c", "import sys; print(sys.executable)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


def detect_host(pythons: Iterable[str], env: Mapping[str, str] = os.environ) -> Host:
    """Probe $SAGEATTENTION_BUILD_PYTHON, this interpreter, and ``python3.X`` on PATH."""
    os_name = host_os()
    candidates = [env.get(BUILD_PYTHON_ENV), sys.executable]
    candidates += [find_python(v) for v in sorted(set(pythons))]
    found: dict[str, list[Interpreter]] = {}
    seen: set[str] = set()
    for exe in candidates:
        # Not realpath: a venv's python links to its base python but sees other packages.
        if not exe or os.path.abspath(exe) in seen:
            continue
        seen.add(os.path.abspath(exe))
        probed = probe_interpreter(exe)
        if probed and probed not in found.get(probed.python, []):
            found.setdefault(probed.python, []).append(probed)
    nvcc = kernels.find_nvcc(env)
    nvcc_version = str(arch.nvcc_version(nvcc)) if nvcc else None
    return Host(os_name, {k: tuple(v) for k, v in found.items()}, nvcc_version,
                repair.repair_prefix(os_name) is not None)


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if host_os() == "windows" else "bin/python")
