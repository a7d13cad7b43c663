"""Compile a small C++ driver against csrc/common on the host, for the tests of the kernels' plain
C++ pieces (exact_div.h, exp2_fma.h). Skips the calling test when there is no C++ compiler."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compile_driver(folder: Path, name: str, source: str) -> Path:
    """Write folder/<name>.cpp, compile it (-O2, C++17, no FMA contraction, csrc/common on the
    include path) and return the executable."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH (g++ or c++)")
    cpp = folder / f"{name}.cpp"
    cpp.write_text(source)
    exe = folder / name
    subprocess.run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-I", str(ROOT / "csrc" / "common"),
                    str(cpp), "-o", str(exe)], check=True)
    return exe
