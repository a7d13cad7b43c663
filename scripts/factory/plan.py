"""Plan builds: which cells of an SM this host builds, how, and why it skips the others.

Pure: takes the matrix cells and a Host, returns frozen CellPlans. Printing the plan before
any compile starts is the caller's first step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from packaging.version import Version

from . import arch, repair
from .arch import REPO_ROOT
from .errors import ToolchainError
from .host import BUILD_PYTHON_ENV, Host, Interpreter
from .model import Cell


@dataclasses.dataclass(frozen=True)
class CellPlan:
    cell: Cell
    build: bool
    reason: str
    interpreter: Interpreter | None = None
    venv: Path | None = None       # set when the cell needs its own venv with its torch
    families: tuple[arch.FamilyBuild, ...] = ()
    repair: bool = True
    steps: tuple[str, ...] = ()


def torch_fits(interp: Interpreter, cell: Cell) -> bool:
    """An interpreter's torch can build a cell: same major.minor, same CUDA version."""
    if interp.torch is None or interp.torch_cuda is None:
        return False
    return (arch.major_minor(Version(interp.torch).base_version) == cell.torch_mm
            and arch.major_minor(interp.torch_cuda) == arch.major_minor(cell.cuda))


def plan_cell(cell: Cell, host: Host, *, repair_wheels: bool = True,
              families: Mapping[str, arch.Family] | None = None,
              root: Path = REPO_ROOT, out_dir: Path | None = None) -> CellPlan:
    """``out_dir``: where the build puts the final wheel (build --out), named in the steps."""
    families = arch.load_families() if families is None else families
    dest = f"{Path(out_dir or 'wheelhouse').as_posix().rstrip('/')}/"
    builds = tuple(arch.family_builds(((t.sm, t.ptx) for t in cell.targets), families))
    runner = " ".join(cell.build_runner) or "a matching runner"
    if cell.os != host.os:
        return CellPlan(cell, False, f"cell is for {cell.os}, this host runs {host.os} "
                                     f"(build it on runner: {runner})", families=builds)
    candidates = host.interpreters.get(cell.python, ())
    fitting = [i for i in candidates if torch_fits(i, cell)]
    interp = (fitting or list(candidates) or [None])[0]
    if interp is None:
        return CellPlan(cell, False, f"no Python {cell.python} interpreter here (looked for "
                                     f"python{cell.python} on PATH and ${BUILD_PYTHON_ENV}); "
                                     f"install it or point {BUILD_PYTHON_ENV} at one, or build "
                                     f"on runner: {runner}", families=builds)
    if host.nvcc is None:
        return CellPlan(cell, False, "nvcc not found: set CUDA_HOME to a CUDA "
                                     f"{cell.cuda} toolkit", families=builds)
    try:  # before a venv and torch are installed
        arch.check_toolchain(Version(host.nvcc), cell.cuda, builds)
    except ToolchainError as exc:
        return CellPlan(cell, False, f"{exc}; set CUDA_HOME to a CUDA {cell.cuda} "
                                     "toolkit", families=builds)
    if repair_wheels and not host.has_repair_tool:
        tool = repair.repair_tool(cell.os)
        return CellPlan(cell, False, f"{tool} is not installed (pip install {tool}), or pass "
                                     "--no-repair", families=builds)
    venv = None if torch_fits(interp, cell) else root / "build" / "venvs" / cell.id
    steps = []
    if venv is None:
        steps.append(f"use {interp.path} (Python {interp.python}, torch {interp.torch}, "
                     f"CUDA {interp.torch_cuda})")
    else:
        steps.append(f"create {venv.relative_to(root)} from {interp.path} and pip install "
                     f"torch=={cell.torch} (its torch is {interp.torch or 'missing'})")
    for b in builds:
        steps.append(f"compile family {b.family.name} ({b.family.extension}): "
                     f"{' '.join(b.gencode_flags())}; kernel objects cached per (nvcc, gencode,"
                     " sources)")
    steps.append(f"pip wheel --no-build-isolation: version {cell.version()}, requires "
                 f"{cell.torch_requirement}, {cell.cxx_std}, build info inside")
    if repair_wheels:
        steps.append(f"repair with {repair.repair_tool(cell.os)}, excluding torch and CUDA "
                     f"libraries -> {dest}")
    else:
        steps.append(f"no repair (--no-repair): copy to {dest}")
    steps.append("check: name, METADATA and build info agree; exact file set")
    return CellPlan(cell, True, "buildable here", interp, venv, builds, repair_wheels,
                    tuple(steps))


def plan_cells(cells: Iterable[Cell], host: Host, **kwargs) -> list[CellPlan]:
    return [plan_cell(c, host, **kwargs) for c in cells]


def format_plan(plans: Sequence[CellPlan], title: str) -> str:
    lines = [f"plan: {title}: {sum(p.build for p in plans)} to build, "
             f"{sum(not p.build for p in plans)} skipped"]
    for p in plans:
        if p.build:
            lines.append(f"  BUILD {p.cell.id}  (targets {' '.join(p.cell.sm_targets)})")
            lines += [f"        {i}. {step}" for i, step in enumerate(p.steps, 1)]
        else:
            lines.append(f"  SKIP  {p.cell.id}: {p.reason}")
    return "\n".join(lines)
