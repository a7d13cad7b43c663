"""Run a test file's ``--worker`` half in Triton's interpreter, for the tests of the Triton kernels
on the CPU. Triton decides interpreter-or-compile when a kernel is decorated (on the first import
of ``sageattention.triton``), and another test may have imported it already, so the kernels run in
a subprocess started with ``TRITON_INTERPRET=1`` that prints one JSON object as its last line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_worker(script: str | Path, timeout: float) -> dict:
    """``python script --worker`` under the interpreter, the repository first on its path; the JSON
    of its last output line. Fails the calling test, with the worker's stderr, when it fails."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(REPO), *inherited]))
    proc = subprocess.run([sys.executable, str(script), "--worker"], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        pytest.fail(f"interpreter worker {Path(script).name} failed (rc={proc.returncode}):\n"
                    f"{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
