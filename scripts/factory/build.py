"""Run a build plan: environment, pip wheel (setup.py compiles), repair, check."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from . import arch, kernels, repair, wheelcheck
from .arch import REPO_ROOT
from .errors import BuildError, PlanError
from .host import venv_python
from .model import Matrix
from .plan import CellPlan
from .source_build import CELL_ENV, TARGETS_ENV

WHEELHOUSE = REPO_ROOT / "wheelhouse"


def _run(command: Sequence[str], what: str, env: Mapping[str, str] | None = None,
         log: Callable[[str], None] = print) -> None:
    log(f"$ {' '.join(map(str, command))}")
    started = time.monotonic()
    result = subprocess.run([str(c) for c in command], env=env, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise BuildError(f"{what} failed (exit {result.returncode}) after "
                         f"{time.monotonic() - started:.0f}s: {' '.join(map(str, command))}")


def _major_minor_or_none(version: str) -> str | None:
    try:
        return arch.major_minor(version)
    except ValueError:
        return None


def _is_cells_wheel(file_name: str, cell) -> bool:
    """Whether a wheel file name is sageattention at the cell's version for its Python tag."""
    try:
        name, version, _, tags = parse_wheel_filename(file_name)
    except InvalidWheelFilename:
        return False
    return (name == "sageattention" and version == cell.version()
            and any(tag.interpreter == cell.python_tag for tag in tags))


def prepare_python(plan: CellPlan, log: Callable[[str], None] = print) -> Path:
    """The interpreter to build with: the host's, or a venv with the cell's torch."""
    if plan.venv is None:
        return Path(plan.interpreter.path)
    python = venv_python(plan.venv)
    if not python.is_file():
        _run([plan.interpreter.path, "-m", "venv", str(plan.venv)], "creating the venv", log=log)
    _run([python, "-m", "pip", "install", f"torch=={plan.cell.torch}", "setuptools>=70",
          "wheel", "packaging", "ninja"], f"installing torch {plan.cell.torch}", log=log)
    probe = subprocess.run([str(python), "-c", "import torch; print(torch.version.cuda)"],
                           capture_output=True, text=True)
    cuda = probe.stdout.strip()
    # major.minor, as the plan's torch_fits and the cell id (cu130) compare it: a cu126 torch
    # in a cu128 cell would build a wheel labelled for the wrong CUDA (setup.py then refuses it
    # after minutes, as "the wheel build failed")
    if probe.returncode != 0 or cuda in ("", "None") or _major_minor_or_none(cuda) != \
            arch.major_minor(plan.cell.cuda):
        raise BuildError(
            f"the torch installed in {plan.venv} has CUDA {cuda or 'none'}, cell "
            f"{plan.cell.id} needs CUDA {plan.cell.cuda}: point pip at the right index, e.g. "
            f"PIP_INDEX_URL=https://download.pytorch.org/whl/{plan.cell.cuda_tag}")
    return python


def build_cell(plan: CellPlan, *, jobs: int, out_dir: Path = WHEELHOUSE,
               matrix: Matrix | None = None, log: Callable[[str], None] = print) -> Path:
    """Build, repair and check one planned cell; returns the final wheel's path."""
    if not plan.build:
        raise PlanError(f"{plan.cell.id} is not buildable here: {plan.reason}")
    started = time.monotonic()
    # absolute: the repair tool runs in the repository root, this process maybe elsewhere
    out_dir = Path(out_dir).resolve()
    cell = plan.cell
    log(f"== {cell.id}: building {cell.version()} ==")
    python = prepare_python(plan, log)
    raw_dir = REPO_ROOT / "build" / "factory" / cell.id
    shutil.rmtree(raw_dir, ignore_errors=True)
    raw_dir.mkdir(parents=True)
    env = {**os.environ, TARGETS_ENV: ";".join(cell.sm_targets), CELL_ENV: cell.id,
           "MAX_JOBS": str(jobs)}
    nvcc = kernels.find_nvcc(env)
    if nvcc is not None and not env.get("CUDA_HOME"):
        env["CUDA_HOME"] = str(kernels.cuda_home_of(nvcc))
    _run([python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "-v",
          "-w", str(raw_dir)], "the wheel build", env=env, log=log)
    built = sorted(raw_dir.glob("*.whl"))
    if len(built) != 1:
        raise BuildError(f"expected one wheel in {raw_dir}, found {[p.name for p in built]}")
    raw = built[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.whl"))
    if plan.repair:
        torch_lib = None
        if cell.os == "windows":  # delvewheel must be told where torch's DLLs are
            torch_lib = Path(subprocess.run(
                [str(python), "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
                capture_output=True, text=True).stdout.strip()) / "lib"
        _run(repair.repair_command(cell.os, raw, out_dir, torch_lib=torch_lib,
                                   prefix=repair.repair_prefix(cell.os)),
             f"{repair.repair_tool(cell.os)} repair", log=log)
        fresh = [p for p in out_dir.glob("*.whl") if p not in before]
        # none new: the repaired wheel overwrote one of the same name from an earlier build
        candidates = fresh or [p for p in out_dir.glob("*.whl") if _is_cells_wheel(p.name, cell)]
        if not candidates:
            raise BuildError(f"{repair.repair_tool(cell.os)} exited 0 but left no wheel of "
                             f"{cell.id} in {out_dir} (repaired from {raw.name})")
        final = max(candidates, key=lambda p: p.stat().st_mtime)
    else:
        final = out_dir / raw.name
        shutil.copy2(raw, final)
    wheelcheck.check_wheel(final, matrix)
    size = final.stat().st_size / 1e6
    log(f"== {cell.id}: {final.name} ({size:.1f} MB) in {time.monotonic() - started:.0f}s; "
        "name, metadata and build info agree ==")
    return final


def run_plans(plans: Sequence[CellPlan], *, jobs: int, out_dir: Path = WHEELHOUSE,
              matrix: Matrix | None = None, log: Callable[[str], None] = print) -> list[Path]:
    buildable = [p for p in plans if p.build]
    if not buildable:
        raise PlanError("nothing to build on this host: every cell was skipped (reasons above)")
    try:  # before the first compile, not after it: a build takes minutes to half an hour
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create the output folder {out_dir} ({exc.strerror or exc}); "
                         "pass --out a folder you can write") from None
    return [build_cell(p, jobs=jobs, out_dir=out_dir, matrix=matrix, log=log)
            for p in buildable]


def default_jobs() -> int:
    return kernels.jobs_from_env(os.environ)
