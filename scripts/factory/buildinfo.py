"""The build info a wheel carries (sageattention/_build_info.json), made at build time."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Mapping

from .arch import REPO_ROOT, FamilyBuild
from .errors import ToolchainError
from .model import Target

SCHEMA_VERSION = 1


def host_compiler_version(env: Mapping[str, str] = os.environ) -> str:
    """First line of the host C++ compiler's version (what nvcc and setuptools use)."""
    if sys.platform == "win32":
        exe = shutil.which("cl")
        if not exe:
            return "cl (not on PATH)"
        result = subprocess.run([exe], capture_output=True, text=True)
        return (result.stderr or result.stdout).splitlines()[0].strip()
    exe = env.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not exe:
        return "unknown (no c++ on PATH)"
    result = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return (result.stdout.splitlines() or ["unknown"])[0].strip()


def git_commit(root: Path = REPO_ROOT, env: Mapping[str, str] = os.environ) -> str:
    """The source commit; SOURCE_COMMIT (set by CI for sdists) wins over git. A SOURCE_COMMIT that
    is not a full hash is kept as given, with a warning: the build info would name less than git."""
    if env.get("SOURCE_COMMIT"):
        given = env["SOURCE_COMMIT"]
        if not re.fullmatch(r"[0-9a-f]{40}(-dirty)?", given):
            print(f"warning: SOURCE_COMMIT={given!r} is not a full 40-character commit hash "
                  "(pass SOURCE_COMMIT=$(git rev-parse HEAD)); the build info records it as given",
                  file=sys.stderr)
        return given
    try:
        result = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = result.stdout.splitlines()
    if result.returncode != 0 or len(lines) != 2 or not re.fullmatch(r"[0-9a-f]{40}", lines[1]):
        return "unknown"
    # a source tree without its own .git (an sdist unpacked inside another checkout) is not that
    # checkout's commit: git answered for the repository above it
    if Path(lines[0]).resolve() != Path(root).resolve():
        return "unknown"
    commit = lines[1]
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return commit + ("-dirty" if dirty else "")


def build_date(env: Mapping[str, str] = os.environ) -> str:
    """UTC ISO date; SOURCE_DATE_EPOCH (reproducible builds) wins over the clock. One that is not
    a whole number of seconds is a ToolchainError (it was a ValueError traceback mid-build)."""
    epoch = env.get("SOURCE_DATE_EPOCH")
    if not epoch:
        moment = datetime.datetime.now(datetime.timezone.utc)
    else:
        try:
            moment = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
        except (ValueError, OverflowError, OSError):
            raise ToolchainError(
                f"SOURCE_DATE_EPOCH={epoch!r} is not a time: it must be whole seconds since "
                "1970-01-01 UTC, e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct); or unset "
                "it to date the build now") from None
    return moment.replace(microsecond=0).isoformat()


def platform_name() -> str:
    """The OS-architecture of the build (linux_x86_64, win_amd64); the repaired wheel's
    manylinux tag is in its WHEEL file."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def make_build_info(*, version: str, local_label: str, targets: Iterable[Target],
                    builds: Iterable[FamilyBuild], torch_version: str, cuda: str,
                    torch_requirement: str, nvcc_version: str, cell_id: str | None,
                    env: Mapping[str, str] = os.environ) -> dict:
    builds = list(builds)
    return {
        "schema_version": SCHEMA_VERSION,
        "version": version,
        "local_label": local_label,
        "sm_targets": [str(t) for t in targets],
        "families": [b.family.name for b in builds],
        "gencode": {b.family.name: b.gencode_flags() for b in builds},
        "ptx": sorted({f"compute_{sm}" for b in builds for sm in b.ptx}),
        "torch": torch_version,
        "torch_requirement": torch_requirement,
        "cuda": cuda,
        "python_tag": f"cp{sys.version_info.major}{sys.version_info.minor}",
        "python": platform.python_version(),
        "platform": platform_name(),
        "compilers": {"nvcc": nvcc_version, "host": host_compiler_version(env)},
        "git_commit": git_commit(env=env),
        "build_date": build_date(env),
        "cell_id": cell_id,
    }
