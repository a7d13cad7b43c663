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

_PROBE = ("import sys, platform\n"
          "print(platform.python_version())\n"
          "try:\n    import torch\n    print(torch.__version__); print(torch.version.cuda)\n"
          "except Exception:\n    print('none'); print('none')\n")


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


def detect_host(pythons: Iterable[str], env: Mapping[str, str] = os.environ) -> Host:
    """Probe $SAGEATTENTION_BUILD_PYTHON, this interpreter, and ``python3.X`` on PATH."""
    os_name = "windows" if sys.platform == "win32" else "linux"
    candidates = [env.get(BUILD_PYTHON_ENV), sys.executable]
    candidates += [shutil.which(f"python{v}") for v in sorted(set(pythons))]
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
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
